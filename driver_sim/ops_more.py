"""More elementwise ops of the NeuronCore: rounding, trigonometry, variadic Max/Min/Sum/
Mean, boolean Or/Xor, the inclusive comparisons, NaN/Inf tests, and a few activations.
Detectors and exported models use these between the ops of the core library; on the NC
they keep such graphs from being cut into many NC/CPU pieces."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.kernels import (
    BOOL,
    FLOAT_CHECK,
    FLOATS,
    NUMBERS,
    VARIADIC,
    Attr,
    dtype_check,
    flag_attr,
    float_attr,
    kernel,
)


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


@kernel("Sign", Engine.POOL, since=(9, 13), check=dtype_check(NUMBERS))
def _sign(x: np.ndarray) -> np.ndarray:
    """Y = -1, 0 or 1 by the sign of X."""
    return np.sign(x)


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


_BOOLS = dtype_check(BOOL, same=(0, 1))


@kernel("Or", Engine.POOL, inputs=(2, 2), since=(7,), check=_BOOLS)
def _or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A or B."""
    return np.logical_or(a, b)


@kernel("Xor", Engine.POOL, inputs=(2, 2), since=(7,), check=_BOOLS)
def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A xor B."""
    return np.logical_xor(a, b)


_COMPARABLE = dtype_check(NUMBERS, same=(0, 1))


@kernel("GreaterOrEqual", Engine.POOL, inputs=(2, 2), since=(12, 16), check=_COMPARABLE)
def _greater_or_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = (A >= B), bool."""
    return np.greater_equal(a, b)


@kernel("LessOrEqual", Engine.POOL, inputs=(2, 2), since=(12, 16), check=_COMPARABLE)
def _less_or_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = (A <= B), bool."""
    return np.less_equal(a, b)


@kernel("IsNaN", Engine.POOL, since=(9, 13, 20), check=FLOAT_CHECK)
def _is_nan(x: np.ndarray) -> np.ndarray:
    """Y = X is NaN, bool."""
    return np.isnan(x)


@kernel(
    "IsInf",
    Engine.POOL,
    attrs={"detect_negative": Attr(flag_attr, 1), "detect_positive": Attr(flag_attr, 1)},
    since=(10, 20),
    check=FLOAT_CHECK,
)
def _is_inf(x: np.ndarray, *, detect_negative: int, detect_positive: int) -> np.ndarray:
    """Y = X is an infinity of a detected sign, bool."""
    if detect_negative and detect_positive:
        return np.isinf(x)
    if detect_negative:
        return np.isneginf(x)
    if detect_positive:
        return np.isposinf(x)
    return np.zeros(np.shape(x), dtype=bool)


def _keep_dtype(fn: Any) -> Any:
    """fn's result in its input's float dtype (numpy may widen a float16 on the way)."""

    @functools.wraps(fn)
    def wrapped(x: np.ndarray, **attrs: Any) -> np.ndarray:
        return np.asarray(fn(x, **attrs)).astype(x.dtype, copy=False)

    return wrapped


@kernel("Elu", Engine.ACT, attrs={"alpha": Attr(float_attr, 1.0)}, since=(6, 22), check=FLOAT_CHECK)
@_keep_dtype
def _elu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X for X > 0, alpha * (exp(X) - 1) otherwise."""
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel(
    "Selu",
    Engine.ACT,
    attrs={
        "alpha": Attr(float_attr, 1.67326319217681884765625),
        "gamma": Attr(float_attr, 1.05070102214813232421875),
    },
    since=(6, 22),
    check=FLOAT_CHECK,
)
@_keep_dtype
def _selu(x: np.ndarray, *, alpha: float, gamma: float) -> np.ndarray:
    """Y = gamma * X for X > 0, gamma * alpha * (exp(X) - 1) otherwise."""
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel("Softsign", Engine.ACT, since=(1, 22), check=FLOAT_CHECK)
@_keep_dtype
def _softsign(x: np.ndarray) -> np.ndarray:
    """Y = X / (1 + |X|)."""
    return x / (1 + np.abs(x))


@kernel("HardSwish", Engine.ACT, since=(14, 22), check=FLOAT_CHECK)
@_keep_dtype
def _hard_swish(x: np.ndarray) -> np.ndarray:
    """Y = X * max(0, min(1, X / 6 + 1 / 2))."""
    return x * np.clip(x / 6 + 0.5, 0, 1)
