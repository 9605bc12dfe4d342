"""Matrix products of the NeuronCore (PE engine): MatMul, Gemm, MatMulBias (the
compiler's fusion of MatMul and a constant bias), Einsum and Det. float16 operands are multiplied in
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
    VARIADIC,
    Attr,
    Shape,
    dtype_check,
    dtype_set,
    flag_attr,
    float_attr,
    kernel,
    str_attr,
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


def _det_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """An LU factorization per matrix: about n^3 / 3 MACs."""
    n = inputs[0][-1] if inputs[0] else 0
    return math.prod(outputs[0]) * n**3 // 3


@kernel("Det", Engine.PE, macs=_det_macs, since=(11, 22), check=dtype_check(FLOATS))
def _det(x: np.ndarray) -> np.ndarray:
    """The determinant of each (M, M) matrix of the last two axes."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det needs square matrices, got shape {x.shape}")
    return via_float32(np.linalg.det, x)


def _equation_attr(value: Any) -> str:
    equation = str_attr(value).replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    if not all(term.replace("...", "").isalpha() or not term for term in inputs.split(",")):
        raise ValueError(f"bad equation {value!r}")
    if arrow and output.replace("...", "") and not output.replace("...", "").isalpha():
        raise ValueError(f"bad equation {value!r}")
    return equation


def _einsum_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """A product of two or more operands: one MAC per point of the loop nest over every
    label, per operand after the first (with an ellipsis: per output element); a
    one-operand sum or transpose: none."""
    terms = attrs["equation"].partition("->")[0].split(",")
    if len(terms) < 2:
        return 0
    if "..." in attrs["equation"]:
        return math.prod(outputs[0]) * (len(terms) - 1)
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, inputs, strict=False):
        sizes.update(zip(term, shape, strict=False))
    return math.prod(sizes.values()) * (len(terms) - 1)


@kernel(
    "Einsum",
    Engine.PE,
    inputs=VARIADIC,
    attrs={"equation": Attr(_equation_attr)},
    macs=_einsum_macs,
    since=(12, 28),
    check=dtype_check(FLOATS | dtype_set("int32", "int64", "uint32", "uint64")),
)
def _einsum(*operands: np.ndarray, equation: str) -> np.ndarray:
    """The Einstein summation `equation` of the operands (numpy's notation: "ij,jk->ik";
    without "->", the labels seen once, in alphabetical order)."""
    if operands[0].dtype == np.float16:
        return via_float32(lambda *wide: np.einsum(equation, *wide), *operands)
    return np.asarray(np.einsum(equation, *operands, optimize=len(operands) > 2))
