"""The session service (`nrt.nmgr_session_manager`): `session_monitor` is a client's
stream for its whole life. When the stream ends (the client exited or was killed) the
runtime releases the models, NCGs and shm maps made with its session id."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import grpc

from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.runtime import Runtime
from neuron_rtd.server import wire

log = logging.getLogger("nrtd.NMGR")

_SESSION = {"fn": "session_monitor"}


class SessionServicer(pb_grpc.nmgr_session_managerServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._open: dict[int, grpc.ServicerContext] = {}
        self._stopping = False
        self._lock = threading.Lock()

    def session_monitor(
        self, request_iterator: Iterator[pb.session_monitor_request], context: grpc.ServicerContext
    ) -> Iterator[pb.session_monitor_response]:
        if next(request_iterator, None) is None:
            return
        session_id = self.runtime.open_session()
        with self._lock:
            self._open[session_id] = context
        ended = threading.Event()

        def end() -> None:
            if ended.is_set():
                return
            ended.set()
            with self._lock:
                self._open.pop(session_id, None)
                stopping = self._stopping
            self._end(session_id, release=not stopping)

        context.add_callback(end)
        log.info("Session %d opened", session_id, extra=_SESSION)
        yield pb.session_monitor_response(
            session_id=session_id, runtime_version=wire.version(self.runtime.version)
        )
        with contextlib.suppress(grpc.RpcError):
            for _ in request_iterator:  # the client keeps the stream open while it lives
                pass
        end()

    def close(self) -> None:
        """End every session stream (the daemon stops): they would hold up its drain."""
        with self._lock:
            self._stopping = True
            contexts = list(self._open.values())
        for context in contexts:
            context.cancel()

    def _end(self, session_id: int, *, release: bool) -> None:
        try:
            released = self.runtime.end_session(session_id, release=release)
        except Exception:
            log.exception("releasing session %d failed", session_id, extra=_SESSION)
            return
        if released is None:  # the daemon's drain unloads everything itself
            log.info("Session %d ended: the daemon stops", session_id, extra=_SESSION)
            return
        log.info(
            "Session %d ended: unloaded models %s, destroyed NCGs %s, unmapped %s",
            session_id,
            released.models or "none",
            released.ncgs or "none",
            released.shm_maps or "none",
            extra=_SESSION,
        )
