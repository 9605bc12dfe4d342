"""Whether the daemon's fronts still answer: it asks them itself (`FrontWatch`).

The loops that serve a front are not all ours: grpcio's serve thread takes every gRPC
call off the completion queue, waitress's I/O thread every HTTP request. Should one end
(an error raised in it, memory refused mid-message), the process lives on with a dead
API, and neither systemd nor the runtime's own health would see it. So a thread asks
each front what any client may ask, over the front itself: gRPC health `Check` on the
daemon's own address (its `--grpc-address` is the same server's), and `GET
/v2/health/live` on the HTTP front and on the metrics' server when they are on. Any
answer counts (NOT_SERVING, an error status too); a front that has not answered for
`front_timeout_secs` is logged, naming it, and the daemon exits non-zero, which systemd
(`Restart=on-failure`) answers with a restart; without systemd the exit says it too.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger("nrtd.NRTD")

EXIT_FRONT_SILENT = 3  # the exit status of a daemon whose front stopped answering
ASKS_PER_TIMEOUT = 4  # each front is asked this often within the timeout


class Front(NamedTuple):
    """A front: its name in the log, and a question that returns once it answered
    (raises when it did not within `timeout` seconds)."""

    name: str
    ask: Callable[[float], None]
    close: Callable[[], None] = lambda: None


def grpc_front(target: str) -> Front:
    """The gRPC front at `target` (a unix: or host:port target the daemon listens on),
    asked a health Check."""
    channel = grpc.insecure_channel(target)
    check = health_pb2_grpc.HealthStub(channel).Check

    def ask(timeout: float) -> None:
        try:
            check(health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            code = error.code()
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise TimeoutError(f"{code.name}: {error.details()}") from None
            # any other status is an answer: the front serves

    return Front(f"the gRPC front on {target}", ask, channel.close)


def http_front(host: str, port: int, name: str = "the HTTP front") -> Front:
    """The HTTP front on `host`:`port` (a wildcard host asked on loopback), asked
    GET /v2/health/live (the metrics' server, `name`d so, answers 404: an answer)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)

    def ask(timeout: float) -> None:
        connection = http.client.HTTPConnection(host.strip("[]"), port, timeout=timeout)
        try:
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()  # any status is an answer
        finally:
            connection.close()

    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return Front(f"{name} on {shown}:{port}", ask)


class FrontWatch:
    """Asks each of `fronts` every `timeout_s / ASKS_PER_TIMEOUT` seconds; once one has
    not answered for `timeout_s`, calls `silent(why)` (the daemon exits) and stops."""

    def __init__(
        self,
        fronts: Sequence[Front],
        timeout_s: float,
        silent: Callable[[str], None],
    ) -> None:
        self.fronts = tuple(fronts)
        self.timeout_s = timeout_s
        self.period_s = timeout_s / ASKS_PER_TIMEOUT
        self.silent = silent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="front-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # a question under way ends with its channel
            self._thread.join(1.0)
        for front in self.fronts:
            front.close()

    def _run(self) -> None:
        answered = dict.fromkeys((f.name for f in self.fronts), time.monotonic())
        # asked at once too: the gRPC question's connection is made as the daemon starts
        while not self._stop.is_set():
            for front in self.fronts:
                why = self._ask(front)
                now = time.monotonic()
                if why is None:
                    answered[front.name] = now
                    continue
                quiet = now - answered[front.name]
                if quiet < self.timeout_s:
                    log.warning(
                        "%s did not answer its health check (%s); the daemon exits if it "
                        "answers nothing for %g s",
                        front.name,
                        why,
                        self.timeout_s,
                        extra={"fn": "watchdog"},
                    )
                    continue
                if not self._stop.is_set():
                    self.silent(
                        f"{front.name} has answered nothing for {quiet:.0f} s (last: {why})"
                    )
                return
            self._stop.wait(self.period_s)

    def _ask(self, front: Front) -> str | None:
        """None when `front` answered; else why not."""
        try:
            front.ask(self.period_s)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None
