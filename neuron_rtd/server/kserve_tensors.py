"""What the two KServe v2 front ends (gRPC `kserve.py`, HTTP `kserve_http.py` with its
JSON in `kserve_json.py`) share: the protocol's shared-memory parameters and the place in
a region they name, a tensor's bytes as an array, an output written to its place, and the
refusal every malformed request gets (INVALID_ARGUMENT)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from neuron_rtd.serving.api import ServingError, SharedMemoryApi, Status
from neuron_rtd.serving.datatypes import datatype_of, dtype_of

SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_PARAMETERS = (SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE)


def invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class ShmPlace:
    """Where a tensor lies in a registered system shared-memory region."""

    region: str
    offset: int
    byte_size: int


def shm_place(what: str, parameters: Mapping[str, object]) -> ShmPlace | None:
    """The place a tensor's parameters (as plain values) name; None when they name none."""
    if parameters.get(SHM_REGION) is None:
        for key in (SHM_OFFSET, SHM_BYTE_SIZE):
            if key in parameters:
                raise invalid(f"{what} has parameter '{key}' but no '{SHM_REGION}'")
        return None
    region = parameters[SHM_REGION]
    if not isinstance(region, str) or not region:
        raise invalid(f"{what}: parameter '{SHM_REGION}' must be a region's name (a string)")
    byte_size = byte_count(parameters, SHM_BYTE_SIZE, what)
    if byte_size is None:
        raise invalid(f"{what}: parameter '{SHM_BYTE_SIZE}' is missing: the tensor's size")
    return ShmPlace(region, byte_count(parameters, SHM_OFFSET, what) or 0, byte_size)


def byte_count(parameters: Mapping[str, object], key: str, what: str) -> int | None:
    """A byte count or offset parameter: a non-negative integer, None when absent."""
    value = parameters.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"{what}: parameter '{key}' must be a number of bytes, got {shown(value)}")
    return value


def shown(value: object) -> str:
    """A value a request gave, as a message quotes it: as JSON when it is JSON (an HTTP
    request's), else as Python writes it (a gRPC parameter's bytes), at most 40 characters."""
    try:
        text = json.dumps(value)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def tensor_dtype(what: str, datatype: str) -> np.dtype:
    try:
        return dtype_of(datatype)
    except ServingError as exc:
        raise ServingError(exc.status, f"{what}: {exc.message}") from None


def check_size(what: str, byte_size: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """INVALID_ARGUMENT unless `byte_size` is what `shape` of `dtype` takes: said before
    a tensor's bytes are fetched (from shared memory, say), so a request that claims
    gigabytes costs nothing."""
    expected = math.prod(shape) * dtype.itemsize
    if byte_size != expected:
        raise invalid(
            f"{what}: shape {list(shape)} of {datatype_of(dtype)} takes {expected} "
            f"bytes, got {byte_size}"
        )


def from_bytes(
    what: str, buffer: bytes | bytearray | memoryview, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    """`buffer` as an array of `dtype` and `shape` (no copy), or INVALID_ARGUMENT naming
    the tensor with the byte counts expected and given."""
    data = memoryview(buffer)
    check_size(what, data.nbytes, dtype, shape)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def write_to_shm(name: str, array: np.ndarray, place: ShmPlace, shm: SharedMemoryApi) -> None:
    """Output `name` written at its place in shared memory, which must hold it."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.nbytes > place.byte_size:
        raise invalid(
            f"output {name!r} takes {data.nbytes} bytes, more than the {place.byte_size} of "
            f"its place in shared memory region {place.region!r} ({SHM_BYTE_SIZE})"
        )
    shm.write(place.region, place.offset, data.data)


def internal_message(what: str, exc: BaseException) -> str:
    """What a client is told of an unexpected error: one line, no traceback (that goes
    to the daemon's log)."""
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return f"{what}: internal error ({detail}); the daemon's log has the details"
