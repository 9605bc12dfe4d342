"""neuron-monitor's collection: which metric groups are due, what each runtime answers,
and the report that puts them together (the original's JSON layout).

Each metric group has its own period and keeps what it saw at the start of it (a
snapshot, the daemon's counters, the devices' counters), so a report says what happened
during the period. A group seen for the first time, or of a daemon that started again
(another pid or start time), counts from the daemon's start; the devices' health
counters, which outlive daemons, from the device's making. An NC's busy time starts
again when its device is reset, so a period with a reset counts only the busy time
after it. A runtime that does not
answer gives its groups an `error` and keeps their starting point: when the same daemon
answers again, the next report covers the whole time in between.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from neuron_rtd.client import NrtClientError
from neuron_rtd.client.observe import Watch, interval, origin
from neuron_rtd.tools.monitor import groups, system
from neuron_rtd.tools.monitor.config import MonitorConfig, RuntimeConfig

Log = Callable[[int, str], None]
SNAPSHOT_GROUPS = (
    "neuroncore_counters",
    "inference_stats",
    "memory_used",
    "neuron_runtime_vcpu_usage",
)
SLACK_S = 0.05  # groups due this close together are collected together


def _no_log(level: int, message: str) -> None:
    pass


@dataclass
class _Start:
    """What one metric group saw at the start of its period."""

    snapshot: Any | None = None  # None: the daemon's start
    counters: Any | None = None  # None: nothing counted yet
    hw: dict[str, dict[str, int]] = field(default_factory=dict)
    since_ns: int = 0  # when the period began (wall clock); 0: never collected


class RuntimeWatch:
    """One runtime of the configuration: its metric groups and what they saw last."""

    def __init__(self, index: int, config: RuntimeConfig, *, timeout_s: float, log: Log) -> None:
        self.index = index
        self.address = config.address
        self.timeout_s = timeout_s
        self.log = log
        self.starts = {g.type: _Start() for g in config.groups}
        self.daemon: tuple[int, int] | None = None  # (pid, start time) of the last answer
        self.described: Any | None = None
        self.error: str | None = None  # None: not asked yet
        self._watch: Watch | None = None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _ask(self, due: list[str]) -> tuple[Any, Any | None, Any | None]:
        if self._watch is None:
            self._watch = Watch(self.address, timeout_s=self.timeout_s)
        watch = self._watch
        described = watch.describe()
        snapshot = watch.snapshot() if any(k in SNAPSHOT_GROUPS for k in due) else None
        counters = watch.counters() if "inference_stats" in due else None
        return described, snapshot, counters

    def collect(self, due: list[str]) -> dict:
        """This runtime's `neuron_runtime_data` entry with the groups `due`."""
        try:
            described, snapshot, counters = self._ask(due)
        except NrtClientError as exc:
            return self._failed(due, str(exc))
        now_ns = snapshot.time_ns if snapshot is not None else time.time_ns()
        daemon = (described.pid, described.start_time_ns)
        if daemon != self.daemon:
            if self.daemon is not None:
                self.log(1, f"{self.address}: a new runtime (pid {described.pid}) answers")
            for start in self.starts.values():  # count from its start; device counts go on
                start.snapshot, start.counters = None, None
                start.since_ns = described.start_time_ns
        elif self.error:
            self.log(1, f"{self.address}: the runtime answers again (pid {described.pid})")
        self.daemon, self.described, self.error = daemon, described, ""
        report = {kind: self._group(kind, described, snapshot, counters, now_ns) for kind in due}
        return self._entry("", report)

    def _group(self, kind: str, described: Any, snapshot: Any, counters: Any, now_ns: int) -> dict:
        start = self.starts[kind]
        seconds = max(0.0, (now_ns - start.since_ns) / 1e9)
        start.since_ns = now_ns
        if kind == "hw_counters":
            made = groups.hw_counters(seconds, start.hw, described)
            start.hw = groups.hw_counts(described)
            return made
        before = start.snapshot
        if before is None:  # the daemon's start
            before = origin(described.start_time_ns, snapshot)
        iv = interval(before, snapshot)
        start.snapshot = snapshot
        if kind == "neuroncore_counters":
            return groups.neuroncore_counters(iv, snapshot)
        if kind == "memory_used":
            return groups.memory_used(iv, snapshot, described)
        if kind == "neuron_runtime_vcpu_usage":
            return groups.neuron_runtime_vcpu_usage(iv)
        made = groups.inference_stats(iv, start.counters, counters)
        start.counters = counters
        return made

    def _failed(self, due: list[str], message: str) -> dict:
        self.close()  # a new channel next time: no waiting out a reconnect backoff
        if self.error != message:
            self.log(1, f"{self.address}: {message}")
        self.error = message
        now_ns = time.time_ns()
        report = {
            kind: {
                "period": round((now_ns - s.since_ns) / 1e9, 6) if s.since_ns else 0.0,
                "error": message,
            }
            for kind, s in ((k, self.starts[k]) for k in due)
        }
        return self._entry(message, report)

    def _entry(self, error: str, report: dict) -> dict:
        return {
            "neuron_runtime_index": self.index,
            "address": self.address,
            "pid": self.daemon[0] if self.daemon else None,
            "error": error,
            "report": report,
        }


class Monitor:
    """The runtimes and system groups of one configuration, on their schedules."""

    def __init__(
        self,
        config: MonitorConfig,
        *,
        timeout_s: float = 5.0,
        log: Log = _no_log,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.clock = clock
        self.runtimes = [
            RuntimeWatch(i, rc, timeout_s=timeout_s, log=log)
            for i, rc in enumerate(config.runtimes)
        ]
        makers: dict[str, Callable[[], system.Group]] = {
            "vcpu_usage": system.VcpuUsage,
            "memory_info": system.MemoryInfo,
        }
        self.system = {g.type: makers[g.type]() for g in config.system}
        self._periods: dict[tuple[int | None, str], float] = {
            (None, g.type): g.period_s for g in config.system
        }
        for i, rc in enumerate(config.runtimes):
            self._periods |= {(i, g.type): g.period_s for g in rc.groups}
        now = clock()
        self._next = dict.fromkeys(self._periods, now)  # all due at once

    def close(self) -> None:
        for runtime in self.runtimes:
            runtime.close()

    def seconds_to_next(self) -> float:
        return max(0.0, min(self._next.values(), default=self.clock()) - self.clock())

    def _take_due(self) -> list[tuple[int | None, str]]:
        now = self.clock()
        due = [key for key, at in self._next.items() if at <= now + SLACK_S]
        for key in due:
            period = self._periods[key]
            following = self._next[key] + period
            self._next[key] = following if following > now else now + period
        return due

    def collect(self) -> dict:
        """The report of the groups due now (on the first call: all of them)."""
        due = self._take_due()
        entries = []
        for runtime in self.runtimes:
            kinds = [kind for i, kind in due if i == runtime.index]
            if kinds:
                started = time.perf_counter()
                entries.append(runtime.collect(kinds))
                self.log(
                    3,
                    f"{runtime.address}: {', '.join(kinds)} in "
                    f"{(time.perf_counter() - started) * 1e3:.1f} ms",
                )
        system_data = {kind: self.system[kind].collect() for i, kind in due if i is None}
        report = {
            "neuron_runtime_data": entries,
            "system_data": system_data,
            "instance_data": self._instance_data(),
            "neuron_hardware_info": self._hardware_info(),
        }
        self.log(2, f"report: {len(entries)} runtime(s), groups {sorted(k for _, k in due)}")
        return report

    def _answered(self) -> list[Any]:
        return [r.described for r in self.runtimes if r.error == "" and r.described is not None]

    def _instance_data(self) -> dict:
        described = self._answered()
        return {  # no EC2 metadata here: the instance type is the simulated machine's
            "instance_name": socket.gethostname(),
            "instance_id": "",
            "instance_type": described[0].instance_type if described else "",
            "instance_availability_zone": "",
            "instance_availability_zone_id": "",
            "instance_region": "",
            "ami_id": "",
            "subnet_id": "",
            "error": "",
        }

    def _hardware_info(self) -> dict:
        """The Neuron devices of the runtimes that answer (each device counted once)."""
        devices = {
            (d.sim_root, dev.index): dev.nc_count for d in self._answered() for dev in d.devices
        }
        if not devices:
            return {
                "neuron_device_count": 0,
                "neuroncore_per_device_count": 0,
                "error": "no runtime answered",
            }
        return {
            "neuron_device_count": len(devices),
            "neuroncore_per_device_count": max(devices.values()),
            "error": "",
        }
