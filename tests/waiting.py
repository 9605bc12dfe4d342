"""Waiting for a condition, not for a time: `wait_until` looks until it holds and fails
(naming what it waited for) past a bound that only a hang reaches."""

from __future__ import annotations

import time
from collections.abc import Callable

PAUSE_S = 0.005  # between two looks


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once `condition()` is truthy; AssertionError naming `what` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(PAUSE_S)
