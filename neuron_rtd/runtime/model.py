"""A loaded model: its placement on NCs, its DRAM, its I/O slots, and one inference.

A model owns `ninfer` I/O slots. A slot holds one buffer per tensor that crosses a node or
stage boundary (model inputs and outputs included), in device DRAM next to the NC that
produces it (or host memory for tensors only CPU nodes touch). An inference takes a free
slot (none free: NERR_QUEUE_FULL), copies its inputs in, runs the nodes in order, copies
its outputs out, and gives the slot back.
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
from neuron_rtd.neff import Neff, TensorSpec
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
    run: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], None]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


Step = StageRun | HostRun


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
    steps: list[Step]
    slots: list[dict[str, np.ndarray]]
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
        self._free = list(range(len(self.slots)))
        self._inputs = {t.name: t for t in self.neff.inputs}
        self._float_outputs = tuple(
            t.name for t in self.neff.outputs if np.issubdtype(t.dtype, np.floating)
        )
        # Per slot, each step with its input and output arrays, bound once here.
        self._bound = [[_bind(step, slot) for step in self.steps] for slot in self.slots]

    @property
    def dram_bytes(self) -> int:
        return sum(buf.nbytes for _, buf in self.dram)

    @property
    def in_flight(self) -> int:
        return len(self.slots) - len(self._free)

    # --- inference -----------------------------------------------------------------
    def infer(self, inputs: Mapping[str, Any]) -> InferResult:
        """Run one inference with inputs given as bytes-like objects, by name."""
        self._check_runnable()
        arrays = self._check_inputs(inputs)
        slot = self._take_slot()
        try:
            start = time.monotonic()
            if self.mode is LoadMode.SHARED:
                with self._serial:  # shared-NC mode runs one request at a time
                    outputs = self._run(slot, arrays)
            else:
                outputs = self._run(slot, arrays)
            elapsed = time.monotonic() - start
            if elapsed > self.params.timeout_s:
                raise InferTimeout(
                    f"inference on model {self.id} took {elapsed:.3f} s, past its timeout "
                    f"of {self.params.timeout_s:g} s"
                )
        finally:
            self._give_slot(slot)
        self.infer_count += 1
        return InferResult(outputs=outputs, code=self._numerical_code(outputs))

    def _run(self, slot_index: int, arrays: Mapping[str, np.ndarray]) -> dict[str, bytes]:
        slot = self.slots[slot_index]
        for name, array in arrays.items():
            np.copyto(slot[name], array, casting="no")
        with driver_errors(f"model {self.id} ({self.name})"):
            for run, ins, outs in self._bound[slot_index]:
                run(ins, outs)
        return {t.name: slot[t.name].tobytes() for t in self.neff.outputs}

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

    def _check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        for name, data in inputs.items():
            spec = self._inputs.get(name)
            if spec is None:
                raise BadInput(
                    f"model {self.id} ({self.name}) has no input named '{name}'; "
                    f"its inputs are: {', '.join(self._inputs)}"
                )
            size = memoryview(data).nbytes
            if size != spec.nbytes:
                raise BadInput(
                    f"input '{name}' of model {self.id}: expected {spec.nbytes} bytes "
                    f"({describe(spec)}), received {size}"
                )
            arrays[name] = np.frombuffer(data, dtype=spec.dtype).reshape(spec.shape)
        missing = [name for name in self._inputs if name not in arrays]
        if missing:
            raise BadInput(
                f"model {self.id} ({self.name}) is missing input(s): "
                + ", ".join(
                    f"'{n}' ({describe(self._inputs[n])}, {self._inputs[n].nbytes} bytes)"
                    for n in missing
                )
            )
        return arrays

    # --- slots ---------------------------------------------------------------------
    def _take_slot(self) -> int:
        with self._cond:
            if not self._free:
                raise QueueFull(
                    f"model {self.id} already has {len(self.slots)} inferences in flight "
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
    Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], None],
    dict[str, np.ndarray],
    dict[str, np.ndarray],
]


def _bind(step: Step, slot: Mapping[str, np.ndarray]) -> BoundStep:
    ins = {n: slot[n] for n in step.inputs}
    outs = {n: slot[n] for n in step.outputs}
    if isinstance(step, StageRun):
        return functools.partial(step.core.run, step.program), ins, outs
    return step.run, ins, outs


def describe(spec: TensorSpec) -> str:
    dims = ",".join(map(str, spec.shape))
    return f"{spec.dtype.name}[{dims}]"
