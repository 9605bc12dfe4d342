"""A run's figures: what it did and what it waited on (`Totals`), how busy the host's
CPUs were, and how busy the NCs of its models and the daemon were (`DaemonBusy`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.client.observe import interval
from neuron_rtd.proto import ext_pb

log = logging.getLogger("neuron_rtd.stream")


def host_busy_cpu_s() -> float:
    """CPU seconds the host spent busy (every process, every core) since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


@dataclass
class Totals:
    """What a run did; updated by the channels, reported every second and at the end."""

    records: int = 0
    bytes: int = 0
    skipped: int = 0
    units_done: int = 0
    units_skipped: int = 0  # done by an earlier run (resume)
    storage_s: float = 0.0
    nc_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    host_cpu_started: float = field(default_factory=host_busy_cpu_s)
    ended: tuple[float, float] | None = None  # (monotonic, host CPU) when streaming ended
    nc_busy_share: float = 0.0  # of the NCs of the run's models, since it started (last read)
    daemon_cpu_s: float = 0.0  # the daemon's CPU seconds since it started (last read)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def restart(self) -> None:
        with self.lock:
            self.started = time.monotonic()
            self.host_cpu_started = host_busy_cpu_s()

    def end(self) -> None:
        """Streaming is over: the figures stop here (the models' unload apart)."""
        with self.lock:
            self.ended = (time.monotonic(), host_busy_cpu_s())

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            now, cpu = self.ended or (time.monotonic(), host_busy_cpu_s())
            seconds = max(now - self.started, 1e-9)
            waited = self.storage_s + self.nc_s
            return {
                "seconds": round(seconds, 3),
                "records": self.records,
                "skipped": self.skipped,
                "units_done": self.units_done,
                "units_skipped": self.units_skipped,
                "records_per_s": round(self.records / seconds, 1),
                "mb_per_s": round(self.bytes / seconds / 1e6, 2),
                "storage_wait_share": round(self.storage_s / waited, 3) if waited else 0.0,
                "nc_wait_share": round(self.nc_s / waited, 3) if waited else 0.0,
                # the host's CPU seconds busy (every process), and its cores
                "host_cpu_s": round(cpu - self.host_cpu_started, 3),
                "host_cpus": psutil.cpu_count() or 1,
                "nc_busy_share": round(self.nc_busy_share, 3),
                "daemon_cpu_s": round(self.daemon_cpu_s, 3),
            }


class DaemonBusy:
    """How busy the NCs of the run's models, and the daemon, have been since it started:
    their busy time and its CPU time in the daemon's ext snapshots (what neuron-top and
    neuron-monitor read)."""

    def __init__(self, client: Client, model_ids: Sequence[int]) -> None:
        self._client = client
        self._ids = set(model_ids)
        self._first = self._read()

    def _read(self) -> ext_pb.snapshot_response | None:
        try:
            return self._client.connection.snapshot(retry=False)  # a figure: never waited for
        except NrtClientError as exc:  # a daemon without it, or gone: the run goes on
            log.debug("no NC busy time: %s", exc)
            return None

    def since_start(self) -> tuple[float | None, float | None]:
        """Since the start: the share (0..1) of the time the NCs were busy, and the CPU
        seconds the daemon spent (each None: unread)."""
        now = self._read()
        if self._first is None or now is None:
            return None, None
        cpu_s = (now.cpu_user_s + now.cpu_system_s) - (
            self._first.cpu_user_s + self._first.cpu_system_s
        )
        ncs = {
            vnc
            for ncg in now.ncgs
            if self._ids & set(ncg.model_ids)
            for vnc in range(ncg.vnc_start, ncg.vnc_start + ncg.nc_count)
        }
        utilization = interval(self._first, now).nc_utilization
        shares = [utilization[vnc] / 100 for vnc in ncs if vnc in utilization]
        return (sum(shares) / len(shares) if shares else None), cpu_s
