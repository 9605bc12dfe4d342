"""A loaded model: its placement on NCs, its DRAM, its I/O slots, and one inference.

A model owns `ninfer` I/O slots. A slot holds one buffer per tensor that crosses a node or
stage boundary (model inputs and outputs included), in device DRAM next to the NC that
produces it (or host memory for tensors only CPU nodes touch). An inference takes a free
slot (none free: NERR_QUEUE_FULL), copies its inputs in, runs the nodes in order, copies
its outputs out, and gives the slot back.

A bucketed NEFF loads one `Variant` per bucket (each with its own steps and slots; slot i
of every variant belongs to the same reservation). An inference finds the sizes of its
dynamic dimensions from the input byte counts, takes the first bucket that holds them,
pads the inputs with zeros up to the bucket's sizes and cuts the outputs back down.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuron_rtd.errors import (
    BadInput,
    FailedState,
    InferTimeout,
    InvalidHandle,
    ModelNotRunning,
    Nerr,
    QueueFull,
)
from neuron_rtd.neff import Bucket, Neff, TensorSpec
from neuron_rtd.runtime.driver import driver_errors


class ModelState(enum.Enum):
    STANDBY = "STANDBY"  # loaded, not running
    READY = "READY"  # running: takes inferences
    FAILED = "FAILED"  # stopped after an unrecoverable error
    UNLOADING = "UNLOADING"


class LoadMode(enum.Enum):
    NORMAL = "normal"
    SHARED = "shared"


@dataclass(frozen=True, kw_only=True)
class ModelParams:
    timeout_s: float
    ninfer: int


@dataclass(frozen=True)
class StageRun:
    """One stage bound to its NC: run(inputs, outputs) with the slot's arrays."""

    vnc: int
    core: Any
    program: Any
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class HostRun:
    """A CPU node: `run(inputs, outputs)` on the host."""

    node: str
    run: Callable[[Mapping[str, Any], Mapping[str, Any]], None]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


Step = StageRun | HostRun


@dataclass
class Variant:
    """One loaded graph of the model (the only one, or one bucket's)."""

    bucket: Bucket
    steps: list[Step]
    slots: list[dict[str, Any]]  # per slot: tensor name -> array or DynamicBuffer

    def __post_init__(self) -> None:
        # Per slot, each step with its input and output arrays, bound once here.
        self.bound = [[_bind(step, slot) for step in self.steps] for slot in self.slots]

    def holds(self, sizes: Mapping[str, int]) -> bool:
        return all(lo <= sizes[sym] <= hi for sym, (lo, hi) in self.bucket.symbols.items())


@dataclass(frozen=True)
class Job:
    """An inference with its inputs checked and its slot taken, not yet run."""

    variant: Variant
    slot: int
    arrays: Mapping[str, np.ndarray]
    sizes: Mapping[str, int]


@dataclass(frozen=True)
class InferResult:
    outputs: dict[str, bytes]
    code: Nerr  # OK, or INFER_COMPLETED_WITH_NUM_ERR when an output holds NaN/Inf


@dataclass
class Model:
    id: int
    name: str
    neff: Neff
    ncg_id: int
    mode: LoadMode
    params: ModelParams
    variants: list[Variant]
    dram: list[tuple[Any, Any]]  # (device, buffer) to free on unload
    vncs: tuple[int, ...]
    session_id: int = 0
    state: ModelState = ModelState.STANDBY
    failure: str = ""
    infer_count: int = 0
    _free: list[int] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _serial: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._free = list(range(self.params.ninfer))
        self._inputs = {t.name: t for t in self.neff.inputs}
        self._float_outputs = tuple(
            t.name for t in self.neff.outputs if np.issubdtype(t.dtype, np.floating)
        )

    @property
    def dram_bytes(self) -> int:
        return sum(buf.nbytes for _, buf in self.dram)

    @property
    def in_flight(self) -> int:
        return self.params.ninfer - len(self._free)

    # --- inference -----------------------------------------------------------------
    def infer(self, inputs: Mapping[str, Any]) -> InferResult:
        """Run one inference with inputs given as bytes-like objects, by name."""
        return self.execute(self.prepare(inputs))

    def prepare(self, inputs: Mapping[str, Any]) -> Job:
        """Check the inputs and take a slot for them (NERR_QUEUE_FULL when `ninfer` are in
        flight): the part of an inference that answers at once, before it is queued."""
        self._check_runnable()
        arrays, sizes = self._check_inputs(inputs)
        variant = self._variant_for(sizes)
        return Job(variant, self._take_slot(), arrays, sizes)

    def execute_abandoned(self, job: Job) -> None:
        """Give back the slot of a prepared inference that will not run."""
        self._give_slot(job.slot)

    def execute(self, job: Job) -> InferResult:
        """Run a prepared inference; its slot is given back whatever happens."""
        try:
            start = time.monotonic()
            if self.mode is LoadMode.SHARED:
                with self._serial:  # shared-NC mode runs one request at a time
                    outputs = self._run(job.variant, job.slot, job.arrays, job.sizes)
            else:
                outputs = self._run(job.variant, job.slot, job.arrays, job.sizes)
            elapsed = time.monotonic() - start
            if elapsed > self.params.timeout_s:
                raise InferTimeout(
                    f"inference on model {self.id} took {elapsed:.3f} s, past its timeout "
                    f"of {self.params.timeout_s:g} s"
                )
        finally:
            self._give_slot(job.slot)
        self.infer_count += 1
        return InferResult(outputs=outputs, code=self._numerical_code(outputs))

    def _run(
        self,
        variant: Variant,
        slot_index: int,
        arrays: Mapping[str, np.ndarray],
        sizes: Mapping[str, int],
    ) -> dict[str, bytes]:
        slot = variant.slots[slot_index]
        for name, array in arrays.items():
            _copy_padded(slot[name], array)
        with driver_errors(f"model {self.id} ({self.name})"):
            for run, ins, outs in variant.bound[slot_index]:
                run(ins, outs)
        return {
            t.name: _cut(np.asarray(slot[t.name]), t, sizes).tobytes() for t in self.neff.outputs
        }

    def _variant_for(self, sizes: Mapping[str, int]) -> Variant:
        for variant in self.variants:
            if variant.holds(sizes):
                return variant
        ranges = ", ".join(
            f"{sym} {lo}..{hi}" for v in self.variants for sym, (lo, hi) in v.bucket.symbols.items()
        )
        given = ", ".join(f"{sym}={n}" for sym, n in sizes.items())
        raise BadInput(
            f"model {self.id} ({self.name}) has no bucket for {given} (buckets: {ranges})"
        )

    def _numerical_code(self, outputs: Mapping[str, bytes]) -> Nerr:
        for name in self._float_outputs:
            spec = self.neff.tensors[name]
            if not np.isfinite(np.frombuffer(outputs[name], dtype=spec.dtype)).all():
                return Nerr.INFER_COMPLETED_WITH_NUM_ERR
        return Nerr.OK

    def _check_runnable(self) -> None:
        if self.state is ModelState.READY:
            return
        if self.state is ModelState.FAILED:
            raise FailedState(f"model {self.id} was stopped after an error: {self.failure}")
        if self.state is ModelState.UNLOADING:
            raise InvalidHandle(f"model {self.id} is being unloaded")
        raise ModelNotRunning(
            f"model {self.id} ({self.name}) is not running (state {self.state.value}): "
            "start it first"
        )

    def _check_inputs(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The inputs as arrays, and the size each dynamic dimension takes in them."""
        arrays: dict[str, np.ndarray] = {}
        sizes: dict[str, int] = {}
        for name, data in inputs.items():
            spec = self._inputs.get(name)
            if spec is None:
                raise BadInput(
                    f"model {self.id} ({self.name}) has no input named '{name}'; "
                    f"its inputs are: {', '.join(self._inputs)}"
                )
            size = memoryview(data).nbytes
            shape = self._input_shape(spec, size, sizes)
            arrays[name] = np.frombuffer(data, dtype=spec.dtype).reshape(shape)
        missing = [name for name in self._inputs if name not in arrays]
        if missing:
            raise BadInput(
                f"model {self.id} ({self.name}) is missing input(s): "
                + ", ".join(
                    f"'{n}' ({describe(self._inputs[n])}, {self._inputs[n].nbytes} bytes)"
                    for n in missing
                )
            )
        return arrays, sizes

    def _input_shape(self, spec: TensorSpec, size: int, sizes: dict[str, int]) -> tuple[int, ...]:
        """The shape `size` bytes make of input `spec`: its own, or with its one symbolic
        axis worked out from the byte count (and checked against the other inputs)."""
        axes = [a for a, sym in enumerate(spec.symbols) if sym is not None]
        if not axes:
            if size != spec.nbytes:
                raise BadInput(
                    f"input '{spec.name}' of model {self.id}: expected {spec.nbytes} bytes "
                    f"({describe(spec)}), received {size}"
                )
            return spec.shape
        (axis,) = axes
        symbol = spec.symbols[axis]
        assert symbol is not None
        row = spec.nbytes // spec.shape[axis]
        if size % row or size == 0:
            raise BadInput(
                f"input '{spec.name}' of model {self.id}: {size} bytes is not a whole number "
                f"of {describe(spec)} rows of {row} bytes along axis {axis}"
            )
        count = size // row
        if sizes.setdefault(symbol, count) != count:
            raise BadInput(
                f"input '{spec.name}' of model {self.id} has {symbol}={count}, another "
                f"input has {symbol}={sizes[symbol]}"
            )
        return (*spec.shape[:axis], count, *spec.shape[axis + 1 :])

    # --- slots ---------------------------------------------------------------------
    def _take_slot(self) -> int:
        with self._cond:
            if not self._free:
                raise QueueFull(
                    f"model {self.id} already has {self.params.ninfer} inferences in flight "
                    f"(ninfer {self.params.ninfer})"
                )
            return self._free.pop()

    def _give_slot(self, slot: int) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no inference is in flight; False if still busy at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self.in_flight, timeout=timeout_s)


BoundStep = tuple[
    Callable[[Mapping[str, Any], Mapping[str, Any]], None],
    dict[str, Any],
    dict[str, Any],
]


def _bind(step: Step, slot: Mapping[str, Any]) -> BoundStep:
    ins = {n: slot[n] for n in step.inputs}
    outs = {n: slot[n] for n in step.outputs}
    if isinstance(step, StageRun):
        return functools.partial(step.core.run, step.program), ins, outs
    return step.run, ins, outs


def describe(spec: TensorSpec) -> str:
    dims = [
        f"{spec.symbols[a]}<={d}" if spec.symbols and spec.symbols[a] else str(d)
        for a, d in enumerate(spec.shape)
    ]
    return f"{spec.dtype.name}[{','.join(dims)}]"


def _copy_padded(target: np.ndarray, array: np.ndarray) -> None:
    """Copy `array` into `target`; a smaller array goes to its start, the rest zeroed."""
    if target.shape == array.shape:
        np.copyto(target, array, casting="no")
        return
    target[...] = 0
    np.copyto(target[tuple(slice(0, n) for n in array.shape)], array, casting="no")


def _cut(value: np.ndarray, spec: TensorSpec, sizes: Mapping[str, int]) -> np.ndarray:
    """An output of a bucket cut down to the sizes of this inference."""
    if not spec.symbols:
        return value
    index = tuple(
        slice(0, sizes[sym]) if sym is not None and sym in sizes else slice(None)
        for sym in spec.symbols
    )
    return value[index]
