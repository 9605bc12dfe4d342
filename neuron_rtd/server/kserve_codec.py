"""The KServe v2 protocol without its transports: an inference decoded from the tensors a
front end lifted off its wire (gRPC `neuron_rtd/server/kserve.py`, HTTP
`neuron_rtd/server/kserve_json.py`) as neutral descriptors (`TensorIn`, `OutputIn`) into
the serving core's one request (`InferRequest`), and its answer (`InferResponse`) rendered
into the tensors each front puts back on its wire (`render`).

Every rule of a request lives here once: a name given once, a known datatype, a shape with
no negative dimension, one source per input (raw bytes, typed values, or a range of a
registered shared-memory region, whose size is checked before a byte is read), the
classification extension's count (`classification: N`, never with a place in shared
memory, as Triton), an output's place in shared memory checked before the inference runs,
and the repository's load parameters. A malformed request is INVALID_ARGUMENT (`invalid`).

A BYTES tensor's bytes (raw, binary, in shared memory) are Triton's encoding
(`neuron_rtd/neff/strings.py`): decoded into an object array of `bytes` of the shape
declared, every malformed encoding refused naming the element; answered encoded the same
way."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from neuron_rtd.errors import BadInput
from neuron_rtd.neff import strings
from neuron_rtd.neff.strings import LENGTH_BYTES
from neuron_rtd.serving import (
    DTYPES,
    InferRequest,
    InferResponse,
    ServingError,
    SharedMemoryApi,
    Status,
    datatype_of,
    dtype_of,
)

SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_PARAMETERS = (SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE)
CLASSIFICATION = "classification"


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
    gigabytes costs nothing. A BYTES tensor's size is its elements' (`from_bytes` checks
    them): here only that it can hold the shape's elements, a length each."""
    if dtype.hasobject:
        elements = math.prod(shape)
        if byte_size < elements * LENGTH_BYTES:
            raise invalid(
                f"{what}: shape {list(shape)} of BYTES takes {elements} elements, at least "
                f"{elements * LENGTH_BYTES} bytes (a {LENGTH_BYTES}-byte length each), got "
                f"{byte_size}"
            )
        return
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
    if dtype.hasobject:  # BYTES: each element its length, then its bytes
        try:
            return strings.decode(data, what, count=math.prod(shape)).reshape(shape)
        except BadInput as exc:
            raise invalid(exc.message) from None
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def tensor_bytes(array: np.ndarray) -> memoryview:
    """An output's bytes as the protocol sends them: its array's, or a BYTES tensor's
    encoding."""
    if array.dtype.hasobject:
        return memoryview(strings.encode(array))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def write_to_shm(name: str, array: np.ndarray, place: ShmPlace, shm: SharedMemoryApi) -> None:
    """Output `name` written at its place in shared memory, which must hold it."""
    data = tensor_bytes(array)
    if data.nbytes > place.byte_size:
        raise invalid(
            f"output {name!r} takes {data.nbytes} bytes, more than the {place.byte_size} of "
            f"its place in shared memory region {place.region!r} ({SHM_BYTE_SIZE})"
        )
    shm.write(place.region, place.offset, data)


# --- one inference -----------------------------------------------------------------------
Typed = Callable[[str, str, np.dtype, tuple[int, ...]], np.ndarray]
"""A front's typed values made an array: (what, datatype, dtype, shape) -> the array."""


@dataclass(slots=True)
class TensorIn:
    """An input as a front lifted it off its wire: its name, datatype, shape and
    parameters (plain values), and its data: `raw` bytes, `typed` values (gRPC's
    `contents`, HTTP's JSON `data`), or a shared-memory range its parameters name."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, object]
    raw: bytes | bytearray | memoryview | None = None
    typed: Typed | None = None


@dataclass(slots=True)
class OutputIn:
    """An output a request asks for, with its parameters (plain values)."""

    name: str
    parameters: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Sources:
    """What a front calls an input's sources in its messages."""

    raw: str
    typed: str


@dataclass(slots=True)
class Asked:
    """An output asked for: where in shared memory it goes (None: back on the wire), and
    the classes asked for in its place (`classification`; 0: the output itself)."""

    place: ShmPlace | None
    parameters: Mapping[str, object]
    classes: int = 0


@dataclass(slots=True)
class Decoded:
    request: InferRequest
    outputs: Mapping[str, Asked]  # the outputs named in the request, in its order


def decode(
    model: str,
    version: str,
    request_id: str,
    parameters: Mapping[str, object],
    inputs: Iterable[TensorIn],
    outputs: Iterable[OutputIn],
    shm: SharedMemoryApi,
    sources: Sources,
) -> Decoded:
    """A request to `model` (`version`, its `request_id` and `parameters`) with its
    inputs decoded and the outputs it asks for; an output's place in shared memory is
    checked here, before the inference runs."""
    arrays: dict[str, np.ndarray] = {}
    for tensor in inputs:
        name = tensor.name
        if name in arrays:
            raise invalid(f"input {name!r} is given twice")
        raw = tensor.raw
        if raw is not None and tensor.typed is None and not tensor.parameters:
            arrays[name] = raw_array(name, tensor.datatype, tensor.shape, raw)
        else:
            arrays[name] = decode_input(f"input {name!r}", tensor, shm, sources)
    asked = decode_outputs(outputs, shm) if outputs else {}
    request = InferRequest(model, arrays, version, list(asked) or None, request_id, parameters)
    if asked:
        classes = {name: o.classes for name, o in asked.items() if o.classes}
        if classes:
            request.classification = classes
    return Decoded(request, asked)


def raw_array(
    name: str, datatype: str, shape: tuple[int, ...], raw: bytes | bytearray | memoryview
) -> np.ndarray:
    """The common case, input `name` sent as raw bytes: seen as an array of the datatype
    and shape declared (no copy), checked as `decode_input` checks it (its datatype, no
    negative dimension, its size), the message made only when one is said."""
    dtype = DTYPES.get(datatype)
    nbytes = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if dtype is None or (shape and min(shape) < 0) or nbytes != math.prod(shape) * dtype.itemsize:
        what = f"input {name!r}"
        dtype = tensor_dtype(what, datatype)
        negative_dims(what, shape)
        if dtype.hasobject:  # BYTES (never in DTYPES): decoded, not seen as an array
            return from_bytes(what, raw, dtype, shape)
        check_size(what, nbytes, dtype, shape)
    return np.ndarray(shape, dtype, raw)  # over the bytes, as np.frombuffer would be


def negative_dims(what: str, shape: tuple[int, ...]) -> None:
    if shape and min(shape) < 0:
        raise invalid(f"{what} has a negative dimension in its shape {list(shape)}")


def decode_input(what: str, tensor: TensorIn, shm: SharedMemoryApi, sources: Sources) -> np.ndarray:
    dtype = tensor_dtype(what, tensor.datatype)
    shape = tensor.shape
    negative_dims(what, shape)
    place = shm_place(what, tensor.parameters) if tensor.parameters else None
    raw, typed = tensor.raw, tensor.typed
    if place is None and typed is None:
        if raw is None:
            raise invalid(
                f"{what} has no data: give {sources.typed}, {sources.raw} or '{SHM_REGION}'"
            )
        return from_bytes(what, raw, dtype, shape)  # the common case: raw bytes
    given = [
        name
        for name, there in (
            (sources.typed, typed is not None),
            (sources.raw, raw is not None),
            (f"'{SHM_REGION}'", place is not None),
        )
        if there
    ]
    if len(given) > 1:
        raise invalid(f"{what} has both {given[0]} and {given[1]}: give one of them")
    if place is not None:
        check_size(what, place.byte_size, dtype, shape)  # before a byte is fetched
        return from_bytes(what, shm.read(place.region, place.offset, place.byte_size), dtype, shape)
    assert typed is not None
    return typed(what, tensor.datatype, dtype, shape)


def decode_outputs(outputs: Iterable[OutputIn], shm: SharedMemoryApi) -> dict[str, Asked]:
    asked: dict[str, Asked] = {}
    for output in outputs:
        what = f"output {output.name!r}"
        if output.name in asked:
            raise invalid(f"{what} is asked for twice")
        parameters = output.parameters
        place = shm_place(what, parameters) if parameters else None
        classes = class_count(what, parameters.get(CLASSIFICATION)) if parameters else 0
        if classes and place is not None:
            raise invalid(
                f"{what} can't set both '{SHM_REGION}' and '{CLASSIFICATION}': the classes "
                "come back in the answer"
            )
        if place is not None:
            shm.check(place.region, place.offset, place.byte_size)  # before the inference runs
        asked[output.name] = Asked(place, parameters, classes)
    return asked


def class_count(what: str, value: object) -> int:
    """An output's `classification` parameter: the number of classes asked for, 0 (or
    absent) for the output itself, as Triton's HTTP front takes it."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(
            f"{what}: parameter '{CLASSIFICATION}' must be the number of classes to answer "
            f"(an integer, 1 or more), got {shown(value)}"
        )
    return value


@dataclass(slots=True)
class Rendered:
    """An output of the answer as a front puts it back: `asked` None or with no place
    when its contents go on the wire; else it was written to its place."""

    name: str
    datatype: str
    array: np.ndarray
    asked: Asked | None


def render(decoded: Decoded, response: InferResponse, shm: SharedMemoryApi) -> list[Rendered]:
    """The answer's outputs, in the model's order; those asked for in shared memory are
    written there first."""
    rendered = []
    asked_for = decoded.outputs
    for name, array in response.outputs.items():
        asked = asked_for.get(name) if asked_for else None
        if asked is not None and asked.place is not None:
            write_to_shm(name, array, asked.place, shm)
        rendered.append(Rendered(name, datatype_of(array.dtype), array, asked))
    return rendered


# --- the model repository ----------------------------------------------------------------
def load_request(parameters: Mapping[str, object]) -> tuple[str, dict[str, bytes]]:
    """`RepositoryModelLoad`'s parameters (plain values; a front decodes a file's content
    into bytes first): the `config` override (JSON text) and the `file:<path>` contents."""
    config = ""
    files: dict[str, bytes] = {}
    for name, value in parameters.items():
        if name == "config":
            if not isinstance(value, str):
                raise invalid("load parameter 'config' must be a string (a JSON model config)")
            config = value
        elif name.startswith("file:"):
            if not isinstance(value, bytes):
                raise invalid(f"load parameter {name!r} must be bytes (the file's content)")
            files[name.removeprefix("file:")] = value
        else:
            raise invalid(
                f"unknown load parameter {name!r}: this server takes 'config' and 'file:<path>'"
            )
    return config, files
