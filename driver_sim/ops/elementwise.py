"""Elementwise arithmetic of the NeuronCore: Add, Sub, Mul, Div, Neg, Abs, Sign, the
variadic Max, Min, Sum and Mean, Clip, rounding (Floor, Ceil, Round), and the math
functions Sqrt, Exp, Log, Reciprocal, Pow, Sin, Cos, Tan, their inverses and the hyperbolic
functions and theirs. The binary and variadic ops
broadcast their inputs as numpy does. The math functions and Clip run on the ACT engine,
the rest on POOL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOAT_CHECK,
    FLOATS,
    NUMBERS,
    SIGNED,
    VARIADIC,
    Attr,
    check_dtypes,
    dtype_check,
    dtype_set,
    float_attr,
    kernel,
    scalar,
    scratch_like,
)

_BINARY_SINCE = (7, 13, 14)  # version 6 and older broadcast only by attribute
_BINARY_CHECK = dtype_check(NUMBERS, same=(0, 1))


@kernel(
    "Add",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A + B (integers wrap)."""
    return np.add(a, b)


@kernel(
    "Sub",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A - B (integers wrap)."""
    return np.subtract(a, b)


@kernel(
    "Mul",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A * B (integers wrap)."""
    return np.multiply(a, b)


@kernel(
    "Div",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A / B; integer division truncates toward zero, as in C."""
    if a.dtype.kind == "f":
        return np.divide(a, b)
    quotient = np.floor_divide(a, b)
    if a.dtype.kind == "u":
        return quotient
    # floor and truncation differ where the division is inexact and the signs differ
    inexact = np.remainder(a, b) != 0
    fix = inexact & (np.less(a, 0) != np.less(b, 0))
    return np.add(quotient, fix, dtype=quotient.dtype)


@kernel("Neg", Engine.POOL, since=(6, 13), check=dtype_check(FLOATS | SIGNED))
def _neg(x: np.ndarray) -> np.ndarray:
    """Y = -X."""
    return np.negative(x)


@kernel("Abs", Engine.POOL, since=(6, 13), check=dtype_check(NUMBERS))
def _abs(x: np.ndarray) -> np.ndarray:
    """Y = |X|."""
    return np.abs(x)


@kernel("Sign", Engine.POOL, since=(9, 13), check=dtype_check(NUMBERS))
def _sign(x: np.ndarray) -> np.ndarray:
    """Y = -1, 0 or 1 by the sign of X."""
    return np.sign(x)


def _unary(op: str, since: tuple[int, ...], fn: Any, doc: str, engine: Engine = Engine.ACT) -> None:
    """Register a float-only elementwise op computing `fn(x)`."""

    def compute(x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(x))

    compute.__doc__ = doc
    kernel(op, engine, since=since, check=FLOAT_CHECK)(compute)


_unary("Floor", (6, 13), np.floor, "Y = floor(X).", Engine.POOL)
_unary("Ceil", (6, 13), np.ceil, "Y = ceil(X).", Engine.POOL)
_unary("Round", (11, 22), np.round, "Y = X rounded half to even.", Engine.POOL)
_unary("Sin", (7, 22), np.sin, "Y = sin(X).")
_unary("Cos", (7, 22), np.cos, "Y = cos(X).")
_unary("Tan", (7, 22), np.tan, "Y = tan(X).")
_unary("Asin", (7, 22), np.arcsin, "Y = arcsin(X).")
_unary("Acos", (7, 22), np.arccos, "Y = arccos(X).")
_unary("Atan", (7, 22), np.arctan, "Y = arctan(X).")
_unary("Sinh", (9, 22), np.sinh, "Y = sinh(X).")
_unary("Cosh", (9, 22), np.cosh, "Y = cosh(X).")
_unary("Asinh", (9, 22), np.arcsinh, "Y = arsinh(X).")
_unary("Acosh", (9, 22), np.arccosh, "Y = arcosh(X).")
_unary("Atanh", (9, 22), np.arctanh, "Y = artanh(X).")


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
    root = np.sqrt(x, out=scratch_like(x))
    root += 0  # -0 + 0 is +0
    np.copyto(root, np.inf, where=np.isneginf(x))
    return root


def _fold(fn: Any, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """fn over the inputs, broadcasting, in one accumulator after the first step."""
    if len(arrays) == 1:
        return np.array(arrays[0], copy=True)
    out = fn(arrays[0], arrays[1])
    for array in arrays[2:]:
        if np.broadcast_shapes(out.shape, array.shape) == out.shape:
            fn(out, array, out=out)  # `out` is our own array: safe to write
        else:
            out = fn(out, array)
    return np.asarray(out)


_SAME = dtype_check(NUMBERS, same=tuple(range(64)))


@kernel("Max", Engine.POOL, inputs=VARIADIC, since=(8, 12, 13), check=_SAME)
def _max(*arrays: np.ndarray) -> np.ndarray:
    """Y = the elementwise maximum of the inputs (NaN wins)."""
    return _fold(np.maximum, arrays)


@kernel("Min", Engine.POOL, inputs=VARIADIC, since=(8, 12, 13), check=_SAME)
def _min(*arrays: np.ndarray) -> np.ndarray:
    """Y = the elementwise minimum of the inputs (NaN wins)."""
    return _fold(np.minimum, arrays)


_SAME_FLOAT = dtype_check(FLOATS, same=tuple(range(64)))


@kernel("Sum", Engine.POOL, inputs=VARIADIC, since=(8, 13), check=_SAME_FLOAT)
def _sum(*arrays: np.ndarray) -> np.ndarray:
    """Y = the elementwise sum of the inputs."""
    return _fold(np.add, arrays)


@kernel("Mean", Engine.POOL, inputs=VARIADIC, since=(8, 13), check=_SAME_FLOAT)
def _mean(*arrays: np.ndarray) -> np.ndarray:
    """Y = the elementwise mean of the inputs."""
    total = _fold(np.add, arrays)
    return np.divide(total, len(arrays)).astype(total.dtype, copy=False)


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
        return scalar(given, "a Clip bound")
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
