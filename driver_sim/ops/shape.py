"""Data movement of the NeuronCore (POOL engine): Identity, Reshape, Flatten, Transpose,
Squeeze, Unsqueeze, Concat, Split, Slice, Gather, Compress, Expand, Tile, Shape, Pad,
CenterCropPad, DepthToSpace, SpaceToDepth, ReverseSequence, Trilu, OneHot and Unique.

Inputs that ONNX takes as tensors (shapes, axes, starts, pads...) arrive as numpy arrays
at run time. Identity returns its input itself, and the movement kernels return views of
their input wherever numpy can (Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Slice,
Split, Expand).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    INDICES,
    NUMBERS,
    VARIADIC,
    Attr,
    SupportCheck,
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
    non_negative_ints_attr,
    positive_attr,
)


@kernel("Identity", Engine.POOL, since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def _identity(x: np.ndarray) -> np.ndarray:
    """Y = X (the same array: kernels never write their inputs)."""
    return x


def _perm_attr(value: Any) -> tuple[int, ...]:
    perm = ints_attr(value)
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"must be a permutation of 0..{len(perm) - 1}, got {list(perm)}")
    return perm


_SHAPE_CHECK = dtype_check(ALL_DTYPES, INDICES)


@kernel(
    "Reshape",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"allowzero": Attr(flag_attr, 0)},
    since=(5, 13, 14, 19, 21, 23, 24, 25),  # 14 added allowzero (default 0)
    check=_SHAPE_CHECK,
)
def _reshape(data: np.ndarray, shape: np.ndarray, *, allowzero: int) -> np.ndarray:
    """`data` in shape `shape` (a view where possible): -1 is inferred, and 0 copies the
    input dimension unless allowzero."""
    dims = int_values(shape)
    if not allowzero:
        if any(d == 0 and i >= np.ndim(data) for i, d in enumerate(dims)):
            raise ValueError(f"shape {dims} copies a dimension data of rank {np.ndim(data)} lacks")
        dims = [np.shape(data)[i] if d == 0 else d for i, d in enumerate(dims)]
    return np.reshape(data, dims)


@kernel(
    "Flatten",
    Engine.POOL,
    attrs={"axis": Attr(int_attr, 1)},
    since=(1, 9, 11, 13, 21, 23, 24, 25),
    check=dtype_check(ALL_DTYPES),
)
def _flatten(x: np.ndarray, *, axis: int) -> np.ndarray:
    """2-D view: the dimensions before `axis` become rows, the rest columns."""
    shape = np.shape(x)
    if not -len(shape) <= axis <= len(shape):
        raise ValueError(f"axis {axis} is out of range for rank {len(shape)}")
    split = axis + len(shape) if axis < 0 else axis
    return np.reshape(x, (math.prod(shape[:split]), math.prod(shape[split:])))


@kernel(
    "Transpose",
    Engine.POOL,
    attrs={"perm": Attr(_perm_attr, None)},
    since=(1, 13, 21, 23, 24, 25),
    check=dtype_check(ALL_DTYPES),
)
def _transpose(x: np.ndarray, *, perm: tuple[int, ...] | None) -> np.ndarray:
    """View with axes permuted by `perm` (default: reversed)."""
    return np.transpose(x, perm)


def _axes_input_check(required: bool) -> SupportCheck:
    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        check_dtypes(dtypes, (ALL_DTYPES, INDICES))
        if values["axes"] is not None and len(dtypes) > 1:
            raise ValueError("axes given both as an attribute and as an input")
        if required and values["axes"] is None and len(dtypes) == 1:
            raise ValueError("axes are missing")

    return check


def _given_axes(axes_input: np.ndarray | None, axes: tuple[int, ...] | None) -> list[int] | None:
    return (
        int_values(axes_input) if axes_input is not None else None if axes is None else list(axes)
    )


@kernel(
    "Squeeze",
    Engine.POOL,
    inputs=(1, 2),
    attrs={"axes": Attr(ints_attr, None)},  # the attribute form, up to Squeeze-11
    since=(1, 11, 13, 21, 23, 24, 25),
    check=_axes_input_check(required=False),
)
def _squeeze(
    data: np.ndarray, axes_input: np.ndarray | None = None, *, axes: tuple[int, ...] | None
) -> np.ndarray:
    """View without the given size-1 axes (default: without every size-1 axis)."""
    given = _given_axes(axes_input, axes)
    if given is None:
        return np.squeeze(data)
    if not given:
        raise ValueError("empty axes (squeeze nothing, or everything?)")
    return np.squeeze(data, axis=axis_indices(given, np.ndim(data)))


@kernel(
    "Unsqueeze",
    Engine.POOL,
    inputs=(1, 2),
    attrs={"axes": Attr(ints_attr, None)},  # the attribute form, up to Unsqueeze-11
    since=(1, 11, 13, 21, 23, 24, 25),
    check=_axes_input_check(required=True),
)
def _unsqueeze(
    data: np.ndarray, axes_input: np.ndarray | None = None, *, axes: tuple[int, ...] | None
) -> np.ndarray:
    """View with size-1 axes inserted at `axes` (positions in the output)."""
    given = _given_axes(axes_input, axes)
    if given is None:
        raise ValueError("Unsqueeze needs axes")
    return np.expand_dims(data, axis_indices(given, np.ndim(data) + len(given)))


def _concat_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, (ALL_DTYPES,), same=range(len(dtypes)))


@kernel(
    "Concat",
    Engine.POOL,
    inputs=VARIADIC,
    attrs={"axis": Attr(int_attr)},
    since=(4, 11, 13),
    check=_concat_check,
)
def _concat(*inputs: np.ndarray, axis: int) -> np.ndarray:
    """The inputs joined along `axis`."""
    if len(inputs) == 1:
        return inputs[0]
    return np.concatenate(inputs, axis=axis)


def _split_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, (ALL_DTYPES, INDICES))
    given = (len(dtypes) > 1) + (values["split"] is not None) + (values["num_outputs"] is not None)
    if given == 0:
        raise ValueError("equal split by output count: a kernel is not told its output count")
    if given > 1:
        raise ValueError("more than one of the split input, split and num_outputs")


@kernel(
    "Split",
    Engine.POOL,
    inputs=(1, 2),
    outputs=VARIADIC,
    attrs={
        "axis": Attr(int_attr, 0),
        "split": Attr(non_negative_ints_attr, None),  # the attribute form, up to Split-11
        "num_outputs": Attr(positive_attr, None),  # Split-18
    },
    since=(2, 11, 13, 18),
    check=_split_check,
)
def _split(
    x: np.ndarray,
    split_input: np.ndarray | None = None,
    *,
    axis: int,
    split: tuple[int, ...] | None,
    num_outputs: int | None,
) -> tuple[np.ndarray, ...]:
    """Views of consecutive parts of `x` along `axis`, of the given sizes, or
    num_outputs parts of ceil(size / num_outputs) (the last one smaller)."""
    axis = axis_index(axis, np.ndim(x))
    size = x.shape[axis]
    if split_input is not None:
        sizes = int_values(split_input)
    elif split is not None:
        sizes = list(split)
    elif num_outputs is not None:
        chunk = -(-size // num_outputs)
        sizes = [chunk] * (num_outputs - 1) + [size - chunk * (num_outputs - 1)]
        if chunk > 0 and sizes[-1] <= 0:  # "the last chunk smaller" cannot be: ambiguous
            raise ValueError(f"an axis of {size} does not split into {num_outputs} chunks")
    else:
        raise ValueError("Split needs split sizes or num_outputs")
    if min(sizes) < 0 or sum(sizes) != size:
        raise ValueError(f"split sizes {sizes} do not add up to the axis size {size}")
    return tuple(np.split(x, list(itertools.accumulate(sizes[:-1])), axis=axis))


def _slice_range(start: int, end: int, step: int, size: int) -> slice:
    """The Python slice of ONNX Slice's (start, end, step) on an axis of `size`: negative
    start/end count from the end; then with step > 0 both clamp to [0, size], with step < 0
    start clamps to [0, size - 1] and end to [-1, size - 1] (-1: past the first element).
    """
    if step == 0:
        raise ValueError("Slice step 0")
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), size), min(max(end, 0), size), step)
    if size == 0:
        return slice(0, 0)
    start = min(max(start, 0), size - 1)
    end = min(max(end, -1), size - 1)
    return slice(start, None if end < 0 else end, step)


@kernel(
    "Slice",
    Engine.POOL,
    inputs=(3, 5),
    since=(10, 11, 13),
    check=_SHAPE_CHECK,
)
def _slice(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    """View of data[starts:ends:steps] on `axes` (default: the first len(starts) axes)."""
    begin, end = int_values(starts), int_values(ends)
    count = len(begin)
    which = list(range(count)) if axes is None else int_values(axes)
    stride = [1] * count if steps is None else int_values(steps)
    if not len(end) == len(which) == len(stride) == count:
        raise ValueError("starts, ends, axes and steps differ in length")
    index = [slice(None)] * np.ndim(data)
    for axis, b, e, s in zip(axis_indices(which, np.ndim(data)), begin, end, stride, strict=True):
        index[axis] = _slice_range(b, e, s, np.shape(data)[axis])
    return np.asarray(data)[tuple(index)]


@kernel(
    "Gather",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"axis": Attr(int_attr, 0)},
    since=(1, 11, 13),
    check=_SHAPE_CHECK,
)
def _gather(data: np.ndarray, indices: np.ndarray, *, axis: int) -> np.ndarray:
    """Slices of `data` along `axis` at `indices` (negative ones count from the end)."""
    return np.take(data, indices, axis=axis_index(axis, np.ndim(data)))


@kernel("Expand", Engine.POOL, inputs=(2, 2), since=(8, 13), check=_SHAPE_CHECK)
def _expand(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Read-only view of `x` broadcast with `shape` (both ways, as numpy does)."""
    return np.broadcast_to(x, np.broadcast_shapes(np.shape(x), tuple(int_values(shape))))


@kernel("Tile", Engine.POOL, inputs=(2, 2), since=(6, 13), check=_SHAPE_CHECK)
def _tile(x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """`x` repeated repeats[i] times along each axis i."""
    reps = int_values(repeats)
    if len(reps) != np.ndim(x) or min(reps, default=0) < 0:
        raise ValueError(f"repeats {reps} do not fit an input of rank {np.ndim(x)}")
    return np.tile(x, reps)


@kernel(
    "Shape",
    Engine.POOL,
    attrs={"start": Attr(int_attr, 0), "end": Attr(int_attr, None)},
    since=(1, 13, 15, 19, 21, 23, 24, 25),
    check=dtype_check(ALL_DTYPES),
)
def _shape(x: np.ndarray, *, start: int, end: int | None) -> np.ndarray:
    """The int64 dimensions of `x` from `start` to `end` (negative: from the back; clamped)."""
    return np.array(np.shape(x)[start:end], dtype=np.int64)


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
