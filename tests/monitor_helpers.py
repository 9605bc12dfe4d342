"""Helpers of the neuron-monitor tests: its process's reports read with bounded waits,
the report schema, free ports, HTTP reads."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import jsonschema

SCHEMA = json.loads((Path(__file__).parent / "neuron_monitor_schema.json").read_text())
_validator = jsonschema.Draft202012Validator(SCHEMA)
ALL_RUNTIME_GROUPS = [
    "neuroncore_counters",
    "inference_stats",
    "memory_used",
    "hw_counters",
    "neuron_runtime_vcpu_usage",
]


def validate(report: dict) -> dict:
    """`report`, after checking it against the schema (every violation in the message)."""
    errors = sorted(_validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])
    return report


def command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"neuron_rtd.cli.{module}", *args]


def config(path: Path, addresses: list[str], period: str = "0.5s") -> Path:
    """A configuration file with every metric group of the runtimes at `addresses`."""
    doc = {
        "period": period,
        "neuron_runtimes": [
            {"address": a, "metrics": [{"type": g} for g in ALL_RUNTIME_GROUPS]} for a in addresses
        ],
        "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}],
    }
    path.write_text(json.dumps(doc))
    return path


class Reports:
    """The JSON lines a process writes, read by a thread; each taken is validated."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()
        self.taken: list[dict] = []

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout_s: float = 30.0) -> dict:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no report within {timeout_s} s") from None
        assert line is not None, "the monitor's output ended"
        report = validate(json.loads(line))
        self.taken.append(report)
        return report

    def until(self, done: Callable[[dict], bool], what: str, *, reports: int = 60) -> dict:
        """The first report (of the next `reports`) for which `done` holds."""
        for _ in range(reports):
            report = self.next()
            if done(report):
                return report
        raise AssertionError(f"{what}: not seen in {reports} reports")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def wait_for(
    check: Callable[[], Any], what: str, *, timeout_s: float = 60.0, every_s: float = 0.2
) -> Any:
    """`check()`'s first truthy answer (exceptions count as not yet), or fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = check()
        except Exception as exc:  # not up yet: tried again until the deadline
            last = exc
        else:
            if answer:
                return answer
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def stop(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> int:
    """SIGTERM and wait; SIGKILL if it will not go (then fail)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{proc.args!r} did not stop on SIGTERM") from None
    return int(proc.returncode)
