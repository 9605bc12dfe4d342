"""Request streams that hold no thread while they wait for their client: `infer_stream`,
KServe's `ModelStreamInfer` and `load` (`StreamTable.serve`).

grpcio's sync server runs a streaming handler on a thread for the stream's whole life,
blocked in the request iterator while the client says nothing: 64 idle streams filled a
pool of 64 threads, and every other client's stream or load waited past its deadline.
Here a stream's reads and answers are asked of gRPC's completion queue (`read_async`,
`send_async`, `neuron_rtd/server/stream_io.py`, as the session streams do): a stream
takes a thread of its pool only to work on a request it has read (an inference, a load's
chunk copied into its buffer, the load itself), so any number of idle streams leave the
pool to those that have work.

An idle stream still costs memory, so the table holds at most `most` streams; when it is
full, the stream that has waited longest for its client (nothing of it running) gives way
to the new one: it ends with RESOURCE_EXHAUSTED saying so. A stream with work running is
never ended; when every stream has work, the new one is refused. A caller that presents
its session (metadata `nrt-session-id`) holds at most `per_session` streams; one more is
refused with RESOURCE_EXHAUSTED. A load stream that sends nothing for `stalled_after_s`
(it holds its NEFF's admitted memory) is ended with RESOURCE_EXHAUSTED too.

Everything here that runs on gRPC's own thread (the completion queue's, which serves
every call) only notes what came and hands work to a pool; any error there is logged and
never raised into gRPC, whose thread would end with it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, Protocol

import grpc

from neuron_rtd.errors import NrtError
from neuron_rtd.runtime import SessionId
from neuron_rtd.server.caller import presented_session
from neuron_rtd.server.stream_io import broke_off, guarded, read_async, send_async

log = logging.getLogger("nrtd.NMGR")

MAX_OPEN_STREAMS = 1024  # open request streams, every kind together
MAX_STREAMS_PER_SESSION = 64  # of them presenting one session
STALLED_AFTER_S = 20.0  # a load stream that sends nothing this long is ended
_SWEEP_S = 1.0


class Answers(Protocol):
    """What one stream does with its requests, on its pool's threads. One may also have
    `arrived(request)`, called for each request as it is read, in the stream's order,
    on gRPC's thread (quick; it must not raise), before its `answer` is worked on."""

    def answer(self, request: Any) -> Any | None:
        """The answer to one request (None: none to send)."""

    def end(self) -> Any | None:
        """Once the client has sent its last request: the last answer (None: none)."""


class _Stream:
    """One open request stream: its reads, the work on its pool, its answers in request
    order (`window` requests worked on at once), and its end, which happens once. A
    `unary` stream (a load) sends one answer, then ends."""

    def __init__(
        self,
        table: StreamTable,
        kind: str,
        requests: Iterator[Any],
        context: grpc.ServicerContext,
        send: Callable[[Any], None],
        answers: Answers,
        *,
        pool: futures.Executor,
        window: int,
        unary: bool,
        session: SessionId | None,
    ) -> None:
        self.table = table
        self.kind = kind
        self.requests = requests
        self.context = context
        self.send = send
        self.answers = answers
        self.pool = pool
        self.window = window
        self.unary = unary
        self.session = session
        self.running = 0  # requests being worked on (read without the lock: an int)
        self.last_active = time.monotonic()  # its last request, or answer taken
        self.client_done = False  # the client ended its side
        self.ended = False
        self._pending: collections.deque[futures.Future[Any]] = collections.deque()
        self._reading = False
        self._sending = False
        self._stopping = False  # read no more: answered (unary), or the daemon stops
        self._last_queued = False  # answers.end() asked for
        self._lock = threading.RLock()
        self._arrived: Callable[[Any], None] | None = getattr(answers, "arrived", None)

    def idle(self) -> bool:
        """Nothing of it is being worked on: it waits for its client."""
        return not self.running and not self.ended

    def start(self) -> None:
        if not self.context.add_callback(self._on_done):
            self._on_done()  # it ended already
            return
        self._pump()

    def drain(self) -> None:
        """The daemon stops: a stream ends once it has answered what it has read; a load
        still reading its client's messages ends at once, UNAVAILABLE."""
        with self._lock:
            self._stopping = True
            cut = self.unary and not self.client_done and not self._last_queued
        if cut:
            self.end(grpc.StatusCode.UNAVAILABLE, f"{self.kind}: the daemon is stopping")
        else:
            self._pump()

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """End the call with `code` (once; nothing more is read or sent)."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
        self.table._forget(self)
        if code is not grpc.StatusCode.OK:
            self.context.set_code(code)
            self.context.set_details(details)
        guarded(self.kind, lambda: self.send(None))  # the status (no-op once cancelled)

    # --- on gRPC's thread, the pool's, or the table's ---------------------------------
    def _on_done(self) -> None:
        """The call ended (cancelled, the connection lost, or ended by us)."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            unanswered = self.unary and not self._stopping
        self.table._forget(self)
        if unanswered:
            broke_off(self.kind)

    def _on_read(self, request: Any) -> None:
        with self._lock:
            self._reading = False
            if self.ended:
                return
            self.last_active = time.monotonic()
            if request is None:
                if not self.context.is_active():  # cancelled, not ended by the client
                    self._on_done()
                    return
                self.client_done = True
            else:
                if self._arrived is not None:
                    self._arrived(request)
                self._work(lambda: self.answers.answer(request))
        self._pump()

    def _on_sent(self) -> None:
        with self._lock:
            self._sending = False
            self.last_active = time.monotonic()
        self._pump()

    def _work(self, make: Callable[[], Any]) -> None:
        """`make` run on the pool; its answer sent in turn (under the lock)."""
        self.running += 1
        try:
            future = self.pool.submit(self._run, make)
        except RuntimeError:  # the pool is shut: the daemon stops
            self.running -= 1
            stopping = f"{self.kind}: the daemon is stopping"
            self.table.later(lambda: self.end(grpc.StatusCode.UNAVAILABLE, stopping))
            return
        self._pending.append(future)
        future.add_done_callback(self._worked)

    def _run(self, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except NrtError as exc:  # answers make their own errors; this is a refusal
            return _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"{self.kind}: {exc}")
        except Exception:
            log.exception("internal error", extra={"fn": self.kind})
            return _Failed(
                grpc.StatusCode.INTERNAL,
                f"{self.kind}: an internal error ended the stream (the daemon's log has "
                "its traceback)",
            )

    def _worked(self, future: futures.Future[Any]) -> None:
        with self._lock:
            self.running -= 1
        guarded(self.kind, self._pump)

    def _pump(self) -> None:
        """Whatever may happen next: the next answer sent, the next request read, or the
        stream's end."""
        failed: _Failed | None = None
        finished = False
        with self._lock:
            if self.ended:
                return
            while not self._sending and self._pending and self._pending[0].done():
                answer = self._pending.popleft().result()
                if answer is None:
                    continue
                if isinstance(answer, _Failed):
                    failed = answer
                    break
                if not send_async(self.requests, answer.SerializeToString(), self._on_sent):
                    return  # the call ended: _on_done ends the stream
                self._sending = True
                if self.unary:
                    self._stopping = True
            if failed is None:
                done = self.client_done or self._stopping
                if not done and not self._reading and len(self._pending) < self.window:
                    self._reading = read_async(self.requests, self._on_read)
                    if not self._reading:
                        return  # the call ended
                elif done and not self._pending and not self._sending:
                    if self.client_done and not self._stopping and not self._last_queued:
                        self._last_queued = True
                        self._work(self.answers.end)
                    else:
                        finished = True
        if failed is not None:
            self.end(failed.code, failed.details)
        elif finished:
            self.end()


class _Failed:
    """A request's work failed: the stream ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class StreamTable:
    """The open request streams of one server (see the module doc)."""

    def __init__(
        self,
        *,
        most: int = MAX_OPEN_STREAMS,
        per_session: int = MAX_STREAMS_PER_SESSION,
        stalled_after_s: float = STALLED_AFTER_S,
    ) -> None:
        self.most = most
        self.per_session = per_session
        self.stalled_after_s = stalled_after_s
        self._open: dict[_Stream, None] = {}  # in the order they opened
        self._per_session: collections.Counter[int] = collections.Counter()
        self._closing = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._quiet_until = 0.0  # refusals and ends logged: one a second (see _note)
        self._unsaid = 0

    def handler(
        self,
        kind: str,
        answers: Callable[[grpc.ServicerContext], Answers],
        *,
        request: Any,
        response: Any,
        pool: futures.Executor,
        window: int = 1,
        unary: bool = False,
    ) -> grpc.RpcMethodHandler:
        """A gRPC method (of `request` and `response` messages) serving each call through
        this table without a thread, its requests answered by `answers(context)` on `pool`."""

        def handle(
            requests: Iterator[Any], context: grpc.ServicerContext, send: Callable[[Any], None]
        ) -> None:
            try:
                made = answers(context)
            except NrtError as exc:
                _refuse(context, send, grpc.StatusCode.INVALID_ARGUMENT, f"{kind}: {exc}")
                return
            except Exception:
                log.exception("internal error", extra={"fn": kind})
                _refuse(
                    context,
                    send,
                    grpc.StatusCode.INTERNAL,
                    f"{kind}: an internal error refused the stream (the daemon's log has "
                    "its traceback)",
                )
                return
            self.serve(kind, requests, context, send, made, pool=pool, window=window, unary=unary)

        handle.experimental_non_blocking = True  # type: ignore[attr-defined]
        return grpc.stream_stream_rpc_method_handler(
            handle,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )

    def serve(
        self,
        kind: str,
        requests: Iterator[Any],
        context: grpc.ServicerContext,
        send: Callable[[Any], None],
        answers: Answers,
        *,
        pool: futures.Executor,
        window: int = 1,
        unary: bool = False,
    ) -> None:
        """Open one stream (or refuse it, saying why) and return: it holds no thread."""
        try:
            session = presented_session(context)
        except NrtError as exc:
            _refuse(context, send, grpc.StatusCode.INVALID_ARGUMENT, f"{kind}: {exc}")
            return
        stream = _Stream(
            self,
            kind,
            requests,
            context,
            send,
            answers,
            pool=pool,
            window=window,
            unary=unary,
            session=session,
        )
        refusal, victim = self._admit(stream)
        if refusal:
            self._note(kind, refusal)
            _refuse(context, send, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            return
        if victim is not None:
            self._note(
                kind,
                f"{kind}: an idle {victim.kind} stream ended to serve another "
                f"({self.most} streams open)",
            )
            victim.end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{victim.kind}: this stream was idle (waiting for its client) and was "
                f"closed to serve another client: the daemon holds at most {self.most} open "
                "streams; open a new one when you have requests to send",
            )
        stream.start()

    def _admit(self, stream: _Stream) -> tuple[str, _Stream | None]:
        """Room for `stream`: (why not, "" when admitted; an idle stream to end for it)."""
        kind = stream.kind
        with self._lock:
            if self._closing:
                return f"{kind}: the daemon is stopping", None
            session = stream.session
            if session is not None and self._per_session[session] >= self.per_session:
                return (
                    f"{kind}: the session presented already holds {self.per_session} open "
                    "streams, as many as one session may: end one before opening another",
                    None,
                )
            victim = None
            if len(self._open) >= self.most:
                idle = [s for s in self._open if s.idle()]
                if not idle:
                    return (
                        f"{kind}: the daemon holds {self.most} open streams, each with work "
                        "running: retry when one has ended",
                        None,
                    )
                victim = min(idle, key=lambda s: s.last_active)
                self._remove(victim)
            self._open[stream] = None
            if session is not None:
                self._per_session[session] += 1
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep, name="stream-sweeper", daemon=True
                )
                self._sweeper.start()
        return "", victim

    def _note(self, kind: str, message: str) -> None:
        """Log a refusal or an end the table chose, at most one a second: those that
        come meanwhile are counted, and the next line says how many (a client opening
        streams by the thousand does not flood the log)."""
        now = time.monotonic()
        with self._lock:
            if now < self._quiet_until:
                self._unsaid += 1
                return
            unsaid, self._unsaid = self._unsaid, 0
            self._quiet_until = now + 1.0
        more = f" (and {unsaid} more since the last such line)" if unsaid else ""
        log.warning("%s%s", message, more, extra={"fn": kind})

    def _remove(self, stream: _Stream) -> None:
        """(under the lock)"""
        if stream not in self._open:
            return
        del self._open[stream]
        if stream.session is not None:
            self._per_session[stream.session] -= 1
            if not self._per_session[stream.session]:
                del self._per_session[stream.session]

    def _forget(self, stream: _Stream) -> None:
        with self._lock:
            self._remove(stream)

    def open_streams(self) -> int:
        with self._lock:
            return len(self._open)

    def later(self, work: Callable[[], None]) -> None:
        """`work` on a thread of its own (never on gRPC's, never under a stream's lock)."""
        threading.Thread(target=guarded, args=("stream", work), daemon=True).start()

    def close(self) -> None:
        """The daemon stops: no stream opens any more; each open one ends once it has
        answered what it has read (a load still reading ends at once)."""
        with self._lock:
            self._closing = True
            streams = list(self._open)
        self._wake.set()
        for stream in streams:
            stream.drain()

    def _sweep(self) -> None:
        """End the load streams that sent nothing for `stalled_after_s`."""
        while not self._wake.wait(_SWEEP_S):
            guarded("stream sweep", self._end_stalled)

    def _end_stalled(self) -> None:
        since = time.monotonic() - self.stalled_after_s
        with self._lock:
            stalled = [
                s
                for s in self._open
                if s.unary and not s.client_done and s.idle() and s.last_active < since
            ]
        for stream in stalled:
            self._note(
                stream.kind,
                f"{stream.kind}: a stream that sent nothing for {self.stalled_after_s:g} s ended",
            )
            stream.end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{stream.kind}: the stream sent nothing for {self.stalled_after_s:g} s and "
                "was ended (it held a load's place and its NEFF's memory): send a load's "
                "messages without pausing",
            )


def _refuse(
    context: grpc.ServicerContext,
    send: Callable[[Any], None],
    code: grpc.StatusCode,
    details: str,
) -> None:
    context.set_code(code)
    context.set_details(details)
    send(None)
