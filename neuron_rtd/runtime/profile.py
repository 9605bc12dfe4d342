"""Per-op profiles of the models loaded with `enable_node_profiling`.

A profiled model runs each NC stage on the reference kernels one instruction at a time
(whatever the NC's engine: the fast engine's single onnxruntime session cannot be timed
per instruction), and each inference that ends well leaves an `InferenceProfile`: per
step (an NC stage run or a CPU node) its host wall time, and per NC instruction its op,
engine, shapes, host wall time and what the cost model counts for it (MACs, cycles; the
simulated NC time is cycles / `NC_CLOCK_HZ`). A model keeps the last `KEEP` of them.

A profiled model's `Profiler` starts an `InferenceRecorder` for each inference, which the
model's run loop hands down the path every inference takes (the driver port, the NC, its
steps): the NC records each instruction in it (an `InstrRecord`, the driver port's), the
model each step. An unprofiled model has no `Profiler` and hands down no recorder: a test
per step is all profiling costs it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass

from neuron_rtd.errors import InvalidError
from neuron_rtd.runtime.driver import NC_CLOCK_HZ, InstrRecord

KEEP = 32  # inferences a profiled model remembers, the most recent ones
Shape = tuple[int, ...]


@dataclass(frozen=True)
class StepRecord:
    """One step of a profiled inference: an NC stage run (`vnc` >= 0, `instrs`) or a CPU
    node (`vnc` -1, its tensors' shapes). Times in ns from the inference's start, host wall
    clock (so are its instructions')."""

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


class InferenceRecorder:
    """What one profiled inference records, from its start: each NC instruction (`record`:
    an `InstrRecorder`, handed down to the NC) and each step (`stage`, `host`, which take
    perf_counter ns)."""

    __slots__ = ("_instrs", "_profiler", "_steps", "ended_ns", "origin_ns", "time_ns")

    def __init__(self, profiler: Profiler) -> None:
        self._profiler = profiler
        self.time_ns = time.time_ns()  # wall clock at the start
        self.origin_ns = time.perf_counter_ns()  # what the records' times count from
        self.ended_ns = self.origin_ns
        self._steps: list[StepRecord] = []
        self._instrs: list[InstrRecord] = []  # the running stage's, so far

    def record(self, instr: InstrRecord) -> None:
        self._instrs.append(instr)

    def stage(
        self, node: str, stage: int, vnc: int, begin_ns: int, host_ns: int, cycles: int
    ) -> None:
        """An NC stage run has ended: its step, with the instructions recorded in it."""
        instrs, self._instrs = tuple(self._instrs), []
        self._steps.append(
            StepRecord(node, stage, vnc, begin_ns - self.origin_ns, host_ns, cycles, instrs)
        )

    def host(
        self,
        node: str,
        begin_ns: int,
        host_ns: int,
        input_shapes: tuple[Shape, ...],
        output_shapes: tuple[Shape, ...],
    ) -> None:
        """A CPU node has run."""
        self._steps.append(
            StepRecord(
                node,
                0,
                -1,
                begin_ns - self.origin_ns,
                host_ns,
                0,
                input_shapes=input_shapes,
                output_shapes=output_shapes,
            )
        )

    def end(self) -> None:
        """Its last step has ended."""
        self.ended_ns = time.perf_counter_ns()

    def keep(self) -> None:
        """The inference ended well: its profiler keeps what was recorded."""
        self._profiler.add(self)

    def profile(self, seq: int) -> InferenceProfile:
        steps = tuple(self._steps)
        return InferenceProfile(
            seq=seq,
            time_ns=self.time_ns,
            host_ns=self.ended_ns - self.origin_ns,
            cycles=sum(s.cycles for s in steps),
            steps=steps,
        )


class Profiler:
    """A profiled model's last `keep` inference profiles."""

    def __init__(self, keep: int = KEEP) -> None:
        self._kept: deque[InferenceProfile] = deque(maxlen=keep)
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self.recorded = 0

    def start(self) -> InferenceRecorder:
        """The recorder of an inference starting now."""
        return InferenceRecorder(self)

    def add(self, recorder: InferenceRecorder) -> None:
        """Keep what `recorder` recorded: an inference that ended well."""
        profile = recorder.profile(next(self._count))
        with self._lock:
            self._kept.append(profile)
            self.recorded += 1

    def kept(self) -> tuple[InferenceProfile, ...]:
        with self._lock:
            return tuple(self._kept)


def model_profile(model_id: int, name: str, profiler: Profiler | None, last: int) -> ModelProfile:
    """What the profiler of model `model_id` (`name`) kept of its last inferences (the
    `last` most recent, 0: all kept), oldest first; InvalidError when it has none."""
    if profiler is None:
        raise InvalidError(
            f"model {model_id} ({name}) was not loaded with node profiling: load "
            "it again with model_params.enable_node_profiling = 1 (neuron-cli profile "
            "MODEL.neff, or Client.load(..., profile=True))"
        )
    kept = profiler.kept()
    if not kept:
        raise InvalidError(
            f"model {model_id} ({name}) has no profiled inference yet: run an inference first"
        )
    if last > 0:
        kept = kept[-last:]
    return ModelProfile(model_id, name, NC_CLOCK_HZ, profiler.recorded, kept)


__all__ = [
    "KEEP",
    "NC_CLOCK_HZ",
    "InferenceProfile",
    "InferenceRecorder",
    "ModelProfile",
    "Profiler",
    "StepRecord",
    "model_profile",
]
