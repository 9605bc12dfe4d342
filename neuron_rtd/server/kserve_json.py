"""The JSON documents of the KServe v2 HTTP/REST protocol (and Triton's extensions to it),
decoded into the serving core's values and encoded from its answers; no HTTP here (that
is `neuron_rtd/server/kserve_http.py`).

An inference request is a JSON header, then (the binary tensor data extension, when the
header's length is given apart) the raw bytes of the inputs that declare a
`binary_data_size`, one after another in the order of the inputs. An input's data is
otherwise its JSON `data` (flat or nested, in row-major order; a BYTES input's, strings)
or a range of a registered system shared-memory region. Outputs go back as JSON `data`,
or as raw bytes after the header (`binary_data`, per output or `binary_data_output` for
all), or into shared memory.

The two documents the core hands over as protobuf messages (`ModelConfig`,
`ModelStatisticsResponse`) are rendered with the messages' field names, every field
present, and 64-bit integers as plain JSON numbers, as Triton's HTTP endpoint does.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import ml_dtypes
import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from neuron_rtd.proto import kserve_pb
from neuron_rtd.server.kserve_codec import (
    SHM_REGION,
    Decoded,
    OutputIn,
    Sources,
    TensorIn,
    Typed,
    byte_count,
    decode,
    invalid,
    load_request,
    render,
    shown,
    tensor_bytes,
)
from neuron_rtd.serving import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RepositoryModel,
    ServerMetadata,
    SharedMemoryApi,
    ShmRegion,
    TensorMeta,
)

BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def dumps(document: object) -> bytes:
    """`document` as compact UTF-8 JSON."""
    return json.dumps(document, separators=(",", ":")).encode()


def loads_object(body: bytes | memoryview, what: str) -> dict[str, Any]:
    """`body` as a JSON object, or INVALID_ARGUMENT saying why it is not one. An empty
    body is an empty object (the protocol's requests whose fields are all optional)."""
    data = bytes(body)
    if not data.strip():
        return {}
    try:
        document = json.loads(data)
    except UnicodeDecodeError as exc:
        raise invalid(f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise invalid(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise invalid(f"{what} is not valid JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise invalid(f"{what} must be a JSON object, got {type(document).__name__}")
    return document


def _field(document: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """`document[key]` when present (None when not), INVALID_ARGUMENT when of another kind."""
    value = document.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise invalid(f"{what}: '{key}' must be {_kind_name(kind)}, got {shown(value)}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    list: "a list",
    dict: "an object",
}


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(_KIND_NAMES.get(k, k.__name__) for k in _kinds(kind))


# --- documents of the core's answers ---------------------------------------------------
def server_metadata_json(meta: ServerMetadata) -> dict[str, object]:
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def _tensor_meta_json(tensor: TensorMeta) -> dict[str, object]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def model_metadata_json(meta: ModelMetadata) -> dict[str, object]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [_tensor_meta_json(t) for t in meta.inputs],
        "outputs": [_tensor_meta_json(t) for t in meta.outputs],
    }


def message_json(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton's HTTP endpoint renders it: field names as in the
    .proto, every field present, 64-bit integers as JSON numbers (protobuf's JSON mapping
    makes them strings)."""
    document = json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    _int64_as_numbers(cast(Descriptor, message.DESCRIPTOR), document)
    return document


def statistics_json(response: kserve_pb.ModelStatisticsResponse) -> dict[str, Any]:
    """Statistics as Triton's HTTP endpoint renders them: every duration present, those
    never measured as {"count": 0, "ns": 0}."""
    filled = kserve_pb.ModelStatisticsResponse()
    filled.CopyFrom(response)
    for model in filled.model_stats:
        for stats in (model.inference_stats, *model.batch_stats):
            for field in stats.DESCRIPTOR.fields:
                if field.message_type is not None:
                    getattr(stats, field.name).SetInParent()
    return message_json(filled)


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_as_numbers(descriptor: Descriptor, document: dict[str, Any]) -> None:
    """The 64-bit integer fields of `document` (`descriptor`'s message as MessageToDict
    renders it), at any depth, turned from strings into numbers, in place."""
    for name, value in document.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry and isinstance(value, dict):
            _map_values_as_numbers(entry.fields_by_name["value"], value)
        elif entry is not None:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _int64_as_numbers(entry, item)
        elif field.type in _INT64_TYPES:
            document[name] = [int(v) for v in value] if isinstance(value, list) else int(value)


def _map_values_as_numbers(field: FieldDescriptor, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if field.message_type is not None and isinstance(value, dict):
            _int64_as_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            values[key] = int(value)


def repository_index_json(models: Sequence[RepositoryModel]) -> list[dict[str, str]]:
    """The index as Triton lists it: each model's name, and its version, state and
    reason when it has them."""
    rows = []
    for model in models:
        row = {"name": model.name}
        for key in ("version", "state", "reason"):
            value = getattr(model, key)
            if value:
                row[key] = value
        rows.append(row)
    return rows


def shm_status_json(regions: Sequence[ShmRegion]) -> list[dict[str, object]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


# --- requests of the model repository and shared memory ---------------------------------
def load_parameters(body: Mapping[str, Any]) -> tuple[str, dict[str, bytes]]:
    """A load request's `parameters`, its `file:<path>` contents lifted out of base64,
    as the decoder takes them (`load_request`: the `config` override and the files)."""
    parameters = _field(body, "parameters", dict, "the load request") or {}
    lifted: dict[str, object] = {}
    for name, value in parameters.items():
        if name.startswith("file:"):
            if not isinstance(value, str):
                raise invalid(f"load parameter {name!r} must be the file's content in base64")
            try:
                value = base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise invalid(f"load parameter {name!r} is not valid base64: {exc}") from None
        lifted[name] = value
    return load_request(lifted)


def shm_register_fields(body: Mapping[str, Any]) -> tuple[str, int, int]:
    """A register request's `key`, `offset` (0 when absent) and `byte_size`."""
    what = "the register request"
    key = _field(body, "key", str, what)
    if not key:
        raise invalid(f"{what} needs 'key': the shm object's name as shm_open takes it")
    offset = byte_count(body, "offset", what) or 0
    byte_size = byte_count(body, "byte_size", what)
    if byte_size is None:
        raise invalid(f"{what} needs 'byte_size': the region's size in bytes")
    return key, offset, byte_size


# --- inference ------------------------------------------------------------------------
SOURCES = Sources(raw=f"'{BINARY_DATA_SIZE}'", typed="'data'")


@dataclass(frozen=True)
class DecodedInfer:
    decoded: Decoded
    binary: Mapping[str, bool]  # the outputs named in the request: each as raw bytes?
    binary_default: bool  # binary_data_output: how the others go back

    @property
    def request(self) -> InferRequest:
        return self.decoded.request


def decode_infer(
    model: str,
    version: str,
    header: Mapping[str, Any],
    binary: memoryview,
    shm: SharedMemoryApi,
) -> DecodedInfer:
    """An inference request: its JSON `header` (parsed) and `binary`, the bytes after it,
    lifted into the decoder's tensors (`neuron_rtd/server/kserve_codec.py:decode`)."""
    parameters = _field(header, "parameters", dict, "the request") or {}
    binary_default = parameters.get(BINARY_DATA_OUTPUT, False)
    if not isinstance(binary_default, bool):
        raise invalid(f"request parameter '{BINARY_DATA_OUTPUT}' must be true or false")
    request_id = _field(header, "id", str, "the request") or ""
    inputs = _lift_inputs(_field(header, "inputs", list, "the request") or [], binary)
    outputs, raw = _lift_outputs(_field(header, "outputs", list, "the request") or [])
    passed = {k: v for k, v in parameters.items() if k != BINARY_DATA_OUTPUT}
    decoded = decode(model, version, request_id, passed, inputs, outputs, shm, SOURCES)
    for name, asked in decoded.outputs.items():
        if asked.place is not None and raw[name]:
            raise invalid(f"output {name!r} asks for both '{BINARY_DATA}' and '{SHM_REGION}'")
    return DecodedInfer(decoded, raw, binary_default)


def _lift_inputs(tensors: Sequence[Any], binary: memoryview) -> list[TensorIn]:
    """The inputs' JSON objects as the decoder's tensors: the bytes an input declares in
    `binary_data_size` cut from `binary`, one after another in the order of the inputs."""
    if not tensors:
        raise invalid("the request has no 'inputs'")
    lifted = []
    at = 0  # where the next input's bytes start in the binary section
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise invalid(f"inputs[{index}] must be an object, got {shown(tensor)}")
        name = _field(tensor, "name", str, f"inputs[{index}]")
        if not name:
            raise invalid(f"inputs[{index}] has no 'name'")
        what = f"input {name!r}"
        datatype = _field(tensor, "datatype", str, what)
        if not datatype:
            raise invalid(f"{what} has no 'datatype'")
        shape = _shape(what, tensor.get("shape"))
        parameters = _field(tensor, "parameters", dict, what) or {}
        size = byte_count(parameters, BINARY_DATA_SIZE, what)
        raw = None
        if size is not None:
            if at + size > len(binary):
                raise invalid(
                    f"{what}: {BINARY_DATA_SIZE} {size} goes past the end of the binary data "
                    f"({len(binary) - at} of {len(binary)} bytes left for it): the body is "
                    "shorter than its inputs declare"
                )
            raw = binary[at : at + size]
            at += size
        typed = _from_json(tensor["data"]) if "data" in tensor else None
        lifted.append(TensorIn(name, datatype, shape, parameters, raw, typed))
    if at != len(binary):
        raise invalid(
            f"the body has {len(binary) - at} bytes of binary data beyond what the inputs "
            f"declare in '{BINARY_DATA_SIZE}' ({at} of {len(binary)}): check "
            "Inference-Header-Content-Length and each input's binary_data_size"
        )
    return lifted


def _lift_outputs(tensors: Sequence[Any]) -> tuple[list[OutputIn], dict[str, bool]]:
    """The outputs' JSON objects as the decoder's, and whether each goes back as raw
    bytes (`binary_data`: HTTP's own parameter)."""
    outputs = []
    raw: dict[str, bool] = {}
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise invalid(f"outputs[{index}] must be an object, got {shown(tensor)}")
        name = _field(tensor, "name", str, f"outputs[{index}]")
        if not name:
            raise invalid(f"outputs[{index}] has no 'name'")
        what = f"output {name!r}"
        parameters = _field(tensor, "parameters", dict, what) or {}
        binary = parameters.get(BINARY_DATA, False)
        if not isinstance(binary, bool):
            raise invalid(f"{what}: parameter '{BINARY_DATA}' must be true or false")
        raw.setdefault(name, binary)
        outputs.append(OutputIn(name, parameters))
    return outputs, raw


def _shape(what: str, dims: object) -> tuple[int, ...]:
    """A JSON shape: a list of integers (none negative: the decoder's rule)."""
    if not isinstance(dims, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in dims
    ):
        raise invalid(f"{what}: 'shape' must be a list of integers, got {shown(dims)}")
    return tuple(dims)


def _from_json(data: object) -> Typed:
    """JSON `data`, made an array by the decoder (`from_json`)."""

    def typed(what: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return from_json(what, data, datatype, dtype, shape)

    return typed


# The kinds of JSON values (as numpy reads them) each kind of tensor takes: integers for
# integer tensors, true/false for BOOL, numbers for floating point ones ("O": integers
# beyond int64, which only uint64 may hold; the conversion checks their range).
_JSON_KINDS = {"b": ("b", "true or false"), "i": ("iuO", "integers"), "u": ("iuO", "integers")}
_NUMBERS = ("iuf", "numbers")


def from_json(
    what: str, data: object, datatype: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    """JSON `data` (flat or nested lists, row-major) as an array of `dtype` and `shape`."""
    if not isinstance(data, list):
        raise invalid(f"{what}: 'data' must be a list of values, got {shown(data)}")
    expected = math.prod(shape)
    if dtype.hasobject:
        return _strings_from_json(what, data, expected).reshape(shape)
    kinds, named = _JSON_KINDS.get(dtype.kind, _NUMBERS)
    try:
        loose = np.asarray(data)
        if loose.size and loose.dtype.kind not in kinds:
            raise TypeError(f"{datatype} takes {named}")
        # bfloat16 takes no JSON value directly: through float32, as its nearest values
        staged = np.asarray(data, dtype=np.float32 if dtype == _BFLOAT16 else dtype)
    except (OverflowError, ValueError, TypeError) as exc:
        raise invalid(
            f"{what}: 'data' must be a list of {datatype} values (flat, or nested evenly): {exc}"
        ) from None
    if staged.size != expected:
        raise invalid(f"{what}: shape {list(shape)} takes {expected} values, got {staged.size}")
    return staged.astype(dtype, copy=False).reshape(shape)


def _strings_from_json(what: str, data: list[Any], expected: int) -> np.ndarray:
    """A BYTES input's JSON `data`: strings (flat, or in lists nested evenly), each
    element its UTF-8 bytes."""
    flat: list[bytes] = []
    rows: list[list[Any]] = [data]
    while rows:  # level by level, so that the nesting's evenness is seen
        lengths = {len(row) for row in rows}
        items = [item for row in rows for item in row]
        if all(isinstance(item, str) for item in items) and len(lengths) == 1:
            flat = [item.encode("utf-8", "surrogatepass") for item in items]
            break
        if not all(isinstance(item, list) for item in items) or len(lengths) != 1:
            odd = next((item for item in items if not isinstance(item, str | list)), None)
            said = f"{shown(odd)} is no string" if odd is not None else "its lists are uneven"
            raise invalid(
                f"{what}: 'data' of a BYTES input must be strings (flat, or nested evenly): {said}"
            )
        rows = items
    if len(flat) != expected:
        raise invalid(f"{what}: its shape takes {expected} strings, got {len(flat)}")
    array = np.empty(expected, dtype=object)
    array[:] = flat
    return array


def encode_infer(
    decoded: DecodedInfer, response: InferResponse, shm: SharedMemoryApi
) -> tuple[dict[str, object], list[bytes | memoryview]]:
    """The response header (a JSON object) and the raw output bytes that follow it; an
    output asked for in shared memory is written there first (`render`) and answered
    with its name, datatype and shape only, as Triton's HTTP server writes it (Triton's
    C++ client takes any output `parameters` for binary data and looks for its
    `binary_data_size`)."""
    outputs: list[dict[str, object]] = []
    chunks: list[bytes | memoryview] = []
    for output in render(decoded.decoded, response, shm):
        array = output.array
        tensor: dict[str, object] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(array.shape),
        }
        asked = output.asked
        if asked is not None and asked.place is not None:
            pass  # in the caller's region: no data, no parameters
        elif decoded.binary.get(output.name, decoded.binary_default):
            raw = tensor_bytes(array)
            tensor["parameters"] = {BINARY_DATA_SIZE: raw.nbytes}
            chunks.append(raw)
        else:
            tensor["data"] = json_values(array, output.name)
        outputs.append(tensor)
    header: dict[str, object] = {
        "model_name": response.model or decoded.request.model,
        "model_version": response.version,
    }
    request_id = response.id or decoded.request.id
    if request_id:
        header["id"] = request_id
    header["outputs"] = outputs
    return header, chunks


def json_values(array: np.ndarray, name: str = "") -> list[Any]:
    """`array`'s values, flat, as JSON numbers (bfloat16 through float32), or a BYTES
    output's as strings: INVALID_ARGUMENT for one that is not UTF-8, which JSON cannot
    carry (binary data can)."""
    if array.dtype.hasobject:
        texts: list[Any] = []
        for index, item in enumerate(array.reshape(-1)):
            try:
                texts.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
            except UnicodeDecodeError:
                raise invalid(
                    f"output {name!r}: string element {index} is not UTF-8, which JSON cannot "
                    f"carry: ask for it as binary data ('{BINARY_DATA}': true)"
                ) from None
        return texts
    if array.dtype == _BFLOAT16:
        array = array.astype(np.float32)
    values: list[Any] = array.reshape(-1).tolist()
    return values
