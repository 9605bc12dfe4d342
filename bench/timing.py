"""How the benches time calls: each call's seconds, sides called in alternating rounds (so
the machine's noise hits every side alike), a percentile of the times, and the sides'
table (p50, p99, and p50 against a base side).

A bench imports it by name: running a bench puts its folder on the path.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The value at fraction `q` (0.99: p99) of the sorted `values` (the nearest below)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[], object], count: int) -> list[float]:
    """Seconds per call of `count` calls."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def alternate(
    sides: dict[str, Callable[[], object]], calls: int, rounds: int, *, warm_up: int = 1
) -> dict[str, list[float]]:
    """Each side's seconds per call, called `calls` times in all in `rounds` alternating
    rounds, after `warm_up` untimed calls of each."""
    for call in sides.values():
        for _ in range(warm_up):
            call()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, call in sides.items():
            times[name] += timed(call, max(1, calls // rounds))
    return times


def report(times: dict[str, list[float]], base: str) -> None:
    """A line per side: its p50 and p99 in us, and its p50 against the `base` side's."""
    width = max(len(name) for name in times)
    p50_base = statistics.median(times[base])
    for name, values in times.items():
        p50 = statistics.median(values)
        print(
            f"  {name:<{width}} p50 {p50 * 1e6:9.1f} us  p99 {percentile(values, 0.99) * 1e6:9.1f}"
            f" us  {p50 / p50_base:6.3f}x {base}"
        )
