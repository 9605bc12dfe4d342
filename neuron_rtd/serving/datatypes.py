"""Element types in the three spellings the serving core meets: numpy's dtype (what a NEFF
and the runtime hold), the v2 protocol's datatype name ("FP32", "INT64", "BF16", ...)
and the model configuration's `DataType` enum (`TYPE_FP32`, ...).

"BYTES" (`TYPE_STRING`), the protocol's variable-length strings, is a NEFF's `string`
tensor: numpy object arrays whose elements are `bytes`. It has no item size, so it is not
in `DTYPES` (the fixed-size types, whose bytes make an array as they are): its bytes are
Triton's encoding (`neuron_rtd/neff/strings.py`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from neuron_rtd.neff.dtypes import STRING_DTYPE, is_string
from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status

# v2 name -> numpy dtype (little-endian: the NEFF's byte order) and config enum value.
_TABLE: tuple[tuple[str, np.dtype, int], ...] = (
    ("BOOL", np.dtype(np.bool_), model_config_pb.TYPE_BOOL),
    ("UINT8", np.dtype("<u1"), model_config_pb.TYPE_UINT8),
    ("UINT16", np.dtype("<u2"), model_config_pb.TYPE_UINT16),
    ("UINT32", np.dtype("<u4"), model_config_pb.TYPE_UINT32),
    ("UINT64", np.dtype("<u8"), model_config_pb.TYPE_UINT64),
    ("INT8", np.dtype("<i1"), model_config_pb.TYPE_INT8),
    ("INT16", np.dtype("<i2"), model_config_pb.TYPE_INT16),
    ("INT32", np.dtype("<i4"), model_config_pb.TYPE_INT32),
    ("INT64", np.dtype("<i8"), model_config_pb.TYPE_INT64),
    ("FP16", np.dtype("<f2"), model_config_pb.TYPE_FP16),
    ("FP32", np.dtype("<f4"), model_config_pb.TYPE_FP32),
    ("FP64", np.dtype("<f8"), model_config_pb.TYPE_FP64),
    ("BF16", np.dtype(ml_dtypes.bfloat16), model_config_pb.TYPE_BF16),
    ("BYTES", STRING_DTYPE, model_config_pb.TYPE_STRING),
)

DATATYPES: tuple[str, ...] = tuple(name for name, _, _ in _TABLE)
"""Every v2 datatype name the core serves."""

_BY_NAME = {name: (dtype, enum) for name, dtype, enum in _TABLE}
_BY_ENUM = {enum: name for name, _, enum in _TABLE}
_BY_DTYPE = {dtype.newbyteorder("="): name for name, dtype, _ in _TABLE}


def datatype_of(dtype: np.dtype) -> str:
    """The v2 name of numpy `dtype` (either byte order); INVALID_ARGUMENT when it has none."""
    name = _BY_DTYPE.get(dtype)  # native order, as the runtime's arrays are
    if name is None:
        name = _BY_DTYPE.get(dtype.newbyteorder("="))
    if name is None:
        raise ServingError(
            Status.INVALID_ARGUMENT, f"numpy dtype {dtype} has no KServe v2 datatype"
        )
    return name


DTYPES: dict[str, np.dtype] = {name: dtype for name, dtype, _ in _TABLE if not is_string(dtype)}
"""Each fixed-size v2 datatype's numpy dtype (little-endian), for a lookup with no call
(not "BYTES", whose bytes are no array's)."""


def dtype_of(datatype: str) -> np.dtype:
    """The numpy dtype (little-endian) of v2 datatype `datatype`."""
    found = _BY_NAME.get(datatype)
    if found is None:
        raise ServingError(Status.INVALID_ARGUMENT, _unknown(datatype))
    return found[0]


def config_type_of(datatype: str) -> int:
    """The config's `DataType` value (`model_config_pb.TYPE_FP32`, ...) of `datatype`."""
    found = _BY_NAME.get(datatype)
    if found is None:
        raise ServingError(Status.INVALID_ARGUMENT, _unknown(datatype))
    return found[1]


def datatype_of_config(data_type: int) -> str:
    """The v2 name of config `DataType` value `data_type`."""
    name = _BY_ENUM.get(data_type)
    if name is None:
        raise ServingError(
            Status.INVALID_ARGUMENT, f"data_type {config_type_name(data_type)} is not served"
        )
    return name


def config_type_name(data_type: int) -> str:
    """`TYPE_FP32`: the config enum's name of `data_type` (for messages)."""
    try:
        return model_config_pb.DataType.Name(data_type)
    except ValueError:
        return f"DataType {data_type}"


def _unknown(datatype: str) -> str:
    return f"unknown datatype {datatype!r} (known: {', '.join(DATATYPES)})"
