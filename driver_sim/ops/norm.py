"""Normalizations of the NeuronCore (ACT engine): BatchNormalization (its inference
form), InstanceNormalization, LayerNormalization, RMSNormalization, GroupNormalization,
MeanVarianceNormalization, LpNormalization and LRN. float16 is computed in float32
and rounded back once at the end. LRN takes even sizes, as the spec allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOAT_CHECK,
    FLOATS,
    Attr,
    as_compute,
    axis_index,
    axis_indices,
    compute_dtype,
    dtype_check,
    flag_attr,
    float_attr,
    int_attr,
    ints_attr,
    kernel,
    positive_attr,
)


def _zero_attr(what: str) -> Callable[[Any], int]:
    """A flag attribute of which only 0 is implemented."""

    def parse(value: Any) -> int:
        if flag_attr(value):
            raise ValueError(f"{what} is not implemented")
        return 0

    return parse


def _one_attr(what: str) -> Callable[[Any], int]:
    """An int attribute of which only 1 is implemented."""

    def parse(value: Any) -> int:
        if int_attr(value) != 1:
            raise ValueError(f"{what}: only 1 is implemented, got {value}")
        return 1

    return parse


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel (C,) vector over X (N, C, *S)."""
    return (-1, *[1] * (x.ndim - 2))


@kernel(
    "BatchNormalization",
    Engine.ACT,
    inputs=(5, 5),
    attrs={
        "epsilon": Attr(float_attr, 1e-5),
        "momentum": Attr(float_attr, 0.9),  # used by training only
        "spatial": Attr(flag_attr, 1),  # version 7
        "training_mode": Attr(_zero_attr("training_mode 1"), 0),
    },
    since=(7, 9, 14, 15),  # inference form (one output)
    check=dtype_check(FLOATS),
)
def _batch_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    *,
    epsilon: float,
    momentum: float,
    spatial: int,
    training_mode: int,
) -> np.ndarray:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B with per-channel statistics (or,
    version 7 with spatial 0, per channel and position), folded into Y = X * a + c."""
    if x.ndim < 2:
        raise ValueError(f"X needs rank >= 2, got shape {x.shape}")
    shape = _channel_shape(x) if spatial else x.shape[1:]
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    shift = bias.astype(np.float64) - mean.astype(np.float64) * factor
    dtype = compute_dtype(x.dtype)
    y = np.multiply(x, factor.astype(dtype).reshape(shape), dtype=dtype)
    y += shift.astype(dtype).reshape(shape)
    return y.astype(x.dtype, copy=False)


@kernel(
    "InstanceNormalization",
    Engine.ACT,
    inputs=(3, 3),
    attrs={"epsilon": Attr(float_attr, 1e-5)},
    since=(1, 6, 22),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _instance_normalization(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, *, epsilon: float
) -> np.ndarray:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B, mean and (population) variance
    over the spatial axes of each image and channel."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    dtype = compute_dtype(x.dtype)
    axes = tuple(range(2, x.ndim))
    centered = np.subtract(x, np.mean(x, axis=axes, keepdims=True, dtype=dtype), dtype=dtype)
    var = np.mean(np.square(centered), axis=axes, keepdims=True)
    factor = as_compute(scale, dtype).reshape(_channel_shape(x)) / np.sqrt(var + epsilon)
    centered *= factor
    centered += as_compute(bias, dtype).reshape(_channel_shape(x))
    return centered.astype(x.dtype, copy=False)


@kernel(
    "LayerNormalization",
    Engine.ACT,
    inputs=(2, 3),
    outputs=(1, 3),
    attrs={
        "axis": Attr(int_attr, -1),
        "epsilon": Attr(float_attr, 1e-5),
        "stash_type": Attr(_one_attr("stash_type"), 1),
    },
    since=(17,),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    axis: int,
    epsilon: float,
    stash_type: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, Mean, InvStdDev), as the ONNX function body: over axes [axis, rank), in float32
    (stash_type 1), D = X - Mean, InvStdDev = 1 / sqrt(mean(D^2) + epsilon); then back in
    X's dtype, Y = D * InvStdDev * Scale + B. Mean and InvStdDev are float32, with the
    normalized axes kept as size 1."""
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axes = tuple(range(axis % x.ndim, x.ndim))
    stash = np.asarray(x, dtype=np.float32)
    mean = np.mean(stash, axis=axes, keepdims=True)
    centered = np.subtract(stash, mean)
    inv_std = np.mean(np.square(centered), axis=axes, keepdims=True)
    inv_std += np.float32(epsilon)
    np.sqrt(inv_std, out=inv_std)
    np.reciprocal(inv_std, out=inv_std)
    centered *= inv_std
    y = centered.astype(x.dtype, copy=False)
    y *= scale
    if bias is not None:
        y += bias
    return y, mean, inv_std


@kernel(
    "LRN",
    Engine.ACT,
    attrs={
        "alpha": Attr(float_attr, 1e-4),
        "beta": Attr(float_attr, 0.75),
        "bias": Attr(float_attr, 1.0),
        "size": Attr(positive_attr),
    },
    since=(1, 13),
    check=FLOAT_CHECK,
)
def _lrn(x: np.ndarray, *, alpha: float, beta: float, bias: float, size: int) -> np.ndarray:
    """Y = X / (bias + alpha / size * square_sum) ^ beta, the square sum over channels
    c - floor((size-1)/2) .. c + ceil((size-1)/2) (clipped to the channels there are)."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    dtype = compute_dtype(x.dtype)
    channels = x.shape[1]
    before = (size - 1) // 2
    squares = np.zeros((x.shape[0], channels + size - 1, *x.shape[2:]), dtype=dtype)
    np.square(x, out=squares[:, before : before + channels], dtype=dtype)
    square_sum = np.array(squares[:, :channels])
    for offset in range(1, size):
        square_sum += squares[:, offset : offset + channels]
    square_sum *= alpha / size
    square_sum += bias
    np.power(square_sum, beta, out=square_sum)
    return np.divide(x, square_sum, dtype=dtype).astype(x.dtype, copy=False)


@kernel(
    "RMSNormalization",
    Engine.ACT,
    inputs=(2, 2),
    attrs={
        "axis": Attr(int_attr, -1),
        "epsilon": Attr(float_attr, 1e-5),
        "stash_type": Attr(_one_attr("stash_type"), 1),
    },
    since=(23,),
    check=dtype_check(FLOATS, same=(0, 1)),
)
def _rms_normalization(
    x: np.ndarray, scale: np.ndarray, *, axis: int, epsilon: float, stash_type: int
) -> np.ndarray:
    """Y = X / sqrt(mean(X^2) + epsilon) * scale, the mean over axes [axis, rank), in
    float32 (stash_type 1), then scaled in X's dtype."""
    axes = tuple(range(axis_index(axis, x.ndim), x.ndim))
    stash = np.asarray(x, dtype=np.float32)
    inv_rms = np.mean(np.square(stash), axis=axes, keepdims=True)
    inv_rms += np.float32(epsilon)
    np.sqrt(inv_rms, out=inv_rms)
    y = np.divide(stash, inv_rms).astype(x.dtype, copy=False)
    y *= scale
    return y


def _lp_attr(value: Any) -> int:
    p = int_attr(value)
    if p not in (1, 2):
        raise ValueError(f"must be 1 or 2, got {p}")
    return p


@kernel(
    "LpNormalization",
    Engine.ACT,
    attrs={"axis": Attr(int_attr, -1), "p": Attr(_lp_attr, 2)},
    since=(1, 22),
    check=FLOAT_CHECK,
)
def _lp_normalization(x: np.ndarray, *, axis: int, p: int) -> np.ndarray:
    """Y = X / ||X||_p along `axis` (0 where the norm is 0)."""
    dtype = compute_dtype(x.dtype)
    wide = np.asarray(x, dtype=dtype)
    axis = axis_index(axis, x.ndim)
    if p == 1:
        norm = np.sum(np.abs(wide), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(np.square(wide), axis=axis, keepdims=True))
    y = np.divide(wide, norm, out=np.zeros_like(wide), where=norm != 0)
    return y.astype(x.dtype, copy=False)


@kernel(
    "MeanVarianceNormalization",
    Engine.ACT,
    attrs={"axes": Attr(ints_attr, (0, 2, 3))},
    since=(9, 13),
    check=FLOAT_CHECK,
)
def _mean_variance_normalization(x: np.ndarray, *, axes: tuple[int, ...]) -> np.ndarray:
    """Y = (X - mean) / sqrt(mean(X^2) - mean^2), the means over `axes`."""
    dtype = compute_dtype(x.dtype)
    over = axis_indices(axes, x.ndim)
    wide = np.asarray(x, dtype=dtype)
    mean = np.mean(wide, axis=over, keepdims=True)
    variance = np.mean(np.square(wide), axis=over, keepdims=True) - np.square(mean)
    y = (wide - mean) / np.sqrt(variance)
    return y.astype(x.dtype, copy=False)


@kernel(
    "GroupNormalization",
    Engine.ACT,
    inputs=(3, 3),
    attrs={
        "epsilon": Attr(float_attr, 1e-5),
        "num_groups": Attr(positive_attr),
        "stash_type": Attr(_one_attr("stash_type"), 1),  # version 21
    },
    since=(21,),  # version 18 scales per group, not per channel
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _group_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    epsilon: float,
    num_groups: int,
    stash_type: int,
) -> np.ndarray:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B, mean and (population) variance
    over each image's group of C / num_groups channels and its spatial axes (in
    float32); scale and B per channel."""
    if x.ndim < 3 or x.shape[1] % num_groups:
        raise ValueError(f"X of shape {x.shape} does not split into {num_groups} groups")
    groups = np.asarray(x, dtype=np.float32).reshape(x.shape[0], num_groups, -1)
    centered = groups - np.mean(groups, axis=2, keepdims=True)
    variance = np.mean(np.square(centered), axis=2, keepdims=True)
    centered /= np.sqrt(variance + np.float32(epsilon))
    y = centered.reshape(x.shape).astype(x.dtype, copy=False)
    y = y * scale.reshape(_channel_shape(x)) + bias.reshape(_channel_shape(x))
    return y.astype(x.dtype, copy=False)
