"""Integer bits and remainders on the NeuronCore (POOL engine): BitwiseAnd, BitwiseOr,
BitwiseXor, BitwiseNot, BitShift, Mod, and BitCast (the bits of one element type read as
another). The binary ops broadcast their inputs as numpy does and take inputs of one
dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOATS,
    HELD_DTYPES,
    INTEGERS,
    NARROW_FLOATS,
    NARROW_INTEGERS,
    SIGNED,
    Attr,
    check_dtypes,
    choice_attr,
    dtype_check,
    flag_attr,
    kernel,
    onnx_dtype_attr,
)

_INTEGER_PAIR = dtype_check(INTEGERS, same=(0, 1))


@kernel("BitwiseAnd", Engine.POOL, inputs=(2, 2), since=(18,), check=_INTEGER_PAIR)
def _bitwise_and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A & B."""
    return np.bitwise_and(a, b)


@kernel("BitwiseOr", Engine.POOL, inputs=(2, 2), since=(18,), check=_INTEGER_PAIR)
def _bitwise_or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A | B."""
    return np.bitwise_or(a, b)


@kernel("BitwiseXor", Engine.POOL, inputs=(2, 2), since=(18,), check=_INTEGER_PAIR)
def _bitwise_xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A ^ B."""
    return np.bitwise_xor(a, b)


@kernel("BitwiseNot", Engine.POOL, since=(18,), check=dtype_check(INTEGERS))
def _bitwise_not(x: np.ndarray) -> np.ndarray:
    """Y = ~X."""
    return np.invert(x)


@kernel(
    "BitShift",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"direction": Attr(choice_attr("LEFT", "RIGHT"))},
    since=(11, 28),  # 11 shifts unsigned integers only, 28 signed ones too
    check=_INTEGER_PAIR,
)
def _bit_shift(x: np.ndarray, y: np.ndarray, *, direction: str) -> np.ndarray:
    """Z = X shifted by Y bits: a left shift drops the bits it moves out of the type (the
    sign bit too); a right shift of a signed type copies the sign bit in. A shift by a
    negative amount or by the type's width or more gives what the sign alone gives: -1
    for a right shift of a negative X, else 0."""
    x, y = np.broadcast_arrays(x, y)
    width = x.dtype.itemsize * 8
    valid = (y >= 0) & (y < width)
    amount = np.where(valid, y, 0)
    if direction == "LEFT":
        unsigned = np.dtype(f"<u{x.dtype.itemsize}")
        shifted = np.left_shift(x.view(unsigned), amount.view(unsigned)).view(x.dtype)
        return np.where(valid, shifted, 0).astype(x.dtype, copy=False)
    fill = np.where(x < 0, -1, 0) if x.dtype in SIGNED else 0  # the sign bit, copied in
    return np.where(valid, np.right_shift(x, amount), fill).astype(x.dtype, copy=False)


@kernel(
    "Mod",
    Engine.POOL,
    inputs=(2, 2),
    attrs={"fmod": Attr(flag_attr, 0)},
    since=(10, 13, 28),
    check=dtype_check(INTEGERS | FLOATS, same=(0, 1)),
)
def _mod(a: np.ndarray, b: np.ndarray, *, fmod: int) -> np.ndarray:
    """C = A mod B: with `fmod` 0, A - floor(A / B) * B (the sign of B, as Python's %);
    with 1, A - trunc(A / B) * B (the sign of A, as C's fmod). Floats: a zero B or an
    infinite A gives NaN; an integer remainder by 0 is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b) if fmod else np.mod(a, b)


def _width(dtype: np.dtype) -> int:
    """The bits of an element of `dtype` (4 for int4, though it takes a byte)."""
    if dtype in NARROW_INTEGERS:
        return int(ml_dtypes.iinfo(dtype).bits)
    if dtype in NARROW_FLOATS:
        return int(ml_dtypes.finfo(dtype).bits)
    return dtype.itemsize * 8


def _bitcast_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [HELD_DTYPES])
    source, target = np.dtype(dtypes[0]), values["to"]
    if _width(source) != _width(target):
        raise ValueError(
            f"BitCast needs types of one width: {source.name} has {_width(source)} bits, "
            f"{target.name} {_width(target)}"
        )


@kernel(
    "BitCast",
    Engine.POOL,
    attrs={"to": Attr(onnx_dtype_attr)},
    since=(26,),
    check=_bitcast_check,
)
def _bitcast(x: np.ndarray, *, to: np.dtype) -> np.ndarray:
    """Y = the bits of X read as `to` (little-endian; a 4- or 2-bit element's bits are the
    low bits of its byte)."""
    return np.ascontiguousarray(x).view(to).reshape(x.shape)
