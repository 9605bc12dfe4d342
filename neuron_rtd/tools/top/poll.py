"""What one poll of a daemon finds, for neuron-top: the daemon's observation over the last
interval (two ext snapshots, `neuron_rtd.client.observe`) and the system's CPU use, or why
it did not answer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from neuron_rtd.client import NrtClientError
from neuron_rtd.client.observe import Interval, Watch, interval


@dataclass(frozen=True)
class SystemCpu:
    """The machine's vCPU use over the last interval, % of all its vCPUs."""

    user: float
    system: float
    count: int


@dataclass(frozen=True)
class DaemonState:
    """One daemon as last seen. `error` is set when it did not answer; `describe` then
    still holds what it said last (for the title), and `snapshot` is None."""

    address: str
    describe: Any | None = None
    snapshot: Any | None = None
    span: Interval | None = None  # None until two snapshots in a row
    error: str | None = None
    system_cpu: SystemCpu | None = None
    polled_at: float = field(default_factory=time.time)


class Poller:
    """Polls one daemon: describe (devices' DRAM changes as models load) and snapshot, and
    the interval since its previous snapshot. After a failure it starts a new channel and
    a new baseline, so a daemon that comes back (maybe a new process) is read afresh."""

    def __init__(self, address: str, *, timeout_s: float = 2.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._watch: Watch | None = None
        self._describe: Any | None = None
        self._before: Any | None = None
        self._cpu_before = psutil.cpu_times()

    def poll(self) -> DaemonState:
        cpu = self._system_cpu()
        if self._watch is None:
            self._watch = Watch(self.address, timeout_s=self.timeout_s)
        try:
            describe = self._watch.describe()
            snapshot = self._watch.snapshot()
        except NrtClientError as exc:
            self._watch.close()
            self._watch = None
            self._before = None
            error = exc.details if exc.details.startswith("no runtime answers") else str(exc)
            return DaemonState(self.address, self._describe, error=error, system_cpu=cpu)
        if self._describe is not None and describe.pid != self._describe.pid:
            self._before = None  # another process: its counts start again
        span = interval(self._before, snapshot) if self._before is not None else None
        self._describe, self._before = describe, snapshot
        return DaemonState(self.address, describe, snapshot, span, system_cpu=cpu)

    def _system_cpu(self) -> SystemCpu | None:
        now, before = psutil.cpu_times(), self._cpu_before
        total = sum(now) - sum(before)
        if total < 0.05:  # too short a time to say (the first poll comes at once)
            return None
        self._cpu_before = now
        return SystemCpu(
            user=100 * (now.user + now.nice - before.user - before.nice) / total,
            system=100 * (now.system - before.system) / total,
            count=psutil.cpu_count() or 1,
        )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
