"""Boolean ops and comparisons of the NeuronCore (POOL engine), in one place: Not, And,
Or, Xor; Equal, Greater, Less, GreaterOrEqual, LessOrEqual; the tests IsNaN and IsInf;
and Where, which selects by a boolean condition. All but Where give bool tensors.
"""

from __future__ import annotations

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    BOOL,
    FLOAT_CHECK,
    NUMBERS,
    Attr,
    dtype_check,
    flag_attr,
    kernel,
)


@kernel("Not", Engine.POOL, since=(1,), check=dtype_check(BOOL))
def _not(x: np.ndarray) -> np.ndarray:
    """Y = not X."""
    return np.logical_not(x)


@kernel("And", Engine.POOL, inputs=(2, 2), since=(7,), check=dtype_check(BOOL))
def _and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A and B."""
    return np.logical_and(a, b)


_BOOLS = dtype_check(BOOL, same=(0, 1))


@kernel("Or", Engine.POOL, inputs=(2, 2), since=(7,), check=_BOOLS)
def _or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A or B."""
    return np.logical_or(a, b)


@kernel("Xor", Engine.POOL, inputs=(2, 2), since=(7,), check=_BOOLS)
def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A xor B."""
    return np.logical_xor(a, b)


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
