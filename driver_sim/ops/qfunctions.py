"""Float functions of int8 tensors, computed exactly (ACT engine): the NC's own
instructions for what a quantized model leaves in float between a DequantizeLinear and a
QuantizeLinear (the compiler fuses them: `neuron_rtd/compiler/fuse.py`).

- QuantizedLookup: any element-wise function of one per-tensor quantized input (GELU,
  Tanh, HardSwish...), as a table of its 256 results the compiler computes.
- QuantizedSoftmax: Softmax of a quantized tensor, quantized: exp through a table of
  integers (2^30 exp(-d x_scale) rounded, d = the row's max minus the value), their sum
  exact in float64, each share T / sum in float64, rounded to float32 and quantized.
- QuantizedLayerNorm: LayerNormalization of a quantized tensor (quantized, or float32
  when no output scale is given): the sums of d = x - x_zero_point and of d^2 exact in
  float64, mean = S1 / N and var = S2 / N - mean^2, d's normalized value
  (d - mean) / sqrt(var + epsilon / x_scale^2) in float64 (the same as on the dequantized
  values), rounded to float32, times scale plus bias in float32.

Every step is an exact integer sum or one IEEE operation in a fixed order, so the fast
engine's graph of the same steps (`driver_sim/onnx_graph.py`) gives the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.quant import BYTES, SCALES, per_tensor, quantize
from driver_sim.ops.registry import Attr, axis_index, check_dtypes, float_attr, int_attr, kernel

_F32 = np.dtype(np.float32)
SOFTMAX_ONE = 2.0**30  # exp(0) in the softmax table: sums of 2^22 entries stay exact


def softmax_table(x_scale: Any) -> np.ndarray:
    """exp(-d * x_scale) * 2^30 rounded, for d = 0..255, float64 (integers)."""
    scale = float(np.asarray(x_scale, dtype=_F32).reshape(()))
    return np.rint(np.array([math.exp(-d * scale) * SOFTMAX_ONE for d in range(256)]))


def layer_norm_epsilon(epsilon: float, x_scale: Any) -> float:
    """epsilon in units of x_scale^2: what is added to the variance of x - x_zero_point."""
    scale = float(np.asarray(x_scale, dtype=_F32).reshape(()))
    return float(np.float64(epsilon) / (np.float64(scale) * np.float64(scale)))


def _lookup_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [BYTES, BYTES])
    table = values.get("table")
    if table is not None and np.shape(table) != (256,):
        raise ValueError(f"the table must hold 256 entries, got shape {np.shape(table)}")


@kernel("QuantizedLookup", Engine.ACT, inputs=(2, 2), check=_lookup_check)
def _quantized_lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[x - min(x's type)]: the value for each of the 256 inputs."""
    if table.shape != (256,):
        raise ValueError(f"the table must hold 256 entries, got shape {table.shape}")
    index = x.astype(np.int16) - np.iinfo(x.dtype).min
    return table[index]


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
    """Softmax along `axis` of the dequantized x, quantized to y (x's zero point cancels)."""
    along = axis_index(axis, x.ndim)
    wide = x.astype(np.int32)
    distance = np.max(wide, axis=along, keepdims=True) - wide
    powers = softmax_table(per_tensor(x_scale, "x_scale"))[distance]
    shares = (powers / np.sum(powers, axis=along, keepdims=True)).astype(_F32)
    zero = per_tensor(y_zero_point, "y_zero_point")
    return quantize(shares, per_tensor(y_scale, "y_scale"), zero, y_zero_point.dtype)


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
    axes = tuple(range(axis_index(axis, x.ndim), x.ndim))
    count = np.float64(math.prod(x.shape[k] for k in axes))
    d = x.astype(np.float64) - np.float64(per_tensor(x_zero_point, "x_zero_point"))
    mean = np.sum(d, axis=axes, keepdims=True) / count
    variance = np.sum(d * d, axis=axes, keepdims=True) / count - mean * mean
    spread = np.sqrt(variance + layer_norm_epsilon(epsilon, per_tensor(x_scale, "x_scale")))
    y = ((d - mean) / spread).astype(_F32) * scale
    if bias is not None:
        y = y + bias
    if y_scale is None or y_zero_point is None:
        return np.asarray(y, dtype=_F32)
    zero = per_tensor(y_zero_point, "y_zero_point")
    return quantize(y, per_tensor(y_scale, "y_scale"), zero, y_zero_point.dtype)
