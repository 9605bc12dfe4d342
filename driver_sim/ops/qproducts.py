"""The NeuronCore's integer products, on the PE: MatMulInteger and ConvInteger (the int32
sums), QLinearMatMul, QLinearConv and onnxruntime's QGemm (the sums requantized). Products
of zero-point-shifted int8/uint8 values are summed exactly into int32 and requantized as
`quant` defines it: the accumulator as float32 times the float32 multiplier
(x_scale * w_scale / y_scale), rounded half to even, plus the output zero point,
saturated to the output type."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.quant import (
    BYTES,
    along_axis,
    as_int32,
    per_tensor,
    qlinear_check,
    requant_multiplier,
    requantize,
    shifted,
)
from driver_sim.ops.registry import (
    KERNELS,
    Attr,
    Shape,
    check_dtypes,
    flag_attr,
    float_attr,
    kernel,
)

_F32 = np.dtype(np.float32)


def _macs_of(op: str, positions: tuple[int, int]) -> Callable[..., int]:
    """The MAC count of float `op`, from the inputs at `positions` (its A and B)."""

    def macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
        operands = [inputs[positions[0]], inputs[positions[1]]]
        return KERNELS[op].macs(operands, outputs, attrs)

    return macs


def _integer_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    """(A, B, a_zero_point, b_zero_point) of MatMulInteger and ConvInteger."""
    check_dtypes(dtypes, [BYTES], same=())
    for k, operand in ((2, 0), (3, 1)):
        if len(dtypes) > k and dtypes[k] != dtypes[operand]:
            raise ValueError(f"input {k} is {dtypes[k]}, its operand {dtypes[operand]}")


def _matmul_operands(
    a: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray, b_zero: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """A and B minus their zero points (A's per tensor or per row, B's per tensor or per
    column), as float64."""
    if a.ndim < 1 or b.ndim < 1:
        raise ValueError(f"MatMul needs operands of rank >= 1, got {a.shape} and {b.shape}")
    az = np.asarray(0 if a_zero is None else a_zero)
    if az.size > 1:
        az = az.reshape(*az.shape, 1)  # per row of A
    bz = np.asarray(0 if b_zero is None else b_zero)
    return shifted(a, az), shifted(b, bz)


@kernel(
    "MatMulInteger",
    Engine.PE,
    inputs=(2, 4),
    macs=_macs_of("MatMul", (0, 1)),
    since=(10,),
    check=_integer_check,
)
def _matmul_integer(
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """Y = (A - a_zero_point) @ (B - b_zero_point) as int32."""
    left, right = _matmul_operands(a, a_zero_point, b, b_zero_point)
    return as_int32(np.matmul(left, right))


def _conv_attrs() -> dict[str, Attr]:
    return dict(KERNELS["Conv"].attrs)


def _integer_conv(
    x: np.ndarray,
    x_zero: np.ndarray | None,
    w: np.ndarray,
    w_zero: np.ndarray | None,
    attrs: Mapping[str, Any],
) -> np.ndarray:
    """The exact int32 sums of Conv over X and W minus their zero points (X's per tensor,
    W's per tensor or per output channel); padding counts as X's zero point."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"X and W need the same rank >= 3, got {x.shape} and {w.shape}")
    xz = per_tensor(x_zero, "x_zero_point")
    wz = along_axis(w_zero, w.shape, 0, "w_zero_point")
    sums = KERNELS["Conv"].compute(shifted(x, xz), shifted(w, wz), None, **attrs)
    return as_int32(sums)


@kernel(
    "ConvInteger",
    Engine.PE,
    inputs=(2, 4),
    attrs=_conv_attrs(),
    macs=_macs_of("Conv", (0, 1)),
    since=(10,),
    check=_integer_check,
)
def _conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """Y = (X - x_zero_point) (*) (W - w_zero_point) as int32."""
    return _integer_conv(x, x_zero_point, w, w_zero_point, attrs)


@kernel(
    "QLinearConv",
    Engine.PE,
    inputs=(8, 9),
    attrs=_conv_attrs(),
    macs=_macs_of("Conv", (0, 3)),
    since=(10,),
    check=qlinear_check((0, 3), 7, bias=8),
)
def _qlinear_conv(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    b: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """Conv of int8/uint8 X and W (W per tensor or per output channel) with an int32
    bias, requantized to y's scale and zero point."""
    acc = _integer_conv(x, x_zero_point, w, w_zero_point, attrs)
    channel = [-1] + [1] * (acc.ndim - 2)
    if b is not None:
        if b.shape != (w.shape[0],):
            raise ValueError(f"B has shape {b.shape}, expected ({w.shape[0]},)")
        acc = acc + b.reshape(channel)
    scale = along_axis(w_scale, w.shape, 0, "w_scale").reshape(channel)
    multiplier = requant_multiplier(
        per_tensor(x_scale, "x_scale"), scale, per_tensor(y_scale, "y_scale")
    )
    return requantize(acc, multiplier, per_tensor(y_zero_point, "y_zero_point"), y_zero_point.dtype)


@kernel(
    "QLinearMatMul",
    Engine.PE,
    inputs=(8, 8),
    macs=_macs_of("MatMul", (0, 3)),
    since=(10, 21),
    check=qlinear_check((0, 3), 7),
)
def _qlinear_matmul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
) -> np.ndarray:
    """A @ B of int8/uint8 operands (B per tensor or per column), requantized to y."""
    left, right = _matmul_operands(
        a, per_tensor(a_zero_point, "a_zero_point"), b, _column(b_zero_point, b, "b_zero_point")
    )
    acc = as_int32(np.matmul(left, right))
    multiplier = requant_multiplier(
        per_tensor(a_scale, "a_scale"), _column(b_scale, b, "b_scale"), y_scale
    )
    return requantize(acc, multiplier, per_tensor(y_zero_point, "y_zero_point"), y_zero_point.dtype)


def _column(value: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    """B's scale or zero point: per tensor, or per column (its last axis)."""
    return along_axis(value, b.shape, b.ndim - 1, what)


@kernel(
    "QGemm",
    Engine.PE,
    inputs=(6, 9),
    attrs={
        "alpha": Attr(float_attr, 1.0),
        "transA": Attr(flag_attr, 0),
        "transB": Attr(flag_attr, 0),
    },
    macs=_macs_of("Gemm", (0, 3)),
    check=qlinear_check((0, 3), 8, bias=6),
)
def _qgemm(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    c: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float,
    transA: int,  # the attribute names of onnxruntime's QGemm
    transB: int,
) -> np.ndarray:
    """alpha * A' @ B' + C of int8/uint8 A and B (B per tensor or per output column), C an
    int32 bias; requantized to y, or as float32 when y's scale is not given."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"QGemm needs 2-D A and B, got shapes {a.shape} and {b.shape}")
    a, b = (a.T if transA else a), (b.T if transB else b)
    b_zero = along_axis(b_zero_point, b.shape, 1, "b_zero_point")
    left, right = _matmul_operands(a, per_tensor(a_zero_point, "a_zero_point"), b, b_zero)
    acc = as_int32(np.matmul(left, right))
    if c is not None:
        acc = acc + c.astype(np.int32)
    b_scales = along_axis(b_scale, b.shape, 1, "b_scale").astype(_F32)
    scale = np.float32(alpha) * per_tensor(a_scale, "a_scale").astype(_F32) * b_scales
    if y_scale is None:
        return acc.astype(_F32) * scale
    multiplier = scale / per_tensor(y_scale, "y_scale").astype(_F32)
    zero = per_tensor(y_zero_point, "y_zero_point")
    dtype = np.dtype(np.uint8) if y_zero_point is None else y_zero_point.dtype
    return requantize(acc, multiplier, zero, dtype)
