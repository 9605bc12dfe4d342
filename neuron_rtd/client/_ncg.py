"""The NeuronCore Groups a client creates from `NEURONCORE_GROUP_SIZES`.

Models go onto them in turn. An NCG runs one model at a time (the others are STANDBY), so
when more models than groups share one, the client switches the running model: it waits
until the running model has no inference in flight, then starts the one asked for (the
framework plugins' model switching).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class NcgGate:
    """One client-made NCG: which of its models runs, and how many inferences use it."""

    def __init__(self, ncg_id: int, nc_count: int) -> None:
        self.id = ncg_id
        self.nc_count = nc_count
        self.running: int | None = None
        self._busy = 0
        self._waiting: collections.Counter[int] = collections.Counter()
        self._cond = threading.Condition()

    @contextmanager
    def running_model(self, model_id: int, start: Callable[[], None]) -> Iterator[None]:
        """Hold the NCG with `model_id` running (`start` makes it so when it is not)."""

        def may_enter() -> bool:
            if self._busy == 0:
                return True
            # join the running model, unless someone waits to switch (no starvation)
            others = any(n for m, n in self._waiting.items() if m != model_id)
            return self.running == model_id and not others

        with self._cond:
            self._waiting[model_id] += 1
            try:
                self._cond.wait_for(may_enter)
                if self.running != model_id:
                    start()
                    self.running = model_id
                self._busy += 1
            finally:
                self._waiting[model_id] -= 1
                self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def started(self, model_id: int) -> None:
        with self._cond:
            self.running = model_id
            self._cond.notify_all()

    def stopped(self, model_id: int) -> None:
        with self._cond:
            if self.running == model_id:
                self.running = None
            self._cond.notify_all()
