"""How the benches time calls: each call's seconds, sides called in alternating rounds (so
the machine's noise hits every side alike), and a percentile of the times.

A bench imports it by name, as `python bench/x.py` puts the script's folder on its path.
"""

from __future__ import annotations

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
