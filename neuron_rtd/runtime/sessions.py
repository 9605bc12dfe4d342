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

from neuron_rtd.errors import InvalidError, ResourceError

NO_SESSION = 0


def session_tag(session_id: int) -> str:
    """The session's public name (8 hex digits); "" for no session."""
    if session_id == NO_SESSION:
        return ""
    return hashlib.blake2b(session_id.to_bytes(8, "little"), digest_size=4).hexdigest()


def session_name(session_id: int) -> str:
    """Who holds what a session holds, in messages (no session: one quota for all)."""
    if session_id == NO_SESSION:
        return "the clients with no session"
    return f"session {session_tag(session_id)}"


class SessionTable:
    """The open sessions; at most `limit` at once (0: any number)."""

    def __init__(self, *, limit: int = 0) -> None:
        self.limit = limit
        self._open: set[int] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def open(self) -> int:
        """A new session's id; ResourceError when `limit` sessions are open."""
        with self._lock:
            if self.limit and len(self._open) >= self.limit:
                raise ResourceError(
                    f"session_monitor: {len(self._open)} sessions are open, the most this "
                    f"daemon serves (session_max_open {self.limit}): close clients that are "
                    "done, or raise session_max_open in the daemon's config"
                )
            while True:
                session_id = secrets.randbits(64)
                if session_id != NO_SESSION and session_id not in self._open:
                    break
            self._open.add(session_id)
        return session_id

    def end(self, session_id: int) -> bool:
        """Forget the session; False if it was not open."""
        with self._lock:
            if session_id not in self._open:
                return False
            self._open.discard(session_id)
        return True

    def is_open(self, session_id: int) -> bool:
        with self._lock:
            return session_id in self._open

    def check(self, session_id: int) -> None:
        """InvalidError unless `session_id` is 0 (no session) or an open session. The
        message never tells an open id from one that never was."""
        if session_id != NO_SESSION and not self.is_open(session_id):
            raise InvalidError(
                "this session id names no open session (its session_monitor stream ended, "
                "or it was never this daemon's): give the id session_monitor answered, "
                "or 0 for no session"
            )
