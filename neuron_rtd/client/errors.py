"""The client's exceptions: a daemon answer other than success, with its nerr code
(`NrtClientError`); a daemon not reached or not answering in time (`NrtConnectionError`,
one too, naming the address, what is wrong there and what to do), or one that answered
that it is stopping (`DaemonStopping`, one of those: it is going away, and what was
loaded on it with it); and the one retry of a call the daemon was UNAVAILABLE for (or
stopping), made only when a daemon is likely back soon.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from neuron_rtd.client.reach import restart_likely, unreachable
from neuron_rtd.errors import STOPPING, InferTimeout, Nerr, NrtError, Stopping, for_code

# INFER_COMPLETED_WITH_NUM_ERR finished with NaN/Inf: the clients treat it as success.
SUCCESS = frozenset({Nerr.OK, Nerr.INFER_COMPLETED_WITH_NUM_ERR})


class NrtClientError(NrtError):
    """The daemon answered `method` with nerr `code`; `details` holds its log lines.

    One of the runtime's own classes too (`neuron_rtd.errors`): `NrtClientError(code, ...)`
    makes the subclass for `code` (as `OSError(errno.ENOENT, ...)` makes a
    FileNotFoundError), so `except QueueFull` catches a full queue from the client as it
    does from `LocalRuntime`, and `except NrtClientError` every error the daemon answered."""

    def __new__(cls, code: int, details: str = "", method: str = "", *args: Any) -> Any:
        chosen = _BY_CODE.get(code, cls) if cls is NrtClientError else cls
        return super().__new__(chosen)

    def __init__(self, code: int, details: str, method: str) -> None:
        nerr = _nerr(code)
        name = f"NERR_{nerr.name}" if nerr is not None else f"nerr {code}"
        super().__init__(f"{method}: {name}: {details}")
        self.code = nerr if nerr is not None else Nerr.FAIL
        self.wire_code = code  # as answered, a code the wire API may not define
        self.details = details
        self.method = method

    @property
    def nerr(self) -> Nerr | None:
        """The code as a `Nerr` (None for a code the wire API does not define)."""
        return _nerr(self.wire_code)

    def __reduce__(self) -> Any:  # made again from what it was made of (a Ray task's error)
        return NrtClientError, (self.wire_code, self.details, self.method)


def _nerr(code: int) -> Nerr | None:
    try:
        return Nerr(code)
    except ValueError:
        return None


def _answered(runtime_class: type[NrtError]) -> type[NrtClientError]:
    """The client's class for a code: an NrtClientError and `runtime_class` both."""
    name = runtime_class.__name__
    return type(
        name,
        (NrtClientError, runtime_class),
        {
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": f"The daemon answered a call with {name}'s nerr code.",
        },
    )


# One client class per code the runtime has a class of its own for; FAIL (and a code the
# wire API does not define) is NrtClientError itself.
_BY_CODE: dict[int, type[NrtClientError]] = {
    code: _answered(for_code(code)) for code in Nerr if for_code(code) is not NrtError
}


class NrtConnectionError(NrtClientError):
    """No daemon answered `method` at `address` (NERR_FAIL), or none in time (NERR_TIMEOUT):
    a transport failure. `grpc_code` is gRPC's status code for it."""

    def __new__(
        cls, method: str, address: str = "", grpc_code: grpc.StatusCode | None = None, *args: Any
    ) -> Any:
        late = grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        return Exception.__new__(DaemonTimeout if late and cls is NrtConnectionError else cls)

    def __init__(
        self, method: str, address: str, grpc_code: grpc.StatusCode | None, message: str
    ) -> None:
        self.address = address
        self.grpc_code = grpc_code
        late = grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        super().__init__(Nerr.TIMEOUT if late else Nerr.FAIL, message, method)

    def __reduce__(self) -> Any:
        return NrtConnectionError, (self.method, self.address, self.grpc_code, self.details)

    @classmethod
    def of(
        cls, method: str, address: str, exc: grpc.RpcError, timeout_s: float | None
    ) -> NrtConnectionError:
        """The failure gRPC reported as `exc`: a call the daemon cancelled (its gRPC
        server does only as it stops) is DaemonStopping."""
        code = code_of(exc)
        if code == grpc.StatusCode.CANCELLED:
            said = f"{STOPPING} at {address}: it cancelled the call (gRPC CANCELLED)"
            return DaemonStopping(method, said, address, code)
        return cls(method, address, code, transport_message(exc, address, timeout_s))

    @classmethod
    def timed_out(cls, method: str, address: str, timeout_s: float | None) -> NrtConnectionError:
        """The daemon did not answer `method` within `timeout_s` (NERR_TIMEOUT), as gRPC's
        DEADLINE_EXCEEDED says it, on a path that is not gRPC's (the fast lane)."""
        late = grpc.StatusCode.DEADLINE_EXCEEDED
        return cls(method, address, late, late_message(address, timeout_s))


class DaemonTimeout(NrtConnectionError, InferTimeout):
    """The daemon did not answer `method` in time (NERR_TIMEOUT): an InferTimeout, as a
    request past its time limit is in `LocalRuntime`."""


class DaemonStopping(NrtConnectionError, Stopping):
    """The daemon answered `method` that it is stopping (NERR_FAIL): it takes no new call,
    and unloads every model once the calls under way are done. A connection error: as
    with a daemon gone, what was loaded on it must be loaded again on the next one; and
    the runtime's `Stopping`, as `LocalRuntime` raises it."""

    def __init__(
        self,
        method: str,
        details: str,
        address: str = "",
        grpc_code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(method, address, grpc_code, details)

    def __reduce__(self) -> Any:
        return DaemonStopping, (self.method, self.details, self.address, self.grpc_code)


def says_stopping(status: Any) -> bool:
    """Whether a wire `status` is a stopping daemon's refusal (`errors.Stopping`)."""
    if status.code != Nerr.FAIL:
        return False
    details = status.details.decode(errors="replace")
    return any(line.startswith(STOPPING) for line in details.splitlines())


def transport_message(exc: grpc.RpcError, address: str, timeout_s: float | None) -> str:
    """What a transport failure means, and what to do."""
    code = code_of(exc)
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        why_not = unreachable(address)  # a unix socket: what is (not) there, and what to do
        if why_not is not None:
            return f"no runtime answers at {address}: {why_not}"
        # gRPC's details end with the system's reason, e.g. "... error: Connection refused"
        _, marker, reason = (details or "").rpartition("error: ")
        why = f" ({reason.strip()})" if marker and reason.strip() else ""
        return (
            f"no runtime answers at {address}{why}: is neuron-rtd running there? "
            "(systemctl status neuron-rtd; NEURON_RTD_ADDRESS names another address)"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return late_message(address, timeout_s)
    name = code.name if code is not None else "error"
    return f"the runtime at {address} failed the call ({name}): {details}"


def late_message(address: str, timeout_s: float | None) -> str:
    within = f" within {timeout_s:g} s" if timeout_s else " in time"
    return f"the runtime at {address} did not answer{within}"


@contextlib.contextmanager
def transport_errors(method: str, address: str, timeout_s: float | None) -> Iterator[None]:
    """A gRPC transport failure in the block becomes an NrtConnectionError."""
    try:
        yield
    except grpc.RpcError as exc:
        raise NrtConnectionError.of(method, address, exc, timeout_s) from None


def check(method: str, status: Any) -> None:
    """Raise NrtClientError unless `status` (a wire `status`) is a success: DaemonStopping
    when the daemon said it is stopping."""
    if status.code not in SUCCESS:
        details = status.details.decode(errors="replace")
        if says_stopping(status):
            raise DaemonStopping(method, details)
        raise NrtClientError(status.code, details, method)


def code_of(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The gRPC status code of a failed call (None when the error carries none)."""
    return exc.code() if isinstance(exc, grpc.Call) else None


T = TypeVar("T")


RECONNECT_S = 5.0  # how long the one retry waits for a daemon likely back (restarting)
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


# When each channel last waited to be connected again: gRPC's connectivity poller keeps
# running up to WATCH_LINGER_S after such a wait and fails loudly if the channel closes
# meanwhile, so closing waits that long (`settle_before_close`).
_last_wait: weakref.WeakKeyDictionary[grpc.Channel, float] = weakref.WeakKeyDictionary()
WATCH_LINGER_S = 0.25


def settle_before_close(channel: grpc.Channel) -> None:
    """Let a connectivity watch of `channel` end before the channel is closed."""
    waited = _last_wait.get(channel)
    if waited is not None:
        time.sleep(max(0.0, waited + WATCH_LINGER_S - time.monotonic()))


def retry_unavailable(
    call: Callable[[], T],
    channel: grpc.Channel,
    address: str | None = None,
    *,
    answered: bool = True,
) -> T:
    """`call()`, made once more when the daemon was UNAVAILABLE and is likely back soon
    (restarting, or its socket not yet there): the clients' one retry, once `channel` is
    connected again (see `wait_reconnected`)."""
    try:
        return call()
    except grpc.RpcError as exc:
        wait_reconnected(exc, channel, address, answered=answered)
    return call()


def wait_reconnected(
    exc: grpc.RpcError,
    channel: grpc.Channel,
    address: str | None = None,
    *,
    answered: bool = True,
) -> None:
    """Return once `channel` is connected again after the failure `exc` (waiting up to
    RECONNECT_S), when it is worth one retry: UNAVAILABLE, and a daemon at `address`
    likely to answer soon (`reach.restart_likely`; `answered`: one answered this client
    before; no `address`: always likely). Else raise `exc` at once: no socket, a stale
    one, a closed door or a refused TCP port on a first call is said in a moment."""
    if code_of(exc) != grpc.StatusCode.UNAVAILABLE:
        raise exc
    if address is not None and not restart_likely(address, answered=answered):
        raise exc
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=RECONNECT_S)
    except grpc.FutureTimeoutError:
        raise exc from None
    finally:
        ready.cancel()  # stop watching the channel
        _last_wait[channel] = time.monotonic()


def wait_restarted(channel: grpc.Channel, timeout_s: float = RECONNECT_S) -> bool:
    """After a stopping daemon's answer: True once `channel` has lost that daemon (its
    drain over) and is connected again, to the daemon started next (as systemd restarts
    one), each within `timeout_s`; False when either does not come."""
    lost = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state != grpc.ChannelConnectivity.READY:
            lost.set()

    channel.subscribe(watch)
    try:
        if not lost.wait(timeout_s):
            return False
    finally:
        channel.unsubscribe(watch)
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        return False
    finally:
        ready.cancel()
        _last_wait[channel] = time.monotonic()
    return True
