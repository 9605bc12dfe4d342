"""Who may call what over gRPC on a TCP address (docs/wire-api.md, "Who may do what").

On the unix socket the socket's mode and group are the gate: whoever may connect is root,
its owner or a member of its group. A TCP port has no mode: any local user can connect to
it. So on a TCP address the daemon asks who is calling (`CallerOf`: the user owning the
client's socket, when it is on this host) and lets only root and members of the socket's
group (`socket_group`, else the daemon's own) do more than ask after health, the server,
and the models (as the HTTP front does): anyone else is answered PERMISSION_DENIED saying
why and what to do. A daemon that listens on its socket and on a TCP address too
(`--grpc-address`) gates only the TCP address's callers. The gate wraps each method's
handler, its flags kept (a handler that runs on a pool of its own, or answers without a
thread, still does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grpc

from neuron_rtd.runtime import Caller, group_name

# What anyone may ask: health, reflection, and the v2 service's metadata, readiness,
# configs, statistics and index (the HTTP front's open routes); nmgr's version.
OPEN_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/nrt.nmgr_v1/get_version",
        *(
            f"/inference.GRPCInferenceService/{name}"
            for name in (
                "ServerLive",
                "ServerReady",
                "ServerMetadata",
                "ModelReady",
                "ModelMetadata",
                "ModelConfig",
                "ModelStatistics",
                "RepositoryIndex",
            )
        ),
    }
)
_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class MembersOnly(grpc.ServerInterceptor):
    """Every method but `OPEN_METHODS` for root and members of group `gid` only."""

    def __init__(self, caller_of: Callable[[grpc.ServicerContext], Caller], gid: int) -> None:
        self.caller_of = caller_of
        self.gid = gid

    def intercept_service(
        self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        gated = {
            kind: self._gate(behavior, details.method)
            for kind in _BEHAVIORS
            if (behavior := getattr(handler, kind, None)) is not None
        }
        return handler._replace(**gated)

    def _gate(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        @functools.wraps(behavior)  # keeps the behaviour's flags (its pool, non-blocking)
        def gated(request: Any, context: grpc.ServicerContext, *more: Any) -> Any:
            # `more`: the answer's callback of a behaviour that answers without a thread
            if not (context.peer() or "").startswith("unix:"):  # the socket's mode gates those
                caller = self.caller_of(context)
                if not caller.in_group(self.gid):
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, self.refusal(method, caller))
            return behavior(request, context, *more)

        return gated

    def refusal(self, method: str, caller: Caller) -> str:
        return (
            f"{method} on this TCP address is for root and members of group "
            f"{group_name(self.gid)}, and "
            f"{caller.describe()} is neither (a caller not on this host is no one): run the "
            "client as such a user, or use the daemon's unix socket (docs/wire-api.md, "
            "who may do what)"
        )
