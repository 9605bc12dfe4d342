"""The standard gRPC health service (`grpc.health.v1.Health`) and server reflection.

Health answers SERVING, for the whole server ("") and for each of our services, while
the runtime's devices are up; NOT_SERVING while their init fails, and from the moment
the daemon starts to drain: watchers are told at once, then their streams end, so that
they do not hold up the drain. Reflection lists our services, the health service and
itself, so `grpcurl` works without the .proto files.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from neuron_rtd.proto import KSERVE_SERVICE, NMGR_EXT, NMGR_SESSION_MANAGER, NMGR_STREAM, NMGR_V1
from neuron_rtd.runtime import Runtime

SERVICES = (NMGR_V1, NMGR_STREAM, NMGR_SESSION_MANAGER, NMGR_EXT, KSERVE_SERVICE)
HEALTH_SERVICE = health.SERVICE_NAME
REFLECTION_SERVICE = reflection.SERVICE_NAME

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Servicer(health.HealthServicer):
    """The library's servicer, whose Watch streams can be ended (at the drain)."""

    def __init__(self) -> None:
        super().__init__()
        self._ends_lock = threading.Lock()
        self._ends: set[Callable[[Any], None]] = set()

    def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
        send_response_callback: Callable[[Any], None] | None = None,
    ) -> Any:
        if send_response_callback is None:  # a server without non-blocking streams
            return super().Watch(request, context)
        send_response = send_response_callback
        ended = False

        def send(response: Any) -> None:  # None ends the stream: once
            nonlocal ended
            if response is None:
                with self._ends_lock:
                    if ended:
                        return
                    ended = True
                    self._ends.discard(send)
            send_response(response)

        with self._ends_lock:
            self._ends.add(send)
        return super().Watch(request, context, send)

    def end_watches(self) -> None:
        with self._ends_lock:
            ends = list(self._ends)
        for end in ends:
            end(None)


class Health:
    """The health servicer of one server, kept in step with its runtime by `update()`."""

    def __init__(self, server: grpc.Server, runtime: Runtime) -> None:
        self.runtime = runtime
        self.servicer = _Servicer()
        self._serving: bool | None = None
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        reflection.enable_server_reflection((*SERVICES, HEALTH_SERVICE, REFLECTION_SERVICE), server)
        self.update()

    def update(self) -> None:
        """Set every status from whether the runtime's devices are up (cheap: called
        twice a second by the daemon's main loop)."""
        serving = self.runtime.ready()
        if serving is self._serving:
            return
        self._serving = serving
        status = _SERVING if serving else _NOT_SERVING
        for name in ("", *SERVICES):
            self.servicer.set(name, status)

    def drain(self) -> None:
        """NOT_SERVING for good, told to every watcher, whose streams then end: the
        server is about to stop."""
        self.servicer.enter_graceful_shutdown()
        self.servicer.end_watches()
