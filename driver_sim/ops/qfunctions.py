"""Float functions of int8 tensors, computed exactly (ACT engine): the NC's own
instructions for what a quantized model leaves in float between a DequantizeLinear and a
QuantizeLinear (the compiler fuses them: `neuron_rtd/compiler/fuse.py`).

- QuantizedLookup: any element-wise function of one per-tensor quantized input (GELU,
  Tanh, HardSwish...), as a table of its 256 results the compiler computes.
- QuantizedSoftmax: Softmax of a quantized tensor, quantized, as onnxruntime's
  QLinearSoftmax computes it (on uint8): exp through a float32 table of the distance to
  the row's maximum, the row's sum added in float32 in order, each share scaled by
  floor(1 / y_scale) and rounded.
- QuantizedLayerNorm: LayerNormalization of a quantized tensor (quantized, or float32
  when no output scale is given) over at most 32768 values: the sums of d = x - x_zero_point
  and of d^2 exact; in float64 mean = S1 / N and inverse = 1 / sqrt(S2 / N - mean^2 + e),
  e the epsilon over x_scale^2 (the same as on the dequantized values); then in float32
  (d - mean) * inverse * scale + bias, mean and inverse rounded to float32.

Every step is an exact integer sum, a table, or one IEEE operation in a fixed order, so
the fast engine's graph (`driver_sim/int8_graph.py`: a Gather of the table; onnxruntime's
QLinearSoftmax and LayerNormalization, whose loops take the same steps in the same order
on every CPU) gives the same bits.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.quant import BYTES, SCALES, per_tensor, quantize
from driver_sim.ops.registry import Attr, axis_index, check_dtypes, float_attr, int_attr, kernel

_F32 = np.dtype(np.float32)
# The most values a QuantizedLayerNorm normalizes: their sum exact in float32 and their
# squares' in int32 (255^2 * 32768 < 2^31), as the fast engine adds them.
LAYER_NORM_MAX = 32768


def softmax_table(x_scale: Any, length: int) -> np.ndarray:
    """The softmax's exp table for rows of `length` values (float32, 256 entries): entry i
    is exp((i - 255 + shift) * x_scale) computed in float64 and rounded, where shift
    (log(FLT_MAX / length) - 5, at least 0, over x_scale) keeps the row's sum finite."""
    scale = np.float32(np.asarray(x_scale, dtype=_F32).reshape(()))
    headroom = _logf(float(np.finfo(_F32).max / np.float32(length)))  # in float32, as there
    shift = max(0.0, headroom - 5.0) / float(scale)
    return np.array([math.exp((i - 255 + shift) * float(scale)) for i in range(256)], _F32)


@functools.cache
def _libm_logf() -> Any:
    """The C library's logf (onnxruntime's table takes the log in float32 with it)."""
    libm = ctypes.CDLL("libm.so.6")  # by name: find_library would run ldconfig
    libm.logf.restype, libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return libm.logf


def _logf(value: float) -> float:
    return float(_libm_logf()(value))


def layer_norm_epsilon(epsilon: float, x_scale: Any) -> float:
    """epsilon in units of x_scale^2 (what is added to the variance of x - x_zero_point),
    rounded to float32."""
    scale = float(np.asarray(x_scale, dtype=_F32).reshape(()))
    return float(np.float32(np.float64(epsilon) / (np.float64(scale) * np.float64(scale))))


def every_byte(dtype: Any) -> np.ndarray:
    """The 256 values of int8 or uint8 `dtype` in a QuantizedLookup table's order: entry b
    is the value whose byte is b (an int8 -1 at 255)."""
    return np.arange(256).astype(np.uint8).view(np.dtype(dtype))


def _lookup_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [BYTES, BYTES])


@kernel("QuantizedLookup", Engine.ACT, inputs=(2, 2), check=_lookup_check)
def _quantized_lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[x's byte] (x mod 256: an int8 -1 reads entry 255): the value for each of the
    256 inputs."""
    if table.shape != (256,):
        raise ValueError(f"the table must hold 256 entries, got shape {table.shape}")
    return table[x.astype(np.uint8)]


def _softmax_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [BYTES, SCALES, SCALES, BYTES])


@kernel(
    "QuantizedSoftmax",
    Engine.ACT,
    inputs=(4, 4),
    attrs={"axis": Attr(int_attr, -1)},
    check=_softmax_check,
)
def _quantized_softmax(
    x: np.ndarray,
    x_scale: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    axis: int,
) -> np.ndarray:
    """Softmax along `axis` of the dequantized x, quantized to y (x's zero point cancels):
    each value's power table[255 - (row max - value)], their sum added in float32 in the
    row's order, y = round_half_even(power * floor(1 / y_scale) / sum) + y_zero_point, at
    most the type's largest value."""
    along = axis_index(axis, x.ndim)
    rows = np.moveaxis(x.astype(np.int32), along, -1)
    table = softmax_table(per_tensor(x_scale, "x_scale"), rows.shape[-1])
    powers = table[255 - (np.max(rows, axis=-1, keepdims=True) - rows)]
    total = np.cumsum(powers, axis=-1, dtype=_F32)[..., -1:]  # one value after another
    steps = np.floor(np.float32(1.0) / per_tensor(y_scale, "y_scale").astype(_F32))
    shares = np.rint(powers * steps / total)
    top = np.iinfo(y_zero_point.dtype).max
    zero = per_tensor(y_zero_point, "y_zero_point").astype(np.float64)
    y = np.minimum(shares.astype(np.float64) + zero, top).astype(y_zero_point.dtype)
    return np.ascontiguousarray(np.moveaxis(y, -1, along))


def _layer_norm_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    floats = frozenset({_F32})
    check_dtypes(dtypes, [BYTES, SCALES, BYTES, floats, floats, SCALES, BYTES][: len(dtypes)])
    if len(dtypes) == 6:
        raise ValueError("y_scale needs y_zero_point")


@kernel(
    "QuantizedLayerNorm",
    Engine.ACT,
    inputs=(4, 7),
    attrs={"axis": Attr(int_attr, -1), "epsilon": Attr(float_attr, 1e-5)},
    check=_layer_norm_check,
)
def _quantized_layer_norm(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int,
    epsilon: float,
) -> np.ndarray:
    """LayerNormalization over axes [axis, rank) of the dequantized x, times `scale` plus
    `bias`: quantized to y, or float32 without y_scale."""
    start = axis_index(axis, x.ndim)
    rows = x.reshape(*x.shape[:start], -1)  # the normalized axes as one
    if rows.shape[-1] > LAYER_NORM_MAX:
        raise ValueError(f"normalizes {rows.shape[-1]} values, at most {LAYER_NORM_MAX}")
    d = rows.astype(np.int32) - per_tensor(x_zero_point, "x_zero_point").astype(np.int32)
    count = np.float64(rows.shape[-1])
    mean = np.sum(d, axis=-1, keepdims=True, dtype=np.int64).astype(np.float64) / count
    squares = np.sum(d * d, axis=-1, keepdims=True, dtype=np.int64).astype(np.float64) / count
    added = np.float64(layer_norm_epsilon(epsilon, per_tensor(x_scale, "x_scale")))
    inverse = 1.0 / np.sqrt(squares - mean * mean + added)
    centred = d.astype(_F32) - mean.astype(_F32)
    y = centred * inverse.astype(_F32) * scale.reshape(-1)
    if bias is not None:
        y = y + bias.reshape(-1)
    y = y.reshape(x.shape)
    if y_scale is None or y_zero_point is None:
        return np.asarray(y, dtype=_F32)
    zero = per_tensor(y_zero_point, "y_zero_point")
    return quantize(y, per_tensor(y_scale, "y_scale"), zero, y_zero_point.dtype)
