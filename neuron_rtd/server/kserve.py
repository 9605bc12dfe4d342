"""The KServe v2 / Triton gRPC service (`inference.GRPCInferenceService`) over the serving
core (`neuron_rtd/serving/api.py:ServingApi`): each RPC decoded, one call into the core,
its answer encoded.

Tensors arrive as `raw_input_contents` (one per input that is neither typed nor in shared
memory, in the order of the inputs), as typed `contents`, or in a registered system
shared-memory region (input parameters `shared_memory_region`, `shared_memory_offset`,
`shared_memory_byte_size`), read through the caller's regions (`ServingApi.shm(caller)`).
Outputs go back as `raw_output_contents`, one per output in output order; an output asked
for in shared memory is written there and sent with empty contents and its parameters
echoed, as Triton does.

A `ServingError` answers with its status's gRPC code and its message as it is; anything
else answers INTERNAL with a one-line message, its traceback going to the daemon's log
only. In `ModelStreamInfer` a request's error is its answer's `error_message` and the
stream goes on (Triton's behaviour); answers come in request order, up to `STREAM_WINDOW`
requests of one stream running at once (so a stream's requests can be batched together:
the stream table, `server/streams.py`, keeps that window).
CUDA shared memory, tracing and log settings answer UNIMPLEMENTED, saying why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np

from neuron_rtd.proto import kserve_pb, kserve_pb_grpc
from neuron_rtd.runtime import Caller, stranger, wire_bytes
from neuron_rtd.server.kserve_tensors import (
    SHM_PARAMETERS,
    SHM_REGION,
    ShmPlace,
    check_size,
    from_bytes,
    internal_message,
    invalid,
    shm_place,
    tensor_dtype,
    write_to_shm,
)
from neuron_rtd.serving.api import (
    InferRequest,
    InferResponse,
    ServingApi,
    ServingError,
    SharedMemoryApi,
    Status,
)
from neuron_rtd.serving.datatypes import datatype_of

log = logging.getLogger("nrtd.KSERVE")

STREAM_WINDOW = 16  # requests of one stream running at once

# The protocol's status kinds as gRPC codes.
CODES: dict[Status, grpc.StatusCode] = {
    Status.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
}

# Where each datatype's values are in `InferTensorContents` (FP16 and BF16 have no
# typed field: raw contents only).
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
}


CUDA_SHM_UNSUPPORTED = (
    "CUDA shared memory is not supported: this server has no GPUs (its devices are "
    "Neuron devices); use system shared memory (SystemSharedMemoryRegister) instead"
)

R = TypeVar("R")


def parameter_value(parameter: Any) -> object:
    """An `InferParameter`'s (or `ModelRepositoryParameter`'s) value; None when unset."""
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, object]:
    return {name: parameter_value(value) for name, value in parameters.items()}


def tensor_shape(what: str, dims: Any) -> tuple[int, ...]:
    shape = tuple(dims)
    if shape and min(shape) < 0:
        raise invalid(f"{what} has a negative dimension in its shape {list(shape)}")
    return shape


def from_contents(
    what: str, contents: Any, datatype: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    """Typed `contents` as an array of `dtype` and `shape`."""
    field = TYPED_FIELDS.get(datatype)
    if field is None:
        raise invalid(f"{what} is {datatype}, which has no typed contents: send it raw")
    values = getattr(contents, field)
    expected = math.prod(shape)
    if len(values) != expected:
        raise invalid(
            f"{what}: shape {list(shape)} takes {expected} values, got {len(values)} in {field}"
        )
    try:
        return np.array(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise invalid(f"{what}: a value in {field} is not a {datatype}: {exc}") from None


def raw_output(array: np.ndarray) -> bytes:
    """An output's raw contents: the bytes the runtime copied it out of its slot into, as
    they are (`wire_bytes`), a copy only when the array is part of them (a batch's rows)."""
    return wire_bytes(array)


class KServeServicer(kserve_pb_grpc.GRPCInferenceServiceServicer):
    """`inference.GRPCInferenceService` over `serving`. `ModelStreamInfer` is served by the
    daemon's stream table (`server/streams.py`, see `neuron_rtd.server.add_servicers`),
    each request of a stream answered by `stream_answer`."""

    def __init__(
        self,
        serving: ServingApi,
        *,
        caller_of: Callable[[grpc.ServicerContext], Caller] = lambda context: stranger(),
    ) -> None:
        self.serving = serving
        self.caller_of = caller_of  # who a call comes from: whose shared memory it names

    # --- how every call answers ---------------------------------------------------------
    def _call(self, method: str, context: grpc.ServicerContext, make: Callable[[], R]) -> R:
        try:
            return make()
        except ServingError as exc:
            error: tuple[grpc.StatusCode, str] = (CODES[exc.status], exc.message)
        except Exception as exc:
            log.exception("internal error", extra={"fn": method})
            error = (grpc.StatusCode.INTERNAL, internal_message(method, exc))
        abort(context, *error)

    # --- health and metadata ------------------------------------------------------------
    def ServerLive(
        self, request: kserve_pb.ServerLiveRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerLiveResponse:
        return self._call(
            "ServerLive", context, lambda: kserve_pb.ServerLiveResponse(live=self.serving.live())
        )

    def ServerReady(
        self, request: kserve_pb.ServerReadyRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerReadyResponse:
        return self._call(
            "ServerReady",
            context,
            lambda: kserve_pb.ServerReadyResponse(ready=self.serving.ready()),
        )

    def ServerMetadata(
        self, request: kserve_pb.ServerMetadataRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerMetadataResponse:
        def make() -> kserve_pb.ServerMetadataResponse:
            meta = self.serving.server_metadata()
            return kserve_pb.ServerMetadataResponse(
                name=meta.name, version=meta.version, extensions=list(meta.extensions)
            )

        return self._call("ServerMetadata", context, make)

    def ModelReady(
        self, request: kserve_pb.ModelReadyRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelReadyResponse:
        return self._call(
            "ModelReady",
            context,
            lambda: kserve_pb.ModelReadyResponse(
                ready=self.serving.model_ready(request.name, request.version)
            ),
        )

    def ModelMetadata(
        self, request: kserve_pb.ModelMetadataRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelMetadataResponse:
        def make() -> kserve_pb.ModelMetadataResponse:
            meta = self.serving.model_metadata(request.name, request.version)
            tensor = kserve_pb.ModelMetadataResponse.TensorMetadata
            return kserve_pb.ModelMetadataResponse(
                name=meta.name,
                versions=list(meta.versions),
                platform=meta.platform,
                inputs=[
                    tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs
                ],
                outputs=[
                    tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs
                ],
            )

        return self._call("ModelMetadata", context, make)

    def ModelConfig(
        self, request: kserve_pb.ModelConfigRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelConfigResponse:
        return self._call(
            "ModelConfig",
            context,
            lambda: kserve_pb.ModelConfigResponse(
                config=self.serving.model_config(request.name, request.version)
            ),
        )

    def ModelStatistics(
        self, request: kserve_pb.ModelStatisticsRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelStatisticsResponse:
        return self._call(
            "ModelStatistics",
            context,
            lambda: self.serving.model_statistics(request.name, request.version),
        )

    # --- inference ----------------------------------------------------------------------
    def ModelInfer(
        self, request: kserve_pb.ModelInferRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelInferResponse:
        return self._call(
            "ModelInfer", context, lambda: self.infer(request, self.caller_of(context))
        )

    def stream_answer(
        self, request: kserve_pb.ModelInferRequest, caller: Caller
    ) -> kserve_pb.ModelStreamInferResponse:
        """One request of a stream, answered: its response, or its error as the message."""
        try:
            return kserve_pb.ModelStreamInferResponse(infer_response=self.infer(request, caller))
        except ServingError as exc:
            message = exc.message
        except Exception as exc:
            log.exception("internal error", extra={"fn": "ModelStreamInfer"})
            message = internal_message("ModelStreamInfer", exc)
        return kserve_pb.ModelStreamInferResponse(
            error_message=message,
            infer_response=kserve_pb.ModelInferResponse(
                model_name=request.model_name,
                model_version=request.model_version,
                id=request.id,
            ),
        )

    def infer(
        self, request: kserve_pb.ModelInferRequest, caller: Caller
    ) -> kserve_pb.ModelInferResponse:
        """One inference: decoded, run by the core, encoded; `caller`'s shared memory."""
        shm = self.serving.shm(caller)
        inputs = self._inputs(request, shm)
        places: dict[str, ShmPlace] = {}
        names: list[str] = []
        for output in request.outputs:
            what = f"output {output.name!r}"
            if output.name in names:
                raise invalid(f"{what} is asked for twice")
            names.append(output.name)
            if "classification" in output.parameters:
                raise ServingError(
                    Status.UNSUPPORTED,
                    f"{what}: the classification extension is not supported; ask for the "
                    "output itself",
                )
            place = shm_place(what, parameters_of(output.parameters)) if output.parameters else None
            if place is not None:
                shm.check(place.region, place.offset, place.byte_size)
                places[output.name] = place
        result = self.serving.infer(
            InferRequest(
                model=request.model_name,
                version=request.model_version,
                inputs=inputs,
                outputs=names or None,
                id=request.id,
                parameters=parameters_of(request.parameters) if request.parameters else {},
            )
        )
        return self._response(request, result, places, shm)

    def _inputs(
        self, request: kserve_pb.ModelInferRequest, shm: SharedMemoryApi
    ) -> dict[str, np.ndarray]:
        raw = request.raw_input_contents
        taken = 0  # raw contents used so far: one per input sent raw, in input order
        inputs: dict[str, np.ndarray] = {}
        for tensor in request.inputs:
            name = tensor.name
            what = f"input {name!r}"
            if name in inputs:
                raise invalid(f"{what} is given twice")
            dtype = tensor_dtype(what, tensor.datatype)
            shape = tensor_shape(what, tensor.shape)
            place = shm_place(what, parameters_of(tensor.parameters)) if tensor.parameters else None
            if place is not None:
                if tensor.HasField("contents"):
                    raise invalid(f"{what} has both contents and {SHM_REGION}")
                check_size(what, place.byte_size, dtype, shape)
                data = shm.read(place.region, place.offset, place.byte_size)
                inputs[name] = from_bytes(what, data, dtype, shape)
            elif tensor.HasField("contents"):
                inputs[name] = from_contents(what, tensor.contents, tensor.datatype, dtype, shape)
            elif taken < len(raw):
                inputs[name] = from_bytes(what, raw[taken], dtype, shape)
                taken += 1
            elif not raw:
                raise invalid(
                    f"{what} has no data: give raw_input_contents, contents or {SHM_REGION}"
                )
            else:
                taken += 1  # one too few: said below
        if taken != len(raw):
            sent_raw = [
                t.name
                for t in request.inputs
                if SHM_REGION not in t.parameters and not t.HasField("contents")
            ]
            raise invalid(
                f"{len(raw)} raw_input_contents for {len(sent_raw)} inputs sent raw "
                f"({', '.join(map(repr, sent_raw)) or 'none'}): one each, in the order of "
                "the inputs"
            )
        return inputs

    def _response(
        self,
        request: kserve_pb.ModelInferRequest,
        result: InferResponse,
        places: Mapping[str, ShmPlace],
        shm: SharedMemoryApi,
    ) -> kserve_pb.ModelInferResponse:
        response = kserve_pb.ModelInferResponse(
            model_name=result.model or request.model_name,
            model_version=result.version,
            id=result.id or request.id,
        )
        raw: list[bytes] = []
        asked = {o.name: o for o in request.outputs} if places else {}
        add = response.outputs.add
        for name, array in result.outputs.items():
            tensor = add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
            if places and name in places:
                write_to_shm(name, array, places[name], shm)
                for key in SHM_PARAMETERS:  # echoed, as Triton does
                    if key in asked[name].parameters:
                        tensor.parameters[key].CopyFrom(asked[name].parameters[key])
                raw.append(b"")  # one raw entry per output keeps the indices aligned
            else:
                raw.append(raw_output(array))
        response.raw_output_contents.extend(raw)
        return response

    # --- the model repository -----------------------------------------------------------
    def RepositoryIndex(
        self, request: kserve_pb.RepositoryIndexRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryIndexResponse:
        def make() -> kserve_pb.RepositoryIndexResponse:
            index = kserve_pb.RepositoryIndexResponse.ModelIndex
            return kserve_pb.RepositoryIndexResponse(
                models=[
                    index(name=m.name, version=m.version, state=m.state, reason=m.reason)
                    for m in self.serving.repository_index(ready_only=request.ready)
                ]
            )

        return self._call("RepositoryIndex", context, make)

    def RepositoryModelLoad(
        self, request: kserve_pb.RepositoryModelLoadRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryModelLoadResponse:
        def make() -> kserve_pb.RepositoryModelLoadResponse:
            config, files = load_parameters(request.parameters)
            self.serving.load_model(request.model_name, config, files or None)
            return kserve_pb.RepositoryModelLoadResponse()

        return self._call("RepositoryModelLoad", context, make)

    def RepositoryModelUnload(
        self, request: kserve_pb.RepositoryModelUnloadRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryModelUnloadResponse:
        def make() -> kserve_pb.RepositoryModelUnloadResponse:
            self.serving.unload_model(request.model_name)
            return kserve_pb.RepositoryModelUnloadResponse()

        return self._call("RepositoryModelUnload", context, make)

    # --- system shared memory -----------------------------------------------------------
    def SystemSharedMemoryRegister(
        self,
        request: kserve_pb.SystemSharedMemoryRegisterRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryRegisterResponse:
        def make() -> kserve_pb.SystemSharedMemoryRegisterResponse:
            if not request.name:
                raise invalid("a shared memory region needs a name")
            self.serving.shm(self.caller_of(context)).register(
                request.name, request.key, request.offset, request.byte_size
            )
            return kserve_pb.SystemSharedMemoryRegisterResponse()

        return self._call("SystemSharedMemoryRegister", context, make)

    def SystemSharedMemoryStatus(
        self,
        request: kserve_pb.SystemSharedMemoryStatusRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryStatusResponse:
        def make() -> kserve_pb.SystemSharedMemoryStatusResponse:
            status = kserve_pb.SystemSharedMemoryStatusResponse.RegionStatus
            return kserve_pb.SystemSharedMemoryStatusResponse(
                regions={
                    r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
                    for r in self.serving.shm(self.caller_of(context)).status(request.name)
                }
            )

        return self._call("SystemSharedMemoryStatus", context, make)

    def SystemSharedMemoryUnregister(
        self,
        request: kserve_pb.SystemSharedMemoryUnregisterRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryUnregisterResponse:
        def make() -> kserve_pb.SystemSharedMemoryUnregisterResponse:
            self.serving.shm(self.caller_of(context)).unregister(request.name)
            return kserve_pb.SystemSharedMemoryUnregisterResponse()

        return self._call("SystemSharedMemoryUnregister", context, make)

    # --- what this server does not do ---------------------------------------------------
    def CudaSharedMemoryRegister(self, request: Any, context: grpc.ServicerContext) -> NoReturn:
        abort(context, grpc.StatusCode.UNIMPLEMENTED, CUDA_SHM_UNSUPPORTED)

    def CudaSharedMemoryStatus(self, request: Any, context: grpc.ServicerContext) -> NoReturn:
        abort(context, grpc.StatusCode.UNIMPLEMENTED, CUDA_SHM_UNSUPPORTED)

    def CudaSharedMemoryUnregister(self, request: Any, context: grpc.ServicerContext) -> NoReturn:
        abort(context, grpc.StatusCode.UNIMPLEMENTED, CUDA_SHM_UNSUPPORTED)

    def TraceSetting(self, request: Any, context: grpc.ServicerContext) -> NoReturn:
        abort(
            context,
            grpc.StatusCode.UNIMPLEMENTED,
            "trace settings are not supported: this server keeps no traces (per-op "
            "profiles: load the model with enable_node_profiling and use neuron-cli profile)",
        )

    def LogSettings(self, request: Any, context: grpc.ServicerContext) -> NoReturn:
        abort(
            context,
            grpc.StatusCode.UNIMPLEMENTED,
            "log settings are not supported over the protocol: the daemon's log level is "
            "its -l flag (or log_level in its config)",
        )


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # it raises; this tells mypy


def load_parameters(parameters: Mapping[str, Any]) -> tuple[str, dict[str, bytes]]:
    """`RepositoryModelLoad`'s parameters: the `config` override (JSON) and the
    `file:<path>` contents."""
    config = ""
    files: dict[str, bytes] = {}
    for name, parameter in parameters.items():
        value = parameter_value(parameter)
        if name == "config":
            if not isinstance(value, str):
                raise invalid("parameter 'config' must be a string (a JSON model config)")
            config = value
        elif name.startswith("file:"):
            if not isinstance(value, bytes):
                raise invalid(f"parameter {name!r} must be bytes (the file's content)")
            files[name.removeprefix("file:")] = value
        else:
            raise invalid(
                f"unknown load parameter {name!r}: this server takes 'config' and 'file:<path>'"
            )
    return config, files
