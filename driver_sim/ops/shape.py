"""Data movement of the NeuronCore (POOL engine): Identity, Reshape, Flatten, Transpose,
Squeeze, Unsqueeze, Concat, Split, Slice, Gather, Expand, Tile and Shape. The moves that
make a new tensor of another layout (Pad, DepthToSpace, OneHot, Unique...) are
`rearrange`'s.

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
    VARIADIC,
    Attr,
    SupportCheck,
    axis_index,
    axis_indices,
    check_dtypes,
    dtype_check,
    flag_attr,
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
