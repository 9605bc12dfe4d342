"""The fast lane: synchronous infers on the daemon's peer socket (server/peer_socket.py)
instead of gRPC, for a local client whose tensors are in shared memory.

A gRPC call costs ~0.4 ms on this kind of host, most of a small model's time; a message
on a unix socket and its answer cost ~10 us. The request and the answer are the very
messages of `nmgr_v1.infer`, carried in `ext.peer_infer_request`/`peer_response`, with
the session the call presents: the daemon answers them as it answers the gRPC call.

Each lane is one connection carrying one call at a time; idle ones are kept for the
next call (a forked child makes its own). A lane is only ever a faster way: `infer`
answers None whenever the lane did not answer (no peer socket, connection refused or
lost, all the daemon's lanes busy, a request too big for a message), and the caller then
makes the gRPC call, with its retry.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from neuron_rtd.errors import Nerr
from neuron_rtd.proto import MAX_PEER_MESSAGE, ext_pb, pb

IDLE_KEPT = 8  # idle lanes kept per client (more threads calling at once close theirs)
RETRY_AFTER_S = 1.0  # after the daemon refused a lane or none could be opened
MESSAGES_KEPT = 256  # requests' messages kept (a model's slots' requests, see `_message`)
KEPT_MESSAGE_BYTES = 1024  # the largest kept: a request of shm names is a few hundred bytes


class LaneTimeout(Exception):
    """The daemon took longer than the call's timeout to answer on a lane."""


class Lanes:
    """The fast lanes of one client to the peer socket at `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._pid = os.getpid()
        self._off_until = 0.0  # no lane tried before then (monotonic)
        self._messages: dict[int, tuple[pb.infer_request, int, bytes]] = {}  # `_message`

    def infer(
        self, request: pb.infer_request, session_id: int, timeout_s: float | None
    ) -> pb.infer_response | None:
        """The daemon's answer to `request` (its status unchecked), or None when the lane
        did not answer: then nothing ran, or the daemon went away meanwhile, as a gRPC
        call would have found it. LaneTimeout past `timeout_s` (None: no bound)."""
        message = self._message(request, session_id)
        if len(message) > MAX_PEER_MESSAGE:
            return None
        lane = self._sent(message, timeout_s)
        if lane is None:
            return None
        try:
            data = lane.recv(MAX_PEER_MESSAGE)
        except TimeoutError:
            lane.close()  # its late answer must not reach the next call
            raise LaneTimeout from None
        except OSError:  # the daemon closed the lane (idle, stopped, restarted)
            lane.close()
            return None
        if not data:
            lane.close()
            return None
        answer = ext_pb.peer_response.FromString(data)
        if answer.status_code != Nerr.OK:  # no lane free, or refused: over gRPC
            lane.close()
            self._off_until = time.monotonic() + RETRY_AFTER_S
            return None
        self._give_back(lane)
        return pb.infer_response.FromString(answer.infer_response)

    def _message(self, request: pb.infer_request, session_id: int) -> bytes:
        """The lane's message of `request` in session `session_id`: made once for a request
        sent again (a model's slot keeps its request: `Model._request`). Keyed by the
        request's id, the request kept with it, so that the id names it while it is kept;
        only small ones are kept (a request with inputs inline is made anew each call)."""
        kept = self._messages.get(id(request))
        if kept is not None and kept[0] is request and kept[1] == session_id:
            return kept[2]
        message: bytes = ext_pb.peer_request(
            infer=ext_pb.peer_infer_request(
                session_id=session_id, infer_request=request.SerializeToString()
            )
        ).SerializeToString()
        if len(message) <= KEPT_MESSAGE_BYTES:  # one naming shared memory, not inline bytes
            if len(self._messages) >= MESSAGES_KEPT:
                self._messages.clear()
            self._messages[id(request)] = (request, session_id, message)
        return message

    def _sent(self, message: bytes, timeout_s: float | None) -> socket.socket | None:
        """A lane `message` was sent on (None: none could take it): a kept one, else a new
        one (a kept lane the daemon has closed since, idle, fails the send: nothing was
        sent on it)."""
        for _ in range(IDLE_KEPT + 1):
            lane, kept = self._take()
            if lane is None:
                return None
            try:
                lane.settimeout(timeout_s)
                lane.send(message)
                return lane
            except OSError:
                lane.close()
                if not kept:
                    return None
        return None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for lane in idle:
            lane.close()

    def _take(self) -> tuple[socket.socket | None, bool]:
        """A lane, and whether it was kept from an earlier call (None: none to be had)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's lanes are its own
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop(), True
        if time.monotonic() < self._off_until:
            return None, False
        lane = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            lane.connect(self.path)
        except OSError:
            lane.close()
            self._off_until = time.monotonic() + RETRY_AFTER_S
            return None, False
        return lane, False

    def _give_back(self, lane: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < IDLE_KEPT and self._pid == os.getpid():
                self._idle.append(lane)
                return
        lane.close()
