"""The session stream a client keeps open for its whole life.

`nmgr_session_manager.session_monitor`: send one request (the framework's name and
version), read one response (the session id), then hold the stream open. NCGs, models and
shm maps made with that id belong to the stream: when it ends the daemon releases them.
A daemon that answers UNIMPLEMENTED has no sessions: the id is 0 (nothing is tracked).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from neuron_rtd import __version__
from neuron_rtd.client.errors import code_of
from neuron_rtd.proto import TICKET_METADATA, pb, pb_grpc

log = logging.getLogger("neuron_rtd.client")

FRAMEWORK_NAME = "neuron-rtd-python"
OPEN_TIMEOUT_S = 30.0  # for the first response, when the client sets no timeout
CLOSE_TIMEOUT_S = 10.0  # for the daemon to release the session after the stream ends


def _version(text: str) -> Any:
    numbers = [int(p) if p.isdigit() else 0 for p in text.split(".")[:2]] + [0, 0]
    return pb.version(full_version=text, major_num=numbers[0], minor_num=numbers[1])


class Session:
    """An open session stream; `id` is 0 when the daemon does not track sessions."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        framework_name: str = FRAMEWORK_NAME,
        framework_version: str = __version__,
        timeout_s: float | None = None,
        ticket: int | None = None,
        retry: Callable[[Callable[[], int]], int],
    ) -> None:
        """`ticket`: a peer ticket (client/_peer.py) naming this user to the daemon.
        `retry(call)`: makes the opening call with the connection's one retry."""
        self._closing = threading.Event()
        self._done = threading.Event()
        self._call: Any = None
        self.runtime_version = ""
        request = pb.session_monitor_request(
            framework_name=framework_name,
            framework_version=_version(framework_version),
            fal_version=_version(__version__),
        )
        stub = pb_grpc.nmgr_session_managerStub(channel)
        metadata = () if ticket is None else ((TICKET_METADATA, str(ticket)),)
        self.id = retry(lambda: self._open(stub, request, timeout_s or OPEN_TIMEOUT_S, metadata))

    def _open(self, stub: Any, request: Any, timeout_s: float, metadata: Any) -> int:
        closing = self._closing = threading.Event()

        def requests() -> Iterator[Any]:
            yield request
            closing.wait()  # the stream stays open until close()

        call = stub.session_monitor(requests(), metadata=metadata)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            call.cancel()

        timer = threading.Timer(timeout_s, expire)  # no answer in time: give up
        timer.daemon = True
        timer.start()
        try:
            first = next(call)
        except (grpc.RpcError, StopIteration) as exc:
            closing.set()
            call.cancel()
            if isinstance(exc, StopIteration) or code_of(exc) == grpc.StatusCode.UNIMPLEMENTED:
                log.info("the daemon tracks no sessions: session id 0")
                return 0
            if expired.is_set():
                raise TimeoutError(
                    f"session_monitor: no session id from the daemon in {timeout_s:g} s"
                ) from None
            raise
        except BaseException:  # Ctrl-C while it opens: no stream left waiting on `closing`
            closing.set()  # (its request thread would hold the channel's close for good)
            call.cancel()
            raise
        finally:
            timer.cancel()
        self._call = call
        call.add_done_callback(lambda _: self._done.set())
        self.runtime_version = first.runtime_version.full_version
        return int(first.session_id)

    @property
    def ended(self) -> bool:
        """True when a tracked session's stream has ended (the daemon went away, or
        released the session): what it made is gone."""
        return self._call is not None and self._done.is_set()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """End the stream and wait until the daemon has closed it, which it does after
        releasing the session's models, NCGs and shm maps. False if it took too long."""
        self._closing.set()
        if self._call is None:
            return True
        released = self._done.wait(timeout_s)
        if not released:
            self._call.cancel()
        return released
