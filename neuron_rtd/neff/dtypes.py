"""The element types a NEFF may carry, by their JSON names.

Every tensor and weight in a NEFF is stored little-endian; `parse_dtype` turns a JSON
name into that little-endian numpy dtype, and `dtype_name` goes the other way.
"""

from __future__ import annotations

import numpy as np

from neuron_rtd.errors import NeffInvalid

ALLOWED_DTYPES: tuple[str, ...] = (
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


def parse_dtype(name: object, where: str) -> np.dtype:
    """The little-endian dtype named `name`; NeffInvalid naming `where` if it is not allowed."""
    if not isinstance(name, str) or name not in ALLOWED_DTYPES:
        allowed = ", ".join(ALLOWED_DTYPES)
        raise NeffInvalid(f"{where}: unknown dtype {name!r} (allowed: {allowed})")
    return np.dtype(name).newbyteorder("<")


def dtype_name(dtype: np.dtype) -> str:
    """The JSON name of `dtype` (byte order dropped: the file is little-endian)."""
    return dtype.name


def little_endian(array: np.ndarray) -> np.ndarray:
    """`array` as a C-contiguous little-endian array (no copy when it already is one)."""
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
