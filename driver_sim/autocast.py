"""Auto-cast: fp32 work done in a 16-bit type, as the chip does it when a model is
compiled so (the field's compiler: `--auto-cast none|matmult|all`, `--auto-cast-type
bf16|fp16`). The inputs of the ops cast are rounded to the 16-bit type; the op computes
and accumulates in fp32 and gives fp32. `matmult` casts the matrix multiplies (and
convolutions, which the PE engine runs as such); `all` casts every op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from driver_sim.errors import KernelError

MODES = ("none", "matmult", "all")
TYPES: dict[str, np.dtype[Any]] = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
}
MATMULT_OPS = frozenset({"MatMul", "MatMulBias", "Gemm", "Conv", "ConvTranspose", "WinogradConv"})
_F32 = np.dtype(np.float32)


def check(mode: str, type_name: str) -> None:
    if mode not in MODES or type_name not in TYPES:
        raise KernelError(
            f"auto-cast {mode!r} to {type_name!r}: the modes are {', '.join(MODES)}, "
            f"the types {', '.join(TYPES)}"
        )


def casts(op: str, mode: str) -> bool:
    """Whether `op`'s fp32 inputs are rounded under auto-cast `mode`."""
    return mode == "all" or (mode == "matmult" and op in MATMULT_OPS)


def rounding(fn: Callable[..., Any], type_name: str) -> Callable[..., Any]:
    """`fn` with each fp32 input rounded to `type_name` first."""
    narrow = TYPES[type_name]

    def rounded(*args: Any) -> Any:
        return fn(*[_round(a, narrow) for a in args])

    return rounded


def _round(value: Any, narrow: np.dtype[Any]) -> Any:
    if isinstance(value, np.ndarray) and value.dtype == _F32:
        return value.astype(narrow).astype(_F32)
    return value
