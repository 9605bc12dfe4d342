"""The gRPC adapters over the runtime's face: the nmgr service and streamed inference
(`nmgr`), client sessions (`sessions`), our extension (`ext`), load-stream reading
(`load_stream`), wire conversion (`wire`), the one error mapping (`calls`), the session a
call presents (`caller`), the peer socket where clients pass shared memory
(`peer_socket`), and the standard health and reflection services (`health`).

Long streams never hold the server's call threads: session and health-watch streams hold
no thread at all, and each `load` or `infer_stream` runs on a pool of its own
(`STREAM_THREADS`), so clients that keep streams open cannot starve the unary calls."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import grpc

from neuron_rtd.proto import ext_pb_grpc, kserve_pb_grpc, pb_grpc
from neuron_rtd.runtime import Runtime
from neuron_rtd.server.caller import CallerOf
from neuron_rtd.server.ext import ExtServicer
from neuron_rtd.server.health import Health
from neuron_rtd.server.kserve import KServeServicer
from neuron_rtd.server.nmgr import NmgrServicer, StreamServicer
from neuron_rtd.server.peer_socket import PeerSocket, Tickets
from neuron_rtd.server.sessions import SessionServicer
from neuron_rtd.serving.api import ServingApi

__all__ = [
    "Health",
    "KServeServicer",
    "PeerSocket",
    "ServicerSet",
    "SessionServicer",
    "Tickets",
    "add_servicers",
]

STREAM_THREADS = 64  # loads and infer streams running at once, each kind


class ServicerSet(NamedTuple):
    """The services the daemon acts on itself: it closes the session streams and ends
    the idle v2 streams at its stop, and keeps the health up to date."""

    sessions: SessionServicer
    health: Health
    kserve: KServeServicer | None


def _on_pool(method: Callable[..., Any], pool: ThreadPoolExecutor) -> Callable[..., Any]:
    """`method`, run by gRPC on `pool` instead of the server's call threads."""

    def handler(*args: Any) -> Any:
        return method(*args)

    handler.experimental_thread_pool = pool  # type: ignore[attr-defined]
    return handler


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
) -> ServicerSet:
    """Add every service to `server` (the KServe v2 one when given its `serving` core);
    those the daemon acts on itself."""
    nmgr = NmgrServicer(runtime)
    nmgr.load = _on_pool(nmgr.load, ThreadPoolExecutor(STREAM_THREADS, "nmgr-load"))  # type: ignore[method-assign]
    streams = StreamServicer(nmgr)
    streams.infer_stream = _on_pool(  # type: ignore[method-assign]
        streams.infer_stream, ThreadPoolExecutor(STREAM_THREADS, "nmgr-stream")
    )
    sessions = SessionServicer(runtime, tickets)
    pb_grpc.add_nmgr_v1Servicer_to_server(nmgr, server)
    pb_grpc.add_nmgr_streamServicer_to_server(streams, server)
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
            caller_of=CallerOf(address),
            stream_pool=ThreadPoolExecutor(STREAM_THREADS, "kserve-stream-infer"),
            # one reader per open stream (each runs on the pool below), with room for a
            # reader still finishing as its stream's handler ends
            read_pool=ThreadPoolExecutor(2 * STREAM_THREADS, "kserve-stream-read"),
        )
        kserve.ModelStreamInfer = _on_pool(  # type: ignore[method-assign]
            kserve.ModelStreamInfer, ThreadPoolExecutor(STREAM_THREADS, "kserve-stream")
        )
        kserve_pb_grpc.add_GRPCInferenceServiceServicer_to_server(kserve, server)
    return ServicerSet(sessions, Health(server, runtime), kserve)
