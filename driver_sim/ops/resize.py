"""Resize on the NeuronCore (POOL engine), separable: per resized axis a table of source
indices and weights (nearest, linear or cubic). float16 is interpolated in float32 and
rounded back once at the end.

Resize follows the spec's formulas as the ONNX reference implementation (and so the
ONNX test data) reads them, where onnxruntime differs: align_corners and
pytorch_half_pixel use the unrounded output length (scale * size), and an axis that keeps
its length is still transformed (tf_crop_and_resize's roi, tf_half_pixel_for_nn's half
pixel shift), which onnxruntime skips.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    FLOATS,
    INDICES,
    Attr,
    as_compute,
    check_dtypes,
    choice_attr,
    compute_dtype,
    flag_attr,
    float_attr,
    int_values,
    ints_attr,
    kernel,
)

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",  # version 11 only
)


def _resize_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    interpolates = values["mode"] != "nearest"
    check_dtypes(dtypes[:1], [FLOATS if interpolates else ALL_DTYPES])
    for dtype in dtypes[1:]:  # roi (floats), scales (float32), sizes (int64)
        if np.dtype(dtype) not in FLOATS | INDICES:
            raise ValueError(f"roi/scales/sizes of dtype {dtype} are not implemented")
    if values["antialias"] and not interpolates:
        raise ValueError("antialias with mode nearest is not implemented")
    if values["exclude_outside"] and not interpolates:
        # the reference zeroes a nearest pixel outside the input, onnxruntime clamps it
        raise ValueError("exclude_outside with mode nearest is not implemented")
    if values["coordinate_transformation_mode"] == "tf_half_pixel_for_nn" and interpolates:
        raise ValueError("tf_half_pixel_for_nn is a nearest-mode transformation")


@dataclass(frozen=True)
class _AxisResize:
    """How one axis is resized: input and output length, the scale, the output length
    before rounding (scale * input, or the asked size) and the roi of that axis."""

    size: int
    out: int
    scale: float
    width: float
    roi: tuple[float, float] | None


def _resize_axes(
    shape: Sequence[int],
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    axes: Sequence[int] | None,
    policy: str,
) -> dict[int, _AxisResize]:
    """Per axis named by `axes` (all by default), its `_AxisResize`."""
    rank = len(shape)
    chosen = list(range(rank)) if axes is None else [a % rank for a in axes]
    if axes is not None and (
        any(not -rank <= a < rank for a in axes) or len(set(chosen)) != len(chosen)
    ):
        raise ValueError(f"axes {list(axes)} are not distinct axes of rank {rank}")
    count = len(chosen)
    boxes: list[tuple[float, float] | None] = [None] * count
    if roi is not None:
        bounds = np.asarray(roi, dtype=np.float64).reshape(-1)
        if bounds.size != 2 * count:
            raise ValueError(f"roi has {bounds.size} values for {count} axes")
        boxes = [(float(bounds[i]), float(bounds[count + i])) for i in range(count)]
    if sizes is not None:
        asked = int_values(sizes, "sizes")
        if len(asked) != count or any(s < 0 for s in asked):
            raise ValueError(f"sizes {asked} do not fit {count} axes")
        ratios = [s / shape[a] for s, a in zip(asked, chosen, strict=True)]
        if policy == "stretch":
            plans = [(s, r, float(s)) for s, r in zip(asked, ratios, strict=True)]
        else:
            common = min(ratios) if policy == "not_larger" else max(ratios)
            plans = [(int(common * shape[a] + 0.5), common, common * shape[a]) for a in chosen]
    elif scales is not None:
        factors = np.asarray(scales, dtype=np.float64).reshape(-1)
        if factors.size != count or np.any(factors <= 0):
            raise ValueError(f"scales {factors.tolist()} do not fit {count} axes")
        plans = [
            (int(f * shape[a]), float(f), f * shape[a])
            for f, a in zip(factors, chosen, strict=True)
        ]
    else:
        raise ValueError("Resize needs scales or sizes")
    return {
        axis: _AxisResize(shape[axis], out, scale, width, box)
        for axis, (out, scale, width), box in zip(chosen, plans, boxes, strict=True)
    }


def _keeps_axis(plan: _AxisResize, mode: str) -> bool:
    """Whether resizing by `plan` maps every output position onto the same input one
    (then the axis is left alone)."""
    same = plan.out == plan.size and plan.scale == 1.0 and plan.roi in (None, (0.0, 1.0))
    return same and mode != "tf_half_pixel_for_nn"  # that one shifts by half a pixel


def _source_coordinates(plan: _AxisResize, mode: str) -> np.ndarray:
    """Per output position, the input coordinate it samples (ONNX
    coordinate_transformation_mode)."""
    y = np.arange(plan.out, dtype=np.float64)
    size, scale, width = plan.size, plan.scale, plan.width
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - plan.out / width)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if width != 1 else np.full(plan.out, -0.5)
    if mode == "align_corners":
        return y * (size - 1) / (width - 1) if width != 1 else np.zeros(plan.out)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if plan.roi is None:
        raise ValueError("tf_crop_and_resize needs the roi input")
    start, end = plan.roi
    if width == 1:
        return np.full(plan.out, (end - start) * (size - 1) / 2 + start * (size - 1))
    return y * (end - start) * (size - 1) / (width - 1) + start * (size - 1)


def _nearest_indices(x: np.ndarray, size: int, nearest_mode: str) -> np.ndarray:
    """The input index nearest to each coordinate (ONNX nearest_mode), clamped."""
    if nearest_mode == "round_prefer_floor":
        index = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        index = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        index = np.floor(x)
    else:
        index = np.ceil(x)
    return np.clip(index, 0, size - 1).astype(np.intp)


def _cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel (Keys) with coefficient `a`."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _interpolation_taps(
    x: np.ndarray,
    plan: _AxisResize,
    mode: str,
    cubic_a: float,
    antialias: int,
    exclude_outside: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (out, taps): the input positions each output position
    mixes and how much of each (linear or cubic, stretched by 1 / scale when antialiasing
    a downscale), edge-clamped or, with exclude_outside, renormalized without outside taps."""
    support = 1 if mode == "linear" else 2
    stretch = min(plan.scale, 1.0) if antialias else 1.0
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 1 - first + 1)  # relative to base, 2 - 2 * first taps
    floor = np.floor(x)
    base = np.where(x == floor, floor - 1, floor)  # an exact hit weighs the right tap by 1
    ratio = x - base
    distance = (offsets[None, :] - ratio[:, None]) * stretch
    linear = mode == "linear"
    weights = np.clip(1 - np.abs(distance), 0, 1) if linear else _cubic(distance, cubic_a)
    if antialias:
        weights /= weights.sum(axis=1, keepdims=True)
    indices = base.astype(np.intp)[:, None] + offsets[None, :]
    if exclude_outside:
        weights = np.where((indices < 0) | (indices >= plan.size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights /= np.where(total == 0, 1.0, total)
    return np.clip(indices, 0, plan.size - 1), weights


def _resample_axis(
    data: np.ndarray, axis: int, indices: np.ndarray, weights: np.ndarray | None
) -> np.ndarray:
    """`data` resampled along `axis`: out[..., o, ...] = sum_j weights[o, j] *
    data[..., indices[o, j], ...] (a plain gather when `weights` is None)."""
    if weights is None:
        return np.take(data, indices, axis=axis)
    shape = [1] * data.ndim
    shape[axis] = -1
    result = None
    for tap in range(indices.shape[1]):
        term = np.take(data, indices[:, tap], axis=axis)
        term *= weights[:, tap].astype(data.dtype).reshape(shape)
        if result is None:
            result = term
        else:
            result += term
    assert result is not None
    return result


@kernel(
    "Resize",
    Engine.POOL,
    inputs=(1, 4),
    attrs={
        "antialias": Attr(flag_attr, 0),
        "axes": Attr(ints_attr, None),
        "coordinate_transformation_mode": Attr(choice_attr(*_COORDINATE_MODES), "half_pixel"),
        "cubic_coeff_a": Attr(float_attr, -0.75),
        "exclude_outside": Attr(flag_attr, 0),
        "extrapolation_value": Attr(float_attr, 0.0),
        "keep_aspect_ratio_policy": Attr(
            choice_attr("stretch", "not_larger", "not_smaller"), "stretch"
        ),
        "mode": Attr(choice_attr("nearest", "linear", "cubic"), "nearest"),
        "nearest_mode": Attr(
            choice_attr("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
            "round_prefer_floor",
        ),
    },
    since=(11, 13, 18, 19),  # version 10 takes (X, scales) and has other semantics
    check=_resize_check,
)
def _resize(
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int,
    axes: tuple[int, ...] | None,
    coordinate_transformation_mode: str,
    cubic_coeff_a: float,
    exclude_outside: int,
    extrapolation_value: float,
    keep_aspect_ratio_policy: str,
    mode: str,
    nearest_mode: str,
) -> np.ndarray:
    """X resized axis by axis to `sizes` (or floor(size * scale)): each output position
    maps to an input coordinate and takes the nearest input element or interpolates
    (linear, cubic); with tf_crop_and_resize, positions mapping outside the input are
    `extrapolation_value`. Empty roi/scales/sizes tensors count as absent."""
    roi, scales, sizes = (None if t is None or np.size(t) == 0 else t for t in (roi, scales, sizes))
    if scales is not None and sizes is not None:
        raise ValueError("Resize takes scales or sizes, not both")
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    if crop and sizes is None:
        # the spec's output size counts the roi, onnxruntime and the reference do not
        raise ValueError("tf_crop_and_resize with scales is not implemented")
    policy = keep_aspect_ratio_policy if sizes is not None else "stretch"
    plans = _resize_axes(x.shape, roi if crop else None, scales, sizes, axes, policy)
    dtype = x.dtype if mode == "nearest" else compute_dtype(x.dtype)
    y = as_compute(x, dtype)
    for axis, plan in plans.items():
        if _keeps_axis(plan, coordinate_transformation_mode):
            continue
        coords = _source_coordinates(plan, coordinate_transformation_mode)
        if mode == "nearest":
            y = _resample_axis(y, axis, _nearest_indices(coords, plan.size, nearest_mode), None)
        else:
            indices, weights = _interpolation_taps(
                coords, plan, mode, cubic_coeff_a, antialias, exclude_outside
            )
            y = _resample_axis(y, axis, indices, weights)
        if crop:
            outside = (coords < 0) | (coords > plan.size - 1)
            if outside.any():
                shape = [1] * y.ndim
                shape[axis] = -1
                y = np.where(outside.reshape(shape), np.array(extrapolation_value).astype(dtype), y)
    if y is x:
        y = x.copy()
    return y.astype(x.dtype, copy=False)
