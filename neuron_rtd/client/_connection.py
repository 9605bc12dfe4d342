"""What a `Client` and its `Model`s share: the channel and stubs, each call's deadline and
its one retry on UNAVAILABLE, the session stream (or none, for a client whose models
outlive it), the pool of async inferences, and the client's shared-memory state (on, or
turned off when the daemon cannot map)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from neuron_rtd.client._config import lanes_from_env
from neuron_rtd.client._lane import Lanes, LaneTimeout
from neuron_rtd.client._peer import pass_objects, ticket
from neuron_rtd.client._session import Session
from neuron_rtd.client._shm import ShmBuffer
from neuron_rtd.client.errors import (
    RECONNECT_OPTIONS,
    NrtClientError,
    NrtConnectionError,
    check,
    retry_unavailable,
    says_stopping,
    settle_before_close,
    transport_errors,
    wait_restarted,
)
from neuron_rtd.errors import Nerr
from neuron_rtd.proto import (
    CHANNEL_OPTIONS,
    SESSION_METADATA,
    ext_pb,
    ext_pb_grpc,
    pb,
    pb_grpc,
)

log = logging.getLogger("neuron_rtd.client")

T = TypeVar("T")

PROT_READ_WRITE = 0x1 | 0x2  # mmap_prot of shm_map: PROT_READ | PROT_WRITE
# Calls made again on the next daemon when the one asked answered that it is stopping
# (those naming a model of the daemon that stops are not: the model goes with it).
RESTARTABLE = frozenset({"create_eg"})


def answer_of(call: Any) -> Any:
    """A gRPC future's answer, waited for on an event of the client's own: a Ctrl-C lands
    there, never inside gRPC's lock of the call (a signal can leave that lock held, and the
    channel's close then waits for the call for good: seen once in a full test run)."""
    done = threading.Event()
    call.add_done_callback(lambda _: done.set())
    done.wait()
    return call.result()


class ClientClosed(RuntimeError):
    def __init__(self) -> None:
        super().__init__("this client is closed")


class Connection:
    def __init__(
        self,
        address: str,
        *,
        timeout_s: float | None,
        shm: bool,
        async_workers: int,
        channel: grpc.Channel | None = None,
        session: bool = True,
    ) -> None:
        self.address = address
        self.answered = False  # a daemon answered a call: losing it, one is likely back soon
        self.use_session = session  # False: everything is made with session id 0
        self.timeout_s = timeout_s
        self.async_workers = async_workers
        self.owns_channel = channel is None
        self.channel = channel or grpc.insecure_channel(
            address, options=CHANNEL_OPTIONS + RECONNECT_OPTIONS
        )
        self.stub = pb_grpc.nmgr_v1Stub(self.channel)
        self.ext = ext_pb_grpc.nmgr_extStub(self.channel)
        self.session: Session | None = None
        self.closed = False
        self._shm = shm
        self._peer_socket: str | None = None  # where the daemon takes passed objects ("": none)
        self._lanes: Lanes | None = None  # the fast lane's, once the peer socket is known
        self._use_lanes = lanes_from_env()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._calls: set[grpc.Future] = set()  # unary calls in flight as futures
        self._calls_done = threading.Condition(self._lock)

    # --- calls ----------------------------------------------------------------------
    def unary(self, method: str, request: Any, *, retry: bool = True, stub: Any = None) -> Any:
        """Call `method` (of the nmgr service, or of `stub`'s); retried once when the daemon
        is UNAVAILABLE (unless `retry` is False), and, for a `RESTARTABLE` method, once the
        next daemon is up when the daemon answered that it is stopping (as it waits for a
        restart by systemd). NrtConnectionError when no daemon answers."""
        call: Callable[..., Any] = getattr(stub or self.stub, method)
        metadata = self.metadata
        with transport_errors(method, self.address, self.timeout_s):
            answer = (
                self.retry(lambda: call(request, timeout=self.timeout_s, metadata=metadata))
                if retry
                else call(request, timeout=self.timeout_s, metadata=metadata)
            )
            if retry and method in RESTARTABLE and self._restarted(answer):
                answer = self.retry(
                    lambda: call(request, timeout=self.timeout_s, metadata=self.metadata)
                )
        self.answered = True
        return answer

    def _restarted(self, answer: Any) -> bool:
        """Whether `answer` is a stopping daemon's and the next one is up since."""
        status = getattr(answer, "status", None)
        return status is not None and says_stopping(status) and wait_restarted(self.channel)

    def retry(self, call: Callable[[], T]) -> T:
        """`call()`, with the clients' one retry when the daemon is UNAVAILABLE but likely
        back soon (`errors.wait_reconnected`)."""
        return retry_unavailable(call, self.channel, self.address, answered=self.answered)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call sends: the session it presents, once one is open (the
        shared memory it names is this session's, and only its calls name it)."""
        presented = self.presented_session()
        return ((SESSION_METADATA, str(presented)),) if presented else ()

    def presented_session(self) -> int:
        """The session this client's calls present (0: none)."""
        session = self.session
        if session is None or not session.id or session.ended:
            return 0
        return session.id

    def infer(self, request: pb.infer_request) -> pb.infer_response:
        """A synchronous infer: on the fast lane (see `_lane`) when its outputs go to
        shared memory (so its answer is small) and the daemon has a peer socket, else,
        or when the lane does not answer, over gRPC with its retry."""
        lanes = self._lanes if self._lanes is not None else self._open_lanes()
        if lanes is not None and request.shm_ofmap:
            try:
                answer = lanes.infer(request, self.presented_session(), self.timeout_s)
            except LaneTimeout:
                raise NrtConnectionError.timed_out("infer", self.address, self.timeout_s) from None
            if answer is not None:
                return answer
        return self.unary("infer", request)

    def _open_lanes(self) -> Lanes | None:
        if not self._use_lanes or self.closed:
            return None
        try:
            path = self.peer_socket()
        except NrtClientError:
            return None
        if not path:
            self._use_lanes = False
            return None
        self._lanes = Lanes(path)
        return self._lanes

    def unary_future(
        self, method: str, request: Any, on_done: Callable[[grpc.Future], None]
    ) -> None:
        """Start `method` without a thread waiting on it; `on_done(call)` runs when it
        completes (on gRPC's thread: it must not wait long), its `result()` raising the
        transport's RpcError, not retried. Closing waits until `on_done` has run, as it
        waits for the pool's calls."""
        with self._lock:
            if self.closed:
                raise ClientClosed
            call: grpc.Future = getattr(self.stub, method).future(
                request, timeout=self.timeout_s, metadata=self.metadata
            )
            self._calls.add(call)

        def done(call: grpc.Future) -> None:
            try:
                on_done(call)
            finally:
                with self._lock:
                    self._calls.discard(call)
                    self._calls_done.notify_all()

        call.add_done_callback(done)

    def load(self, stream: Callable[[], Iterator[pb.load_request]]) -> pb.load_response:
        """The `load` call on a fresh `stream()`; retried once on UNAVAILABLE (a broken
        stream loads nothing), or once the next daemon is up when the one asked answered
        that it is stopping. Interrupted (`_load_once`), it leaves no model behind."""
        with transport_errors("load", self.address, self.timeout_s):
            answer = self.retry(lambda: self._load_once(stream()))
            if self._restarted(answer):
                answer = self.retry(lambda: self._load_once(stream()))
        self.answered = True
        return answer

    def _load_once(self, requests: Iterator[pb.load_request]) -> pb.load_response:
        """One `load` call, waited for where Ctrl-C reaches it. Stopped while it waits (a
        KeyboardInterrupt, any exception but the call's own failure), the call is
        cancelled: the daemon then unloads a model it makes for it (its caller left
        before the answer), and a stream cut short loads nothing. When the answer had come
        already, the model it made is unloaded here (`unload_made`)."""
        call = self.stub.load.future(requests, timeout=self.timeout_s, metadata=self.metadata)
        try:
            return answer_of(call)
        except grpc.RpcError:
            raise
        except BaseException as stop:
            if not call.cancel() and call.exception() is None:  # it had ended: answered
                answer = call.result()
                if answer.status.code == Nerr.OK:
                    self.unload_made(answer.h_nn.id, stop)
            raise

    def unload_made(self, model_id: int, stop: BaseException) -> None:
        """Unload a model a load made for a caller stopped by `stop` (Ctrl-C, an error)
        after the daemon's answer: no one will hold it. When that fails, a note on the
        exception that goes on (`stop`, or a second Ctrl-C meanwhile) says the model stays
        and how to unload it."""

        def note(why: str) -> str:
            return (
                f"model {model_id} may stay loaded on the daemon at {self.address} ({why}): "
                f"unload it (neuron-cli -a {self.address} unload {model_id})"
            )

        try:
            self.model_call("unload", pb.unload_request, model_id)
        except NrtClientError as exc:
            if exc.code != Nerr.INVALID_HANDLE:  # else it is gone already
                stop.add_note(note(f"unloading it failed: {exc}"))
        except BaseException as again:
            again.add_note(note("unloading it was interrupted"))
            raise

    def model_call(self, method: str, request_cls: Any, model_id: int) -> None:
        """`start`, `stop` or `unload` of one model, its status checked."""
        response = self.unary(method, request_cls(h_nn=pb.h_nn(id=model_id)))
        check(method, response.status)

    def start_model(self, model_id: int) -> None:
        self.model_call("start", pb.start_request, model_id)

    def snapshot(self, *, retry: bool = True) -> ext_pb.snapshot_response:
        """The daemon's ext snapshot (its NCs, NCGs and models now), its status checked;
        retried once on UNAVAILABLE unless `retry` is False."""
        request = ext_pb.snapshot_request()
        response = self.unary("snapshot", request, retry=retry, stub=self.ext)
        if response.status_code != Nerr.OK:
            raise NrtClientError(response.status_code, response.details, "snapshot")
        return response

    def profile(self, model_id: int, last: int = 0) -> ext_pb.profile_response:
        """The ext profile of a model loaded with profiling, asked in this client's
        session (a session's model tells it only to calls that present the session)."""
        request = ext_pb.profile_request(model_id=model_id, last=last)
        response = self.unary("profile", request, stub=self.ext)
        if response.status_code != Nerr.OK:
            raise NrtClientError(response.status_code, response.details, "profile")
        return response

    # --- session --------------------------------------------------------------------
    def open_session(self) -> bool:
        """Open the session stream unless one is open; True when a new one was opened
        (the first, or the daemon went away since: a new daemon holds nothing of ours).
        Without sessions there is nothing to open: always False."""
        if not self.use_session:
            return False
        return self._open_stream()

    def _open_stream(self) -> bool:
        if self.closed:
            raise ClientClosed
        if self.session is not None and not self.session.ended:
            return False
        peer, unidentified = self._ticket()
        with transport_errors("session_monitor", self.address, self.timeout_s):
            self.session = Session(
                self.channel, timeout_s=self.timeout_s, ticket=peer, retry=self.retry
            )
        if unidentified is not None:  # said once the session is open (a daemon gone says so)
            log.warning("session opened unidentified: %s", unidentified)
        self.answered = True
        return True

    def _ticket(self) -> tuple[int | None, NrtClientError | None]:
        """A ticket that makes the session this user's (the daemon counts sessions per
        user); None where the daemon has no peer socket, or (with why) it cannot give one."""
        path = self.peer_socket()
        if not path:
            return None, None
        try:
            return ticket(path), None
        except NrtClientError as exc:
            return None, exc

    def session_id(self) -> int:
        if not self.use_session:
            return 0
        assert self.session is not None, "open_session first"
        return self.session.id

    # --- async inferences -----------------------------------------------------------
    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self.closed:
                raise ClientClosed
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.async_workers, thread_name_prefix="nrt-client")
            return self._pool

    def close_pool(self) -> None:
        """No more async inferences: those not started are cancelled, running ones end."""
        with self._lock:
            self.closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._calls_done.wait_for(lambda: not self._calls)

    # --- shared memory --------------------------------------------------------------
    @property
    def shm_enabled(self) -> bool:
        return self._shm

    def peer_socket(self) -> str:
        """Where the daemon takes passed shm objects (its describe says; "": nowhere)."""
        if self._peer_socket is None:
            try:
                response = self.unary("describe", ext_pb.describe_request(), stub=self.ext)
            except NrtConnectionError as exc:
                if exc.grpc_code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                response = ext_pb.describe_response()  # not our daemon: by name
            self._peer_socket = response.peer_socket
        return self._peer_socket

    def passes_objects(self) -> bool:
        """Whether `share` passes buffers' objects over the daemon's peer socket (in this
        client's session) rather than having the daemon map them by name: buffers made to
        be shared then need no name (`ShmBuffer(passed=True)`). A failure to tell is
        False here, and `share` then meets it again and says what it was."""
        try:
            if not self.peer_socket():
                return False
            self._open_stream()
        except NrtClientError:
            return False
        return self.session is not None and bool(self.session.id)

    def share(self, buffers: Sequence[ShmBuffer], session_id: int) -> bool:
        """Give the daemon the buffers: passed over its peer socket in this client's
        session stream (one is opened for them if the client has none: its end unmaps
        them), or, where the daemon has no peer socket, `shm_map`ped by name with
        `session_id`. Their names are unlinked either way. False (and shared memory off
        for this client) when the daemon cannot map them."""
        try:
            if self.peer_socket():
                self._open_stream()
                assert self.session is not None
                if self.session.id:
                    return self._pass(buffers, self.session.id)
        except NrtClientError as exc:
            return self._share_failed(buffers, [], exc)
        return self._map_by_name(buffers, session_id)

    def _pass(self, buffers: Sequence[ShmBuffer], session_id: int) -> bool:
        for buffer in buffers:
            buffer.unlink()  # passed, not named: no one else can open it
        try:
            pass_objects(self.peer_socket(), session_id, buffers, PROT_READ_WRITE)
        except NrtClientError as exc:
            return self._share_failed(buffers, [], exc)
        return True

    def _share_failed(
        self, buffers: Sequence[ShmBuffer], mapped: Sequence[ShmBuffer], exc: NrtClientError
    ) -> bool:
        self.unshare(mapped)
        for buffer in buffers:
            buffer.close()
        if (
            isinstance(exc, NrtConnectionError)  # not the daemon saying no: none answered
            and exc.grpc_code != grpc.StatusCode.UNIMPLEMENTED
        ):
            raise exc
        self.shm_failed(str(exc))
        return False

    def _map_by_name(self, buffers: Sequence[ShmBuffer], session_id: int) -> bool:
        mapped: list[ShmBuffer] = []
        try:
            for buffer in buffers:
                request = pb.shm_map_request(
                    path=buffer.path, mmap_prot=PROT_READ_WRITE, session_id=session_id
                )
                try:
                    response = self.unary("shm_map", request)
                finally:
                    buffer.unlink()  # the daemon has it open (or never will)
                check("shm_map", response.status)
                mapped.append(buffer)
        except NrtClientError as exc:
            return self._share_failed(buffers, mapped, exc)
        return True

    def unshare(self, buffers: Sequence[ShmBuffer], *, unmap: bool = True) -> None:
        """`shm_unmap` the buffers (best effort, when `unmap` and still connected: not
        retried, as a daemon gone or restarted holds no map of them) and free them here."""
        for buffer in buffers:
            if unmap and not buffer.closed:
                request = pb.shm_unmap_request(path=buffer.path, mmap_prot=PROT_READ_WRITE)
                with contextlib.suppress(NrtClientError, ValueError):
                    self.unary("shm_unmap", request, retry=False)
            buffer.close()

    def shm_failed(self, reason: str) -> None:
        if self._shm:
            self._shm = False
            log.warning("shared memory off for this client, tensors go inline: %s", reason)

    # --- close ----------------------------------------------------------------------
    def close_channel(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        if self.owns_channel:
            settle_before_close(self.channel)
            self.channel.close()
