"""Pooling of the NeuronCore (POOL engine): MaxPool (and its Indices output),
AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, and MaxUnpool.

Pooling is separable: max and sum reduce one spatial axis at a time over strided views
(the windows: `driver_sim.ops.window`), and the average divides by per-axis window
counts multiplied together. float16 is averaged in float32 and rounded back once. Where
ONNX implementations disagree on a corner (a negative automatic padding, "SAME" padding
with dilations) the kernels refuse it rather than pick one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOAT_CHECK,
    FLOATS,
    Attr,
    as_compute,
    check_dtypes,
    choice_attr,
    compute_dtype,
    dtype_set,
    flag_attr,
    kernel,
    non_negative_ints_attr,
    positive_attr,
    positive_ints_attr,
)
from driver_sim.ops.window import (
    AUTO_PADS,
    SAME_AUTO_PADS,
    Window,
    check_auto_pad,
    conv_window,
)

_MAX_POOL_DTYPES = FLOATS | dtype_set("int8", "uint8")


class _LazyOutputs:
    """The outputs of a multi-output kernel, each made when first read: a step that names
    only the first output never pays for the others (steps unpack with zip)."""

    def __init__(self, *makers: Callable[[], np.ndarray]) -> None:
        self._makers = makers
        self._made: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._makers)

    def __getitem__(self, index: int) -> np.ndarray:
        index = range(len(self._makers))[index]
        if index not in self._made:
            self._made[index] = self._makers[index]()
        return self._made[index]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self._makers)))


def _pool_window(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
    auto_pad: str,
    ceil_mode: int,
) -> Window:
    """The windows of MaxPool/AveragePool: as Conv's, except that ceil_mode 1 rounds the
    output count up, dropping a last window that would start in the end padding."""
    if len(kernel) != len(sizes):
        raise ValueError(f"kernel_shape has {len(kernel)} values for {len(sizes)} spatial axes")
    window = conv_window(sizes, kernel, strides, dilations, pads, auto_pad)
    if not ceil_mode or auto_pad != "NOTSET":  # SAME gives ceil(size / stride) either way
        return window
    out = []
    for axis, size in enumerate(sizes):
        stride = window.strides[axis]
        span = size + window.begin[axis] + window.end[axis]
        span -= (window.kernel[axis] - 1) * window.dilations[axis] + 1
        count = -(-span // stride) + 1
        if (count - 1) * stride >= size + window.begin[axis]:
            count -= 1
        out.append(count)
    return Window(
        window.kernel, window.strides, window.dilations, window.begin, window.end, tuple(out)
    )


def _axis_views(
    a: np.ndarray, axis: int, window: Window, spatial_axis: int
) -> Iterator[np.ndarray]:
    """Per tap of `spatial_axis`, the strided view of `a` along array axis `axis`."""
    for tap in range(window.kernel[spatial_axis]):
        index = [slice(None)] * a.ndim
        index[axis] = window.tap_slice(spatial_axis, tap)
        yield a[tuple(index)]


def _reduce_windows(padded: np.ndarray, window: Window, ufunc: np.ufunc) -> np.ndarray:
    """`ufunc` (maximum or add) over each window of `padded` (N, C, *extent), one spatial
    axis at a time, the last axis first."""
    y = padded
    for spatial_axis in reversed(range(len(window.kernel))):
        views = list(_axis_views(y, 2 + spatial_axis, window, spatial_axis))
        acc = ufunc(views[0], views[1]) if len(views) > 1 else np.array(views[0])
        for view in views[2:]:
            ufunc(acc, view, out=acc)
        y = acc
    return y


def _lowest(dtype: np.dtype) -> Any:
    """The padding value of max pooling: -inf, or the smallest integer."""
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _pool_check(values: Mapping[str, Any]) -> None:
    check_auto_pad(values)
    auto_pad = values["auto_pad"]
    if auto_pad == "VALID" and values.get("ceil_mode"):
        # the spec's formula and onnxruntime's give different output sizes
        raise ValueError("auto_pad VALID with ceil_mode 1 is not implemented")
    dilations = values.get("dilations")
    if auto_pad in SAME_AUTO_PADS and dilations is not None and any(d != 1 for d in dilations):
        # the spec pads for the dilated kernel, onnxruntime and the reference for the plain one
        raise ValueError(f"auto_pad {auto_pad} with dilations is not implemented")


def _max_pool_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [_MAX_POOL_DTYPES])
    _pool_check(values)


def _avg_pool_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [FLOATS])
    _pool_check(values)


_POOL_ATTRS = {
    "auto_pad": Attr(choice_attr(*AUTO_PADS), "NOTSET"),
    "ceil_mode": Attr(flag_attr, 0),
    "dilations": Attr(positive_ints_attr, None),
    "kernel_shape": Attr(positive_ints_attr),
    "pads": Attr(non_negative_ints_attr, None),
    "strides": Attr(positive_ints_attr, None),
}


@kernel(
    "MaxPool",
    Engine.POOL,
    outputs=(1, 2),
    attrs={**_POOL_ATTRS, "storage_order": Attr(flag_attr, 0)},
    since=(1, 8, 10, 11, 12, 22),
    check=_max_pool_check,
)
def _max_pool(
    x: np.ndarray,
    *,
    auto_pad: str,
    ceil_mode: int,
    dilations: tuple[int, ...] | None,
    kernel_shape: tuple[int, ...],
    pads: tuple[int, ...] | None,
    storage_order: int,
    strides: tuple[int, ...] | None,
) -> _LazyOutputs:
    """(Y, Indices): the max of each window (padding never wins), and where it is, as a
    flat index into X (row-major, or column-major over the spatial axes when
    storage_order is 1); the first of equal maxima in row-major order. Indices is only
    computed when read."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    window = _pool_window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = window.padded(x, _lowest(x.dtype))
    return _LazyOutputs(
        lambda: _reduce_windows(padded, window, np.maximum),
        lambda: _max_pool_indices(x, padded, window, storage_order),
    )


def _max_pool_indices(
    x: np.ndarray, padded: np.ndarray, window: Window, storage_order: int
) -> np.ndarray:
    """MaxPool's Indices: the max is carried along with its flat input index, one spatial
    axis at a time from the last (so ties go to the row-major first)."""
    sizes = x.shape[2:]
    flat = np.arange(math.prod(sizes), dtype=np.int64)
    position = flat.reshape(sizes[::-1]).T if storage_order else flat.reshape(sizes)
    index = window.padded(position[None, None], -1)  # -1 marks padding
    values, indices = padded, np.broadcast_to(index, padded.shape)
    for spatial_axis in reversed(range(len(sizes))):
        axis = 2 + spatial_axis
        value_views = _axis_views(values, axis, window, spatial_axis)
        index_views = _axis_views(indices, axis, window, spatial_axis)
        best, best_index = np.array(next(value_views)), np.array(next(index_views))
        for value, where in zip(value_views, index_views, strict=True):
            better = (value > best) | ((best_index < 0) & (where >= 0))
            np.copyto(best, value, where=better)
            np.copyto(best_index, where, where=better)
        values, indices = best, best_index
    n, c = x.shape[:2]
    image_offset = np.arange(n * c, dtype=np.int64).reshape(n, c, *[1] * len(sizes))
    return np.add(indices, image_offset * math.prod(sizes), where=indices >= 0, out=indices)


def _window_counts(size: int, window: Window, axis: int, include_pad: bool) -> np.ndarray:
    """Per output position of `axis`, how many taps of its window fall inside the input
    (or inside input and explicit padding, with `include_pad`)."""
    starts = np.arange(window.out[axis]) * window.strides[axis] - window.begin[axis]
    taps = starts[:, None] + np.arange(window.kernel[axis]) * window.dilations[axis]
    low, high = (-window.begin[axis], size + window.end[axis]) if include_pad else (0, size)
    return np.count_nonzero((taps >= low) & (taps < high), axis=1)


@kernel(
    "AveragePool",
    Engine.POOL,
    attrs={**_POOL_ATTRS, "count_include_pad": Attr(flag_attr, 0)},
    since=(1, 7, 10, 11, 19, 22),
    check=_avg_pool_check,
)
def _average_pool(
    x: np.ndarray,
    *,
    auto_pad: str,
    ceil_mode: int,
    count_include_pad: int,
    dilations: tuple[int, ...] | None,
    kernel_shape: tuple[int, ...],
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """The mean of each window over its taps inside the input (count_include_pad 0) or
    inside input and padding (1; the extra windows of ceil_mode count only up to the end
    padding)."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    sizes = x.shape[2:]
    window = _pool_window(sizes, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = compute_dtype(x.dtype)
    padded = window.padded(as_compute(x, dtype), 0)
    sums = _reduce_windows(padded, window, np.add)
    counts = np.ones((), dtype=dtype)
    for axis, size in enumerate(sizes):
        per_axis = _window_counts(size, window, axis, bool(count_include_pad))
        shape = [1] * len(sizes)
        shape[axis] = -1
        counts = counts * per_axis.astype(dtype).reshape(shape)
    sums /= counts
    return sums.astype(x.dtype, copy=False)


@kernel("GlobalAveragePool", Engine.POOL, since=(1, 22), check=FLOAT_CHECK)
def _global_average_pool(x: np.ndarray) -> np.ndarray:
    """The mean over all spatial axes, kept as size-1 axes."""
    axes = tuple(range(2, x.ndim))
    return np.mean(x, axis=axes, keepdims=True, dtype=compute_dtype(x.dtype)).astype(x.dtype)


@kernel("GlobalMaxPool", Engine.POOL, since=(1, 22), check=FLOAT_CHECK)
def _global_max_pool(x: np.ndarray) -> np.ndarray:
    """The max over all spatial axes, kept as size-1 axes."""
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@kernel(
    "LpPool",
    Engine.POOL,
    attrs={**_POOL_ATTRS, "p": Attr(positive_attr, 2)},
    since=(2, 11, 18, 22),
    check=_avg_pool_check,
)
def _lp_pool(
    x: np.ndarray,
    *,
    auto_pad: str,
    ceil_mode: int,
    dilations: tuple[int, ...] | None,
    kernel_shape: tuple[int, ...],
    p: int,
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """The p-norm of each window: (sum of |X|^p over its taps) ^ (1 / p); padding
    counts as 0."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    window = _pool_window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = compute_dtype(x.dtype)
    powers = np.power(np.abs(as_compute(x, dtype)), p)
    sums = _reduce_windows(window.padded(powers, 0), window, np.add)
    return np.power(sums, 1.0 / p).astype(x.dtype, copy=False)


@kernel(
    "MaxUnpool",
    Engine.POOL,
    inputs=(2, 3),
    attrs={
        "kernel_shape": Attr(positive_ints_attr),
        "pads": Attr(non_negative_ints_attr, None),
        "strides": Attr(positive_ints_attr, None),
    },
    since=(9, 11, 22),
    check=lambda dtypes, values: check_dtypes(dtypes, [FLOATS, dtype_set("int64")]),
)
def _max_unpool(
    x: np.ndarray,
    indices: np.ndarray,
    output_shape: np.ndarray | None = None,
    *,
    kernel_shape: tuple[int, ...],
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """MaxPool undone: zeros of the size MaxPool came from, (in - 1) * stride + kernel
    - pads, with each X value put back at its flat index (MaxPool's Indices) in that
    size; an output_shape (no smaller) holds the same positions, zeros after them."""
    rank = x.ndim - 2
    stride = list(strides or [1] * rank)
    pad = list(pads or [0] * (2 * rank))
    if rank < 1 or len(kernel_shape) != rank or indices.shape != x.shape:
        raise ValueError(f"X {x.shape}, indices {indices.shape}, kernel {kernel_shape}")
    pooled = [*x.shape[:2]] + [
        (x.shape[2 + i] - 1) * stride[i] + kernel_shape[i] - pad[i] - pad[i + rank]
        for i in range(rank)
    ]
    shape = pooled if output_shape is None else [int(v) for v in output_shape.reshape(-1)]
    if len(shape) != x.ndim or any(s < p for s, p in zip(shape, pooled, strict=True)):
        raise ValueError(f"output_shape {shape} is smaller than the pooled input's {pooled}")
    y = np.zeros(shape, dtype=x.dtype)
    y[np.unravel_index(indices.reshape(-1), pooled)] = x.reshape(-1)
    return y
