"""Per-op profiles of the models loaded with `enable_node_profiling`.

A profiled model runs each NC stage on the reference kernels one instruction at a time
(whatever the NC's engine: the fast engine's single onnxruntime session cannot be timed
per instruction), and each inference that ends well leaves an `InferenceProfile`: per
step (an NC stage run or a CPU node) its host wall time, and per NC instruction its op,
engine, shapes, host wall time and what the cost model counts for it (MACs, cycles; the
simulated NC time is cycles / `NC_CLOCK_HZ`). A model keeps the last `KEEP` of them.

An unprofiled model has no `Profiler` and runs as it always did: the only cost of this
module to it is the choice, made once at load, of which execute loop it runs.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass

from neuron_rtd.runtime.driver import NC_CLOCK_HZ

KEEP = 32  # inferences a profiled model remembers, the most recent ones
Shape = tuple[int, ...]


@dataclass(frozen=True)
class InstrRecord:
    """One NC instruction of a profiled inference (times in ns from the inference's
    start, host wall clock)."""

    index: int  # in its stage's program
    op: str
    engine: str  # PE, ACT or POOL
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    start_ns: int
    host_ns: int
    macs: int
    cycles: int  # on its engine, as the cost model counts them


@dataclass(frozen=True)
class StepRecord:
    """One step of a profiled inference: an NC stage run (`vnc` >= 0, `instrs`) or a CPU
    node (`vnc` -1, its tensors' shapes)."""

    node: str
    stage: int
    vnc: int
    start_ns: int
    host_ns: int
    cycles: int  # the stage run's (its busiest engine's); 0 for a CPU node
    instrs: tuple[InstrRecord, ...] = ()
    input_shapes: tuple[Shape, ...] = ()
    output_shapes: tuple[Shape, ...] = ()

    @property
    def on_nc(self) -> bool:
        return self.vnc >= 0


@dataclass(frozen=True)
class InferenceProfile:
    seq: int  # the model's profiled inferences, counted from 1
    time_ns: int  # wall clock at its start, ns since the epoch
    host_ns: int  # its steps, first start to last end
    cycles: int  # NC cycles of all its stage runs
    steps: tuple[StepRecord, ...]


@dataclass(frozen=True)
class ModelProfile:
    """What `Runtime.profile` answers: the kept inferences, oldest first."""

    model_id: int
    name: str
    nc_clock_hz: int
    recorded: int  # profiled inferences since the load (some no longer kept)
    inferences: tuple[InferenceProfile, ...]


class Profiler:
    """A profiled model's last `keep` inference profiles."""

    def __init__(self, keep: int = KEEP) -> None:
        self._kept: deque[InferenceProfile] = deque(maxlen=keep)
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self.recorded = 0

    def next_seq(self) -> int:
        return next(self._count)

    def add(self, profile: InferenceProfile) -> None:
        with self._lock:
            self._kept.append(profile)
            self.recorded += 1

    def kept(self) -> tuple[InferenceProfile, ...]:
        with self._lock:
            return tuple(self._kept)


__all__ = [
    "KEEP",
    "NC_CLOCK_HZ",
    "InferenceProfile",
    "InstrRecord",
    "ModelProfile",
    "Profiler",
    "StepRecord",
]
