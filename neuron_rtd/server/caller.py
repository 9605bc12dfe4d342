"""What a call presents in its gRPC metadata: its session (`nrt-session-id`, decimal),
which our client sends on every call once its session is open, and, on `session_monitor`,
a peer ticket (`nrt-peer-ticket`, decimal: see `peer_socket`) naming the caller's user.
The original interface carries a session id only in `load`, `create_eg` and `shm_map`; a
call that presents its session names the shared memory that session mapped, and only such
a call names an object the session passed over the peer socket (see `runtime/shm.py`)."""

from __future__ import annotations

import grpc

from neuron_rtd.errors import InvalidError
from neuron_rtd.proto import SESSION_METADATA, TICKET_METADATA


def presented_session(context: grpc.ServicerContext) -> int | None:
    """The session id the call presents; None when it presents none (or 0)."""
    return _uint64(context, SESSION_METADATA, "a session id") or None


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
