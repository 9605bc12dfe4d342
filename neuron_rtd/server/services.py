"""Every gRPC service of the daemon added to its server (`add_servicers`): nmgr, with its
load and inference streams served by the stream table (no thread held while a stream
waits), sessions, the extension, and the KServe v2 service when the daemon serves a
model repository; and the services the daemon acts on itself (`ServicerSet`)."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import grpc

from neuron_rtd.proto import ext_pb_grpc, kserve_pb, kserve_pb_grpc, pb, pb_grpc
from neuron_rtd.runtime import ComputeGate, Runtime
from neuron_rtd.server.caller import CallerOf
from neuron_rtd.server.ext import ExtServicer
from neuron_rtd.server.health import Health
from neuron_rtd.server.kserve import STREAM_WINDOW, KServeServicer
from neuron_rtd.server.kserve_messages import parameter_value
from neuron_rtd.server.nmgr import InferAnswers, LoadAnswers, NmgrServicer, StreamServicer
from neuron_rtd.server.peer_socket import Tickets
from neuron_rtd.server.pool import server_pool
from neuron_rtd.server.sessions import RELEASE_WORKERS, SessionServicer
from neuron_rtd.server.streams import StreamTable
from neuron_rtd.serving import ServingApi

STREAM_THREADS = 64  # stream requests worked on at once (loads; inferences), each kind


class ServicerSet(NamedTuple):
    """The services the daemon acts on itself: it closes the session streams and ends
    the request streams at its stop, and keeps the health up to date."""

    sessions: SessionServicer
    health: Health
    kserve: KServeServicer | None
    streams: StreamTable


class _Replacing:
    """`server` as a generated `add_*Servicer_to_server` sees it, with the handlers
    named in `replaced` put in place of the generated ones: the streams served by
    `streams` (non-blocking handlers; `load`, stream-unary on the wire, served as a
    stream that answers once)."""

    def __init__(self, server: grpc.Server, replaced: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server = server
        self.replaced = replaced

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """The generated generic handler is made again in `add_registered_method_handlers`
        from the handlers as replaced."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        handlers = {**handlers, **self.replaced}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self.server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]


class _KServeStream:
    """A `ModelStreamInfer` served by `streams`: each request answered as the v2
    service's `stream_answer` answers it, for the stream's caller. The stream works on
    several requests at once; a request of a sequence (parameter `sequence_id`) waits
    for the one before it of that model and sequence in this stream to be answered, so
    a sequence's requests reach its scheduler in the order they were sent."""

    def __init__(
        self, kserve: KServeServicer, context: grpc.ServicerContext, gate: ComputeGate
    ) -> None:
        self.kserve = kserve
        self.caller = kserve.caller_of(context)
        self.gate = gate
        self._lock = threading.Lock()
        # (model, sequence id) -> the latest request's "answered"; a request by id -> its
        # sequence's key, the "answered" of the request before it, and its own
        self._last: dict[tuple[str, object], threading.Event] = {}
        self._order: dict[
            int, tuple[tuple[str, object], threading.Event | None, threading.Event]
        ] = {}

    def arrived(self, request: Any) -> None:
        """A request read, in the stream's order (on gRPC's thread: quick)."""
        if "sequence_id" not in request.parameters:
            return
        key = (request.model_name, parameter_value(request.parameters["sequence_id"]))
        answered = threading.Event()
        with self._lock:
            before = self._last.get(key)
            self._last[key] = answered
            self._order[id(request)] = (key, before, answered)

    def answer(self, request: Any) -> Any:
        with self._lock:
            order = self._order.pop(id(request), None)
        if order is None:
            return self.kserve.stream_answer(request, self.caller)
        key, before, answered = order
        try:
            if before is not None:
                with self.gate.waiting():
                    before.wait()
            return self.kserve.stream_answer(request, self.caller)
        finally:
            answered.set()
            with self._lock:
                if self._last.get(key) is answered:
                    del self._last[key]

    def end(self) -> None:
        return None


def add_servicers(
    server: grpc.Server,
    runtime: Runtime,
    *,
    address: str,
    sim_root: str,
    instance_type: str,
    tickets: Tickets,
    peer_socket: str = "",
    serving: ServingApi | None = None,
    stream_threads: int = STREAM_THREADS,
    session_end_threads: int = RELEASE_WORKERS,
    caller_of: CallerOf | None = None,
) -> ServicerSet:
    """Add every service to `server` (the KServe v2 one when given its `serving` core);
    those the daemon acts on itself. Streams' requests run on pools of `stream_threads`
    threads each (loads; inferences), on the runtime's compute gate's turns; ended
    sessions are released `session_end_threads` at once. `caller_of` names the callers on
    every address the server listens on (default: those of `address` alone)."""
    table = StreamTable()
    gate = runtime.compute_gate
    infer_pool = server_pool(gate, stream_threads, "stream")  # infer_stream's and v2's
    nmgr = NmgrServicer(runtime)
    replaced = {
        "load": table.handler(
            "load",
            lambda context: LoadAnswers(nmgr, context),
            request=pb.load_request,
            response=pb.load_response,
            pool=server_pool(gate, stream_threads, "load"),
            unary=True,
        )
    }
    streamed = {
        "infer_stream": table.handler(
            "infer_stream",
            lambda context: InferAnswers(nmgr, context),
            request=pb.infer_request,
            response=pb.infer_response,
            pool=infer_pool,
        )
    }
    sessions = SessionServicer(runtime, tickets, release_threads=session_end_threads)
    pb_grpc.add_nmgr_v1Servicer_to_server(nmgr, _Replacing(server, replaced))
    pb_grpc.add_nmgr_streamServicer_to_server(StreamServicer(nmgr), _Replacing(server, streamed))
    pb_grpc.add_nmgr_session_managerServicer_to_server(sessions, server)
    ext_pb_grpc.add_nmgr_extServicer_to_server(
        ExtServicer(
            runtime,
            address=address,
            sim_root=sim_root,
            instance_type=instance_type,
            peer_socket=peer_socket,
        ),
        server,
    )
    kserve = None
    if serving is not None:
        kserve = KServeServicer(
            serving,
            caller_of=caller_of or CallerOf(address),
        )
        v2 = kserve
        kserve_streamed = {
            "ModelStreamInfer": table.handler(
                "ModelStreamInfer",
                lambda context: _KServeStream(v2, context, gate),
                request=kserve_pb.ModelInferRequest,
                response=kserve_pb.ModelStreamInferResponse,
                pool=infer_pool,
                window=STREAM_WINDOW,
            )
        }
        kserve_pb_grpc.add_GRPCInferenceServiceServicer_to_server(
            kserve, _Replacing(server, kserve_streamed)
        )
    return ServicerSet(sessions, Health(server, runtime), kserve, table)
