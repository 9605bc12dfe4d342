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

Each method only lifts its request's tensors off the wire into the transport-free
decoder (`neuron_rtd/server/kserve_codec.py`) and puts the answer back (both in
`neuron_rtd/server/kserve_messages.py`); every failure is
answered through one decorator (`answered`) by the one table of
`neuron_rtd/server/kserve_errors.py`. In `ModelStreamInfer` a request's error is its
answer's `error_message` and the stream goes on (Triton's behaviour); answers come in
request order, up to `STREAM_WINDOW` requests of one stream running at once (so a
stream's requests can be batched together: the stream table, `server/streams.py`, keeps
that window).
CUDA shared memory is served as Triton built without GPUs serves it: no region is held
(status lists none, unregister has nothing to do), register is refused (INVALID_ARGUMENT).
Tracing and log settings answer UNIMPLEMENTED, saying why.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc

from neuron_rtd.proto import kserve_pb, kserve_pb_grpc
from neuron_rtd.runtime import Caller, stranger
from neuron_rtd.server.kserve_codec import OutputIn, decode, invalid, load_request
from neuron_rtd.server.kserve_errors import (
    GRPC_CODES,
    cuda_shm_register,
    cuda_shm_status,
    refusal,
)
from neuron_rtd.server.kserve_messages import (
    SOURCES,
    AnswerKey,
    all_outputs,
    lifted_inputs,
    parameters_of,
    raw_inputs,
    response_message,
)
from neuron_rtd.serving import InferRequest, ServingApi, SharedMemoryApi

log = logging.getLogger("nrtd.KSERVE")

STREAM_WINDOW = 16  # requests of one stream running at once

_STRANGER = stranger()  # who a request that names no region is taken for: it needs none

S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")


def answered(
    method: Callable[[S, Q, grpc.ServicerContext], R],
) -> Callable[[S, Q, grpc.ServicerContext], R]:
    """A method whose every failure is answered by the one error table: a `ServingError`
    with its status's gRPC code and its message, anything else INTERNAL (`refusal`)."""
    name = method.__name__

    @functools.wraps(method)
    def answer(self: S, request: Q, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except Exception as exc:
            status, message = refusal(exc, name, name)
        abort(context, GRPC_CODES[status], message)

    return answer


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
        self._strangers: SharedMemoryApi | None = None  # regions of a call that names none
        self._heads: dict[AnswerKey, kserve_pb.ModelInferResponse] = {}  # `all_outputs`'

    # --- health and metadata ------------------------------------------------------------
    @answered
    def ServerLive(
        self, request: kserve_pb.ServerLiveRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerLiveResponse:
        return kserve_pb.ServerLiveResponse(live=self.serving.live())

    @answered
    def ServerReady(
        self, request: kserve_pb.ServerReadyRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerReadyResponse:
        return kserve_pb.ServerReadyResponse(ready=self.serving.ready())

    @answered
    def ServerMetadata(
        self, request: kserve_pb.ServerMetadataRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ServerMetadataResponse:
        meta = self.serving.server_metadata()
        return kserve_pb.ServerMetadataResponse(
            name=meta.name, version=meta.version, extensions=list(meta.extensions)
        )

    @answered
    def ModelReady(
        self, request: kserve_pb.ModelReadyRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelReadyResponse:
        return kserve_pb.ModelReadyResponse(
            ready=self.serving.model_ready(request.name, request.version)
        )

    @answered
    def ModelMetadata(
        self, request: kserve_pb.ModelMetadataRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelMetadataResponse:
        meta = self.serving.model_metadata(request.name, request.version)
        tensor = kserve_pb.ModelMetadataResponse.TensorMetadata
        return kserve_pb.ModelMetadataResponse(
            name=meta.name,
            versions=list(meta.versions),
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    @answered
    def ModelConfig(
        self, request: kserve_pb.ModelConfigRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelConfigResponse:
        return kserve_pb.ModelConfigResponse(
            config=self.serving.model_config(request.name, request.version)
        )

    @answered
    def ModelStatistics(
        self, request: kserve_pb.ModelStatisticsRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelStatisticsResponse:
        return self.serving.model_statistics(request.name, request.version)

    # --- inference ----------------------------------------------------------------------
    @answered
    def ModelInfer(
        self, request: kserve_pb.ModelInferRequest, context: grpc.ServicerContext
    ) -> kserve_pb.ModelInferResponse:
        return self.infer(request, lambda: self.caller_of(context))

    def stream_answer(
        self, request: kserve_pb.ModelInferRequest, caller: Caller
    ) -> kserve_pb.ModelStreamInferResponse:
        """One request of a stream, answered: its response, or its error as the message."""
        try:
            answer = self.infer(request, lambda: caller)
            return kserve_pb.ModelStreamInferResponse(infer_response=answer)
        except Exception as exc:
            _, message = refusal(exc, "ModelStreamInfer", "ModelStreamInfer")
        return kserve_pb.ModelStreamInferResponse(
            error_message=message,
            infer_response=kserve_pb.ModelInferResponse(
                model_name=request.model_name,
                model_version=request.model_version,
                id=request.id,
            ),
        )

    def infer(
        self, request: kserve_pb.ModelInferRequest, caller: Callable[[], Caller]
    ) -> kserve_pb.ModelInferResponse:
        """One inference: its tensors lifted off the message and decoded, run by the core,
        its answer put back. Only a tensor's parameters name a shared-memory region, so
        who calls (`caller()`: a stat of the daemon's socket, its peer) is asked only
        when some tensor has parameters; otherwise the regions are a stranger's, none.
        The common request (every input raw, no parameters, no output named) is decoded
        in one pass over its message (`raw_inputs`), to the same arrays and answers."""
        if not request.outputs and not request.parameters:
            arrays = raw_inputs(request)
            if arrays is not None:
                one = InferRequest(
                    request.model_name, arrays, request.model_version, None, request.id, {}
                )
                return all_outputs(request, self.serving.infer(one), self._heads)
        inputs, named = lifted_inputs(request)
        asked = request.outputs
        outputs = [OutputIn(o.name, parameters_of(o.parameters)) for o in asked] if asked else []
        if named or any(o.parameters for o in outputs):
            shm = self.serving.shm(caller())
        else:
            shm = self._strangers or self._stranger_regions()
        decoded = decode(
            request.model_name,
            request.model_version,
            request.id,
            parameters_of(request.parameters) if request.parameters else {},
            inputs,
            outputs,
            shm,
            SOURCES,
        )
        return response_message(request, decoded, self.serving.infer(decoded.request), shm)

    def _stranger_regions(self) -> SharedMemoryApi:
        """A stranger's regions (none): asked of the core once, kept."""
        self._strangers = self.serving.shm(_STRANGER)
        return self._strangers

    # --- the model repository -----------------------------------------------------------
    @answered
    def RepositoryIndex(
        self, request: kserve_pb.RepositoryIndexRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryIndexResponse:
        index = kserve_pb.RepositoryIndexResponse.ModelIndex
        return kserve_pb.RepositoryIndexResponse(
            models=[
                index(name=m.name, version=m.version, state=m.state, reason=m.reason)
                for m in self.serving.repository_index(ready_only=request.ready)
            ]
        )

    @answered
    def RepositoryModelLoad(
        self, request: kserve_pb.RepositoryModelLoadRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryModelLoadResponse:
        config, files = load_request(parameters_of(request.parameters))
        self.serving.load_model(request.model_name, config, files or None)
        return kserve_pb.RepositoryModelLoadResponse()

    @answered
    def RepositoryModelUnload(
        self, request: kserve_pb.RepositoryModelUnloadRequest, context: grpc.ServicerContext
    ) -> kserve_pb.RepositoryModelUnloadResponse:
        self.serving.unload_model(request.model_name)
        return kserve_pb.RepositoryModelUnloadResponse()

    # --- system shared memory -----------------------------------------------------------
    @answered
    def SystemSharedMemoryRegister(
        self,
        request: kserve_pb.SystemSharedMemoryRegisterRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryRegisterResponse:
        if not request.name:
            raise invalid("a shared memory region needs a name")
        self.serving.shm(self.caller_of(context)).register(
            request.name, request.key, request.offset, request.byte_size
        )
        return kserve_pb.SystemSharedMemoryRegisterResponse()

    @answered
    def SystemSharedMemoryStatus(
        self,
        request: kserve_pb.SystemSharedMemoryStatusRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryStatusResponse:
        status = kserve_pb.SystemSharedMemoryStatusResponse.RegionStatus
        return kserve_pb.SystemSharedMemoryStatusResponse(
            regions={
                r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
                for r in self.serving.shm(self.caller_of(context)).status(request.name)
            }
        )

    @answered
    def SystemSharedMemoryUnregister(
        self,
        request: kserve_pb.SystemSharedMemoryUnregisterRequest,
        context: grpc.ServicerContext,
    ) -> kserve_pb.SystemSharedMemoryUnregisterResponse:
        self.serving.shm(self.caller_of(context)).unregister(request.name)
        return kserve_pb.SystemSharedMemoryUnregisterResponse()

    # --- CUDA shared memory, as Triton without GPUs ---------------------------------------
    @answered
    def CudaSharedMemoryRegister(
        self, request: kserve_pb.CudaSharedMemoryRegisterRequest, context: grpc.ServicerContext
    ) -> kserve_pb.CudaSharedMemoryRegisterResponse:
        raise cuda_shm_register(request.name, "SystemSharedMemoryRegister")

    @answered
    def CudaSharedMemoryStatus(
        self, request: kserve_pb.CudaSharedMemoryStatusRequest, context: grpc.ServicerContext
    ) -> kserve_pb.CudaSharedMemoryStatusResponse:
        if request.name:  # asked by name: is it the caller's system shared memory?
            cuda_shm_status(request.name, self.serving.shm(self.caller_of(context)))
        return kserve_pb.CudaSharedMemoryStatusResponse()  # no region: none is held

    @answered
    def CudaSharedMemoryUnregister(
        self, request: kserve_pb.CudaSharedMemoryUnregisterRequest, context: grpc.ServicerContext
    ) -> kserve_pb.CudaSharedMemoryUnregisterResponse:
        return kserve_pb.CudaSharedMemoryUnregisterResponse()  # none is held: done

    # --- what this server does not do ---------------------------------------------------
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
