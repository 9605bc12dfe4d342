"""The one dtype policy: how a caller's values become a model input of the NEFF's dtype;
and the one shape check (`input_array`, `shape_problem`): an input's shape is the NEFF's,
but for the axes it says may vary (a dynamic batch's, a bucketed length: any size up to
its largest bucket; which bucket holds it is the runtime's to say).

Used by every path that sends inputs (the client's `Model`, `LocalRuntime`, neuron-cli
infer, validate and profile, neuron-batch), so each takes the same values and refuses the
same others, in the same words:

- the input's own dtype passes as it is (one dtype comparison, nothing else);
- a safe cast passes, converted: one whose every value is a value of the input's dtype
  (int32 to int64, float16 to float32, uint8 to float32, bool to any number);
- any other dtype passes only when each of its values survives the conversion (converted
  and back, equal; NaN stays NaN): float64 zeros or values float32 holds exactly pass, 0.1
  or 1e300 do not; int64 ids that fit in int32 pass, 2**40 does not;
- Python numbers and lists of them (not numpy arrays or scalars) have no dtype of their
  own: for a float input they are rounded to its precision, as numpy rounds them, as long
  as none overflows to infinity (`[0.1, 2]` passes for float32, `[1e300]` does not); for
  any other input their values must survive as above (`[300]` is no uint8);
- an ml_dtypes array saved in an npz file comes back as plain bytes (`|V2` for
  bfloat16): bytes of the item size of a narrow input type are taken as that type;
- a string input (dtype `string`) takes str or bytes elements as they are, an object
  array (`neuron_rtd/neff/strings.py` checks each as it goes in);
- everything else is refused (`BadInput`, NERR_INFER_BAD_INPUT) naming the input, its
  dtype, the model's, a value that does not fit and the way out: convert the values
  yourself, or ask for numpy's unsafe cast (`cast=True`, `--cast`), which keeps what it
  can: precision is lost, out-of-range floats become inf, integers wrap.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from neuron_rtd.errors import BadInput
from neuron_rtd.neff.dtypes import int_range, is_narrow, is_string, number_kind
from neuron_rtd.neff.model import TensorSpec

_NUMBERS = "biuf"  # the dtype kinds a NEFF's tensors have
_PYTHON = (bool, int, float, list, tuple)  # values np.asarray gives a dtype of its choice


def as_input(
    value: object, dtype: np.dtype, name: str, *, cast: bool = False, option: str = "cast=True"
) -> np.ndarray:
    """`value` (an array, or anything np.asarray takes) as an array of `dtype`, the NEFF's
    dtype of input `name`, under the policy above (the array itself when it has that
    dtype). `cast`: numpy's unsafe cast instead of the policy, without numpy's warnings
    (asked for, what it loses is no surprise). BadInput when a value does not fit;
    `option` names how the caller asks for the cast, in the message."""
    if is_string(dtype):  # strings: no number policy; each element is checked as it goes in
        array = np.asarray(value, dtype=object)
        if any(not isinstance(item, str | bytes) for item in array.reshape(-1)):
            raise BadInput(f"input {name!r}: the model takes strings (str or bytes elements)")
        return array
    array = np.asarray(value)
    if array.dtype == dtype:
        return array
    if _raw_bytes_of(array, dtype):  # an ml_dtypes array through npz: its bytes
        return array.view(dtype)
    if cast:
        try:
            with np.errstate(all="ignore"):  # asked for: no warning of what it loses
                return _astype(array, dtype)
        except (TypeError, ValueError) as exc:
            raise BadInput(
                f"input {name!r}: {array.dtype} cannot be cast to {dtype}: {exc}"
            ) from None
    if number_kind(array.dtype) not in _NUMBERS:
        raise BadInput(f"input {name!r} is {array.dtype}: the model takes {dtype.name} numbers")
    python = isinstance(value, _PYTHON) and not isinstance(value, np.generic)  # np.float64
    converted, lost = fitted(array, dtype, python=python)
    if lost is None:
        return converted
    what = "holds Python numbers" if python else f"is {array.dtype.name}"
    raise BadInput(
        f"input {name!r} {what}, the model takes {dtype.name}, which cannot hold its values "
        f"({lost}): convert them (.astype('{dtype.name}')) or pass {option} for numpy's "
        "unsafe cast (precision lost, out-of-range values become inf or wrap)"
    )


def input_array(
    value: object, spec: TensorSpec, *, cast: bool = False, option: str = "cast=True"
) -> np.ndarray:
    """`value` as input `spec` of a model: of its dtype (`as_input`) and of its shape
    (`shape_problem`), checked before anything is sent or run; BadInput naming what does
    not fit. Every front that takes arrays checks them here."""
    array = as_input(value, spec.dtype, spec.name, cast=cast, option=option)
    if array.shape != spec.shape:
        problem = shape_problem(array.shape, spec)
        if problem is not None:
            raise BadInput(problem)
    return array


def shape_problem(shape: tuple[int, ...], spec: TensorSpec) -> str | None:
    """What is wrong with an array of `shape` as input `spec` (None: nothing): the rank
    and each fixed axis must be the NEFF's; an axis that may vary takes any size up to
    its bound (the largest bucket's; none for an unbounded one)."""
    varying = spec.varying_axes
    fits = len(shape) == len(spec.shape) and all(
        size == want or (axis in varying and (want == 0 or size <= want))
        for axis, (size, want) in enumerate(zip(shape, spec.shape, strict=True))
    )
    if fits:
        return None
    return (
        f"input {spec.name!r} has shape {shape_text(shape)}; the model takes "
        f"{spec.describe()}: give it an array of that shape"
    )


def shape_text(shape: tuple[int, ...]) -> str:
    """`(2, 8)`, `(5,)`, `()`: as Python writes a tuple."""
    return str(tuple(int(d) for d in shape))


def fitted(
    array: np.ndarray, dtype: np.dtype, *, python: bool = False
) -> tuple[np.ndarray, str | None]:
    """`array` (of numbers) converted to `dtype`, and None when the policy takes it, else
    what happens to the first value that does not fit (`1e+300 is out of its range`).
    `python`: the values came from Python numbers (no dtype of their own)."""
    source = array.dtype
    if safe_cast(source, dtype):
        return _astype(array, dtype), None
    with np.errstate(all="ignore"):
        converted = _astype(array, dtype)
        if python and number_kind(dtype) == "f" and source.kind in "iuf":
            lost = np.isfinite(array) & ~np.isfinite(converted)
        else:
            lost = ~_kept(array, converted)
    if not lost.any():
        return converted, None
    where = int(np.flatnonzero(lost)[0])
    return converted, _what_happens(array.flat[where].item(), converted.flat[where].item(), dtype)


def _raw_bytes_of(array: np.ndarray, dtype: np.dtype) -> bool:
    """Whether `array` is plain bytes (void, no fields) of `dtype`'s item size, `dtype`
    a narrow type: what an npz file gives back for an ml_dtypes array, which it stores
    as bytes (`|V2` for bfloat16)."""
    plain = array.dtype.kind == "V" and array.dtype.fields is None and not is_narrow(array.dtype)
    return plain and is_narrow(dtype) and array.dtype.itemsize == dtype.itemsize


def _kept(array: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """Where `array`'s values are `converted`'s: converted back they are as they were
    (NaN as NaN), and within the range of an integer type (a value that wraps around
    and back, -1 to uint8 255 to int8 -1, is not kept)."""
    back = _astype(converted, array.dtype)
    kept = back == array
    if number_kind(array.dtype) == "f" and number_kind(converted.dtype) == "f":
        kept |= np.isnan(array) & np.isnan(back)
    if number_kind(converted.dtype) in "iu" and number_kind(array.dtype) != "b":
        low, high = int_range(converted.dtype)
        wide = array.astype(np.float64) if is_narrow(array.dtype) else array
        kept &= (wide >= low) & (wide <= high)
    return np.asarray(kept)


@functools.lru_cache(maxsize=256)
def safe_cast(source: np.dtype, target: np.dtype) -> bool:
    """Whether every value of `source` is a value of `target`: numpy's safe casts, less
    those of integers wider than the float's mantissa (int64 to float64). Where one is
    a narrow type of ml_dtypes (whose own safe casts are not all safe: int8 to float8)
    every value of `source` is tried, when it has at most 2**16 of them."""
    if source == target:
        return True
    if is_narrow(source) or is_narrow(target):
        return source.itemsize <= 2 and _holds_every_value(source, target)
    if not np.can_cast(source, target, "safe"):
        return False
    if source.kind in "iu" and target.kind == "f":
        bits = source.itemsize * 8 - (source.kind == "i")
        return bits <= np.finfo(target).nmant + 1
    return True


def _holds_every_value(source: np.dtype, target: np.dtype) -> bool:
    """Whether each value of `source` (a type of one or two bytes) comes back from
    `target` as it was."""
    with np.errstate(all="ignore"):
        if source.kind == "b":
            values = np.array([False, True])
        else:  # each value once (a 4-bit type's byte has 16 of them, in 256 patterns)
            patterns = np.arange(256**source.itemsize, dtype=f"<u{source.itemsize}")
            wide = _astype(patterns.view(source), np.dtype(np.float64))
            values = _astype(np.unique(wide), source)
        return bool(_kept(values, _astype(values, target)).all())


def _astype(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array.astype(dtype)`; between narrow types ml_dtypes does not convert directly
    (int4 to uint4, a float8 to float8_e8m0fnu) through int64 for integers, else float32
    (each holds every value of theirs)."""
    try:
        return array.astype(dtype)
    except TypeError:
        if not (is_narrow(array.dtype) and is_narrow(dtype)):
            raise
    integers = number_kind(array.dtype) in "iu" and number_kind(dtype) in "iu"
    return array.astype(np.int64 if integers else np.float32).astype(dtype)


def _what_happens(value: float, converted: float, dtype: np.dtype) -> str:
    """`1e+300 is out of its range`, `300 is out of its range, -128 to 127`, `0.1 would
    become 0.10000000149011612` (`value` and `converted` are numbers: ints, floats, bools)."""
    finite = math.isfinite(value)
    kind = number_kind(dtype)
    if finite and kind in "iu":
        low, high = int_range(dtype)
        if not low <= value <= high:
            return f"{value!r} is out of its range, {low} to {high}"
    if finite and kind == "f" and not math.isfinite(converted):
        return f"{value!r} is out of its range"
    return f"{value!r} would become {converted!r}"
