"""A request stream's reads and answers asked of gRPC's completion queue without waiting
(`read_async`, `send_async`), for the streams that hold no thread (`streams.py`) and the
session streams (`sessions.py`). They stand on grpcio's server internals, pinned with
grpcio in pyproject.toml. What runs on gRPC's own thread (the completion queue's, which
serves every call) is `guarded`: an error there is logged, never raised into gRPC, whose
thread would end with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from grpc import _server as grpc_server  # a stream's reads and sends, see read_async
from grpc._cython import cygrpc  # type: ignore[attr-defined]

log = logging.getLogger("nrtd.NMGR")


def guarded(what: str, work: Callable[[], Any]) -> None:
    """Run `work`; an exception is logged, never raised (on gRPC's thread or a pool's)."""
    try:
        work()
    except Exception:
        log.exception("%s: internal error", what, extra={"fn": what})


def read_async(requests: Iterator[Any], on_read: Callable[[Any], None]) -> bool:
    """Ask for the stream's next request without waiting for it: `on_read(request)` runs
    on gRPC's thread when it comes, `on_read(None)` when the client ended its side or the
    call ended. False (and nothing asked) when the call has ended already."""
    state = requests._state  # type: ignore[attr-defined]
    call = requests._call  # type: ignore[attr-defined]
    receive = grpc_server._receive_message(state, call, requests._request_deserializer)  # type: ignore[attr-defined]

    def received(event: Any) -> Any:
        outcome = receive(event)  # grpc's own bookkeeping: the request, or the end
        with state.condition:
            request, state.request = state.request, None
        guarded("stream read", lambda: on_read(request))
        return outcome

    with state.condition:
        if state.client is grpc_server._CANCELLED or not grpc_server._is_rpc_state_active(state):
            return False
        if grpc_server._RECEIVE_MESSAGE_TOKEN in state.due:
            return True  # a read is pending already
        call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), received)
        state.due.add(grpc_server._RECEIVE_MESSAGE_TOKEN)
    return True


def send_async(requests: Iterator[Any], message: bytes, on_sent: Callable[[], None]) -> bool:
    """Send one serialized answer on the stream without waiting for the client to take
    it: `on_sent()` runs on gRPC's thread once it is sent (or the call ended). False (and
    nothing sent) when the call has ended already. One send at a time per stream."""
    state = requests._state  # type: ignore[attr-defined]
    call = requests._call  # type: ignore[attr-defined]
    with state.condition:
        if not grpc_server._is_rpc_state_active(state):
            return False
        operation = cygrpc.SendMessageOperation(
            message, grpc_server._get_send_message_op_flags_from_state(state)
        )
        if state.initial_metadata_allowed:
            operations: tuple[Any, ...] = (
                grpc_server._get_initial_metadata_operation(state, None),
                operation,
            )
            state.initial_metadata_allowed = False
            token = grpc_server._SEND_INITIAL_METADATA_AND_SEND_MESSAGE_TOKEN
        else:
            operations = (operation,)
            token = grpc_server._SEND_MESSAGE_TOKEN
        bookkeeping = grpc_server._send_message(state, token)

        def sent(event: Any) -> Any:
            outcome = bookkeeping(event)
            guarded("stream send", on_sent)
            return outcome

        call.start_server_batch(operations, sent)
        state.due.add(token)
        grpc_server._reset_per_message_state(state)
    return True


def broke_off(kind: str) -> None:
    """Log that a stream of `kind` that answers once (a load) lost its caller first."""
    log.info(
        "the %s stream broke off before its end (the client went away)", kind, extra={"fn": kind}
    )
