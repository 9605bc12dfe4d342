"""systemd integration: readiness (`Type=notify`), status text, stopping, watchdog."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

log = logging.getLogger("nrtd.NRTD")

NOTIFY_TIMEOUT_S = 1.0  # a service manager that takes no message within this misses it


def notify(*fields: str) -> bool:
    """Send `fields` ("READY=1", "STATUS=...") to the service manager, if any; False
    when there is none, or it did not take the message within NOTIFY_TIMEOUT_S.

    Sent here, not by python-systemd's `notify`, which holds the GIL while it sends: a
    notify socket whose queue is full (a manager slow to read it; 10 datagrams by
    default) froze every thread of the daemon, not just the one notifying."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(NOTIFY_TIMEOUT_S)
        try:
            sock.sendto("\n".join(fields).encode(), address)
        except OSError as exc:  # TimeoutError too
            log.debug("notify %s: %s", path, exc, extra={"fn": "notify"})
            return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog period systemd asked for, or None when there is no watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        period = int(usec) / 1e6
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number", usec, extra={"fn": "watchdog"})
        return None
    return period / 2 if period > 0 else None


class Watchdog:
    """Pings `WATCHDOG=1` every half period while `healthy()` says so."""

    def __init__(self, interval_s: float, healthy: Callable[[], bool]) -> None:
        self.interval_s = interval_s
        self.healthy = healthy
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            if self.healthy():
                notify("WATCHDOG=1")
            else:
                log.error(
                    "runtime unresponsive: not pinging the watchdog", extra={"fn": "watchdog"}
                )
            if self._stop.wait(self.interval_s):
                return
