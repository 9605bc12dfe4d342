"""The session a call presents: gRPC metadata `nrt-session-id` (decimal), which our
client sends on every call once its session is open. The original interface carries a
session id only in `load`, `create_eg` and `shm_map`; a call that presents its session
names the shared memory that session mapped, and only such a call names an object the
session passed over the shm socket (see `runtime/shm.py`)."""

from __future__ import annotations

import grpc

from neuron_rtd.errors import InvalidError

SESSION_METADATA = "nrt-session-id"


def presented_session(context: grpc.ServicerContext) -> int | None:
    """The session id the call presents; None when it presents none (or 0)."""
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_METADATA:
            text = value if isinstance(value, str) else value.decode("ascii", "replace")
            if not text.isdigit() or int(text) >= 1 << 64:
                raise InvalidError(
                    f"metadata {SESSION_METADATA} must be a session id (a decimal uint64), "
                    f"got {text[:40]!r}"
                )
            return int(text) or None
    return None
