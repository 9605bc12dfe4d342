"""One inference as a model runs it (`Job`): its slot taken and its inputs copied in,
then run, then answered; and what an input read straight into the slot is (`Source`)."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from neuron_rtd.errors import Nerr, NrtError
from neuron_rtd.runtime.variant import Variant


class Source(Protocol):
    """An input the model reads into its own slot (client shared memory): no copy on
    the way to the slot."""

    @property
    def nbytes(self) -> int: ...

    def read_into(self, target: memoryview) -> None: ...


class JobState(enum.Enum):
    SUBMITTING = "submitting"  # copying its inputs in
    QUEUED = "queued"  # inputs in its slot, waiting to run
    RUNNING = "running"
    DONE = "done"  # ended: `error` set, or the outputs are in the slot


BUSY_STATES = (JobState.SUBMITTING, JobState.RUNNING)  # touching the slot's memory


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class Job:
    """One inference: its slot taken and its inputs copied in, then run, then answered.

    The slot (and so the outputs in it) is held until the job is answered or dropped:
    `ninfer` bounds the inferences posted and not yet waited for."""

    variant: Variant
    slot: int
    sizes: Mapping[str, int]
    state: JobState = JobState.SUBMITTING
    code: Nerr = Nerr.OK
    error: NrtError | None = None
    cancel: NrtError | None = None  # set by stop/unload: end at the next step boundary
    posted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    ended: float = 0.0
    nc_ns: int = 0  # time on the NCs
    cycles: int = 0  # NC cycles, as the simulated NCs count them
    answering: bool = False
    released: bool = False
    abandoned: bool = False  # nobody will answer it: release the slot when it ends
    # Held from creation until the job ends: waiting for the end is acquiring it (a bare
    # lock costs a tenth of an Event, and every inference makes one).
    _running: threading.Lock = field(default_factory=_held_lock)

    @property
    def done(self) -> bool:
        return self.state is JobState.DONE

    def wait_done(self, timeout_s: float | None = None) -> bool:
        """Wait until the job has ended; False if it has not within `timeout_s`."""
        if not self._running.acquire(timeout=-1 if timeout_s is None else max(timeout_s, 0)):
            return False
        self._running.release()
        return True
