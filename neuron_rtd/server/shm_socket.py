"""The shm socket: where a client passes its shared memory objects themselves.

gRPC cannot carry a file descriptor, and cannot say who is calling. A unix socket can do
both: a client sends, in one SOCK_SEQPACKET message, an `ext.shm_share_request` (its
session id, the name calls will give the object, the protection) with the object's open
file descriptor as SCM_RIGHTS; the daemon answers one `ext.shm_share_response`. The
daemon so uses exactly the object the caller holds (which may stay 0600, open to no one
else), never one it looked up by name for whoever asked. The session id, a secret of
the client that opened the session, says whose object it is; the peer's uid
(SO_PEERCRED) goes in the log.

One thread serves every connection through a selector: a client that connects and says
nothing costs a file descriptor until `IDLE_S`, not a thread; at most `MAX_CONNECTIONS`
are open at once (more are closed at once).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
import time
from pathlib import Path

from neuron_rtd.errors import Nerr, NrtError
from neuron_rtd.proto import ext_pb
from neuron_rtd.runtime import Runtime, session_tag

log = logging.getLogger("nrtd.NMGR")

MAX_MESSAGE = 4096  # a request is a session id, a name of at most 255 bytes and a number
MAX_CONNECTIONS = 256
IDLE_S = 10.0
_FDS = array.array("i").itemsize


class ShmSocket:
    """Serves shm_share requests on `path` (made with `mode`, chowned to `gid`)."""

    def __init__(self, runtime: Runtime, path: Path, *, mode: int, gid: int | None) -> None:
        self.runtime = runtime
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            if path.is_socket():
                path.unlink()
        old = os.umask(0o777 & ~mode)
        try:
            self._listener.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)
        self._inode = path.stat().st_ino
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._seen: dict[socket.socket, float] = {}  # connection -> when it last spoke
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="shm-socket", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in list(self._seen):
            self._drop(conn)
        self._selector.close()
        self._listener.close()
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()

    # --- the loop -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.5):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._answer(key.fileobj)  # type: ignore[arg-type]
            self._drop_idle()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        if len(self._seen) >= MAX_CONNECTIONS:
            log.warning(
                "shm socket: %d connections open, the most it serves: one refused",
                len(self._seen),
                extra={"fn": "shm_share"},
            )
            conn.close()
            return
        conn.setblocking(False)
        self._seen[conn] = time.monotonic()
        self._selector.register(conn, selectors.EVENT_READ)

    def _drop_idle(self) -> None:
        oldest = time.monotonic() - IDLE_S
        for conn in [c for c, seen in self._seen.items() if seen < oldest]:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._seen.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()

    def _answer(self, conn: socket.socket) -> None:
        try:
            data, ancdata, flags, _ = conn.recvmsg(
                MAX_MESSAGE, socket.CMSG_SPACE(4 * _FDS), socket.MSG_CMSG_CLOEXEC
            )
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        fds = _passed_fds(ancdata)
        if not data and not fds:  # the client closed its end
            self._drop(conn)
            return
        self._seen[conn] = time.monotonic()
        response = self._share(conn, data, flags, fds)
        try:
            conn.send(response.SerializeToString())
        except OSError:
            self._drop(conn)

    def _share(
        self, conn: socket.socket, data: bytes, flags: int, fds: list[int]
    ) -> ext_pb.shm_share_response:
        """Map the one object passed, or refuse (closing whatever was passed)."""
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 1:
                raise _Refused(
                    "an shm_share message holds one shm_share_request of at most "
                    f"{MAX_MESSAGE} bytes and exactly one file descriptor (SCM_RIGHTS), "
                    f"got {len(data)} bytes and {len(fds)} descriptors"
                )
            request = ext_pb.shm_share_request()
            try:
                request.ParseFromString(data)
            except Exception:  # protobuf's DecodeError, by whichever implementation
                raise _Refused("the message is not an shm_share_request") from None
            fd = fds.pop()
            self.runtime.shm_adopt(fd, request.path, request.mmap_prot, request.session_id)
        except (_Refused, NrtError) as exc:
            for fd in fds:
                os.close(fd)
            code = exc.code if isinstance(exc, NrtError) else Nerr.INVALID
            log.error("shm_share: %s", exc, extra={"fn": "shm_share"})
            return ext_pb.shm_share_response(status_code=int(code), details=str(exc))
        uid = _peer_uid(conn)
        log.debug(
            "Session %s (uid %s) passed shared memory '%s'",
            session_tag(request.session_id),
            uid,
            request.path,
            extra={"fn": "shm_share"},
        )
        return ext_pb.shm_share_response(status_code=int(Nerr.OK))


class _Refused(Exception):
    pass


def _passed_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _FDS])
    return list(fds)


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[1]
