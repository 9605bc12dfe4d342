"""A NeuronCore: loads programs and runs them, one at a time, counting the work.

A run executes in the caller's thread under the core's lock (a run that finds the core
busy waits its turn, as the process that owns the device said: `TakeTurn`). Counters live in the
device's stats file (see `driver_sim.stats`); a run adds its precomputed totals there
(`LoadedProgram.cost_of`, as `RunCounts`) plus its measured busy time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from driver_sim import blas
from driver_sim.errors import DriverError
from driver_sim.execute import InstrRecorder, bind_inputs, copy_outputs, run_steps
from driver_sim.fast import FastProgram, check_engine
from driver_sim.ops.random import use_rng
from driver_sim.program import MAX_CACHED_COSTS, LoadedProgram, NcProgram, RunCost, load_program
from driver_sim.stats import NC_FIELD, NcCounters, cycle_slots, nc_counters_from, nc_slots
from neuron_rtd.onnxrt import WHILE_BUSY, check_spinning

if TYPE_CHECKING:
    from driver_sim.device import Device

_BUSY_NS = NC_FIELD["busy_ns"]

# How a run takes its NC's lock (a wait for a run in progress is a wait its process may
# count as such: the daemon's compute gate lets another call compute meanwhile); None:
# it plainly waits.
TakeTurn = Callable[[threading.Lock], None]


def _plainly(lock: threading.Lock) -> None:
    lock.acquire()


# The stats file's words are little-endian, the host's own (x86, ARM): a run adds to them
# as the host's unsigned 64-bit words.
assert sys.byteorder == "little", "driver_sim's stats file needs a little-endian host"


@dataclass(frozen=True)
class RunCounts:
    """What one run adds to its NC's counters: (stats slot, amount) for each nonzero
    increment of its `RunCost`, and its cycles. Added word by word as Python ints, they
    cost a fraction of numpy's adds of the cost's arrays, whose calls are slow right
    after a run (onnxruntime's) has had the caches."""

    adds: tuple[tuple[int, int], ...]
    cycles: int


class NeuronCore:
    """NC `index` of an owned device."""

    def __init__(
        self,
        device: Device,
        index: int,
        *,
        engine: str = "reference",
        threads: int = 1,
        spinning: str = WHILE_BUSY,
        take_turn: TakeTurn | None = None,
    ) -> None:
        self.device_index = device.index
        self.index = index
        self.engine = check_engine(engine)
        self.threads = threads  # the fast engine's onnxruntime threads ...
        self.spinning = check_spinning(spinning)  # ... and how they wait for work
        self._device = device
        self.lock = threading.Lock()
        self._take_turn: TakeTurn = take_turn or _plainly
        self.rng = np.random.default_rng()
        self._slots: np.ndarray | None = None
        self._words: memoryview | None = None  # `_slots`, as words to add to
        self._busy_slot = nc_slots(index).start + _BUSY_NS

    def __repr__(self) -> str:
        return f"NeuronCore(device={self.device_index}, nc={self.index})"

    def attach_stats(self, slots: np.ndarray | None) -> None:
        """Point the counters at the device's stats slots (None: detach, at release)."""
        self._slots = slots
        if self._words is not None:
            self._words.release()  # now: the stats file unmaps once no view is left
        self._words = None if slots is None else slots.data.cast("B").cast("Q")

    def load(self, program: NcProgram, *, reference: bool = False) -> LoadedProgram:
        """Validate and resolve `program` for this core; KernelError if it is bad.
        `reference`: it runs on the reference kernels whatever the core's engine (a
        program whose runs are recorded, timed instruction by instruction)."""
        self._device.before_load(self.index)
        loaded = load_program(self, program)
        if self.engine == "fast" and not reference:
            loaded.fast = FastProgram.of(
                loaded, self.threads, program.opset, spinning=self.spinning
            )
        return loaded

    def run(
        self,
        program: LoadedProgram,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        recorder: InstrRecorder | None = None,
    ) -> int:
        """Run `program` on `inputs`, copying each program output into `outputs[name]`;
        the run's cycles (its busiest engine's). With a `recorder` it runs on the reference
        kernels whatever the core's engine, one instruction at a time, each timed and
        costed for the recorder (see `run_steps`); the counters count it as any run."""
        if program.owner is not self:
            raise DriverError(f"program was loaded on {program.owner!r}, not on {self!r}")
        self._take_turn(self.lock)  # another run in progress: a wait, as its owner counts it
        try:
            start = time.perf_counter_ns()
            self._device.before_run(self.index)
            fast = program.fast if recorder is None else None
            key = None if fast is None else fast.run(inputs, outputs)
            if fast is None or key is None:
                cost = self._run_reference(program, inputs, outputs, recorder)
                return self._count(self._counts(cost), start)
            counts = fast.counts.get(key)
            if counts is None:  # measured by the reference kernels once per shape set
                counts = self._counts(self._run_reference(program, inputs, None))
                if len(fast.counts) < MAX_CACHED_COSTS:
                    fast.counts[key] = counts
            return self._count(counts, start)
        finally:
            self.lock.release()

    def _run_reference(
        self,
        program: LoadedProgram,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None,
        recorder: InstrRecorder | None = None,
    ) -> RunCost:
        """Run on the numpy kernels, into `outputs` (None: only to measure), each
        instruction recorded when there is a `recorder`; the run's cost."""
        env = program.template.copy()
        key = bind_inputs(program, inputs, env)
        use_rng(self.rng)
        blas.run_starts()
        try:
            freed = run_steps(program, env, recorder)
        finally:
            blas.run_ends()
            use_rng(None)
        if outputs is not None:
            copy_outputs(program, env, outputs)
        return program.cost_of(key, env, freed)

    def _counts(self, cost: RunCost) -> RunCounts:
        """A run's cost as this core's `RunCounts`."""
        nc, engines = nc_slots(self.index).start, cycle_slots(self.index).start
        adds = [(nc + k, n) for k, n in enumerate(cost.nc_totals.tolist()) if n]
        adds += [(engines + e, n) for e, n in enumerate(cost.engine_cycles.tolist()) if n]
        return RunCounts(tuple(adds), cost.cycles)

    def _count(self, counts: RunCounts, start_ns: int) -> int:
        """Add a run's counts and busy time to the counters; its cycles."""
        words = self._words
        if words is None:
            raise DriverError(f"{self!r}: device {self.device_index} was released")
        for slot, amount in counts.adds:
            words[slot] += amount
        words[self._busy_slot] += time.perf_counter_ns() - start_ns
        return counts.cycles

    def seed(self, seed: int, stream: int = 0) -> None:
        """Restart this core's random generator from `seed` (`stream` tells apart the
        cores seeded alike: the NCs of one NCG draw different numbers)."""
        with self.lock:
            self.rng = np.random.default_rng([seed, stream])

    def counters(self) -> NcCounters:
        """This core's counters since the device's last reset."""
        slots = self._slots
        if slots is None:
            raise DriverError(f"{self!r}: device {self.device_index} was released")
        return nc_counters_from(slots, self.index)
