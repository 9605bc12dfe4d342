"""The HTTP server under the KServe v2 front end (`kserve_http.py`'s `KServeApp`): waitress
(a maintained pure-Python WSGI server), with what the daemon asks of it.

One I/O thread reads and parses requests and holds every connection, so an idle
keep-alive client costs a socket, not a thread; a fixed pool of workers runs the
requests, whose `Serving.infer` blocks until its (possibly batched) answer, each on a
turn of the runtime's compute gate (`neuron_rtd/runtime/compute.py`), as gRPC's calls. Waitress
buffers a request's body as it comes (in memory, then a temporary file), refuses one
longer than `max_body_bytes` from its Content-Length alone, and answers malformed HTTP
itself: here its error answers are JSON `{"error": ...}` like every other.

What this adds to waitress: who each connection comes from (a connection to a loopback
address names its caller, the owner of the socket at its other end,
`neuron_rtd/server/peers.py`, found once as it is accepted: environ `PEER_KEY` and
`LOOPBACK_KEY`); a connection must finish each request's headers within
`header_timeout_s` (a client trickling them is closed); one user holds at most
`max_connections_per_user` connections; the listening socket bound by the daemon itself.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask
from waitress.utilities import Error

from neuron_rtd.runtime import Caller, ComputeGate
from neuron_rtd.server.kserve_http import (
    HEADER_TIMEOUT_S,
    JSON_TYPE,
    LOOPBACK_KEY,
    MAX_CONNECTIONS_PER_USER,
    PEER_KEY,
    HttpOptions,
    KServeApp,
)
from neuron_rtd.server.kserve_json import (
    dumps,
)
from neuron_rtd.server.peers import tcp_caller
from neuron_rtd.serving import ServingApi

log = logging.getLogger("nrtd.KSERVE")

MAX_CONNECTIONS = 4096  # open connections (fewer under a low RLIMIT_NOFILE); beyond: backlog
IDLE_TIMEOUT_S = 120  # an idle keep-alive connection is closed after this
MAINTENANCE_S = 1  # how often connections are checked against their timeouts
STOP_GRACE_S = 2.0  # how long stop() lets requests under way finish
# A request's body, or an answer, larger than this goes through a temporary file instead
# of memory (waitress's default: 512 KB and 1 MB); most tensors stay in memory.
BUFFER_IN_MEMORY_BYTES = 16 << 20


# --- waitress, with JSON error answers --------------------------------------------------
class _JsonErrorTask(ErrorTask):
    """Waitress's answer to malformed HTTP (a bad Content-Length, headers or body too
    large, ...), as `{"error": ...}`."""

    def execute(self) -> None:
        error: Error = cast(Any, self.request).error  # the stubs take the parser for its error
        message = f"{error.reason}: {error.body}"
        if error.code == 413:
            limit = self.channel.adj.max_request_body_size
            message = (
                f"the request body is larger than {limit} bytes, the most this server takes: "
                "pass large tensors in system shared memory"
            )
        body = dumps({"error": message})
        self.status = f"{error.code} {error.reason}"
        self.response_headers = [
            *self.response_headers,
            ("Content-Type", JSON_TYPE),
            ("Content-Length", str(len(body))),
        ]
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Task(WSGITask):
    """Waitress's request task, telling the application who is at the other end."""

    def get_environment(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environment()
        channel = cast(_Channel, self.channel)
        environ[PEER_KEY] = channel.peer
        environ[LOOPBACK_KEY] = channel.loopback
        return environ


def _is_loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except (ValueError, TypeError, IndexError):
        return False


class _Channel(HTTPChannel):
    """One connection: who is at its other end (found once, as it is accepted), and the
    deadline for the headers of the request it is receiving (None between requests)."""

    task_class = _Task
    error_task_class = _JsonErrorTask

    def __init__(
        self, server: Any, sock: socket.socket, addr: Any, adj: Adjustments, map: Any = None
    ) -> None:
        listener = cast(_Listener, server)
        self.peer: Caller | None = None
        self.loopback = False
        try:
            local = sock.getsockname()
        except OSError:
            local = None
        if local is not None and _is_loopback(local):
            self.loopback = True
            self.peer = tcp_caller((local[0], local[1]), (addr[0], addr[1]))
        self.user = self.peer.named.uid if self.peer and self.peer.named else None
        self.header_deadline: float | None = time.monotonic() + listener.header_timeout_s
        self.counted = False
        super().__init__(server, sock, addr, adj, map)
        listener.channel_opened(self, sock)

    def received(self, data: bytes) -> bool:
        if data and self.request is None and self.header_deadline is None:
            listener = cast(_Listener, self.server)
            self.header_deadline = time.monotonic() + listener.header_timeout_s
        received: bool = super().received(data)
        if self.request is None or self.request.headers_finished:
            self.header_deadline = None
        return received

    def del_channel(self, map: Any = None) -> None:
        if self.counted:
            self.counted = False
            cast(_Listener, self.server).channel_closed(self)
        super().del_channel(map)


class _Listener(TcpWSGIServer):
    """Waitress's TCP server, stopped from another thread in steps, closing connections
    whose headers are late, and holding at most `per_user` connections of one user (the
    I/O thread does all of this). (Its stubs miss `_map` and give `trigger` the wrong
    type: hence the casts.)"""

    channel_class = _Channel
    header_timeout_s = HEADER_TIMEOUT_S
    per_user = MAX_CONNECTIONS_PER_USER

    def set_limits(self, header_timeout_s: float, per_user: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.per_user = per_user
        self._users: dict[int | None, int] = {}

    def channel_opened(self, channel: _Channel, sock: socket.socket) -> None:
        users = self._users
        held = users.get(channel.user, 0)
        users[channel.user] = held + 1
        channel.counted = True
        if held >= self.per_user:
            who = "strangers" if channel.user is None else f"uid {channel.user}"
            message = (
                f"{who} hold {held} connections to this server, the most one user may: "
                "close some, or reuse keep-alive connections"
            )
            body = dumps({"error": message})
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                sock.send(head.encode() + body)  # a fresh socket's buffer takes it
            channel.will_close = True

    def channel_closed(self, channel: _Channel) -> None:
        users = self._users
        left = users.get(channel.user, 1) - 1
        if left > 0:
            users[channel.user] = left
        else:
            users.pop(channel.user, None)

    def maintenance(self, now: Any) -> None:
        """Waitress's (idle connections closed), and connections whose request's headers
        are late closed: a client trickling its headers holds no slot for long."""
        super().maintenance(now)
        late = time.monotonic()
        for channel in list(cast(Any, self).active_channels.values()):
            deadline = getattr(channel, "header_deadline", None)
            if deadline is not None and deadline < late and not channel.requests:
                channel.will_close = True

    @property
    def port(self) -> int:
        return int(cast(Any, self).effective_port)

    def close(self) -> None:
        """The listening socket closed; the trigger stays open until `close_connections`
        (waitress's own `close` closes both, on an error in the listener say, and a stop
        under way then had no way left to wake the I/O thread: EBADF, seen as a thread's
        exception in a test and, once, as the daemon's exit code 1 on SIGTERM)."""
        wasyncore.dispatcher.close(self)

    def call_in_loop(self, thunk: Callable[[], None]) -> None:
        """`thunk` run by the I/O thread, which it wakes; not run when that thread is gone
        (its trigger closed: nothing is left for it to do)."""
        with contextlib.suppress(OSError):
            cast(Any, self).trigger.pull_trigger(thunk)

    def stop_accepting(self) -> None:
        """The listening socket closed (in the I/O thread)."""
        self.accepting = False
        self.close()

    def close_connections(self) -> None:
        """Every connection closed once what it has to send is sent, and the trigger: the
        I/O loop then ends (in the I/O thread)."""
        server = cast(Any, self)
        for channel in list(server._map.values()):
            if isinstance(channel, HTTPChannel):
                channel.close_when_flushed = True
        server.trigger.close()


class WsgiFront(Protocol):
    """What the server serves: the v2 front end (`KServeApp`), or another of the daemon's
    HTTP applications (`neuron_rtd/server/metrics.py:MetricsApp`)."""

    max_body_bytes: int
    stopping: bool

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any: ...

    def wait_idle(self, timeout: float) -> bool: ...


def _gated(app: WsgiFront, gate: ComputeGate) -> Callable[..., Any]:
    """`app` as a WSGI application whose every request computes on a turn of `gate`
    (the runtime's: one computing call per usable core, every front's)."""

    def gated(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with gate.turn():
            return app(environ, start_response)

    return gated


# --- the server -------------------------------------------------------------------------
class HttpServer:
    """The v2 HTTP/REST front end over `serving` (or `app`), listening on `address`
    ("HOST:PORT", port 0 for any free one) once started: an I/O thread and `threads`
    workers of its own."""

    def __init__(
        self,
        serving: ServingApi,
        address: str,
        options: HttpOptions | None = None,
        *,
        threads: int | None = None,
        max_body_bytes: int | None = None,
        compute_gate: ComputeGate | None = None,
        app: WsgiFront | None = None,
    ) -> None:
        self.serving = serving
        self.address = address
        self.options = options or HttpOptions()
        self.threads = self.options.threads if threads is None else threads
        self.app: WsgiFront = app or KServeApp(serving, self.options, max_body_bytes=max_body_bytes)
        self.compute_gate = compute_gate  # each request computes on a turn of it
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self._dispatcher: ThreadedTaskDispatcher | None = None
        self._loop: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        """Listen and serve; an OSError saying what is wrong and what to do when the
        address is not one to listen on."""
        with self._lock:
            if self._listener is not None or self._stopped:
                raise RuntimeError("an HttpServer starts once")
            sock, sockinfo = bind(self.address)
            adj = Adjustments(
                threads=self.threads,
                ident="neuron-rtd",
                max_request_body_size=self.app.max_body_bytes,
                inbuf_overflow=BUFFER_IN_MEMORY_BYTES,
                outbuf_overflow=BUFFER_IN_MEMORY_BYTES,
                connection_limit=connection_limit(),
                channel_timeout=IDLE_TIMEOUT_S,
                cleanup_interval=MAINTENANCE_S,
                asyncore_use_poll=True,  # select() fails on fds past 1024
                expose_tracebacks=False,
            )
            dispatcher = ThreadedTaskDispatcher()
            dispatcher.set_thread_count(self.threads)
            try:
                listener = _Listener(
                    self.app if self.compute_gate is None else _gated(self.app, self.compute_gate),
                    map={},
                    _sock=sock,
                    dispatcher=dispatcher,
                    adj=adj,
                    bind_socket=False,
                    sockinfo=sockinfo,
                )
            except BaseException:
                sock.close()
                dispatcher.shutdown(timeout=1)
                raise
            listener.set_limits(
                self.options.header_timeout_s, self.options.max_connections_per_user
            )
            self._listener, self._dispatcher = listener, dispatcher
            self._loop = threading.Thread(target=listener.run, name="kserve-http", daemon=True)
            self._loop.start()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the HTTP server is not started")
        return self._listener.port

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop listening, let requests under way finish (up to `grace_s` s), then close
        every connection. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            listener, dispatcher, loop = self._listener, self._dispatcher, self._loop
        if listener is None or dispatcher is None or loop is None:
            return
        listener.call_in_loop(listener.stop_accepting)
        self.app.wait_idle(grace_s)
        self.app.stopping = True  # a request arriving now on an open connection: 503
        self.app.wait_idle(0.1)
        listener.call_in_loop(listener.close_connections)
        loop.join(5.0)
        dispatcher.shutdown(cancel_pending=True, timeout=1)


def connection_limit() -> int:
    """MAX_CONNECTIONS, or fewer when the process may open fewer files (a connection is one;
    the rest of the daemon keeps 256): past it, new connections wait in the backlog
    instead of failing to be accepted."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - 256))


def split_http_address(address: str) -> tuple[str, int] | None:
    """The host (brackets stripped) and port of "HOST:PORT" or "[v6]:PORT"; None when
    `address` is not one. The daemon's config checks `http_address` with it too."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (sep and host and port_text.isdigit() and int(port_text) <= 65535):
        return None
    return host, int(port_text)


def bind(address: str) -> tuple[socket.socket, tuple[Any, ...]]:
    """A TCP socket bound to `address` ("HOST:PORT", "[v6]:PORT") and waitress's sockinfo
    for it; OSError with a message saying what to do."""
    split = split_http_address(address)
    if split is None:
        raise OSError(
            errno.EINVAL,
            f"{address!r} is not HOST:PORT (127.0.0.1:8000, [::1]:8000; port 0: any free port)",
        )
    host, port = split
    try:
        found = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, socket.IPPROTO_TCP, socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise OSError(
            errno.EINVAL,
            f"host {host!r} does not resolve ({exc.strerror}): give an address of this "
            "machine (127.0.0.1 for loopback)",
        ) from None
    family, kind, proto, _, sockaddr = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, bind_failure(host, port, exc)) from None
    return sock, (family, kind, proto, sock.getsockname())


def bind_failure(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use: stop what listens there, or choose another "
            "port (0: any free port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine: give one of its addresses"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges the daemon does not have: choose one above 1023"
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"
