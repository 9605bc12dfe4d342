"""Matrix products of the NeuronCore (PE engine): MatMul, Gemm, and MatMulBias, the
compiler's fusion of MatMul and a constant bias. float16 operands are multiplied in
float32 and the result rounded back once (`via_float32`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOATS,
    Attr,
    Shape,
    dtype_check,
    dtype_set,
    flag_attr,
    float_attr,
    kernel,
    via_float32,
)

# ---- MAC counts (see driver_sim.cost) ------------------------------------------------


def _matmul_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    contraction = inputs[0][-1]
    return math.prod(outputs[0]) * contraction


def _gemm_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    a = inputs[0]
    contraction = a[0] if attrs["transA"] else a[1]
    return math.prod(outputs[0]) * contraction


@kernel(
    "MatMul",
    Engine.PE,
    inputs=(2, 2),
    macs=_matmul_macs,
    since=(1, 9, 13),
    check=dtype_check(FLOATS | dtype_set("int32", "int64", "uint32", "uint64"), same=(0, 1)),
)
def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Y = A @ B with numpy.matmul broadcasting (1-D operands promoted and dropped)."""
    return via_float32(_stacked_matmul, a, b)


def _stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul, with a stack of rows times one matrix (B, S, K) @ (K, N) done as one
    (B*S, K) @ (K, N) GEMM: numpy would make it B separate ones."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:
        flat = np.matmul(a.reshape(-1, a.shape[-1]), b)
        return flat.reshape(*a.shape[:-1], b.shape[-1])
    return np.matmul(a, b)


@kernel(
    "MatMulBias",
    Engine.PE,
    inputs=(3, 3),
    macs=_matmul_macs,
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _matmul_bias(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Y = A @ B + bias (bias along the last axis), the bias added in place into the
    product. Not an ONNX op: the compiler fuses MatMul + Add of a constant into it."""
    if a.dtype == np.float16:
        return via_float32(_matmul_bias, a, b, bias)
    product = _stacked_matmul(a, b)
    np.add(product, bias, out=product)
    return product


@kernel(
    "Gemm",
    Engine.PE,
    inputs=(2, 3),
    attrs={
        "alpha": Attr(float_attr, 1.0),
        "beta": Attr(float_attr, 1.0),
        "transA": Attr(flag_attr, 0),
        "transB": Attr(flag_attr, 0),
    },
    macs=_gemm_macs,
    since=(7, 9, 11, 13),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float,
    beta: float,
    transA: int,  # the ONNX attribute names
    transB: int,
) -> np.ndarray:
    """Y = alpha * A' @ B' + beta * C, C unidirectionally broadcast to Y."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got shapes {a.shape} and {b.shape}")
    a = a.T if transA else a
    b = b.T if transB else b
    if c is None or beta == 0.0:
        return via_float32(_scaled_product, a, b, alpha=alpha, beta=beta)
    return via_float32(_scaled_product, a, b, c, alpha=alpha, beta=beta)


def _scaled_product(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, alpha: float, beta: float
) -> np.ndarray:
    y = np.matmul(a, b)
    if alpha != 1.0:
        y *= alpha
    if c is not None:
        y += c if beta == 1.0 else c * beta
    return y
