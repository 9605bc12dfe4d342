"""Indexed reads and writes of the NeuronCore (POOL engine): GatherElements, GatherND,
ScatterElements (and Scatter, its old name), ScatterND (with their reductions) and
TensorScatter (a cache update).
Negative indices count from the end of their axis; an index out of range is an error.
Scatters return a new array: their data input is never written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    INDICES,
    Attr,
    axis_index,
    check_dtypes,
    choice_attr,
    dtype_check,
    int_attr,
    kernel,
)

_GATHER_CHECK = dtype_check(ALL_DTYPES, INDICES)
# the reductions a scatter may apply, as numpy ufuncs (none: the update replaces)
_REDUCTIONS: dict[str, Any] = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, (ALL_DTYPES, INDICES, ALL_DTYPES), same=(0, 2))


def _in_range(indices: np.ndarray, size: int, what: str) -> np.ndarray:
    """`indices` (negative ones counted from the end) checked against an axis of `size`."""
    indices = np.asarray(indices, dtype=np.int64)
    if np.any((indices < -size) | (indices >= size)):
        raise ValueError(f"{what} index out of range for an axis of {size}")
    return np.where(indices < 0, indices + size, indices)


def _element_index(indices: np.ndarray, axis: int, size: int) -> tuple[np.ndarray, ...]:
    """The full index of each element of `indices`: its own position, but `indices` on
    `axis`."""
    index: list[Any] = list(np.indices(indices.shape, sparse=True))
    index[axis] = _in_range(indices, size, "element")
    return tuple(index)


@kernel(
    "GatherElements",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"axis": Attr(int_attr, 0)},
    since=(11, 13),
    check=_GATHER_CHECK,
)
def _gather_elements(data: np.ndarray, indices: np.ndarray, *, axis: int) -> np.ndarray:
    """Y[i][j][k] = data[indices[i][j][k]][j][k] (for axis 0; so on): Y has the shape
    of `indices`."""
    axis = axis_index(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"indices of rank {indices.ndim} for data of rank {data.ndim}")
    return data[_element_index(indices, axis, data.shape[axis])]


def _apply(
    out: np.ndarray, index: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str
) -> np.ndarray:
    ufunc = _REDUCTIONS[reduction]
    if ufunc is None:
        out[index] = updates
    else:
        ufunc.at(out, index, updates)
    return out


_SCATTER_ATTRS = {
    "reduction": Attr(choice_attr(*_REDUCTIONS), "none"),  # version 16 (max, min: 18)
}


@kernel(
    "ScatterElements",
    Engine.POOL,
    inputs=(3, 3),
    attrs={**_SCATTER_ATTRS, "axis": Attr(int_attr, 0)},
    since=(11, 13, 16, 18),
    check=_scatter_check,
)
def _scatter_elements(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, *, axis: int, reduction: str
) -> np.ndarray:
    """A copy of `data` with out[... indices[i, j] (on axis) ...] = updates[i, j] (or
    combined with it by the reduction, for every update to the same place)."""
    axis = axis_index(axis, data.ndim)
    if indices.shape != updates.shape or indices.ndim != data.ndim:
        raise ValueError(f"indices {indices.shape}, updates {updates.shape}, data {data.shape}")
    index = _element_index(indices, axis, data.shape[axis])
    return _apply(np.array(data), index, updates, reduction)


@kernel(
    "Scatter",
    Engine.POOL,
    inputs=(3, 3),
    attrs={"axis": Attr(int_attr, 0)},
    since=(9, 11),
    check=_scatter_check,
)
def _scatter(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, *, axis: int
) -> np.ndarray:
    """ScatterElements without a reduction, under its old name (deprecated by version 11)."""
    return _scatter_elements(data, indices, updates, axis=axis, reduction="none")


def _nd_index(data_shape: Sequence[int], indices: np.ndarray) -> tuple[np.ndarray, ...]:
    """The index tuple of the last axis of `indices` (k leading axes of data)."""
    depth = indices.shape[-1]
    if depth > len(data_shape):
        raise ValueError(f"indices of depth {depth} for data of rank {len(data_shape)}")
    return tuple(_in_range(indices[..., i], data_shape[i], "ND") for i in range(depth))


@kernel(
    "ScatterND",
    Engine.POOL,
    inputs=(3, 3),
    attrs=_SCATTER_ATTRS,
    since=(11, 13, 16, 18),
    check=_scatter_check,
)
def _scatter_nd(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, *, reduction: str
) -> np.ndarray:
    """A copy of `data` with the slice out[indices[i..., :]] = updates[i...] (or combined
    by the reduction)."""
    index = _nd_index(data.shape, indices)
    expected = indices.shape[:-1] + data.shape[indices.shape[-1] :]
    if updates.shape != expected:
        raise ValueError(f"updates of shape {updates.shape}, expected {expected}")
    return _apply(np.array(data), index, updates, reduction)


def _non_negative_attr(value: Any) -> int:
    number = int_attr(value)
    if number < 0:
        raise ValueError(f"must not be negative, got {number}")
    return number


@kernel(
    "GatherND",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"batch_dims": Attr(_non_negative_attr, 0)},
    since=(11, 12, 13),
    check=_GATHER_CHECK,
)
def _gather_nd(data: np.ndarray, indices: np.ndarray, *, batch_dims: int) -> np.ndarray:
    """Y[b..., i...] = data[b..., indices[b..., i..., :]...]: the slices of data (after
    its first batch_dims axes, which data and indices share) that indices name."""
    batch = data.shape[:batch_dims]
    if indices.ndim <= batch_dims or indices.shape[:batch_dims] != batch:
        raise ValueError(f"indices {indices.shape} and data {data.shape} differ in batch")
    count = math.prod(batch)
    flat_data = data.reshape(count, *data.shape[batch_dims:])
    flat_indices = indices.reshape(count, -1, indices.shape[-1])
    index = _nd_index(flat_data.shape[1:], flat_indices)
    rows = np.arange(count).reshape(-1, 1)
    picked = flat_data[(rows, *index)]
    return picked.reshape(*indices.shape[:-1], *flat_data.shape[1 + indices.shape[-1] :])


@kernel(
    "TensorScatter",
    Engine.POOL,
    inputs=(2, 3),
    attrs={"mode": Attr(choice_attr("linear", "circular"), "linear"), "axis": Attr(int_attr, -2)},
    since=(24,),
    check=dtype_check(ALL_DTYPES, ALL_DTYPES, INDICES, same=(0, 1)),
)
def _tensor_scatter(
    past_cache: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray | None = None,
    *,
    mode: str,
    axis: int,
) -> np.ndarray:
    """The cache with update written along `axis` from write_indices[b] (default 0) on,
    per batch b (axis 0); circular: the positions wrap around the axis."""
    axis = axis_index(axis, past_cache.ndim)
    length, count = past_cache.shape[axis], update.shape[axis]
    others = [d for i, d in enumerate(past_cache.shape) if i != axis]
    if axis == 0 or [d for i, d in enumerate(update.shape) if i != axis] != others:
        raise ValueError(f"update {update.shape} does not fit cache {past_cache.shape}")
    batch = past_cache.shape[0]
    starts = np.zeros(batch, np.int64) if write_indices is None else write_indices.astype(np.int64)
    positions = starts.reshape(-1, 1) + np.arange(count)
    if mode == "circular":
        positions %= length
    elif count and (np.any(positions < 0) or np.any(positions >= length)):
        raise ValueError(f"writes past the cache's {length} positions")
    present = np.array(past_cache)
    np.moveaxis(present, axis, 1)[np.arange(batch).reshape(-1, 1), positions] = np.moveaxis(
        update, axis, 1
    )
    return present
