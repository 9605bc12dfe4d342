"""What a call presents in its gRPC metadata: its session (`nrt-session-id`, decimal),
which our client sends on every call once its session is open, and, on `session_monitor`,
a peer ticket (`nrt-peer-ticket`, decimal: see `peer_socket`) naming the caller's user.
The original interface carries a session id only in `load`, `create_eg` and `shm_map`; a
call that presents its session names the shared memory that session mapped, and only such
a call names an object the session passed over the peer socket (see `runtime/shm.py`)."""

from __future__ import annotations

import ipaddress
import os
import threading
import time

import grpc

from neuron_rtd.errors import InvalidError
from neuron_rtd.proto import SESSION_METADATA, TICKET_METADATA
from neuron_rtd.runtime import Caller, SessionId, socket_caller, stranger
from neuron_rtd.server.peers import grpc_peer_address, tcp_caller

_SOCKET_CALLER_TTL_S = 5.0  # the socket's users read again at most this often


class CallerOf:
    """Who a gRPC call on the daemon's `address` (and the TCP addresses it also listens
    on, `listening`) comes from."""

    def __init__(self, address: str) -> None:
        """`address`: the daemon's gRPC target, `unix:/path` or `host:port` (as
        `client/address.py` makes it)."""
        self.unix_path: str | None = None
        self.locals: list[tuple[str | None, int]] = []  # host None: the connection's peer's
        if address.startswith("unix:"):
            self.unix_path = address.removeprefix("unix:")
        else:
            self.listening(address)
        self._lock = threading.Lock()
        self._socket: tuple[tuple[int, int, int, int], float, Caller] | None = None

    def listening(self, address: str) -> None:
        """The server also listens on TCP `address` ("host:port", its port as bound):
        before it starts (the list is read, never changed, once calls come)."""
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            return
        host = host.strip("[]")
        try:
            ip: str | None = str(ipaddress.ip_address(host))
        except ValueError:  # a name (localhost): which of its addresses a connection took
            ip = None
        if ip in ("0.0.0.0", "::"):  # a wildcard: alike
            ip = None
        # unknown, it is taken to be the peer's own, as on loopback (beyond it: no one)
        self.locals.append((ip, int(port)))

    def __call__(self, context: grpc.ServicerContext) -> Caller:
        peer = context.peer() or ""
        if peer.startswith("unix:"):
            return self._socket_caller() if self.unix_path is not None else stranger()
        remote = grpc_peer_address(peer)
        if remote is None:
            return stranger()
        for host, port in self.locals:  # the connection came to one of them: its pair names it
            found = tcp_caller((host or remote[0], port), remote)
            if found is not None:
                return found
        return stranger()

    def _socket_caller(self) -> Caller:
        assert self.unix_path is not None
        info = os.stat(self.unix_path)
        stamp = (info.st_ino, info.st_mode, info.st_uid, info.st_gid)
        now = time.monotonic()
        with self._lock:
            known = self._socket
        if known is not None and known[0] == stamp and now - known[1] < _SOCKET_CALLER_TTL_S:
            return known[2]
        found = socket_caller(self.unix_path)
        with self._lock:
            self._socket = (stamp, now, found)
        return found


def presented_session(context: grpc.ServicerContext) -> SessionId | None:
    """The session id the call presents; None when it presents none (or 0)."""
    presented = _uint64(context, SESSION_METADATA, "a session id")
    return SessionId(presented) if presented else None


def presented_ticket(context: grpc.ServicerContext) -> int | None:
    """The peer ticket the call presents; None when it presents none."""
    return _uint64(context, TICKET_METADATA, "a peer ticket")


def _uint64(context: grpc.ServicerContext, key: str, what: str) -> int | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            text = value if isinstance(value, str) else value.decode("ascii", "replace")
            if not text.isdigit() or int(text) >= 1 << 64:
                raise InvalidError(
                    f"metadata {key} must be {what} (a decimal uint64), got {text[:40]!r}"
                )
            return int(text)
    return None
