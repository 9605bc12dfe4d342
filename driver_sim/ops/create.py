"""Ops that make a tensor rather than transform one (POOL engine): Constant (from its
one value attribute), ConstantOfShape, Range and EyeLike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    ALL_DTYPES,
    ONNX_DTYPES,
    Attr,
    dtype_check,
    dtype_set,
    float_attr,
    floats_attr,
    int_attr,
    int_values,
    ints_attr,
    kernel,
    onnx_dtype_attr,
    scalar,
    tensor_attr,
)


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


def _stash_type_attr(value: Any) -> np.dtype:
    code = int_attr(value)
    if code not in (1, 11):
        raise ValueError(f"must be 1 (float) or 11 (double), got {code}")
    return ONNX_DTYPES[code]


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
    dims = int_values(shape)
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
    first, last, step = (scalar(v, "a Range input") for v in (start, limit, delta))
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


@kernel(
    "EyeLike",
    Engine.POOL,
    attrs={"dtype": Attr(onnx_dtype_attr, None), "k": Attr(int_attr, 0)},
    since=(9, 22),
    check=dtype_check(ALL_DTYPES),
)
def _eye_like(x: np.ndarray, *, dtype: np.dtype | None, k: int) -> np.ndarray:
    """A 2-D tensor of X's shape (and dtype unless given) with ones on the k-th diagonal
    (positive: above the main one) and zeros elsewhere."""
    if x.ndim != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {x.shape}")
    return np.eye(x.shape[0], x.shape[1], k, dtype=dtype or x.dtype)
