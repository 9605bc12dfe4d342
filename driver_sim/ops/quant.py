"""Quantized ops of the NeuronCore: integer tensors q that stand for real values
(q - zero_point) * scale, as ONNX defines them (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv) and as
onnxruntime's quantizer emits them in its own domain (`CONTRIB_OPS`: QGemm, QLinearAdd,
QLinearMul, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSigmoid,
QLinearLeakyRelu).

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
    KERNELS,
    ONNX_DTYPES,
    Attr,
    Shape,
    axis_index,
    check_dtypes,
    dtype_set,
    flag_attr,
    float_attr,
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
_BYTES = dtype_set("int8", "uint8")  # the types the PE multiplies and the QLinear ops take
_SCALES = dtype_set("float32", "float16")
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


def _shifted(q: np.ndarray, zero_point: Any) -> np.ndarray:
    """q - zero_point as float64 (exact), for the products the PE sums."""
    return np.asarray(q, dtype=np.float64) - np.asarray(zero_point, dtype=np.float64)


def _int32(exact: np.ndarray) -> np.ndarray:
    """An exactly integral float64 sum as the int32 accumulator."""
    return np.rint(exact).astype(np.int32)


def _multiplier(x_scale: Any, w_scale: Any, y_scale: Any) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32, in that order (as onnxruntime computes it)."""
    product = np.asarray(x_scale, dtype=_F32) * np.asarray(w_scale, dtype=_F32)
    return np.asarray(product / np.asarray(y_scale, dtype=_F32), dtype=_F32)


# ---- quantization parameters ---------------------------------------------------------------


def _per_tensor(value: np.ndarray | None, what: str) -> np.ndarray:
    """A one-element scale or zero point as a 0-d array (0 when absent)."""
    if value is None:
        return np.zeros((), dtype=np.int32)
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"{what} must have one element, got shape {array.shape}")
    return array.reshape(())


def _along(
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
    check_dtypes(dtypes, [_SCALES, _SCALES, _QUANTIZED])
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
    scale = _along(y_scale, x.shape, axis, "y_scale", block_size)
    zero = _along(y_zero_point, x.shape, axis, "y_zero_point", block_size)
    return quantize(x, scale, zero, dtype)


def _dequantize_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(
        dtypes, [_QUANTIZED | dtype_set("int32"), _SCALES, _QUANTIZED | dtype_set("int32")]
    )
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
    scale = _along(x_scale, x.shape, axis, "x_scale", block_size)
    zero = _along(x_zero_point, x.shape, axis, "x_zero_point", block_size)
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


# ---- the PE's integer products -------------------------------------------------------------


def _macs_of(op: str, positions: tuple[int, int]) -> Callable[..., int]:
    """The MAC count of float `op`, from the inputs at `positions` (its A and B)."""

    def macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
        operands = [inputs[positions[0]], inputs[positions[1]]]
        return KERNELS[op].macs(operands, outputs, attrs)

    return macs


def _integer_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    """(A, B, a_zero_point, b_zero_point) of MatMulInteger and ConvInteger."""
    check_dtypes(dtypes, [_BYTES], same=())
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
    return _shifted(a, az), _shifted(b, bz)


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
    return _int32(np.matmul(left, right))


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
    xz = _per_tensor(x_zero, "x_zero_point")
    wz = _along(w_zero, w.shape, 0, "w_zero_point")
    sums = KERNELS["Conv"].compute(_shifted(x, xz), _shifted(w, wz), None, **attrs)
    return _int32(sums)


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


def _qlinear_check(
    operands: Sequence[int], output_zero: int, bias: int | None = None
) -> Callable[[Sequence[np.dtype], Mapping[str, Any]], None]:
    """A support check of a QLinear op: each operand at `operands` int8/uint8 with its
    zero point (the next input but one) of its type, scales (the next inputs) float, the
    output zero point at `output_zero` int8/uint8, an int32 bias at `bias`."""

    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        allowed: list[frozenset[np.dtype]] = [_ANY] * len(dtypes)
        for k in operands:
            allowed[k : k + 3] = [_BYTES, _SCALES, _BYTES][: len(allowed[k : k + 3])]
        if output_zero - 1 < len(allowed):
            allowed[output_zero - 1] = _SCALES
        if output_zero < len(allowed):
            allowed[output_zero] = _BYTES
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


@kernel(
    "QLinearConv",
    Engine.PE,
    inputs=(8, 9),
    attrs=_conv_attrs(),
    macs=_macs_of("Conv", (0, 3)),
    since=(10,),
    check=_qlinear_check((0, 3), 7, bias=8),
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
    scale = _along(w_scale, w.shape, 0, "w_scale").reshape(channel)
    multiplier = _multiplier(
        _per_tensor(x_scale, "x_scale"), scale, _per_tensor(y_scale, "y_scale")
    )
    return requantize(
        acc, multiplier, _per_tensor(y_zero_point, "y_zero_point"), y_zero_point.dtype
    )


@kernel(
    "QLinearMatMul",
    Engine.PE,
    inputs=(8, 8),
    macs=_macs_of("MatMul", (0, 3)),
    since=(10, 21),
    check=_qlinear_check((0, 3), 7),
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
        a, _per_tensor(a_zero_point, "a_zero_point"), b, _column(b_zero_point, b, "b_zero_point")
    )
    acc = _int32(np.matmul(left, right))
    multiplier = _multiplier(
        _per_tensor(a_scale, "a_scale"), _column(b_scale, b, "b_scale"), y_scale
    )
    return requantize(
        acc, multiplier, _per_tensor(y_zero_point, "y_zero_point"), y_zero_point.dtype
    )


def _column(value: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
    """B's scale or zero point: per tensor, or per column (its last axis)."""
    return _along(value, b.shape, b.ndim - 1, what)


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
    check=_qlinear_check((0, 3), 8, bias=6),
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
    b_zero = _along(b_zero_point, b.shape, 1, "b_zero_point")
    left, right = _matmul_operands(a, _per_tensor(a_zero_point, "a_zero_point"), b, b_zero)
    acc = _int32(np.matmul(left, right))
    if c is not None:
        acc = acc + c.astype(np.int32)
    b_scales = _along(b_scale, b.shape, 1, "b_scale").astype(_F32)
    scale = np.float32(alpha) * _per_tensor(a_scale, "a_scale").astype(_F32) * b_scales
    if y_scale is None:
        return acc.astype(_F32) * scale
    multiplier = scale / _per_tensor(y_scale, "y_scale").astype(_F32)
    zero = _per_tensor(y_zero_point, "y_zero_point")
    dtype = np.dtype(np.uint8) if y_zero_point is None else y_zero_point.dtype
    return requantize(acc, multiplier, zero, dtype)


# ---- onnxruntime's element-wise and pooling ops: through float ----------------------------


def _through_float(
    fn: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
) -> np.ndarray:
    """quantize(fn(dequantize(x)))  in y's scale and zero point (x's type)."""
    real = dequantize(x, _per_tensor(x_scale, "X_scale"), _per_tensor(x_zero_point, "X_zero_point"))
    return quantize(
        fn(real),
        _per_tensor(y_scale, "Y_scale"),
        _per_tensor(y_zero_point, "Y_zero_point"),
        x.dtype,
    )


_UNARY_CHECK = _qlinear_check((0,), 4)


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
    left = _shifted(a, _per_tensor(a_zero_point, "A_zero_point")).astype(_F32)
    right = _shifted(b, _per_tensor(b_zero_point, "B_zero_point")).astype(_F32)
    return left, right


_BINARY_CHECK = _qlinear_check((0, 3), 7)


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
    sc = _per_tensor(c_scale, "C_scale").astype(_F32)
    ratio_a = _per_tensor(a_scale, "A_scale").astype(_F32) / sc
    ratio_b = _per_tensor(b_scale, "B_scale").astype(_F32) / sc
    total = left * ratio_a + right * ratio_b
    return saturate(
        np.rint(total) + _per_tensor(c_zero_point, "C_zero_point").astype(_F32), a.dtype
    )


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
    multiplier = _multiplier(
        _per_tensor(a_scale, "A_scale"),
        _per_tensor(b_scale, "B_scale"),
        _per_tensor(c_scale, "C_scale"),
    )
    product = left * right * multiplier
    return saturate(
        np.rint(product) + _per_tensor(c_zero_point, "C_zero_point").astype(_F32), a.dtype
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
    sums = _shifted(planes, _per_tensor(x_zero_point, "x_zero_point")).sum(axis=axes, keepdims=True)
    ys = _per_tensor(y_scale, "y_scale").astype(_F32)
    multiplier = _per_tensor(x_scale, "x_scale").astype(_F32) / (ys * np.float32(pixels))
    y = requantize(_int32(sums), multiplier, _per_tensor(y_zero_point, "y_zero_point"), x.dtype)
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
    check_dtypes(dtypes[:2], [_SCALES, _BYTES])
    for k in range(2, len(dtypes), 3):
        check_dtypes(dtypes[k : k + 3], [_BYTES, _SCALES, _BYTES])
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
    ys, yz = _per_tensor(y_scale, "Y_scale"), _per_tensor(y_zero_point, "Y_zero_point")
    parts = []
    for k in range(0, len(triples), 3):
        x, xs, xz = triples[k : k + 3]
        xs, xz = _per_tensor(xs, "X_scale"), _per_tensor(xz, "X_zero_point")
        if xs == ys and xz == yz:
            parts.append(x)
        else:
            parts.append(quantize(dequantize(x, xs, xz), ys, yz, y_zero_point.dtype))
    return np.concatenate(parts, axis=axis_index(axis, parts[0].ndim))
