"""KServe's inference in gRPC messages: a `ModelInferRequest`'s tensors lifted off it
for the transport-free decoder (`neuron_rtd/server/kserve_codec.py`), or, the common
request (every input raw, no parameters, no output named), decoded straight to arrays in
one pass; and an answer put back into a `ModelInferResponse`. The servicer
(`neuron_rtd/server/kserve.py`) calls these between the wire and the serving core."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from neuron_rtd.errors import shown
from neuron_rtd.proto import kserve_pb
from neuron_rtd.runtime import wire_bytes
from neuron_rtd.server.kserve_codec import (
    SHM_PARAMETERS,
    SHM_REGION,
    Decoded,
    Sources,
    TensorIn,
    invalid,
    raw_array,
    render,
)
from neuron_rtd.serving import InferResponse, ServingError, SharedMemoryApi, datatype_of

# Where each datatype's values are in `InferTensorContents` (FP16 and BF16 have no
# typed field: raw contents only; BYTES' entries are its elements).
TYPED_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",  # one element per entry
}


SOURCES = Sources(raw="raw_input_contents", typed="contents")
_NONE: Mapping[str, object] = MappingProxyType({})  # a tensor's parameters when it has none


def parameter_value(parameter: Any) -> object:
    """An `InferParameter`'s (or `ModelRepositoryParameter`'s) value; None when unset."""
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, object]:
    return {name: parameter_value(value) for name, value in parameters.items()}


def from_contents(contents: Any) -> Callable[[str, str, np.dtype, tuple[int, ...]], np.ndarray]:
    """Typed `contents` (`InferTensorContents`), made an array by the decoder."""

    def typed(what: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        field = TYPED_FIELDS.get(datatype)
        if field is None:
            raise invalid(f"{what} is {datatype}, which has no typed contents: send it raw")
        values = getattr(contents, field)
        expected = math.prod(shape)
        if len(values) != expected:
            raise invalid(
                f"{what}: shape {list(shape)} takes {expected} values, got {len(values)} in {field}"
            )
        if dtype.hasobject:  # BYTES: each entry an element's bytes
            array = np.empty(expected, dtype=dtype)
            array[:] = list(values)
            return array.reshape(shape)
        try:
            return np.array(values, dtype=dtype).reshape(shape)
        except (OverflowError, ValueError) as exc:
            raise invalid(f"{what}: a value in {field} is not a {datatype}: {exc}") from None

    return typed


def raw_inputs(request: kserve_pb.ModelInferRequest) -> dict[str, np.ndarray] | None:
    """The inputs of a request whose every input is sent raw, with no parameters and a
    name of its own, decoded in one pass (`raw_array`: checked as `decode` checks them,
    its errors the same, in the same order); None for any other request, which takes
    the general way (`lifted_inputs`, `decode`)."""
    raw = request.raw_input_contents
    tensors = request.inputs
    count = len(tensors)
    if len(raw) != count:
        return None
    arrays: dict[str, np.ndarray] = {}
    for at in range(count):  # (indexing a repeated field is faster than iterating it)
        tensor = tensors[at]
        name = tensor.name
        if tensor.parameters or name in arrays or tensor.HasField("contents"):
            return None
        arrays[name] = raw_array(name, tensor.datatype, tuple(tensor.shape[:]), raw[at])
    return arrays


def lifted_inputs(request: kserve_pb.ModelInferRequest) -> tuple[list[TensorIn], bool]:
    """The request's inputs as the decoder takes them, and whether any has parameters
    (only they name a shared-memory region). `raw_input_contents` go, one each and in
    order, to the inputs sent raw (neither typed `contents` nor in shared memory); their
    count is checked here, as the message's own rules are: a request with
    `raw_input_contents` gives no input typed `contents` (`mixed_contents`)."""
    raw = request.raw_input_contents
    count = len(raw)
    lifted = []
    taken = 0
    named = False
    parameters: Mapping[str, object]
    for tensor in request.inputs:
        if tensor.parameters:
            named = True
            parameters = parameters_of(tensor.parameters)
        else:
            parameters = _NONE
        shape = tuple(tensor.shape[:])  # (a slice is a list: made a tuple faster)
        if tensor.HasField("contents"):
            if count:
                raise mixed_contents(tensor.name, request.model_name)
            typed = from_contents(tensor.contents)
            lifted.append(TensorIn(tensor.name, tensor.datatype, shape, parameters, typed=typed))
        elif SHM_REGION in parameters:
            lifted.append(TensorIn(tensor.name, tensor.datatype, shape, parameters))
        else:
            data = raw[taken] if taken < count else None
            taken += 1
            lifted.append(TensorIn(tensor.name, tensor.datatype, shape, parameters, data))
    if count and taken != count:
        sent_raw = [
            t.name
            for t in request.inputs
            if SHM_REGION not in t.parameters and not t.HasField("contents")
        ]
        raise invalid(
            f"{count} raw_input_contents for {len(sent_raw)} inputs sent raw "
            f"({', '.join(map(repr, sent_raw)) or 'none'}): one each, in the order of "
            "the inputs"
        )
    return lifted, named


def mixed_contents(name: str, model: str) -> ServingError:
    """The v2 rule that a request sending `raw_input_contents` gives no input typed
    `contents`, broken by input `name`: refused in Triton's words, which clients match."""
    return invalid(
        f"contents field must not be specified when using raw_input_contents for "
        f"'{shown(name)}' for model '{shown(model)}': send every input raw (one "
        "raw_input_contents each, in the order of the inputs) or every input typed"
    )


def response_message(
    request: kserve_pb.ModelInferRequest,
    decoded: Decoded,
    result: InferResponse,
    shm: SharedMemoryApi,
) -> kserve_pb.ModelInferResponse:
    """The answer on the wire: one raw output content per output in output order, the
    bytes the runtime copied each out of its slot into, as they are (`wire_bytes`); an
    output written to shared memory has empty contents and its parameters echoed, as
    Triton does. A request that names no output has each rendered as it is, without
    `render`'s look for a place in shared memory."""
    if not decoded.outputs:  # none asked by name, so none in shared memory: all go back
        return all_outputs(request, result)
    response = kserve_pb.ModelInferResponse(
        model_name=result.model or request.model_name,
        model_version=result.version,
        id=result.id or request.id,
    )
    raw: list[bytes] = []
    add = response.outputs.add
    asked = None
    for output in render(decoded, result, shm):
        array = output.array
        tensor = add(name=output.name, datatype=output.datatype, shape=array.shape)
        if output.asked is not None and output.asked.place is not None:
            if asked is None:
                asked = {o.name: o for o in request.outputs}
            for key in SHM_PARAMETERS:  # echoed as given, as Triton does
                if key in asked[output.name].parameters:
                    tensor.parameters[key].CopyFrom(asked[output.name].parameters[key])
            raw.append(b"")  # one raw entry per output keeps the indices aligned
        else:
            raw.append(wire_bytes(array))
    response.raw_output_contents.extend(raw)
    return response


ANSWERS_KEPT = 256  # answers' heads kept for `all_outputs` (then forgotten, all at once)
AnswerKey = tuple[str, str, tuple[tuple[str, np.dtype, tuple[int, ...]], ...]]


def all_outputs(
    request: kserve_pb.ModelInferRequest,
    result: InferResponse,
    heads: dict[AnswerKey, kserve_pb.ModelInferResponse] | None = None,
) -> kserve_pb.ModelInferResponse:
    """The answer to a request that names no output (so none goes to shared memory):
    every output back on the wire, in the model's order. Its head (the model, version,
    and each output's name, datatype and shape) is copied from one made before for the
    same model, version and outputs when `heads` keeps one (made once, never changed
    after: a copy of it costs less than making it)."""
    outputs = result.outputs
    model = result.model or request.model_name
    key = (model, result.version, tuple([(n, a.dtype, a.shape) for n, a in outputs.items()]))
    head = heads.get(key) if heads is not None else None
    if head is None:
        head = kserve_pb.ModelInferResponse(model_name=model, model_version=result.version)
        add = head.outputs.add
        for name, array in outputs.items():
            add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
        if heads is not None:
            if len(heads) >= ANSWERS_KEPT:
                heads.clear()
            heads[key] = head
    response = kserve_pb.ModelInferResponse()
    response.CopyFrom(head)
    answer_id = result.id or request.id
    if answer_id:
        response.id = answer_id
    put = response.raw_output_contents.append
    for array in outputs.values():
        put(wire_bytes(array))
    return response
