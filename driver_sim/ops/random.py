"""Random ops: RandomUniform, RandomNormal, their -Like forms, Bernoulli, and Dropout
(its inference form, which draws nothing).

They draw from the generator of the NeuronCore that runs them (`current_rng`), which the
runtime seeds per NCG (`random_seed`): after the same seed, the same draws. A node with a
`seed` attribute draws from a generator of that seed instead, the same numbers every run.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import FLOATS, Attr, float_attr, ints_attr, kernel

_state = threading.local()
_fallback = np.random.default_rng()  # for runs outside a NeuronCore (host CPU nodes)


def use_rng(rng: np.random.Generator | None) -> None:
    """Random ops run in this thread from now on draw from `rng` (None: a generator of
    the process). A NeuronCore sets its own for the length of a run."""
    _state.rng = rng


def current_rng(seed: float | None) -> np.random.Generator:
    if seed is not None:
        return np.random.default_rng(int(seed))
    rng = getattr(_state, "rng", None)
    return rng if rng is not None else _fallback


_FLOAT_CODES: dict[int, np.dtype[Any]] = {
    1: np.dtype("float32"),
    10: np.dtype("float16"),
    11: np.dtype("float64"),
}
_BERNOULLI_CODES: dict[int, np.dtype[Any]] = {
    **_FLOAT_CODES,
    2: np.dtype("uint8"),
    3: np.dtype("int8"),
    5: np.dtype("int16"),
    6: np.dtype("int32"),
    7: np.dtype("int64"),
    9: np.dtype("bool"),
}


def _dtype_attr(codes: Mapping[int, np.dtype]) -> Any:
    def parse(value: Any) -> np.dtype:
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"must be an integer element type, got {value!r}")
        if int(value) not in codes:
            raise ValueError(f"element type {value} is not implemented here")
        return codes[int(value)]

    return parse


def _float_dtype_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    for dtype in dtypes:
        if dtype not in FLOATS:
            raise ValueError(f"input dtype {dtype} is not implemented (floats only)")


_COMMON = {"seed": Attr(float_attr, None)}
_UNIFORM = {**_COMMON, "low": Attr(float_attr, 0.0), "high": Attr(float_attr, 1.0)}
_NORMAL = {**_COMMON, "mean": Attr(float_attr, 0.0), "scale": Attr(float_attr, 1.0)}


def _uniform(rng: np.random.Generator, shape: Sequence[int], low: float, high: float) -> Any:
    return rng.uniform(low, high, tuple(shape))


def _normal(rng: np.random.Generator, shape: Sequence[int], mean: float, scale: float) -> Any:
    return rng.normal(mean, scale, tuple(shape))


def _register(op: str, attrs: Mapping[str, Attr], draw: Any, what: str) -> None:
    """`op` (values of its `shape`, float32 unless `dtype` says) and `op`Like (values of
    its input's shape and dtype unless `dtype` says), both drawn by `draw`."""

    def fixed(
        *, shape: tuple[int, ...], dtype: np.dtype, seed: float | None, **params: float
    ) -> np.ndarray:
        return np.asarray(draw(current_rng(seed), shape, **params), dtype=dtype)

    def like(
        x: np.ndarray, *, dtype: np.dtype | None, seed: float | None, **params: float
    ) -> np.ndarray:
        return np.asarray(draw(current_rng(seed), x.shape, **params), dtype=dtype or x.dtype)

    fixed.__doc__ = f"Y[shape] {what}."
    like.__doc__ = f"Y of X's shape (and dtype unless given) {what}."
    codes = _dtype_attr(_FLOAT_CODES)
    kernel(
        op,
        Engine.ACT,
        inputs=(0, 0),
        attrs={**attrs, "shape": Attr(ints_attr), "dtype": Attr(codes, np.dtype("float32"))},
        since=(1, 22),
    )(fixed)
    kernel(
        f"{op}Like",
        Engine.ACT,
        attrs={**attrs, "dtype": Attr(codes, None)},
        since=(1, 22),
        check=_float_dtype_check,
    )(like)


_register("RandomUniform", _UNIFORM, _uniform, "drawn uniformly from [low, high)")
_register("RandomNormal", _NORMAL, _normal, "drawn from the normal distribution N(mean, scale^2)")

# The ops that draw from the NC's own generator (`use_rng`).
RANDOM_OPS = frozenset(
    {"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli"}
)


@kernel(
    "Bernoulli",
    Engine.ACT,
    attrs={**_COMMON, "dtype": Attr(_dtype_attr(_BERNOULLI_CODES), None)},
    since=(15, 22),
    check=_float_dtype_check,
)
def _bernoulli(x: np.ndarray, *, dtype: np.dtype | None, seed: float | None) -> np.ndarray:
    """Y = 1 with probability X, else 0 (elementwise)."""
    draws = current_rng(seed).uniform(0.0, 1.0, x.shape) < x
    return draws.astype(dtype or x.dtype)


def _dropout_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    _float_dtype_check(dtypes[:2], values)
    if len(dtypes) > 2:
        raise ValueError("the training_mode input (dropping at random) is not implemented")


@kernel(
    "Dropout",
    Engine.ACT,
    inputs=(1, 2),
    outputs=(1, 2),
    attrs={**_COMMON, "ratio": Attr(float_attr, 0.5)},  # ratio: the attribute of version 10
    since=(10, 12, 13, 22),
    check=_dropout_check,
)
def _dropout(
    data: np.ndarray, ratio_input: np.ndarray | None = None, *, seed: float | None, ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """(output, mask) of inference, where nothing drops: the data itself and a mask of
    ones (True)."""
    return data, np.ones(data.shape, dtype=bool)
