"""Sampling at grid points (POOL engine): GridSample (nearest, linear and cubic
interpolation over 1 to 3 spatial axes; zeros, border and reflection padding) and
AffineGrid, which makes the sampling grid of an affine transform (its products on PE).

A grid point holds normalized coordinates in [-1, 1], the last spatial axis first (x,
then y, then z); with align_corners -1 and 1 are the centers of the edge pixels, without
it their outer edges.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOATS,
    INDICES,
    Attr,
    Shape,
    choice_attr,
    dtype_check,
    flag_attr,
    int_values,
    kernel,
)

_CUBIC_ALPHA = -0.75  # Keys' cubic convolution, as the spec's bicubic mode


def _to_pixels(normalized: np.ndarray, size: int, align_corners: int) -> np.ndarray:
    """Pixel coordinates of normalized ones on an axis of `size` pixels."""
    if align_corners:
        return (normalized + 1) / 2 * (size - 1)
    return ((normalized + 1) * size - 1) / 2


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """x reflected about the borders low and high until it lies between them."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below, above = x < low, x > high
    distance = np.where(below, low - x, np.where(above, x - high, 0))
    folds = np.floor(distance / span)
    rest = distance - folds * span
    even = folds % 2 == 0
    from_below = np.where(even, low + rest, high - rest)
    from_above = np.where(even, high - rest, low + rest)
    return np.where(below, from_below, np.where(above, from_above, x))


def _taps(x: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (integer pixel, weight) pairs interpolation at coordinates x reads."""
    if mode == "nearest":
        return [(x.astype(np.int64), np.ones_like(x))]
    start = np.floor(x)
    t = x - start
    first = start.astype(np.int64)
    if mode == "linear":
        return [(first, 1 - t), (first + 1, t)]
    a = _CUBIC_ALPHA
    s = t + 1
    u, v = 1 - t, 2 - t
    weights = (
        ((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * u - (a + 3)) * u * u + 1,
        ((a * v - 5 * a) * v + 8 * a) * v - 4 * a,
    )
    return [(first + k - 1, w) for k, w in enumerate(weights)]


def _pad_index(
    index: np.ndarray, size: int, padding: str, low: float, high: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """A pixel index made readable by the padding mode, and where it reads a real pixel
    (None: everywhere); zeros padding reads 0 outside."""
    if padding == "zeros":
        inside = (index >= 0) & (index < size)
        return np.clip(index, 0, size - 1), inside
    if padding == "reflection":
        index = np.trunc(_reflect(index.astype(np.float64), low, high)).astype(np.int64)
    return np.clip(index, 0, size - 1), None


@kernel(
    "GridSample",
    Engine.POOL,
    inputs=(2, 2),
    attrs={
        "align_corners": Attr(flag_attr, 0),
        "mode": Attr(choice_attr("nearest", "linear", "cubic", "bilinear", "bicubic"), "linear"),
        "padding_mode": Attr(choice_attr("zeros", "border", "reflection"), "zeros"),
    },
    since=(16, 20, 22),
    check=dtype_check(FLOATS, FLOATS),
)
def _grid_sample(
    x: np.ndarray, grid: np.ndarray, *, align_corners: int, mode: str, padding_mode: str
) -> np.ndarray:
    """Y[n, c, o...] = X[n, c] interpolated at grid[n, o...] (N, C, *out); coordinates
    outside the image are first clamped (border) or reflected (reflection) into it."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    rank = x.ndim - 2
    if rank < 1 or grid.ndim != x.ndim or grid.shape[-1] != rank or grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid of shape {grid.shape} does not fit X of shape {x.shape}")
    sizes = x.shape[2:]
    out_shape = (x.shape[0], x.shape[1], *grid.shape[1:-1])
    if math.prod(out_shape) == 0:
        return np.zeros(out_shape, dtype=x.dtype)
    per_axis = []
    for axis, size in enumerate(sizes):
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        coords = _to_pixels(grid[..., rank - 1 - axis], size, align_corners)
        if mode == "nearest":
            coords = np.rint(coords)
        outside = (coords < low) | (coords > high)
        if padding_mode == "border":
            coords = np.where(outside, np.clip(coords, 0, size - 1), coords)
        elif padding_mode == "reflection":
            coords = np.where(outside, _reflect(coords, low, high), coords)
        taps = [
            (*_pad_index(index, size, padding_mode, low, high), weight.astype(x.dtype))
            for index, weight in _taps(coords, mode)
        ]
        per_axis.append(taps)
    batch = np.arange(x.shape[0]).reshape(-1, *[1] * (grid.ndim - 2))
    y = np.zeros((*out_shape[:1], *out_shape[2:], out_shape[1]), dtype=x.dtype)
    for combination in itertools.product(*per_axis):
        weight = np.ones(grid.shape[:-1], dtype=x.dtype)
        for _, inside, tap_weight in combination:
            weight = weight * (tap_weight if inside is None else np.where(inside, tap_weight, 0))
        where: tuple[Any, ...] = (batch, slice(None), *[index for index, _, _ in combination])
        pixels = x[where]
        y += pixels * weight[..., None]  # pixels: (N, *out, C)
    return np.moveaxis(y, -1, 1)


def _affine_grid_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """A (rank + 1)-long product per output coordinate."""
    return math.prod(outputs[0]) * (outputs[0][-1] + 1)


@kernel(
    "AffineGrid",
    Engine.PE,
    inputs=(2, 2),
    attrs={"align_corners": Attr(flag_attr, 0)},
    macs=_affine_grid_macs,
    since=(20,),
    check=dtype_check(FLOATS, INDICES),
)
def _affine_grid(theta: np.ndarray, size: np.ndarray, *, align_corners: int) -> np.ndarray:
    """The sampling grid (N, [D,] H, W, rank) of the affine maps theta (N, rank,
    rank + 1) for images of size (N, C, [D,] H, W): theta @ (x, y, [z,] 1) at each
    pixel's normalized coordinates."""
    dims = int_values(size, "size")
    spatial = dims[2:]
    rank = len(spatial)
    if rank not in (2, 3) or theta.shape != (dims[0], rank, rank + 1):
        raise ValueError(f"theta of shape {theta.shape} does not fit size {dims}")
    axes = []
    for length in reversed(spatial):  # x (the last axis) first
        if align_corners:
            axes.append(np.linspace(-1, 1, length) if length > 1 else np.zeros(length))
        else:
            axes.append((np.arange(length) * 2 + 1) / length - 1)
    mesh = np.meshgrid(*reversed(axes), indexing="ij")  # each of the spatial shape
    points = [*reversed(mesh), np.ones(tuple(spatial))]
    base = np.stack(points, axis=-1).astype(theta.dtype).reshape(-1, rank + 1)
    grid = np.matmul(base, np.swapaxes(theta, 1, 2))  # (N, pixels, rank)
    return grid.reshape(dims[0], *spatial, rank).astype(theta.dtype, copy=False)
