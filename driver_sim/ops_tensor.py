"""Elementwise, activation, reduction and data-movement ops of the NeuronCore.

Every kernel follows the ONNX semantics of the op versions in its `since`; inputs that
ONNX takes as tensors (shapes, axes, starts, K...) arrive as numpy arrays at run time.
Data-movement kernels return views of their input wherever numpy can (Reshape, Squeeze,
Unsqueeze, Flatten, Transpose, Slice, Split, Expand).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from driver_sim.cost import Engine
from driver_sim.kernels import (
    ALL_DTYPES,
    BOOL,
    FLOAT_CHECK,
    FLOATS,
    INDICES,
    NUMBERS,
    SIGNED,
    VARIADIC,
    Attr,
    SupportCheck,
    check_dtypes,
    choice_attr,
    dtype_check,
    dtype_set,
    flag_attr,
    float_attr,
    floats_attr,
    int_attr,
    ints_attr,
    kernel,
    non_negative_ints_attr,
    positive_attr,
    tensor_attr,
    via_float32,
)

# ---- helpers -----------------------------------------------------------------------------


def _ints(tensor: np.ndarray) -> list[int]:
    """The values of an integer tensor input (shape, axes, starts...) as Python ints."""
    array = np.asarray(tensor)
    if array.dtype.kind not in "iu":
        raise ValueError(f"expected an integer tensor, got dtype {array.dtype}")
    return [int(v) for v in array.reshape(-1).tolist()]


def _scalar(tensor: np.ndarray, what: str) -> np.ndarray:
    """A one-element tensor input as a 0-d array."""
    array = np.asarray(tensor)
    if array.size != 1:
        raise ValueError(f"{what} must have one element, got shape {array.shape}")
    return array.reshape(())


def _axis(axis: int, rank: int) -> int:
    """`axis` in [-rank, rank) made non-negative."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """Distinct axes, each in [-rank, rank), made non-negative."""
    result = tuple(_axis(a, rank) for a in axes)
    if len(set(result)) != len(result):
        raise ValueError(f"repeated axis in {list(axes)}")
    return result


def _scratch(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A new array shaped like `x` (an array even when `x` is a numpy scalar)."""
    return np.empty_like(x, dtype=dtype)


# ---- attribute parsers ---------------------------------------------------------------------


def _perm_attr(value: Any) -> tuple[int, ...]:
    perm = ints_attr(value)
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"must be a permutation of 0..{len(perm) - 1}, got {list(perm)}")
    return perm


def _tensor_value_attr(value: Any) -> np.ndarray:
    """A tensor attribute of a dtype the NeuronCore holds, made read-only."""
    array = tensor_attr(value)
    if array.dtype not in ALL_DTYPES:
        raise ValueError(f"tensors of dtype {array.dtype} are not implemented")
    array.flags.writeable = False
    return array


def _fill_value_attr(value: Any) -> np.ndarray:
    array = _tensor_value_attr(value)
    if array.size != 1:
        raise ValueError(f"must have one element, got shape {array.shape}")
    return array.reshape(())


def _refused_attr(what: str) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        raise ValueError(f"{what} are not implemented")

    return parse


# ONNX TensorProto element types the NeuronCore holds (others: string, bfloat16, complex,
# float8, 4-bit and 2-bit types).
_ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("float32"),
    2: np.dtype("uint8"),
    3: np.dtype("int8"),
    4: np.dtype("uint16"),
    5: np.dtype("int16"),
    6: np.dtype("int32"),
    7: np.dtype("int64"),
    9: np.dtype("bool"),
    10: np.dtype("float16"),
    11: np.dtype("float64"),
    12: np.dtype("uint32"),
    13: np.dtype("uint64"),
}


def _onnx_dtype_attr(value: Any) -> np.dtype:
    code = int_attr(value)
    if code not in _ONNX_DTYPES:
        raise ValueError(
            f"element type {code} is not implemented (only bool, integers, float16/32/64)"
        )
    return _ONNX_DTYPES[code]


def _stash_type_attr(value: Any) -> np.dtype:
    code = int_attr(value)
    if code not in (1, 11):
        raise ValueError(f"must be 1 (float) or 11 (double), got {code}")
    return _ONNX_DTYPES[code]


# ---- ACT: activations and transcendentals ------------------------------------------------


@kernel("Sqrt", Engine.ACT, since=(6, 13), check=FLOAT_CHECK)
def _sqrt(x: np.ndarray) -> np.ndarray:
    """Y = sqrt(X)."""
    return np.sqrt(x)


@kernel("Exp", Engine.ACT, since=(6, 13), check=FLOAT_CHECK)
def _exp(x: np.ndarray) -> np.ndarray:
    """Y = exp(X)."""
    return np.exp(x)


@kernel("Log", Engine.ACT, since=(6, 13), check=FLOAT_CHECK)
def _log(x: np.ndarray) -> np.ndarray:
    """Y = ln(X)."""
    return np.log(x)


@kernel("Reciprocal", Engine.ACT, since=(6, 13), check=FLOAT_CHECK)
def _reciprocal(x: np.ndarray) -> np.ndarray:
    """Y = 1 / X."""
    return np.reciprocal(x)


# float32 erf as tanh(g): g(x) = atanh(erf(x)) = x * (2/sqrt(pi) + t * P(t) / Q(t)) with
# t = min(x^2, 16), P/Q a weighted least-squares rational fit (made for this kernel) of
# (atanh(erf(x)) / x - 2/sqrt(pi)) / x^2 on |x| <= 4, off by < 1e-8 in g; beyond, erf and
# tanh(g) both round to +-1. Computed in float32 it is within 4 ulp of the correctly
# rounded erf (10x faster than scipy's, which float64 inputs still use).
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_ERF_P = (  # highest degree first
    7.358234151912113e-06,
    0.0004250050004916922,
    0.005113689960044026,
    0.031611841749435085,
    0.10277249288157864,
)
_ERF_Q = (
    6.356201055698896e-07,
    0.000180400075748132,
    0.005392289657053264,
    0.056138304119491604,
    0.3096204924702246,
    1.0,
)


def _polynomial(t: np.ndarray, coefficients: Sequence[float]) -> np.ndarray:
    """sum(c * t^k) by Horner's rule, in t's dtype (a new array)."""
    y = np.multiply(t, coefficients[0], out=_scratch(t))
    y += coefficients[1]
    for coefficient in coefficients[2:]:
        y *= t
        y += coefficient
    return y


def _erf_atanh(x: np.ndarray) -> np.ndarray:
    """atanh(erf(x)) for float32 x (a new float32 array; see above)."""
    t = np.multiply(x, x, out=_scratch(x))
    np.minimum(t, 16.0, out=t)
    g = _polynomial(t, _ERF_P)
    g /= _polynomial(t, _ERF_Q)
    g *= t
    g += _TWO_OVER_SQRT_PI
    g *= x
    return g


def _erf32(x: np.ndarray) -> np.ndarray:
    g = _erf_atanh(x)
    return np.tanh(g, out=g)


@kernel("Erf", Engine.ACT, since=(9, 13), check=FLOAT_CHECK)
def _erf(x: np.ndarray) -> np.ndarray:
    """Y = erf(X)."""
    if x.dtype == np.float64:
        return special.erf(x)
    return via_float32(_erf32, x)


@kernel(
    "Pow",
    Engine.ACT,
    inputs=(2, 2),
    since=(7, 12, 13, 15),
    check=dtype_check(FLOATS | dtype_set("int32", "int64"), NUMBERS),
)
def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Z = X ** Y in the promoted type of X and Y, rounded (truncated) to X's dtype."""
    if x.dtype.kind == "f" and y.dtype.kind == "f" and y.size == 1 and y.ndim <= x.ndim:
        exponent = float(y.reshape(()))
        if exponent == 2.0:
            return np.square(x)
        if exponent == 1.0:
            return x
        if exponent == 0.5:
            return _square_root_power(x)
    return np.asarray(np.power(x, y)).astype(x.dtype, copy=False)


def _square_root_power(x: np.ndarray) -> np.ndarray:
    """pow(x, 0.5) as C defines it: sqrt(x), except pow(-0, 0.5) = +0 and
    pow(-inf, 0.5) = +inf (numpy's own power takes sqrt for a 0.5 exponent)."""
    root = np.sqrt(x, out=_scratch(x))
    root += 0  # -0 + 0 is +0
    np.copyto(root, np.inf, where=np.isneginf(x))
    return root


@kernel(
    "LeakyRelu",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 0.01)},
    since=(6, 16),
    check=FLOAT_CHECK,
)
def _leaky_relu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X where X >= 0, alpha * X elsewhere."""
    y = np.multiply(x, alpha, out=_scratch(x))
    np.copyto(y, x, where=np.greater_equal(x, 0))
    return y


@kernel(
    "PRelu",
    Engine.ACT,
    inputs=(2, 2),
    since=(7, 9, 16),
    check=dtype_check(FLOATS | dtype_set("int32", "int64", "uint32", "uint64"), same=(0, 1)),
)
def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """Y = X where X >= 0, slope * X elsewhere (slope broadcast to X)."""
    y = np.asarray(np.multiply(x, slope))
    if y.shape != np.shape(x):
        raise ValueError(f"slope of shape {slope.shape} does not broadcast to {np.shape(x)}")
    np.copyto(y, x, where=np.greater_equal(x, 0))
    return y


@kernel(
    "HardSigmoid",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 0.2), "beta": Attr(float_attr, 0.5)},
    since=(6, 22),
    check=FLOAT_CHECK,
)
def _hard_sigmoid(x: np.ndarray, *, alpha: float, beta: float) -> np.ndarray:
    """Y = max(0, min(1, alpha * X + beta))."""
    return via_float32(_hard_sigmoid_of, x, alpha=alpha, beta=beta)


def _hard_sigmoid_of(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = np.multiply(x, alpha, out=_scratch(x))
    y += beta
    return np.clip(y, 0, 1, out=y)


@kernel("Softplus", Engine.ACT, since=(1, 22), check=FLOAT_CHECK)
def _softplus(x: np.ndarray) -> np.ndarray:
    """Y = ln(exp(X) + 1), without overflow."""
    return np.logaddexp(x, 0)


_SQRT_HALF = math.sqrt(0.5)
_MINUS_2_SQRT_TWO_OVER_PI = -2.0 * math.sqrt(2.0 / math.pi)


def _gelu_erf32(x: np.ndarray) -> np.ndarray:
    # Phi(x) = (1 + erf(z)) / 2 = (1 + tanh(g)) / 2 = 1 / (1 + exp(-2g)), z = x / sqrt 2,
    # g = atanh(erf(z)): no cancellation where erf(z) is near -1
    z = np.multiply(x, _SQRT_HALF, out=_scratch(x))
    g = _erf_atanh(z)
    g *= -2.0
    np.exp(g, out=g)
    g += 1
    y = np.divide(x, g, out=g)
    tail = z < -4.0  # where g is clamped, Phi < 1e-8: take the float64 formula there
    if tail.any():
        y[tail] = _gelu_erf64(np.asarray(x)[tail].astype(np.float64))
    return y


def _gelu_erf64(x: np.ndarray) -> np.ndarray:
    # Phi(x) = erfc(-x / sqrt 2) / 2
    y = np.multiply(x, -_SQRT_HALF, out=_scratch(x))
    special.erfc(y, out=y)
    y *= x
    y *= 0.5
    return y


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # x * (1 + tanh(u)) / 2 as x / (1 + exp(-2u)): no cancellation for x < 0
    y = np.multiply(x, x, out=_scratch(x))
    y *= 0.044715
    y += 1
    y *= x
    y *= _MINUS_2_SQRT_TWO_OVER_PI  # -2u
    np.exp(y, out=y)
    y += 1
    return np.divide(x, y, out=y)


@kernel(
    "Gelu",
    Engine.ACT,
    attrs={"approximate": Attr(choice_attr("none", "tanh"), "none")},
    since=(20,),
    check=FLOAT_CHECK,
)
def _gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """Y = X * Phi(X); approximate="tanh": Phi(x) ~ (1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))/2."""
    if approximate == "tanh":
        return via_float32(_gelu_tanh, x)
    return _gelu_erf64(x) if x.dtype == np.float64 else via_float32(_gelu_erf32, x)


@kernel(
    "LogSoftmax",
    Engine.ACT,
    attrs={"axis": Attr(int_attr, -1)},
    since=(13,),  # versions 1 and 11 coerce the input to 2-D around `axis` (default 1)
    check=FLOAT_CHECK,
)
def _log_softmax(x: np.ndarray, *, axis: int) -> np.ndarray:
    """Y = X - max - ln(sum(exp(X - max))) along `axis`, in one temporary."""
    return via_float32(_shifted_log_softmax, x, axis=axis)


def _shifted_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    peak = np.max(x, axis=axis, keepdims=True)
    y = np.subtract(x, peak, out=_scratch(x))
    np.exp(y, out=y)
    total = np.log(np.sum(y, axis=axis, keepdims=True))
    np.subtract(x, peak, out=y)
    y -= total
    return y


_NOT_FLOAT32 = dtype_set("float16", "float64")


def _clip_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, (NUMBERS,), same=(0, 1, 2))
    attr_form = values["min"] is not None or values["max"] is not None
    if attr_form and len(dtypes) > 1:
        raise ValueError("bounds given both as attributes (Clip-6) and as inputs")
    if attr_form and np.dtype(dtypes[0]) not in FLOATS:
        raise ValueError(f"Clip-6 (bounds as attributes) takes floats, got {dtypes[0]}")
    if not attr_form and len(dtypes) == 1 and np.dtype(dtypes[0]) in _NOT_FLOAT32:
        # Clip-6 defaults the bounds to +-FLT_MAX, Clip-11+ to the limits of the dtype: a
        # bare Clip of float16/float64 means different things in the two versions.
        raise ValueError(f"Clip without bounds of {dtypes[0]} differs between Clip-6 and 11+")


_FLT_MAX = float(np.finfo(np.float32).max)


def _input_bound(given: np.ndarray | None, dtype: np.dtype, lowest: bool) -> np.ndarray | None:
    """A Clip-11+ bound: the input, else the dtype's lowest/highest value (None for
    integers, whose limits clip nothing)."""
    if given is not None:
        return _scalar(given, "a Clip bound")
    if dtype.kind != "f":
        return None
    info = np.finfo(dtype)
    return np.asarray(info.min if lowest else info.max, dtype=dtype)


@kernel(
    "Clip",
    Engine.ACT,
    inputs=(1, 3),
    attrs={"min": Attr(float_attr, None), "max": Attr(float_attr, None)},
    since=(6, 11, 12, 13),
    check=_clip_check,
)
def _clip(
    x: np.ndarray,
    low: np.ndarray | None = None,
    high: np.ndarray | None = None,
    *,
    min: float | None,  # the ONNX attribute names (Clip-6)
    max: float | None,
) -> np.ndarray:
    """Y = min(max(X, min), max); absent bounds are the dtype's lowest/highest value
    (Clip-6, bounds as attributes: -FLT_MAX and FLT_MAX)."""
    if min is not None or max is not None:
        floor = np.asarray(-_FLT_MAX if min is None else min).astype(x.dtype)
        ceiling = np.asarray(_FLT_MAX if max is None else max).astype(x.dtype)
        return np.clip(x, floor, ceiling)
    lo, hi = _input_bound(low, x.dtype, lowest=True), _input_bound(high, x.dtype, lowest=False)
    if lo is None and hi is None:
        return x
    return np.clip(x, lo, hi)


# ---- POOL: elementwise ---------------------------------------------------------------------


@kernel("Neg", Engine.POOL, since=(6, 13), check=dtype_check(FLOATS | SIGNED))
def _neg(x: np.ndarray) -> np.ndarray:
    """Y = -X."""
    return np.negative(x)


@kernel("Abs", Engine.POOL, since=(6, 13), check=dtype_check(NUMBERS))
def _abs(x: np.ndarray) -> np.ndarray:
    """Y = |X|."""
    return np.abs(x)


@kernel(
    "Where",
    Engine.POOL,
    inputs=(3, 3),
    since=(9, 16),
    check=dtype_check(BOOL, ALL_DTYPES, same=(1, 2)),
)
def _where(condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Output = X where condition, else Y (all three broadcast)."""
    return np.where(condition, x, y)


@kernel(
    "Equal",
    Engine.POOL,
    inputs=(2, 2),
    since=(7, 11, 13, 19),
    check=dtype_check(ALL_DTYPES, same=(0, 1)),
)
def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = (A == B), bool."""
    return np.equal(a, b)


@kernel(
    "Greater",
    Engine.POOL,
    inputs=(2, 2),
    since=(7, 9, 13),
    check=dtype_check(NUMBERS, same=(0, 1)),
)
def _greater(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = (A > B), bool."""
    return np.greater(a, b)


@kernel(
    "Less",
    Engine.POOL,
    inputs=(2, 2),
    since=(7, 9, 13),
    check=dtype_check(NUMBERS, same=(0, 1)),
)
def _less(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = (A < B), bool."""
    return np.less(a, b)


@kernel("Not", Engine.POOL, since=(1,), check=dtype_check(BOOL))
def _not(x: np.ndarray) -> np.ndarray:
    """Y = not X."""
    return np.logical_not(x)


@kernel("And", Engine.POOL, inputs=(2, 2), since=(7,), check=dtype_check(BOOL))
def _and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A and B."""
    return np.logical_and(a, b)


@kernel(
    "Cast",
    Engine.POOL,
    attrs={
        "to": Attr(_onnx_dtype_attr),
        # only casts to float8 saturate or round, and those are refused
        "saturate": Attr(flag_attr, 1),
        "round_mode": Attr(choice_attr("up", "down", "nearest"), "up"),
    },
    since=(6, 9, 13, 19, 21, 23, 24, 25, 28),
    check=dtype_check(ALL_DTYPES),
)
def _cast(x: np.ndarray, *, to: np.dtype, saturate: int, round_mode: str) -> np.ndarray:
    """Y = X converted to `to` (floats to integers truncate; nonzero to bool is True)."""
    return x if x.dtype == to else np.asarray(x).astype(to)


# ---- POOL: reductions ----------------------------------------------------------------------

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
    given = _ints(axes_input) if axes_input is not None else axes
    if not given:
        return () if noop else None
    return _axes(given, np.ndim(x))


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
    axis = _axis(axis, np.ndim(x))
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
    axis = _axis(axis, np.ndim(x))
    size = x.shape[axis]
    count = int(_scalar(k, "K"))
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


# ---- POOL: data movement -----------------------------------------------------------------

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
    dims = _ints(shape)
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
    return _ints(axes_input) if axes_input is not None else None if axes is None else list(axes)


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
    return np.squeeze(data, axis=_axes(given, np.ndim(data)))


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
    return np.expand_dims(data, _axes(given, np.ndim(data) + len(given)))


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
    axis = _axis(axis, np.ndim(x))
    size = x.shape[axis]
    if split_input is not None:
        sizes = _ints(split_input)
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
    begin, end = _ints(starts), _ints(ends)
    count = len(begin)
    which = list(range(count)) if axes is None else _ints(axes)
    stride = [1] * count if steps is None else _ints(steps)
    if not len(end) == len(which) == len(stride) == count:
        raise ValueError("starts, ends, axes and steps differ in length")
    index = [slice(None)] * np.ndim(data)
    for axis, b, e, s in zip(_axes(which, np.ndim(data)), begin, end, stride, strict=True):
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
    return np.take(data, indices, axis=_axis(axis, np.ndim(data)))


@kernel("Expand", Engine.POOL, inputs=(2, 2), since=(8, 13), check=_SHAPE_CHECK)
def _expand(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Read-only view of `x` broadcast with `shape` (both ways, as numpy does)."""
    return np.broadcast_to(x, np.broadcast_shapes(np.shape(x), tuple(_ints(shape))))


@kernel("Tile", Engine.POOL, inputs=(2, 2), since=(6, 13), check=_SHAPE_CHECK)
def _tile(x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """`x` repeated repeats[i] times along each axis i."""
    reps = _ints(repeats)
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


_CONSTANT_ATTRS = {
    "value": Attr(_tensor_value_attr, None),
    "value_float": Attr(float_attr, None),
    "value_floats": Attr(floats_attr, None),
    "value_int": Attr(int_attr, None),
    "value_ints": Attr(ints_attr, None),
    "value_string": Attr(_refused_attr("string constants"), None),
    "value_strings": Attr(_refused_attr("string constants"), None),
}


def _constant_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    given = [name for name, value in values.items() if value is not None]
    if len(given) != 1:
        raise ValueError(f"needs exactly one value attribute, got {given or 'none'}")


@kernel(
    "Constant",
    Engine.POOL,
    inputs=(0, 0),
    attrs=_CONSTANT_ATTRS,
    since=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25),
    check=_constant_check,
)
def _constant(**values: Any) -> np.ndarray:
    """The tensor its one value attribute holds (value_float(s): float32; value_int(s):
    int64)."""
    if values["value"] is not None:
        return np.asarray(values["value"])
    if values["value_float"] is not None or values["value_floats"] is not None:
        floats = values["value_float"]
        return np.array(values["value_floats"] if floats is None else floats, dtype=np.float32)
    ints = values["value_int"]
    return np.array(values["value_ints"] if ints is None else ints, dtype=np.int64)


_FLOAT_ZERO = np.zeros((), dtype=np.float32)


@kernel(
    "ConstantOfShape",
    Engine.POOL,
    attrs={"value": Attr(_fill_value_attr, None)},
    since=(9, 20, 21, 23, 24, 25),
    check=dtype_check(dtype_set("int64")),
)
def _constant_of_shape(shape: np.ndarray, *, value: np.ndarray | None) -> np.ndarray:
    """A tensor of shape `shape` filled with `value` (default float32 0)."""
    fill = _FLOAT_ZERO if value is None else value
    dims = _ints(shape)
    if min(dims, default=0) < 0:
        raise ValueError(f"negative dimension in {dims}")
    return np.full(dims, fill, dtype=fill.dtype)


@kernel(
    "Range",
    Engine.POOL,
    inputs=(3, 3),
    attrs={"stash_type": Attr(_stash_type_attr, np.dtype("float32"))},
    since=(11, 27),
    check=dtype_check(dtype_set("float16", "float32", "float64", "int16", "int32", "int64")),
)
def _range(
    start: np.ndarray, limit: np.ndarray, delta: np.ndarray, *, stash_type: np.dtype
) -> np.ndarray:
    """start + i * delta for i < max(ceil((limit - start) / delta), 0); float16 is
    computed in `stash_type`."""
    dtype = np.asarray(start).dtype
    first, last, step = (_scalar(v, "a Range input") for v in (start, limit, delta))
    if step == 0:
        raise ValueError("Range delta 0")
    if dtype.kind == "i":
        a, b, d = int(first), int(last), int(step)
        count = max(-((a - b) // d), 0)
        return (np.arange(count, dtype=np.int64) * d + a).astype(dtype, copy=False)
    work = stash_type if dtype == np.float16 else dtype
    begin, end, stride = (np.asarray(v).astype(work) for v in (first, last, step))
    count = max(math.ceil(float(end - begin) / float(stride)), 0)
    return (np.arange(count, dtype=work) * stride + begin).astype(dtype, copy=False)
