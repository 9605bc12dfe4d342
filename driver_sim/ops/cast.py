"""Cast (POOL engine): conversion between the element types the NeuronCore holds."""

from __future__ import annotations

from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    ONNX_DTYPES,
    Attr,
    choice_attr,
    dtype_check,
    flag_attr,
    int_attr,
    kernel,
)


def _onnx_dtype_attr(value: Any) -> np.dtype:
    code = int_attr(value)
    if code not in ONNX_DTYPES:
        raise ValueError(
            f"element type {code} is not implemented (only bool, integers, float16/32/64)"
        )
    return ONNX_DTYPES[code]


@kernel(
    "Cast",
    Engine.POOL,
    attrs={
        "to": Attr(_onnx_dtype_attr),
        # only casts to float8 saturate or round, and those are refused
        "saturate": Attr(flag_attr, 1),
        "round_mode": Attr(choice_attr("up", "down", "nearest"), "up"),
    },
    since=(6, 9, 13, 19, 21, 23, 24, 25, 28),
    check=dtype_check(ALL_DTYPES),
)
def _cast(x: np.ndarray, *, to: np.dtype, saturate: int, round_mode: str) -> np.ndarray:
    """Y = X converted to `to` (floats to integers truncate; nonzero to bool is True)."""
    return x if x.dtype == to else np.asarray(x).astype(to)
