"""Data movement of the NeuronCore (POOL engine) that makes a new tensor rather than a view
of its input: Pad and CenterCropPad, DepthToSpace and SpaceToDepth, ReverseSequence,
Trilu, OneHot, and the selections whose output shape depends on the data, Compress and
Unique. The moves numpy can do as views (Reshape, Transpose, Slice...) are `shape`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    INDICES,
    NUMBERS,
    Attr,
    axis_index,
    axis_indices,
    check_dtypes,
    choice_attr,
    dtype_check,
    dtype_set,
    flag_attr,
    float_attr,
    int_attr,
    int_values,
    ints_attr,
    kernel,
    positive_attr,
)

_SHAPE_CHECK = dtype_check(ALL_DTYPES, INDICES)  # data of any type, shapes as indices


def _pad_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes[:1], [ALL_DTYPES])  # constant_value is cast to the data's dtype
    if values["pads"] is not None and len(dtypes) > 1:
        raise ValueError("pads given both as attribute and as input")


@kernel(
    "Pad",
    Engine.POOL,
    inputs=(1, 4),
    attrs={
        "mode": Attr(choice_attr("constant", "reflect", "edge", "wrap"), "constant"),
        "pads": Attr(ints_attr, None),  # version 2
        "value": Attr(float_attr, 0.0),  # version 2
    },
    since=(2, 11, 13, 18, 19, 21, 23, 24, 25),
    check=_pad_check,
)
def _pad(
    data: np.ndarray,
    pads_input: np.ndarray | None = None,
    constant_value: np.ndarray | None = None,
    axes_input: np.ndarray | None = None,
    *,
    mode: str,
    pads: tuple[int, ...] | None,
    value: float,
) -> np.ndarray:
    """`data` with pads[i] elements added before and pads[i + n] after axis axes[i]
    (negative counts remove elements first): a constant, the reflection about the edge
    element, the edge element repeated, or the data wrapped around."""
    rank = data.ndim
    if pads is None:
        if pads_input is None:
            raise ValueError("Pad needs pads")
        counts = int_values(pads_input, "pads")
    else:
        counts = list(pads)
    axes = list(range(rank)) if axes_input is None else int_values(axes_input, "axes")
    if any(not -rank <= a < rank for a in axes) or len(counts) != 2 * len(axes):
        raise ValueError(f"pads {counts} do not fit axes {axes} of rank {rank}")
    before, after = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        before[axis % rank], after[axis % rank] = counts[i], counts[len(axes) + i]
    cropped = data[
        tuple(
            slice(max(0, -b), s - max(0, -a))
            for b, a, s in zip(before, after, data.shape, strict=True)
        )
    ]
    widths = [(max(0, b), max(0, a)) for b, a in zip(before, after, strict=True)]
    if mode != "constant":
        return np.pad(cropped, widths, mode=mode)  # type: ignore[call-overload]
    fill: Any = value if pads is not None else 0
    if constant_value is not None:
        fill = np.asarray(constant_value).reshape(-1)[0] if np.size(constant_value) else 0
    return np.pad(
        cropped, widths, mode="constant", constant_values=np.array(fill).astype(data.dtype)
    )


def _block_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [ALL_DTYPES])


@kernel(
    "DepthToSpace",
    Engine.POOL,
    attrs={"blocksize": Attr(positive_attr), "mode": Attr(choice_attr("DCR", "CRD"), "DCR")},
    since=(1, 11, 13, 28),
    check=_block_check,
)
def _depth_to_space(x: np.ndarray, *, blocksize: int, mode: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C / b^2, H * b, W * b): each pixel's channels spread over a
    b x b block; the channel index is (row, column, depth) in DCR, (depth, row, column)
    in CRD."""
    if x.ndim != 4 or x.shape[1] % (blocksize * blocksize):
        raise ValueError(f"input {x.shape} does not fit blocksize {blocksize}")
    n, c, h, w = x.shape
    depth = c // (blocksize * blocksize)
    if mode == "DCR":
        blocks = x.reshape(n, blocksize, blocksize, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = x.reshape(n, depth, blocksize, blocksize, h, w).transpose(0, 1, 4, 2, 5, 3)
    return blocks.reshape(n, depth, h * blocksize, w * blocksize)


@kernel(
    "SpaceToDepth",
    Engine.POOL,
    attrs={"blocksize": Attr(positive_attr), "mode": Attr(choice_attr("DCR", "CRD"), "DCR")},
    since=(1, 13, 28),
    check=_block_check,
)
def _space_to_depth(x: np.ndarray, *, blocksize: int, mode: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C * b^2, H / b, W / b), the inverse of DepthToSpace: each
    b x b block goes to the channels, ordered (row, column, depth) in DCR, (depth, row,
    column) in CRD."""
    if x.ndim != 4 or x.shape[2] % blocksize or x.shape[3] % blocksize:
        raise ValueError(f"input {x.shape} does not fit blocksize {blocksize}")
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // blocksize, blocksize, w // blocksize, blocksize)
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return blocks.transpose(order).reshape(
        n, c * blocksize * blocksize, h // blocksize, w // blocksize
    )


@kernel(
    "Trilu",
    Engine.POOL,
    inputs=(1, 2),
    attrs={"upper": Attr(flag_attr, 1)},
    since=(14,),
    check=_SHAPE_CHECK,
)
def _trilu(x: np.ndarray, k: np.ndarray | None = None, *, upper: int) -> np.ndarray:
    """The upper (or lower) triangle of each matrix of the last two axes, from the k-th
    diagonal (default 0; positive: above the main one) on; 0 elsewhere."""
    if x.ndim < 2:
        raise ValueError(f"Trilu needs rank >= 2, got shape {x.shape}")
    offset = 0 if k is None else int(int_values(k, "k")[0])
    return np.triu(x, offset) if upper else np.tril(x, offset)


@kernel(
    "CenterCropPad",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"axes": Attr(ints_attr, None)},
    since=(18,),
    check=_SHAPE_CHECK,
)
def _center_crop_pad(
    x: np.ndarray, shape: np.ndarray, *, axes: tuple[int, ...] | None
) -> np.ndarray:
    """X cropped or zero-padded about its center to `shape` on `axes` (default: all):
    a crop starts at (size - target) // 2, a pad puts (target - size) // 2 before."""
    sizes = int_values(shape, "shape")
    which = list(range(x.ndim)) if axes is None else list(axis_indices(axes, x.ndim))
    if len(sizes) != len(which) or min(sizes, default=0) < 0:
        raise ValueError(f"shape {sizes} does not fit axes {which}")
    target = list(x.shape)
    source = [slice(None)] * x.ndim
    place = [slice(None)] * x.ndim
    for axis, size in zip(which, sizes, strict=True):
        have = x.shape[axis]
        target[axis] = size
        if size <= have:
            start = (have - size) // 2
            source[axis] = slice(start, start + size)
        else:
            start = (size - have) // 2
            place[axis] = slice(start, start + have)
    y = np.zeros(target, dtype=x.dtype)
    y[tuple(place)] = x[tuple(source)]
    return y


@kernel(
    "OneHot",
    Engine.POOL,
    inputs=(3, 3),
    attrs={"axis": Attr(int_attr, -1)},
    since=(9, 11, 28),
    check=dtype_check(NUMBERS, NUMBERS, ALL_DTYPES),
)
def _one_hot(
    indices: np.ndarray, depth: np.ndarray, values: np.ndarray, *, axis: int
) -> np.ndarray:
    """A new axis of `depth` at `axis` holding values[1] (on) at each index and values[0]
    (off) elsewhere; negative indices count from depth, those out of range are all off."""
    size = int(np.asarray(depth).reshape(-1)[0])
    if size < 1 or values.size != 2:
        raise ValueError(f"depth {size} and values of shape {values.shape}")
    axis = axis_index(axis, indices.ndim + 1)
    index = np.asarray(indices).astype(np.int64)
    index = np.where(index < 0, index + size, index)
    shape = [1] * (indices.ndim + 1)
    shape[axis] = size
    hot = np.expand_dims(index, axis) == np.arange(size).reshape(shape)
    off, on = values.reshape(-1)
    return np.where(hot, on, off).astype(values.dtype)


@kernel(
    "ReverseSequence",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"batch_axis": Attr(flag_attr, 1), "time_axis": Attr(flag_attr, 0)},
    since=(10, 28),
    check=dtype_check(ALL_DTYPES, dtype_set("int64")),
)
def _reverse_sequence(
    x: np.ndarray, sequence_lens: np.ndarray, *, batch_axis: int, time_axis: int
) -> np.ndarray:
    """Each batch entry's first sequence_lens[b] steps along time_axis reversed, the rest
    kept as they are."""
    if batch_axis == time_axis or x.ndim < 2:
        raise ValueError(f"batch_axis {batch_axis}, time_axis {time_axis}, shape {x.shape}")
    lengths = np.asarray(sequence_lens).reshape(-1)
    steps = x.shape[time_axis]
    if lengths.shape != (x.shape[batch_axis],) or np.any((lengths < 0) | (lengths > steps)):
        raise ValueError(f"sequence_lens {lengths.tolist()} for shape {x.shape}")
    time = np.arange(steps).reshape(1, -1)
    length = lengths.reshape(-1, 1)
    source = np.where(time < length, length - 1 - time, time)  # (batch, time)
    moved = np.moveaxis(x, (batch_axis, time_axis), (0, 1))
    picked = moved[np.arange(len(lengths)).reshape(-1, 1), source]
    return np.moveaxis(picked, (0, 1), (batch_axis, time_axis))


@kernel(
    "Compress",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"axis": Attr(int_attr, None)},
    since=(9, 11, 28),
    check=dtype_check(ALL_DTYPES, dtype_set("bool")),
)
def _compress(x: np.ndarray, condition: np.ndarray, *, axis: int | None) -> np.ndarray:
    """The slices along `axis` (default: of X flattened) where condition is True; a
    condition shorter than the axis leaves the rest out."""
    flags = np.asarray(condition, dtype=bool).reshape(-1)
    if axis is None:
        flat = np.reshape(x, -1)
        if flags.size > flat.size:
            raise ValueError(f"condition of {flags.size} for {flat.size} elements")
        return flat[: flags.size][flags]
    axis = axis_index(axis, x.ndim)
    if flags.size > x.shape[axis]:
        raise ValueError(f"condition of {flags.size} for an axis of {x.shape[axis]}")
    return np.compress(flags, x, axis=axis)


@kernel(
    "Unique",
    Engine.POOL,
    outputs=(1, 4),
    attrs={"axis": Attr(int_attr, None), "sorted": Attr(flag_attr, 1)},
    since=(11, 28),
    check=dtype_check(NUMBERS),
)
def _unique(
    x: np.ndarray, *, axis: int | None, sorted: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Y, indices, inverse_indices, counts): the distinct elements of X flattened (or
    slices along `axis`), ascending or (sorted 0) in order of first occurrence; where
    each first occurs in X; for each element (slice) of X its place in Y; and how often
    each occurs. The indices are int64."""
    where = None if axis is None else axis_index(axis, x.ndim)
    values, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=where
    )
    inverse = inverse.reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if where is None else where)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return values, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)
