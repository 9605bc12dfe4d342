"""The peer socket: where a local client says who it is and passes its shared memory.

gRPC cannot say who is calling (grpcio gives no peer credentials: every unix peer is
"unix:"), nor carry a file descriptor. A unix socket beside the daemon's does both: the
kernel names the caller (SO_PEERCRED), and a message may carry an open descriptor
(SCM_RIGHTS). On a SOCK_SEQPACKET connection each message holds one `ext.peer_request`,
answered by one `ext.peer_response`:
- `shm_share` (with the object's descriptor): the daemon maps exactly the object the caller
  holds (which may stay 0600, open to no one else), never one it looked up by name for
  whoever asked, as `path` of the session named, a secret of the client that opened it;
- `ticket`: a random ticket that names the caller's uid to one `session_monitor` call
  (metadata `nrt-peer-ticket`) within `TICKET_TTL_S`, so that the session counts against
  that user's `session_max_per_peer`, and only that user may pass objects into it;
- `infer`: a synchronous infer, as `nmgr_v1.infer` answers it (`answer_infer`), for the
  session it presents: a local client's fast lane. A unix socket round trip costs ~10 us
  where a gRPC call costs ~0.4 ms, which is most of a small model's time.

One thread serves every connection through a selector: a client that connects and says
nothing costs a file descriptor until `IDLE_S`, not a thread; at most `MAX_CONNECTIONS`
are open at once, `MAX_PER_UID` of them one user's (more are closed at once). A
connection's first `infer` makes it a lane: a thread of its own blocks on it and runs
each call as it comes (no hand-off between threads, which would cost what the lane
saves), until the client closes it or says nothing for `LANE_IDLE_S`, each call on a turn
of the runtime's compute gate (`neuron_rtd/runtime/compute.py`), as gRPC's; at most
`max_lanes` (the config's `peer_lanes`), `max_lanes_per_uid` of them one user's (an infer
past those is refused with NERR_RESOURCE: the client calls over gRPC).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from pathlib import Path

from neuron_rtd.errors import InvalidError, Nerr, NrtError
from neuron_rtd.proto import MAX_PEER_MESSAGE, ext_pb, pb
from neuron_rtd.runtime import Runtime, SessionId, session_tag
from neuron_rtd.server.nmgr import answer_infer
from neuron_rtd.server.stream_io import guarded

log = logging.getLogger("nrtd.NMGR")

MAX_CONNECTIONS = 1024
MAX_PER_UID = 256  # a user's clients starting at once each connect briefly
IDLE_S = 10.0
MAX_LANES = 256
MAX_LANES_PER_UID = 64
LANE_IDLE_S = 60.0
TICKET_TTL_S = 60.0
_FDS = array.array("i").itemsize
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Tickets:
    """Tickets given to callers the kernel named, each for one session within its time."""

    def __init__(self, ttl_s: float = TICKET_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._given: dict[int, tuple[int, float]] = {}  # ticket -> (uid, until)
        self._lock = threading.Lock()

    def give(self, uid: int) -> int:
        now = time.monotonic()
        with self._lock:
            for ticket in [t for t, (_, until) in self._given.items() if until < now]:
                del self._given[ticket]
            while True:
                ticket = secrets.randbits(64)
                if ticket and ticket not in self._given:
                    break
            self._given[ticket] = (uid, now + self.ttl_s)
        return ticket

    def take(self, ticket: int) -> int:
        """The uid a ticket names, once; InvalidError for one unknown, used or expired."""
        with self._lock:
            uid, until = self._given.pop(ticket, (-1, 0.0))
        if uid < 0 or until < time.monotonic():
            raise InvalidError(
                "nrt-peer-ticket names no ticket of this daemon's (each names one session "
                f"within {self.ttl_s:g} s of being given): ask the peer socket for another"
            )
        return uid


class PeerSocket:
    """Serves peer requests on `path` (made with `mode`, chowned to `gid`)."""

    def __init__(
        self,
        runtime: Runtime,
        tickets: Tickets,
        path: Path,
        *,
        mode: int,
        gid: int | None,
        max_lanes: int = MAX_LANES,
        max_lanes_per_uid: int = MAX_LANES_PER_UID,
    ) -> None:
        self.runtime = runtime
        self.max_lanes = max_lanes
        self.max_lanes_per_uid = max_lanes_per_uid
        self.tickets = tickets
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
        # every connection's user (lanes' too), and the lanes: lane threads end theirs
        self._lock = threading.Lock()
        self._uid: dict[socket.socket, int] = {}
        self._per_uid: Counter[int] = Counter()
        self._lanes: dict[socket.socket, int] = {}  # lane -> its user
        self._lanes_per_uid: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="peer-socket", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # never started when the daemon's start failed first
            self._thread.join(5)
        for conn in list(self._seen):
            self._drop(conn)
        with self._lock:
            lanes = list(self._lanes)
        for lane in lanes:  # its thread wakes from its read and ends it
            with contextlib.suppress(OSError):
                lane.shutdown(socket.SHUT_RDWR)
        self._selector.close()
        self._listener.close()
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()

    # --- connections ----------------------------------------------------------------
    def _serve(self) -> None:
        """The selector's loop. Whatever a connection's message raises (a bug, or memory
        refused: MemoryError) is logged, that connection closed, and the loop serves on;
        so does an error of the loop itself, after a pause (it would repeat at once)."""
        while not self._stop.is_set():
            try:
                self._serve_once()
            except Exception:
                log.exception("peer socket: internal error", extra={"fn": "peer_socket"})
                self._stop.wait(0.5)

    def _serve_once(self) -> None:
        for key, _ in self._selector.select(timeout=0.5):
            try:
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._answer(key.fileobj)  # type: ignore[arg-type]
            except Exception:  # a bug: logged, and the socket serves on
                log.exception("peer socket: internal error", extra={"fn": "peer_socket"})
                if key.fileobj is not self._listener:
                    self._drop(key.fileobj)  # type: ignore[arg-type]
        self._drop_idle()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        uid = _peer_uid(conn)
        with self._lock:
            full = uid is None or len(self._seen) >= MAX_CONNECTIONS
            full = full or self._per_uid[uid] >= MAX_PER_UID  # type: ignore[index]
        if full:
            log.warning(
                "peer socket: a connection of uid %s refused (%d open, %d of them its own; "
                "at most %d, %d per user)",
                uid,
                len(self._seen),
                self._per_uid[uid] if uid is not None else 0,
                MAX_CONNECTIONS,
                MAX_PER_UID,
                extra={"fn": "peer_socket"},
            )
            conn.close()
            return
        assert uid is not None
        conn.setblocking(False)
        self._seen[conn] = time.monotonic()
        with self._lock:
            self._uid[conn] = uid
            self._per_uid[uid] += 1
        self._selector.register(conn, selectors.EVENT_READ)

    def _drop_idle(self) -> None:
        oldest = time.monotonic() - IDLE_S
        for conn in [c for c, seen in self._seen.items() if seen < oldest]:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._seen.pop(conn, None)
        with self._lock:
            uid = self._uid.pop(conn, None)
            if uid is not None:
                _less(self._per_uid, uid)
            if self._lanes.pop(conn, None) is not None and uid is not None:
                _less(self._lanes_per_uid, uid)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()

    # --- lanes ----------------------------------------------------------------------
    def _open_lane(self, conn: socket.socket, uid: int, first: _Message) -> bool:
        """Make `conn` a lane, its thread answering `first` and what follows; False (the
        connection left as it is) when there are as many lanes as may be."""
        with self._lock:
            if (
                len(self._lanes) >= self.max_lanes
                or self._lanes_per_uid[uid] >= self.max_lanes_per_uid
            ):
                return False
            self._lanes[conn] = uid
            self._lanes_per_uid[uid] += 1
        self._selector.unregister(conn)
        self._seen.pop(conn, None)
        conn.setblocking(True)
        conn.settimeout(LANE_IDLE_S)
        thread = threading.Thread(
            target=self._lane, args=(conn, uid, first), name="peer-lane", daemon=True
        )
        thread.start()
        return True

    def _lane(self, conn: socket.socket, uid: int, first: _Message) -> None:
        message: _Message | None = first
        try:
            gate = self.runtime.compute_gate
            while message is not None and not self._stop.is_set():
                with gate.turn():  # the runtime's: one computing call per core, every front's
                    answer = self._respond(uid, message)
                conn.send(answer)
                message = _receive(conn)
        except OSError:  # the client went away mid-answer
            pass
        except Exception:  # a bug, or memory refused: logged, and this lane closed
            log.exception("peer socket: internal error on a lane", extra={"fn": "peer_socket"})
        finally:
            guarded("peer_socket", lambda: self._drop(conn))

    # --- requests -------------------------------------------------------------------
    def _answer(self, conn: socket.socket) -> None:
        try:
            message = _receive(conn)
        except BlockingIOError:
            return
        except OSError:
            message = None
        if message is None:  # the client closed its end
            self._drop(conn)
            return
        self._seen[conn] = time.monotonic()
        uid = self._uid[conn]
        if not _asks_infer(message):
            answer = self._respond(uid, message)
        elif self._open_lane(conn, uid, message):
            return  # the lane's thread answers it
        else:  # never run here: an inference would hold up every other connection
            answer = ext_pb.peer_response(
                status_code=int(Nerr.RESOURCE),
                details=f"no lane free for infer (at most {self.max_lanes}, "
                f"{self.max_lanes_per_uid} "
                "per user): call it over gRPC",
            ).SerializeToString()
        try:
            conn.send(answer)
        except OSError:
            self._drop(conn)

    def _respond(self, uid: int, message: _Message) -> bytes:
        """The answer to one message of user `uid`, serialized."""
        data, flags, fds = message
        try:
            response = self._handle(uid, data, flags, fds)
        except (_Refused, NrtError) as exc:
            code = exc.code if isinstance(exc, NrtError) else Nerr.INVALID
            log.error("%s", exc, extra={"fn": "peer_socket"})
            response = ext_pb.peer_response(status_code=int(code), details=str(exc))
        finally:
            for fd in fds:  # whatever the request did not take
                os.close(fd)
        answer = response.SerializeToString()
        if len(answer) > MAX_PEER_MESSAGE:  # an infer with its outputs inline, say
            answer = ext_pb.peer_response(
                status_code=int(Nerr.INVALID),
                details=f"the answer holds {len(answer)} bytes, more than a peer message "
                f"carries ({MAX_PEER_MESSAGE}): name shm_ofmap outputs, or call over gRPC",
            ).SerializeToString()
        return answer

    def _handle(self, uid: int, data: bytes, flags: int, fds: list[int]) -> ext_pb.peer_response:
        """One request of user `uid`; a descriptor it takes is removed from `fds`."""
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise _Refused(
                f"a peer message holds one peer_request of at most {MAX_PEER_MESSAGE} bytes and "
                "at most one file descriptor"
            )
        request = _parse(data)
        kind = request.WhichOneof("what")
        if kind in ("ticket", "infer") and fds:
            raise _Refused(f"a {kind} request carries no file descriptor")
        if kind == "ticket":
            return ext_pb.peer_response(status_code=int(Nerr.OK), ticket=self.tickets.give(uid))
        if kind == "infer":
            return self._infer(request.infer)
        if kind != "shm_share":
            raise _Refused("the peer_request asks for nothing: shm_share, ticket or infer")
        if len(fds) != 1:
            raise _Refused(
                f"shm_share: the message must carry the object's one file descriptor "
                f"(SCM_RIGHTS), it carries {len(fds)}"
            )
        share = request.shm_share
        session_id = SessionId(share.session_id)
        fd = fds.pop()
        self.runtime.shm_adopt(fd, share.path, share.mmap_prot, session_id, uid)
        log.debug(
            "Session %s (uid %d) passed shared memory '%s'",
            session_tag(session_id),
            uid,
            share.path,
            extra={"fn": "shm_share"},
        )
        # never an empty message (proto3's all-default answer): on SOCK_SEQPACKET a
        # zero-length read is how the client sees the daemon close the connection
        mapped = f"mapped '{share.path}' in session {session_tag(session_id)}"
        return ext_pb.peer_response(status_code=int(Nerr.OK), details=mapped)

    def _infer(self, infer: ext_pb.peer_infer_request) -> ext_pb.peer_response:
        try:
            request = pb.infer_request.FromString(infer.infer_request)
        except Exception:  # protobuf's DecodeError, by whichever implementation
            raise _Refused("infer: infer_request is not an nrt.infer_request") from None
        presented = SessionId(infer.session_id) if infer.session_id else None
        answer = answer_infer(self.runtime, request, lambda: presented)
        return ext_pb.peer_response(
            status_code=int(Nerr.OK), infer_response=answer.SerializeToString()
        )


class _Refused(Exception):
    pass


_Message = tuple[bytes, int, list[int]]  # data, recvmsg flags, descriptors passed


def _receive(conn: socket.socket) -> _Message | None:
    """The next message on `conn`; None once the client has closed its end (OSError when
    the connection fails, BlockingIOError on a non-blocking one with nothing to read,
    TimeoutError on a lane that said nothing for LANE_IDLE_S)."""
    data, ancdata, flags, _ = conn.recvmsg(
        MAX_PEER_MESSAGE, socket.CMSG_SPACE(4 * _FDS), socket.MSG_CMSG_CLOEXEC
    )
    fds = _passed_fds(ancdata)
    if not data and not fds:
        return None
    return data, flags, fds


def _parse(data: bytes) -> ext_pb.peer_request:
    try:
        return ext_pb.peer_request.FromString(data)
    except Exception:  # protobuf's DecodeError, by whichever implementation
        raise _Refused("the message is not a peer_request") from None


def _asks_infer(message: _Message) -> bool:
    """Whether the message is a well-formed infer request (the lane answers even its
    errors; anything else is answered where it came)."""
    data, flags, fds = message
    if fds or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        return False
    try:
        return _parse(data).WhichOneof("what") == "infer"
    except _Refused:
        return False


def _less(counter: Counter[int], key: int) -> None:
    counter[key] -= 1
    if not counter[key]:
        del counter[key]


def _passed_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _FDS])
    return list(fds)


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    except OSError:
        return None
    return int(_CREDENTIALS.unpack(creds)[1])
