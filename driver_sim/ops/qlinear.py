"""onnxruntime's quantized element-wise, pooling and concatenating ops on the NeuronCore
(its domain, `CONTRIB_DOMAIN`: QLinearSigmoid, QLinearLeakyRelu, QLinearAdd, QLinearMul,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat). No spec makes them exact,
and onnxruntime computes them through float, so the NC does too: dequantize, the float op,
quantize in the output's scale and zero point. The integer arithmetic they share with the
ONNX quantized ops is `quant`'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.quant import (
    BYTES,
    SCALES,
    as_int32,
    dequantize,
    per_tensor,
    qlinear_check,
    quantize,
    requant_multiplier,
    requantize,
    saturate,
    shifted,
)
from driver_sim.ops.registry import (
    KERNELS,
    Attr,
    axis_index,
    check_dtypes,
    flag_attr,
    float_attr,
    int_attr,
    kernel,
)

_F32 = np.dtype(np.float32)


def _through_float(
    fn: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
) -> np.ndarray:
    """quantize(fn(dequantize(x)))  in y's scale and zero point (x's type)."""
    real = dequantize(x, per_tensor(x_scale, "X_scale"), per_tensor(x_zero_point, "X_zero_point"))
    return quantize(
        fn(real),
        per_tensor(y_scale, "Y_scale"),
        per_tensor(y_zero_point, "Y_zero_point"),
        x.dtype,
    )


_UNARY_CHECK = qlinear_check((0,), 4)


@kernel("QLinearSigmoid", Engine.ACT, inputs=(4, 5), check=_UNARY_CHECK)
def _qlinear_sigmoid(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    def sigmoid(v: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 / (1.0 + np.exp(-v)), dtype=_F32)

    return _through_float(sigmoid, x, x_scale, x_zero_point, y_scale, y_zero_point)


@kernel(
    "QLinearLeakyRelu",
    Engine.ACT,
    inputs=(4, 5),
    attrs={"alpha": Attr(float_attr, 0.01)},
    check=_UNARY_CHECK,
)
def _qlinear_leaky_relu(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float,
) -> np.ndarray:
    slope = np.float32(alpha)
    return _through_float(
        lambda v: np.where(v >= 0, v, v * slope), x, x_scale, x_zero_point, y_scale, y_zero_point
    )


def _binary(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """A and B minus their zero points, as float32 (exact: at most 16-bit integers)."""
    left = shifted(a, per_tensor(a_zero_point, "A_zero_point")).astype(_F32)
    right = shifted(b, per_tensor(b_zero_point, "B_zero_point")).astype(_F32)
    return left, right


_BINARY_CHECK = qlinear_check((0, 3), 7)


@kernel("QLinearAdd", Engine.POOL, inputs=(7, 8), check=_BINARY_CHECK)
def _qlinear_add(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """C = A + B in C's quantization: (A - za) * sa / sc + (B - zb) * sb / sc, rounded,
    plus zc (broadcasting as Add)."""
    left, right = _binary(a, a_scale, a_zero_point, b, b_scale, b_zero_point)
    sc = per_tensor(c_scale, "C_scale").astype(_F32)
    ratio_a = per_tensor(a_scale, "A_scale").astype(_F32) / sc
    ratio_b = per_tensor(b_scale, "B_scale").astype(_F32) / sc
    total = left * ratio_a + right * ratio_b
    return saturate(np.rint(total) + per_tensor(c_zero_point, "C_zero_point").astype(_F32), a.dtype)


@kernel("QLinearMul", Engine.POOL, inputs=(7, 8), check=_BINARY_CHECK)
def _qlinear_mul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """C = A * B in C's quantization: (A - za) * (B - zb) * (sa * sb / sc), rounded, plus zc."""
    left, right = _binary(a, a_scale, a_zero_point, b, b_scale, b_zero_point)
    multiplier = requant_multiplier(
        per_tensor(a_scale, "A_scale"),
        per_tensor(b_scale, "B_scale"),
        per_tensor(c_scale, "C_scale"),
    )
    product = left * right * multiplier
    return saturate(
        np.rint(product) + per_tensor(c_zero_point, "C_zero_point").astype(_F32), a.dtype
    )


def _channels_last(x: np.ndarray, channels_last: int) -> np.ndarray:
    """x (N, *S, C) as (N, C, *S) when `channels_last`, else x."""
    if not channels_last:
        return x
    return np.moveaxis(x, -1, 1)


def _channels_back(y: np.ndarray, channels_last: int) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y


@kernel(
    "QLinearGlobalAveragePool",
    Engine.POOL,
    inputs=(5, 5),
    attrs={"channels_last": Attr(flag_attr, 0)},
    check=_UNARY_CHECK,
)
def _qlinear_global_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    channels_last: int,
) -> np.ndarray:
    """The mean over the spatial axes: the int32 sum of x - x_zero_point over the n pixels,
    requantized by x_scale / (y_scale * n)."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    planes = _channels_last(x, channels_last)
    axes = tuple(range(2, planes.ndim))
    pixels = int(np.prod(planes.shape[2:]))
    sums = shifted(planes, per_tensor(x_zero_point, "x_zero_point")).sum(axis=axes, keepdims=True)
    ys = per_tensor(y_scale, "y_scale").astype(_F32)
    multiplier = per_tensor(x_scale, "x_scale").astype(_F32) / (ys * np.float32(pixels))
    y = requantize(as_int32(sums), multiplier, per_tensor(y_zero_point, "y_zero_point"), x.dtype)
    return _channels_back(y, channels_last)


@kernel(
    "QLinearAveragePool",
    Engine.POOL,
    inputs=(4, 5),
    attrs={**KERNELS["AveragePool"].attrs, "channels_last": Attr(flag_attr, 0)},
    check=_UNARY_CHECK,
)
def _qlinear_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    channels_last: int,
    **attrs: Any,
) -> np.ndarray:
    """AveragePool of the dequantized X (float32), quantized to y."""
    pool = KERNELS["AveragePool"].compute

    def average(real: np.ndarray) -> np.ndarray:
        return _channels_back(pool(_channels_last(real, channels_last), **attrs), channels_last)

    return _through_float(average, x, x_scale, x_zero_point, y_scale, y_zero_point)


def _concat_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    if len(dtypes) < 5 or (len(dtypes) - 2) % 3:
        raise ValueError(f"{len(dtypes)} inputs: Y_scale, Y_zero_point and triples needed")
    check_dtypes(dtypes[:2], [SCALES, BYTES])
    for k in range(2, len(dtypes), 3):
        check_dtypes(dtypes[k : k + 3], [BYTES, SCALES, BYTES])
        if dtypes[k] != dtypes[1] or dtypes[k + 2] != dtypes[1]:
            raise ValueError(f"input {k} and its zero point must be {dtypes[1]}")


@kernel(
    "QLinearConcat",
    Engine.POOL,
    inputs=(5, 1 << 16),
    attrs={"axis": Attr(int_attr)},
    check=_concat_check,
)
def _qlinear_concat(
    y_scale: np.ndarray, y_zero_point: np.ndarray, *triples: np.ndarray, axis: int
) -> np.ndarray:
    """The inputs (each X, X_scale, X_zero_point) requantized to y's scale and zero point
    (copied as they are where theirs are y's), joined along `axis`."""
    ys, yz = per_tensor(y_scale, "Y_scale"), per_tensor(y_zero_point, "Y_zero_point")
    parts = []
    for k in range(0, len(triples), 3):
        x, xs, xz = triples[k : k + 3]
        xs, xz = per_tensor(xs, "X_scale"), per_tensor(xz, "X_zero_point")
        if xs == ys and xz == yz:
            parts.append(x)
        else:
            parts.append(quantize(dequantize(x, xs, xz), ys, yz, y_zero_point.dtype))
    return np.concatenate(parts, axis=axis_index(axis, parts[0].ndim))
