"""Start `neuron-rtd` as a child process and wait until it is ready, the way systemd
does: through a `NOTIFY_SOCKET` we own, waiting for `READY=1`.

Used by the demo, the benchmarks and the tests that drive the real daemon.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType


class DaemonStartError(Exception):
    """The daemon exited or stayed silent instead of becoming ready."""


class NotifyListener:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = str(Path(directory) / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[str] = []

    def receive(self, timeout_s: float) -> str | None:
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        self.messages.append(data)
        return data

    def wait_for(
        self, field: str, timeout_s: float, alive: Callable[[], bool] | None = None
    ) -> bool:
        """Wait until a message carries `field` (e.g. "READY=1")."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(field in m.split("\n") for m in self.messages):
                return True
            if alive is not None and not alive():
                return False
            self.receive(min(0.2, max(0.0, deadline - time.monotonic())))
        return any(field in m.split("\n") for m in self.messages)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class DaemonProcess:
    """`with DaemonProcess(...) as d:` runs the real daemon on a socket of its own."""

    def __init__(
        self,
        *,
        sim_root: str | os.PathLike[str],
        socket_path: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nrtd-")
        self.socket_path = str(socket_path or Path(self._tmp.name) / "neuron.sock")
        self.address = f"unix:{self.socket_path}"
        self.sim_root = str(sim_root)
        self.args = list(args)
        self.extra_env = env or {}
        self.log_path = str(log_path or Path(self._tmp.name) / "daemon.log")
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.notify: NotifyListener | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "neuron_rtd.daemon.main",
            "-g",
            self.address,
            "-x",
            *self.args,
        ]

    def start(self) -> DaemonProcess:
        self.notify = NotifyListener(self._tmp.name)
        env = {
            **os.environ,
            "NEURON_SIM_ROOT": self.sim_root,
            "NOTIFY_SOCKET": self.notify.path,
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = self.proc
        if not self.notify.wait_for(
            "READY=1", self.ready_timeout_s, alive=lambda: proc.poll() is None
        ):
            self.stop()
            raise DaemonStartError(
                f"neuron-rtd did not become ready (exit {proc.returncode}):\n{self.log()}"
            )
        return self

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait; SIGKILL if it will not go. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.notify:
            self.notify.close()
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
