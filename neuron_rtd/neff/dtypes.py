"""The element types a NEFF may carry, by their JSON names.

Every tensor and weight in a NEFF is stored little-endian; `parse_dtype` turns a JSON
name into that little-endian numpy dtype, and `dtype_name` goes the other way.

Besides numpy's own types a NEFF carries the narrow ones of ml_dtypes (bfloat16, the
float8 types, float4_e2m1fn, int4/uint4, int2/uint2), named as ml_dtypes names them.
Each element takes one byte or more, as those arrays hold them in memory: a 4-bit or
2-bit element is one byte whose low bits hold the value (ONNX packs two or four to a
byte; a NEFF does not). So a tensor's bytes are its array's bytes, `itemsize * size`,
everywhere a tensor travels (weights mapped in place, device DRAM, the wire, shared
memory), and a client sends `array.tobytes()` of its ml_dtypes array. The cost is two
(4-bit) or four (2-bit) times the bytes of packed storage.

numpy calls these types kind "V" (void; float8_e5m2 "f"), and numpy's safe casts among
them are not all safe; `is_narrow` tells them, `number_kind` says what they are ("f",
"i", "u") and `int_range` gives an integer type's limits, for the code that reasons about
values (`casting`).

One more element type is not a number: `string` (ONNX's STRING, the v2 protocol's BYTES),
held as numpy object arrays. Its elements vary in length, so a string tensor has no
`itemsize * size` bytes: only CPU nodes (onnxruntime) touch one, never an NC or a weight,
and where it travels as bytes it takes Triton's encoding (`neuron_rtd/neff/strings.py`).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from neuron_rtd.errors import NeffInvalid

NUMPY_DTYPES: tuple[str, ...] = (
    "float16",
    "float32",
    "float64",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
)
# ml_dtypes' narrow types, by number kind.
NARROW_FLOATS: tuple[str, ...] = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
)
NARROW_SIGNED: tuple[str, ...] = ("int4", "int2")
NARROW_UNSIGNED: tuple[str, ...] = ("uint4", "uint2")
NARROW_DTYPES: tuple[str, ...] = NARROW_FLOATS + NARROW_SIGNED + NARROW_UNSIGNED
ALLOWED_DTYPES: tuple[str, ...] = NUMPY_DTYPES + NARROW_DTYPES
"""The numbers: the element types an NC holds and a weight may have."""
STRING = "string"
STRING_DTYPE = np.dtype(object)  # a string tensor's elements: Python str or bytes objects
TENSOR_DTYPES: tuple[str, ...] = (*ALLOWED_DTYPES, STRING)
"""Every element type a NEFF's tensors may have."""

_BY_NAME: dict[str, np.dtype] = {
    name: np.dtype(getattr(ml_dtypes, name, name)).newbyteorder("<") for name in ALLOWED_DTYPES
}
_BY_NAME[STRING] = STRING_DTYPE
_NARROW_KINDS: dict[np.dtype, str] = {
    **{_BY_NAME[name]: "f" for name in NARROW_FLOATS},
    **{_BY_NAME[name]: "i" for name in NARROW_SIGNED},
    **{_BY_NAME[name]: "u" for name in NARROW_UNSIGNED},
}


def parse_dtype(name: object, where: str) -> np.dtype:
    """The little-endian dtype named `name`; NeffInvalid naming `where` if it is not allowed."""
    if not isinstance(name, str) or name not in _BY_NAME:
        allowed = ", ".join(TENSOR_DTYPES)
        raise NeffInvalid(f"{where}: unknown dtype {name!r} (allowed: {allowed})")
    return _BY_NAME[name]


def dtype_name(dtype: np.dtype) -> str:
    """The JSON name of `dtype` (byte order dropped: the file is little-endian)."""
    return STRING if dtype == STRING_DTYPE else dtype.name


def is_string(dtype: np.dtype) -> bool:
    """Whether `dtype` is a string tensor's (numpy's object dtype)."""
    return dtype == STRING_DTYPE


def is_narrow(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of ml_dtypes' narrow types (numpy's own rules, such as its
    safe casts and `kind`, do not hold for them)."""
    return dtype in _NARROW_KINDS


def number_kind(dtype: np.dtype) -> str:
    """numpy's kind of `dtype` ("b", "i", "u", "f", ...), with ml_dtypes' narrow types,
    which numpy calls "V", as the numbers they are: "f" for bfloat16, float8 and
    float4, "i" for int4 and int2, "u" for uint4 and uint2."""
    return _NARROW_KINDS.get(dtype, dtype.kind)


@functools.lru_cache(maxsize=64)
def int_range(dtype: np.dtype) -> tuple[int, int]:
    """The least and greatest value of integer `dtype` (numpy's or a narrow one)."""
    info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


def little_endian(array: np.ndarray) -> np.ndarray:
    """`array` as a C-contiguous little-endian array (no copy when it already is one)."""
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
