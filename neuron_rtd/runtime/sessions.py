"""Client sessions: what a session id is, and which ids are open.

A session id is a capability: whoever names it acts as the session (ties models, NCGs and
shared memory to it, uses its shared memory, spends its quotas). So it is a random 64-bit
number (the original's `uint64`), told only to the client that opened it, and never shown
elsewhere: logs, snapshots and errors name a session by its tag, a short digest of the id
from which the id cannot be found.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import Counter
from typing import NewType

from neuron_rtd.errors import InvalidError, ResourceError

# A session's id, the one name of the concept in the runtime: a capability (see above),
# never a count, a model id or a uid, which mypy keeps it apart from.
SessionId = NewType("SessionId", int)
NO_SESSION = SessionId(0)


def session_tag(session_id: SessionId) -> str:
    """The session's public name (8 hex digits); "" for no session."""
    if session_id == NO_SESSION:
        return ""
    return hashlib.blake2b(session_id.to_bytes(8, "little"), digest_size=4).hexdigest()


def session_name(session_id: SessionId) -> str:
    """Who holds what a session holds, in messages (no session: one quota for all)."""
    if session_id == NO_SESSION:
        return "the clients with no session"
    return f"session {session_tag(session_id)}"


UNIDENTIFIED = None  # the peer of a session whose caller did not say who it is


def peer_name(peer: int | None) -> str:
    return "the clients that did not identify themselves" if peer is None else f"uid {peer}"


class SessionTable:
    """The open sessions, and the peer (user id, or UNIDENTIFIED) each belongs to: at most
    `limit` open in all and `per_peer` for one peer (0: any number). The clients that did
    not identify themselves (over the peer socket) count as one peer."""

    def __init__(self, *, limit: int = 0, per_peer: int = 0) -> None:
        self.limit = limit
        self.per_peer = per_peer
        self._open: dict[SessionId, int | None] = {}  # session id -> its peer
        self._held: Counter[int | None] = Counter()
        self._lock = threading.Lock()

    def open(self, peer: int | None = UNIDENTIFIED) -> SessionId:
        """A new session's id for `peer`; ResourceError past either limit."""
        with self._lock:
            if self.limit and len(self._open) >= self.limit:
                raise ResourceError(
                    f"session_monitor: {len(self._open)} sessions are open, the most this "
                    f"daemon serves (session_max_open {self.limit}): close clients that are "
                    "done, or raise session_max_open in the daemon's config"
                )
            held = self._held[peer]
            if self.per_peer and held >= self.per_peer:
                raise ResourceError(
                    f"session_monitor: {peer_name(peer)} hold {held} open sessions, the most "
                    f"one peer may (session_max_per_peer {self.per_peer}): close sessions "
                    "that are done"
                    + (
                        "; a client that identifies itself counts as its own user"
                        if peer is None
                        else ""
                    )
                )
            while True:
                session_id = SessionId(secrets.randbits(64))
                if session_id != NO_SESSION and session_id not in self._open:
                    break
            self._open[session_id] = peer
            self._held[peer] += 1
        return session_id

    def end(self, session_id: SessionId) -> bool:
        """Forget the session; False if it was not open."""
        with self._lock:
            if session_id not in self._open:
                return False
            peer = self._open.pop(session_id)
            self._held[peer] -= 1
            if not self._held[peer]:
                del self._held[peer]
        return True

    def is_open(self, session_id: SessionId) -> bool:
        with self._lock:
            return session_id in self._open

    def peer(self, session_id: SessionId) -> int | None:
        """The peer an open session belongs to (UNIDENTIFIED if it never said)."""
        self.check(session_id)
        with self._lock:
            return self._open.get(session_id)

    def presented(self, session: SessionId | None) -> SessionId | None:
        """The session a call presents (None or 0: none), checked to be open."""
        if not session:
            return None
        self.check(session)
        return session

    def check_passer(self, session_id: SessionId, uid: int) -> None:
        """InvalidError unless user `uid` may pass objects into the open session: any
        user into a session of no known user, else only that user."""
        if session_id == NO_SESSION:
            raise InvalidError(
                "a passed shared memory object needs a session: open one with "
                "session_monitor and give its id"
            )
        owner = self.peer(session_id)
        if owner is not None and owner != uid:
            raise InvalidError(
                f"{session_name(session_id)} belongs to another user: pass objects into "
                "a session of your own"
            )

    def check(self, session_id: SessionId) -> None:
        """InvalidError unless `session_id` is 0 (no session) or an open session. The
        message never tells an open id from one that never was."""
        if session_id != NO_SESSION and not self.is_open(session_id):
            raise InvalidError(
                "this session id names no open session (its session_monitor stream ended, "
                "or it was never this daemon's): give the id session_monitor answered, "
                "or 0 for no session"
            )


def check_ncs_quota(session_id: SessionId, would_hold: int, limit: int) -> None:
    """ResourceError if the session's NCGs would hold more NCs than `limit` (0: any)."""
    if limit and would_hold > limit:
        raise ResourceError(
            f"{session_name(session_id)} would hold {would_hold} NeuronCores, past the "
            f"most one may hold (session_max_ncs {limit}): destroy an NCG or unload a "
            "model first"
        )


def check_models_quota(session_id: SessionId, held: int, limit: int) -> None:
    """ResourceError if the session has `limit` models loaded already (0: any)."""
    if limit and held >= limit:
        raise ResourceError(
            f"{session_name(session_id)} has {held} models loaded, the most one may "
            f"(session_max_models {limit}): unload one first"
        )
