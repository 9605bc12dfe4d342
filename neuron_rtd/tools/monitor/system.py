"""The system-level metric groups of a neuron-monitor report (`vcpu_usage`,
`memory_info`), read with psutil. The first `vcpu_usage` covers the time since boot."""

from __future__ import annotations

import time
from typing import Any, Protocol

import psutil

# report field <- psutil cpu_times field; guest time is already in user time on Linux
CPU_FIELDS = {
    "user": "user",
    "nice": "nice",
    "system": "system",
    "idle": "idle",
    "io_wait": "iowait",
    "irq": "irq",
    "soft_irq": "softirq",
}
_COUNTED = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class Group(Protocol):
    def collect(self) -> dict: ...


def _seconds(times: Any) -> dict[str, float]:
    return {name: getattr(times, name, 0.0) for name in _COUNTED}


def _usage(before: dict[str, float] | None, after: dict[str, float]) -> dict[str, float]:
    spent = {k: max(0.0, v - (before or {}).get(k, 0.0)) for k, v in after.items()}
    total = sum(spent.values()) or 1.0
    return {field: round(spent[name] / total * 100, 2) for field, name in CPU_FIELDS.items()}


class VcpuUsage:
    """`vcpu_usage`: each vCPU's time split over the period, their average, and the
    context switches."""

    def __init__(self) -> None:
        self._since = psutil.boot_time()
        self._total: dict[str, float] | None = None
        self._per_cpu: list[dict[str, float]] | None = None
        self._switches = 0

    def collect(self) -> dict:
        now = time.time()
        total = _seconds(psutil.cpu_times())
        per_cpu = [_seconds(t) for t in psutil.cpu_times(percpu=True)]
        switches = psutil.cpu_stats().ctx_switches
        before = self._per_cpu or []
        report = {
            "period": round(now - self._since, 6),
            "average_usage": _usage(self._total, total),
            "usage_data": {
                str(i): _usage(before[i] if i < len(before) else None, cpu)
                for i, cpu in enumerate(per_cpu)
            },
            "context_switch_count": max(0, switches - self._switches),
            "error": "",
        }
        self._since, self._total, self._per_cpu, self._switches = now, total, per_cpu, switches
        return report


class MemoryInfo:
    """`memory_info`: the host's memory and swap, at the end of the period."""

    def __init__(self) -> None:
        self._since = time.time()

    def collect(self) -> dict:
        now = time.time()
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        report = {
            "period": round(now - self._since, 6),
            "memory_total_bytes": memory.total,
            "memory_used_bytes": memory.used,
            "swap_total_bytes": swap.total,
            "swap_used_bytes": swap.used,
            "error": "",
        }
        self._since = now
        return report
