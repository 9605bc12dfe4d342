"""The gRPC adapters over the runtime's face: the nmgr service and streamed inference
(`nmgr`), client sessions (`sessions`), our extension (`ext`), load-stream reading
(`load_stream`), wire conversion (`wire`), the one error mapping (`calls`), and the
standard health and reflection services (`health`)."""

from __future__ import annotations

import grpc

from neuron_rtd.proto import ext_pb_grpc, pb_grpc
from neuron_rtd.runtime import Runtime
from neuron_rtd.server.ext import ExtServicer
from neuron_rtd.server.health import Health
from neuron_rtd.server.nmgr import NmgrServicer, StreamServicer
from neuron_rtd.server.sessions import SessionServicer

__all__ = ["Health", "SessionServicer", "add_servicers"]


def add_servicers(
    server: grpc.Server, runtime: Runtime, *, address: str, sim_root: str, instance_type: str
) -> tuple[SessionServicer, Health]:
    """Add every service to `server`; the session service, which the daemon closes at
    its stop, and the health service, which it keeps up to date."""
    nmgr = NmgrServicer(runtime)
    sessions = SessionServicer(runtime)
    pb_grpc.add_nmgr_v1Servicer_to_server(nmgr, server)
    pb_grpc.add_nmgr_streamServicer_to_server(StreamServicer(nmgr), server)
    pb_grpc.add_nmgr_session_managerServicer_to_server(sessions, server)
    ext_pb_grpc.add_nmgr_extServicer_to_server(
        ExtServicer(runtime, address=address, sim_root=sim_root, instance_type=instance_type),
        server,
    )
    return sessions, Health(server, runtime)
