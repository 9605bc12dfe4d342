"""Quantized ops of the NeuronCore: integer tensors q that stand for real values
(q - zero_point) * scale, as ONNX defines them (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv) and as
onnxruntime's quantizer emits them in its own domain (`CONTRIB_OPS`: QGemm, QLinearAdd,
QLinearMul, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSigmoid,
QLinearLeakyRelu). This module holds their arithmetic, their quantization parameters and
the ops that quantize and dequantize (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear); the PE's integer products are `qproducts`, onnxruntime's
element-wise and pooling ops `qlinear`.

The arithmetic is the integer arithmetic the specs define: products of zero-point-shifted
int8/uint8 values summed exactly (in float64, exact for any tensor that fits the NC: a
product is below 2^16, a sum of 2^37 of them below 2^53) into int32, then requantized:
the accumulator as float32 times the float32 multiplier (x_scale * w_scale / y_scale),
rounded half to even, plus the output zero point, saturated to the output type. The
element-wise ops of onnxruntime's domain (which it computes through float, no spec making
them exact) compute as it does: dequantize, the float op, quantize.

Quantizing divides by the scale (x / y_scale, rounded half to even, plus the zero point,
saturated), as the spec and onnxruntime do. Scales and zero points are per tensor (one
element), per axis (1-D along `axis`) or, for QuantizeLinear and DequantizeLinear, per
block of `block_size` along `axis`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ONNX_DTYPES,
    Attr,
    Shape,
    axis_index,
    check_dtypes,
    dtype_set,
    flag_attr,
    int_attr,
    kernel,
)

# The ops of onnxruntime's domain ("com.microsoft") the NC implements.
CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_OPS = frozenset(
    {
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearConcat",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
    }
)

_QUANTIZED = dtype_set("int8", "uint8", "int16", "uint16")  # what QuantizeLinear makes
BYTES = dtype_set("int8", "uint8")  # the types the PE multiplies and the QLinear ops take
SCALES = dtype_set("float32", "float16")
_F32 = np.dtype(np.float32)
_ANY: frozenset[np.dtype] = frozenset()  # placeholder: a position checked elsewhere


# ---- the arithmetic -----------------------------------------------------------------------


def saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Integral `values` clamped to the range of `dtype`, in `dtype`."""
    info = np.iinfo(dtype)
    return np.clip(values, info.min, info.max).astype(dtype)


def quantize(x: np.ndarray, scale: Any, zero_point: Any, dtype: np.dtype) -> np.ndarray:
    """saturate(round_half_even(x / scale) + zero_point), the division in float32."""
    ratio = np.asarray(x, dtype=_F32) / np.asarray(scale, dtype=_F32)
    return saturate(np.rint(ratio) + np.asarray(zero_point, dtype=_F32), dtype)


def dequantize(q: np.ndarray, scale: Any, zero_point: Any) -> np.ndarray:
    """(q - zero_point) * scale in float32."""
    shifted = np.asarray(q, dtype=np.int64) - np.asarray(zero_point, dtype=np.int64)
    return shifted.astype(_F32) * np.asarray(scale, dtype=_F32)


def requantize(acc: np.ndarray, multiplier: Any, zero_point: Any, dtype: np.dtype) -> np.ndarray:
    """An int32 accumulator in the output's quantization: float32(acc) * multiplier,
    rounded half to even, plus the zero point, saturated to `dtype`."""
    scaled = np.asarray(acc).astype(_F32) * np.asarray(multiplier, dtype=_F32)
    return saturate(np.rint(scaled) + np.asarray(zero_point, dtype=_F32), dtype)


def shifted(q: np.ndarray, zero_point: Any) -> np.ndarray:
    """q - zero_point as float64 (exact), for the products the PE sums."""
    return np.asarray(q, dtype=np.float64) - np.asarray(zero_point, dtype=np.float64)


def as_int32(exact: np.ndarray) -> np.ndarray:
    """An exactly integral float64 sum as the int32 accumulator."""
    return np.rint(exact).astype(np.int32)


def requant_multiplier(x_scale: Any, w_scale: Any, y_scale: Any) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32, in that order (as onnxruntime computes it)."""
    product = np.asarray(x_scale, dtype=_F32) * np.asarray(w_scale, dtype=_F32)
    return np.asarray(product / np.asarray(y_scale, dtype=_F32), dtype=_F32)


# ---- quantization parameters ---------------------------------------------------------------


def per_tensor(value: np.ndarray | None, what: str) -> np.ndarray:
    """A one-element scale or zero point as a 0-d array (0 when absent)."""
    if value is None:
        return np.zeros((), dtype=np.int32)
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"{what} must have one element, got shape {array.shape}")
    return array.reshape(())


def along_axis(
    value: np.ndarray | None, shape: Shape, axis: int, what: str, block_size: int = 0
) -> np.ndarray:
    """A scale or zero point broadcastable to `shape`: one element (per tensor), 1-D of
    shape[axis] elements (per axis), or with `block_size` the shape of x with
    ceil(shape[axis] / block_size) along axis (per block)."""
    if value is None:
        return np.zeros((), dtype=np.int32)
    array = np.asarray(value)
    if array.size == 1 and array.ndim <= 1 and not block_size:
        return array.reshape(())
    axis = axis_index(axis, len(shape))
    if block_size:
        blocks = -(-shape[axis] // block_size)
        wanted = (*shape[:axis], blocks, *shape[axis + 1 :])
        if array.shape != wanted:
            raise ValueError(f"{what} has shape {array.shape}, expected {wanted} for blocks")
        return np.repeat(array, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    if array.ndim != 1 or array.shape[0] != shape[axis]:
        raise ValueError(
            f"{what} has shape {array.shape}: one element or {shape[axis]} (axis {axis}) needed"
        )
    return array.reshape([-1 if k == axis else 1 for k in range(len(shape))])


def _zero_point_dtype(zero_point: np.ndarray | None, output_dtype: int) -> np.dtype:
    if zero_point is not None:
        return np.dtype(np.asarray(zero_point).dtype)
    return ONNX_DTYPES[output_dtype] if output_dtype else np.dtype(np.uint8)


def qlinear_check(
    operands: Sequence[int], output_zero: int, bias: int | None = None
) -> Callable[[Sequence[np.dtype], Mapping[str, Any]], None]:
    """A support check of a QLinear op: each operand at `operands` int8/uint8 with its
    zero point (the next input but one) of its type, scales (the next inputs) float, the
    output zero point at `output_zero` int8/uint8, an int32 bias at `bias`."""

    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        allowed: list[frozenset[np.dtype]] = [_ANY] * len(dtypes)
        for k in operands:
            allowed[k : k + 3] = [BYTES, SCALES, BYTES][: len(allowed[k : k + 3])]
        if output_zero - 1 < len(allowed):
            allowed[output_zero - 1] = SCALES
        if output_zero < len(allowed):
            allowed[output_zero] = BYTES
        if bias is not None and bias < len(allowed):
            allowed[bias] = dtype_set("int32")
        for index, dtype in enumerate(dtypes):
            if allowed[index] and np.dtype(dtype) not in allowed[index]:
                raise ValueError(
                    f"input {index} has dtype {dtype}, which the kernel does not implement"
                )
        for k in operands:
            if k + 2 < len(dtypes) and dtypes[k + 2] != dtypes[k]:
                raise ValueError(f"input {k} is {dtypes[k]}, its zero point {dtypes[k + 2]}")

    return check


# ---- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear -------------------------------


def _output_dtype_attr(value: Any) -> int:
    code = int_attr(value)
    if code and ONNX_DTYPES.get(code) not in _QUANTIZED:
        raise ValueError(f"output type {code} is not one the NC quantizes to")
    return code


def _zero_attr(value: Any) -> int:
    """An attribute the NC implements only at its default, 0 (`precision`)."""
    code = int_attr(value)
    if code:
        raise ValueError(f"only 0 (the default) is implemented, got {code}")
    return code


def _block_attr(value: Any) -> int:
    size = int_attr(value)
    if size < 0:
        raise ValueError(f"must not be negative, got {size}")
    return size


def _quantize_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [SCALES, SCALES, _QUANTIZED])
    code = values["output_dtype"]
    if len(dtypes) > 2 and code and ONNX_DTYPES[code] != dtypes[2]:
        raise ValueError(f"output_dtype {code} differs from the zero point's {dtypes[2]}")


@kernel(
    "QuantizeLinear",
    Engine.ACT,
    inputs=(2, 3),
    attrs={
        "axis": Attr(int_attr, 1),
        "block_size": Attr(_block_attr, 0),
        "saturate": Attr(flag_attr, 1),  # for float8 outputs, which the NC does not make
        "output_dtype": Attr(_output_dtype_attr, 0),
        "precision": Attr(_zero_attr, 0),
    },
    since=(10, 13, 19, 21, 23, 24, 25, 28),
    check=_quantize_check,
)
def _quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int,
    block_size: int,
    saturate: int,
    output_dtype: int,
    precision: int,
) -> np.ndarray:
    """y = saturate(round(x / y_scale) + y_zero_point), per tensor, axis or block."""
    dtype = _zero_point_dtype(y_zero_point, output_dtype)
    scale = along_axis(y_scale, x.shape, axis, "y_scale", block_size)
    zero = along_axis(y_zero_point, x.shape, axis, "y_zero_point", block_size)
    return quantize(x, scale, zero, dtype)


def _dequantize_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [_QUANTIZED | dtype_set("int32"), SCALES, _QUANTIZED | dtype_set("int32")])
    if len(dtypes) > 2 and dtypes[2] != dtypes[0]:
        raise ValueError(f"x is {dtypes[0]}, its zero point {dtypes[2]}")
    code = values["output_dtype"]
    if code and ONNX_DTYPES.get(code) != dtypes[1]:
        raise ValueError(f"output_dtype {code} differs from the scale's {dtypes[1]}")


@kernel(
    "DequantizeLinear",
    Engine.ACT,
    inputs=(2, 3),
    attrs={
        "axis": Attr(int_attr, 1),
        "block_size": Attr(_block_attr, 0),
        "output_dtype": Attr(int_attr, 0),
    },
    since=(10, 13, 19, 21, 23, 24, 25, 28),
    check=_dequantize_check,
)
def _dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int,
    block_size: int,
    output_dtype: int,
) -> np.ndarray:
    """y = (x - x_zero_point) * x_scale, in the scale's type (computed in float32)."""
    scale = along_axis(x_scale, x.shape, axis, "x_scale", block_size)
    zero = along_axis(x_zero_point, x.shape, axis, "x_zero_point", block_size)
    if x.dtype == np.int32 and np.any(zero != 0):
        raise ValueError("an int32 x takes no zero point but 0")
    return dequantize(x, scale, zero).astype(x_scale.dtype, copy=False)


@kernel(
    "DynamicQuantizeLinear",
    Engine.ACT,
    outputs=3,
    since=(11,),
    check=lambda dtypes, values: check_dtypes(dtypes, [dtype_set("float32")]),
)
def _dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x as uint8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto
    [0, 255] (scale 1 when x is all zeros)."""
    low = min(float(x.min(initial=0.0)), 0.0)
    high = max(float(x.max(initial=0.0)), 0.0)
    scale = np.float32(1.0) if high == low else np.float32(np.float32(high - low) / 255)
    zero = saturate(np.rint(np.float32(0.0) - np.float32(low) / scale), np.dtype(np.uint8))
    y = quantize(x, scale, zero, np.dtype(np.uint8))
    return y, np.asarray(scale, dtype=_F32), np.asarray(zero)
