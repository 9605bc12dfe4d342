"""The session service (`nrt.nmgr_session_manager`): `session_monitor` is a client's
stream for its whole life. When the stream ends (the client closed it, exited or was
killed) the runtime releases the models, NCGs and shm maps made with its session id.

A session stream holds no server thread: a thousand idle clients cost memory, not the
daemon's attention. grpcio's sync server can answer a stream without a thread
(`experimental_non_blocking`), but has no public way to read one without blocking a
thread, and grpc.aio, which has, costs every unary call 0.12 ms more (measured here:
0.46 -> 0.59 ms per call). So the stream's reads are asked of gRPC's completion queue
directly (`neuron_rtd/server/streams.py:read_async`, on grpcio's server internals, pinned
with grpcio in pyproject.toml); what a read ends (a release) runs on a small pool of its
own. An error in either is logged, and both serve on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from neuron_rtd.errors import Nerr, NrtError
from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.runtime import Runtime, SessionId, session_tag
from neuron_rtd.server import wire
from neuron_rtd.server.caller import presented_ticket
from neuron_rtd.server.peer_socket import Tickets
from neuron_rtd.server.stream_io import guarded, read_async

log = logging.getLogger("nrtd.NMGR")

_SESSION = {"fn": "session_monitor"}
RELEASE_WORKERS = 2  # sessions released at once (their models unloaded, NCGs destroyed)


class _SessionStream:
    """One open session stream: its id, and its end, which happens once."""

    def __init__(
        self,
        servicer: SessionServicer,
        session_id: SessionId,
        requests: Iterator[Any],
        context: grpc.ServicerContext,
        send: Callable[[Any], None],
    ) -> None:
        self.servicer = servicer
        self.session_id = session_id
        self.requests = requests
        self.context = context
        self.send = send
        self._ended = False
        self._lock = threading.Lock()

    def on_read(self, request: Any) -> None:
        """On gRPC's thread: a request from the client (read on, ignored), or its end."""
        if request is not None:
            read_async(self.requests, self.on_read)
            return
        self.servicer.later(lambda: self.end(close_stream=True))

    def on_done(self) -> None:
        """The call ended (cancelled, the connection lost, or ended by us): on gRPC's
        thread, which logs what this raises, and serves on."""
        self.servicer.later(lambda: self.end(close_stream=False))

    def end(self, close_stream: bool) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.servicer.ended(self)
        if close_stream:
            self.send(None)  # the stream ends once the session is released


class SessionServicer(pb_grpc.nmgr_session_managerServicer):
    def __init__(
        self, runtime: Runtime, tickets: Tickets, *, release_threads: int = RELEASE_WORKERS
    ) -> None:
        self.runtime = runtime
        self.tickets = tickets
        self._open: dict[int, _SessionStream] = {}
        self._stopping = False
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(release_threads, thread_name_prefix="session-end")

    def session_monitor(  # type: ignore[override]
        self,
        request_iterator: Iterator[pb.session_monitor_request],
        context: grpc.ServicerContext,
        send_response: Callable[[Any], None],
    ) -> None:
        """Answer the session id at once (the client's one request is read, and ignored,
        with the rest), then return: the stream holds no thread until it ends. The session
        is the user's that a peer ticket in the metadata names, if any (see peer_socket)."""
        try:
            ticket = presented_ticket(context)
            peer = None if ticket is None else self.tickets.take(ticket)
            session_id = self.runtime.open_session(peer)
        except NrtError as exc:
            log.error("%s", exc, extra=_SESSION)
            refused = exc.code == Nerr.RESOURCE
            context.set_code(
                grpc.StatusCode.RESOURCE_EXHAUSTED if refused else grpc.StatusCode.INVALID_ARGUMENT
            )
            context.set_details(str(exc))
            send_response(None)
            return
        stream = _SessionStream(self, session_id, request_iterator, context, send_response)
        with self._lock:
            self._open[session_id] = stream
        who = "unidentified" if peer is None else f"uid {peer}"
        log.info("Session %s opened (%s)", session_tag(session_id), who, extra=_SESSION)
        send_response(
            pb.session_monitor_response(
                session_id=session_id, runtime_version=wire.version(self.runtime.version)
            )
        )
        if not context.add_callback(stream.on_done) or not read_async(
            request_iterator, stream.on_read
        ):
            stream.on_done()  # it ended already

    session_monitor.experimental_non_blocking = True  # type: ignore[attr-defined]

    def later(self, work: Callable[[], None]) -> None:
        """Run `work` on the release pool (never on gRPC's thread, which must not wait);
        inline once the pool is shut (the daemon stops: nothing is released then)."""
        try:
            self.pool.submit(guarded, "session_monitor", work)
        except RuntimeError:
            guarded("session_monitor", work)

    def ended(self, stream: _SessionStream) -> None:
        """Release what the session holds (unless the daemon stops: its drain does)."""
        with self._lock:
            self._open.pop(stream.session_id, None)
            stopping = self._stopping
        self._end(stream.session_id, release=not stopping)

    def close(self) -> None:
        """End every session stream (the daemon stops): they would hold up its drain."""
        with self._lock:
            self._stopping = True
            streams = list(self._open.values())
        for stream in streams:
            stream.context.cancel()
        self.pool.shutdown(wait=True)

    def _end(self, session_id: SessionId, *, release: bool) -> None:
        tag = session_tag(session_id)
        try:
            released = self.runtime.end_session(session_id, release=release)
        except Exception:
            log.exception("releasing session %s failed", tag, extra=_SESSION)
            return
        if released is None:  # the daemon's drain unloads everything itself
            log.info("Session %s ended: the daemon stops", tag, extra=_SESSION)
            return
        log.info(
            "Session %s ended: unloaded models %s, destroyed NCGs %s, unmapped %s",
            tag,
            released.models or "none",
            released.ncgs or "none",
            released.shm_maps or "none",
            extra=_SESSION,
        )
