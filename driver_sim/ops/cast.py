"""Cast and CastLike (POOL engine): conversion between the element types the NeuronCore
holds, numpy's and ml_dtypes' narrow ones (bfloat16, float8, float4, 4- and 2-bit
integers), as ONNX defines it:

- floats to floats round to nearest even; out of range they become infinity (or NaN, in
  a type without infinity); floats to integers truncate; integers to narrower integers
  keep their low bits (200 becomes -56 in int8, 9 becomes -7 in int4); nonzero to bool
  is True;
- to the four float8 types of ONNX (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) with `saturate`
  (the default) a value beyond the greatest finite one, infinity included, becomes that
  value (448 for e4m3fn); without it, it becomes what the type has (infinity in e5m2,
  NaN in the others);
- to float8_e8m0fnu (a power of two: exponent only) a value's exponent is kept and its
  fraction rounded as `round_mode` says (up, the default; down; nearest, a tie going
  up); with `saturate` nothing rounds past the greatest exponent and infinity becomes
  it, without it both become NaN. Negative values convert as their magnitude (ONNX
  leaves them unspecified).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    HELD_DTYPES,
    NARROW,
    NARROW_INTEGERS,
    Attr,
    choice_attr,
    dtype_check,
    flag_attr,
    kernel,
    onnx_dtype_attr,
)

# The float8 types whose conversion `saturate` governs.
SATURATING = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_F32_NAN_EXPONENT = 0xFF  # a float32's biased exponent of infinity and NaN (as in e8m0)
_E8M0_MAX = 0xFE  # e8m0's greatest exponent (2**127)
_FRACTION = 0x7FFFFF  # a float32's fraction bits
_HALF = 0x400000  # the fraction bit worth half the exponent's step


def convert(x: np.ndarray, to: np.dtype, *, saturate: bool = True, round_mode: str = "up") -> Any:
    """`x` converted to `to` as ONNX's Cast does (see the module's docstring)."""
    if x.dtype == to:
        return x
    if to == E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in SATURATING and saturate:
        return _astype(_saturated(x, to), to)
    return _astype(x, to)


def _saturated(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """`x` with every value beyond the greatest finite one of `to` (infinities too)
    made that value, in float32 (float64 kept: one rounding, not two)."""
    wide = x if x.dtype == np.float64 else _astype(x, np.dtype(np.float32))
    limit = float(ml_dtypes.finfo(to).max)
    return np.clip(wide, -limit, limit)


def _astype(x: np.ndarray, to: np.dtype) -> Any:
    """`x.astype(to)`; between narrow types ml_dtypes does not convert directly (int4 to
    uint4, float8 to float8_e8m0fnu) through int64 for integers (low bits kept), else
    through float32 (which holds every value of theirs)."""
    try:
        return np.asarray(x).astype(to)
    except TypeError:
        if x.dtype not in NARROW or to not in NARROW:
            raise
    via = np.int64 if x.dtype in NARROW_INTEGERS and to in NARROW_INTEGERS else np.float32
    return np.asarray(x).astype(via).astype(to)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """`x` as float8_e8m0fnu: each value's float32 exponent, its fraction rounded."""
    bits = np.ascontiguousarray(_astype(x, np.dtype(np.float32))).view(np.uint32)
    exponent = (bits >> 23) & _F32_NAN_EXPONENT
    fraction = bits & _FRACTION
    special = exponent == _F32_NAN_EXPONENT
    if round_mode == "up":
        up = fraction != 0
    elif round_mode == "nearest":  # at least half a step; a tie goes up (but from 0)
        up = ((fraction & _HALF) != 0) & ((exponent > 0) | ((fraction & (_HALF - 1)) != 0))
    else:
        up = np.zeros(bits.shape, dtype=bool)
    if saturate:
        up &= exponent < _E8M0_MAX
    result = exponent + up
    result[special] = _F32_NAN_EXPONENT
    if saturate:
        result[special & (fraction == 0)] = _E8M0_MAX  # infinity
    return result.astype(np.uint8).view(E8M0)


_ROUNDING = {
    "saturate": Attr(flag_attr, 1),
    "round_mode": Attr(choice_attr("up", "down", "nearest"), "up"),
}


@kernel(
    "Cast",
    Engine.POOL,
    attrs={"to": Attr(onnx_dtype_attr), **_ROUNDING},
    since=(6, 9, 13, 19, 21, 23, 24, 25, 28),
    check=dtype_check(HELD_DTYPES),
)
def _cast(x: np.ndarray, *, to: np.dtype, saturate: int, round_mode: str) -> np.ndarray:
    """Y = X converted to `to`."""
    return convert(x, to, saturate=bool(saturate), round_mode=round_mode)


@kernel(
    "CastLike",
    Engine.POOL,
    inputs=(2, 2),
    attrs=_ROUNDING,
    since=(15, 19, 21, 23, 24, 25),
    check=dtype_check(HELD_DTYPES),
)
def _cast_like(
    x: np.ndarray, target_type: np.ndarray, *, saturate: int, round_mode: str
) -> np.ndarray:
    """Y = X converted to the element type of `target_type` (its values are not read)."""
    return convert(x, target_type.dtype, saturate=bool(saturate), round_mode=round_mode)
