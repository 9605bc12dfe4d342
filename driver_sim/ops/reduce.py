"""Reductions of the NeuronCore (POOL engine): ReduceSum, ReduceMean, ReduceMax,
ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and
ReduceLogSumExp (axes as an attribute or an input, keepdims, noop_with_empty_axes),
ArgMax, ArgMin, TopK, and the running CumSum and CumProd.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    FLOATS,
    INDICES,
    NUMBERS,
    Attr,
    SupportCheck,
    axis_index,
    axis_indices,
    check_dtypes,
    dtype_check,
    dtype_set,
    flag_attr,
    int_attr,
    int_values,
    ints_attr,
    kernel,
    scalar,
)

_REDUCE_ATTRS = {
    "axes": Attr(ints_attr, None),  # the attribute form (up to ReduceSum-11 / Reduce*-13)
    "keepdims": Attr(flag_attr, 1),
    "noop_with_empty_axes": Attr(flag_attr, 0),
}


def _reduce_check(allowed: frozenset[np.dtype]) -> SupportCheck:
    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        check_dtypes(dtypes, (allowed, INDICES))
        if values["axes"] is not None and len(dtypes) > 1:
            raise ValueError("axes given both as an attribute and as an input")

    return check


def _reduce_axes(
    x: np.ndarray, axes_input: np.ndarray | None, axes: Sequence[int] | None, noop: int
) -> tuple[int, ...] | None:
    """The axes to reduce, as numpy takes them: None for all, () for none."""
    given = int_values(axes_input) if axes_input is not None else axes
    if not given:
        return () if noop else None
    return axis_indices(given, np.ndim(x))


def _reduction(
    op: str, since: tuple[int, ...], allowed: frozenset[np.dtype]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a reduction `reduce(x, axis, keepdims)` as `op`, with ONNX's axes
    handling (attribute or input), keepdims and noop_with_empty_axes."""

    def register(reduce: Callable[..., Any]) -> Callable[..., Any]:
        def compute(
            x: np.ndarray,
            axes_input: np.ndarray | None = None,
            *,
            axes: tuple[int, ...] | None,
            keepdims: int,
            noop_with_empty_axes: int,
        ) -> np.ndarray:
            axis = _reduce_axes(x, axes_input, axes, noop_with_empty_axes)
            return np.asarray(reduce(x, axis, bool(keepdims)))

        compute.__doc__ = reduce.__doc__
        kernel(
            op,
            Engine.POOL,
            inputs=(1, 2),
            attrs=_REDUCE_ATTRS,
            since=since,
            check=_reduce_check(allowed),
        )(compute)
        return reduce

    return register


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return True
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype a reduction accumulates in: float32 for float16, else the dtype itself
    (integers wrap as ONNX runtimes do, rather than widen as numpy would)."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


@_reduction("ReduceSum", (1, 11, 13), NUMBERS)
def _reduce_sum(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """Sum over the axes (0 over an empty set)."""
    total = np.sum(x, axis=axis, keepdims=keepdims, dtype=_accumulator(x.dtype))
    return total.astype(x.dtype, copy=False)


@_reduction("ReduceMean", (1, 11, 13, 18), FLOATS)
def _reduce_mean(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """Mean over the axes (NaN over an empty set; float16 accumulates in float32)."""
    return np.mean(x, axis=axis, keepdims=keepdims)


@_reduction("ReduceMax", (1, 11, 12, 13, 18, 20), ALL_DTYPES)
def _reduce_max(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """Maximum over the axes (the dtype's lowest value over an empty set)."""
    return np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype))


@_reduction("ReduceMin", (1, 11, 12, 13, 18, 20), ALL_DTYPES)
def _reduce_min(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """Minimum over the axes (the dtype's highest value over an empty set)."""
    return np.min(x, axis=axis, keepdims=keepdims, initial=_highest(x.dtype))


@_reduction("ReduceProd", (1, 11, 13, 18), NUMBERS)
def _reduce_prod(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """Product over the axes (1 over an empty set)."""
    product = np.prod(x, axis=axis, keepdims=keepdims, dtype=_accumulator(x.dtype))
    return product.astype(x.dtype, copy=False)


@_reduction("ReduceL2", (1, 11, 13, 18), FLOATS)
def _reduce_l2(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """sqrt(sum(X^2)) over the axes (0 over an empty set)."""
    squares = np.square(x, dtype=_accumulator(x.dtype))
    return np.sqrt(np.sum(squares, axis=axis, keepdims=keepdims)).astype(x.dtype, copy=False)


_ARG_ATTRS = {
    "axis": Attr(int_attr, 0),
    "keepdims": Attr(flag_attr, 1),
    "select_last_index": Attr(flag_attr, 0),
}


def _arg_reduce(
    find: Callable[..., Any], x: np.ndarray, axis: int, keepdims: int, last: int
) -> np.ndarray:
    """argmax/argmin along `axis` as int64; ties go to the first (or last) index."""
    axis = axis_index(axis, np.ndim(x))
    if not last:
        return np.asarray(find(x, axis=axis, keepdims=bool(keepdims)), dtype=np.int64)
    found = find(np.flip(x, axis), axis=axis, keepdims=bool(keepdims))
    return np.asarray(x.shape[axis] - 1 - found, dtype=np.int64)


@kernel(
    "ArgMax",
    Engine.POOL,
    attrs=_ARG_ATTRS,
    since=(1, 11, 12, 13),
    check=dtype_check(NUMBERS),
)
def _argmax(x: np.ndarray, *, axis: int, keepdims: int, select_last_index: int) -> np.ndarray:
    """Index (int64) of the largest element along `axis`."""
    return _arg_reduce(np.argmax, x, axis, keepdims, select_last_index)


@kernel(
    "ArgMin",
    Engine.POOL,
    attrs=_ARG_ATTRS,
    since=(1, 11, 12, 13),
    check=dtype_check(NUMBERS),
)
def _argmin(x: np.ndarray, *, axis: int, keepdims: int, select_last_index: int) -> np.ndarray:
    """Index (int64) of the smallest element along `axis`."""
    return _arg_reduce(np.argmin, x, axis, keepdims, select_last_index)


@kernel(
    "TopK",
    Engine.POOL,
    inputs=(2, 2),
    outputs=(1, 2),
    attrs={
        "axis": Attr(int_attr, -1),
        "largest": Attr(flag_attr, 1),
        "sorted": Attr(flag_attr, 1),  # unsorted order is unspecified: sorted is fine
    },
    since=(10, 11, 24),
    check=dtype_check(NUMBERS, INDICES),
)
def _topk(
    x: np.ndarray, k: np.ndarray, *, axis: int, largest: int, sorted: int
) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) elements along `axis`, sorted, and their int64
    indices; equal values keep their index order (the lower index first)."""
    axis = axis_index(axis, np.ndim(x))
    size = x.shape[axis]
    count = int(scalar(k, "K"))
    if not 0 <= count <= size:
        raise ValueError(f"K = {count} is out of range for an axis of {size}")
    if largest:
        # a stable ascending sort of the reversed axis, read backwards: descending with
        # equal values in ascending index order
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        indices = (size - 1) - _take_first(order, count, axis)
    else:
        indices = _take_first(np.argsort(x, axis=axis, kind="stable"), count, axis)
    indices = indices.astype(np.int64, copy=False)
    return np.take_along_axis(x, indices, axis=axis), indices


def _take_first(x: np.ndarray, count: int, axis: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, count)
    return x[tuple(index)]


@_reduction("ReduceL1", (1, 11, 13, 18), NUMBERS)
def _reduce_l1(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """sum(|X|) over the axes (0 over an empty set)."""
    total = np.sum(np.abs(x), axis=axis, keepdims=keepdims, dtype=_accumulator(x.dtype))
    return total.astype(x.dtype, copy=False)


@_reduction("ReduceSumSquare", (1, 11, 13, 18), NUMBERS)
def _reduce_sum_square(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """sum(X^2) over the axes (0 over an empty set)."""
    squares = np.square(x, dtype=_accumulator(x.dtype))
    return np.sum(squares, axis=axis, keepdims=keepdims).astype(x.dtype, copy=False)


@_reduction("ReduceLogSum", (1, 11, 13, 18, 28), FLOATS)
def _reduce_log_sum(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """ln(sum(X)) over the axes (-inf over an empty set)."""
    total = np.sum(x, axis=axis, keepdims=keepdims, dtype=_accumulator(x.dtype))
    return np.log(total).astype(x.dtype, copy=False)


@_reduction("ReduceLogSumExp", (1, 11, 13, 18, 28), FLOATS)
def _reduce_log_sum_exp(x: np.ndarray, axis: Any, keepdims: bool) -> Any:
    """ln(sum(exp(X))) over the axes, from the largest element so that nothing
    overflows (-inf over an empty set)."""
    wide = np.asarray(x, dtype=_accumulator(x.dtype))
    if wide.size == 0 or axis == ():
        return np.log(np.sum(np.exp(wide), axis=axis, keepdims=keepdims)).astype(x.dtype)
    peak = np.max(wide, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(wide - peak), axis=axis, keepdims=True)
    result = np.log(total) + peak
    if not keepdims:
        result = np.squeeze(result, axis=axis)
    return result.astype(x.dtype, copy=False)


_CUMULATIVE_ATTRS = {"exclusive": Attr(flag_attr, 0), "reverse": Attr(flag_attr, 0)}


def _cumulative(
    ufunc: Any, x: np.ndarray, axis_input: np.ndarray, exclusive: int, reverse: int
) -> np.ndarray:
    """ufunc.accumulate along the axis (a scalar input), from the end with `reverse`;
    `exclusive`: each element left out of its own result (the first one is the
    identity)."""
    axis = axis_index(int(scalar(axis_input, "axis")), x.ndim)
    values = np.flip(x, axis) if reverse else x
    result = ufunc.accumulate(values, axis=axis, dtype=_accumulator(x.dtype))
    if exclusive:
        shifted = np.full_like(result, ufunc.identity)
        count = x.shape[axis]
        if count:
            target = [slice(None)] * x.ndim
            source = [slice(None)] * x.ndim
            target[axis], source[axis] = slice(1, count), slice(0, count - 1)
            shifted[tuple(target)] = result[tuple(source)]
        result = shifted
    if reverse:
        result = np.flip(result, axis)
    return np.asarray(result).astype(x.dtype, copy=False)


_CUMULATIVE_CHECK = dtype_check(NUMBERS - dtype_set("int8", "int16", "uint8", "uint16"), INDICES)


@kernel(
    "CumSum",
    Engine.POOL,
    inputs=(2, 2),
    attrs=_CUMULATIVE_ATTRS,
    since=(11, 14),
    check=_CUMULATIVE_CHECK,
)
def _cumsum(x: np.ndarray, axis: np.ndarray, *, exclusive: int, reverse: int) -> np.ndarray:
    """Running sums of X along `axis`."""
    return _cumulative(np.add, x, axis, exclusive, reverse)


@kernel(
    "CumProd",
    Engine.POOL,
    inputs=(2, 2),
    attrs=_CUMULATIVE_ATTRS,
    since=(26,),
    check=_CUMULATIVE_CHECK,
)
def _cumprod(x: np.ndarray, axis: np.ndarray, *, exclusive: int, reverse: int) -> np.ndarray:
    """Running products of X along `axis`."""
    return _cumulative(np.multiply, x, axis, exclusive, reverse)
