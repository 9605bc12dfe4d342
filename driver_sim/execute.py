"""Executing a loaded program's steps: inputs into slots, kernels in order, outputs out.

`NeuronCore.run` wraps this with its lock, fault checks and counters; `execute_program`
is the bare form, for the host (CPU nodes run the same kernels, counting nothing). A run
given an `InstrRecorder` (a profiled one) also times and costs each instruction and hands
its `InstrRecord` to the recorder; a run given none does nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from driver_sim.cost import engine_cycles
from driver_sim.errors import KernelError
from driver_sim.ops import Shape
from driver_sim.program import LoadedProgram

_KERNEL_FAILURES = (ValueError, TypeError, IndexError, ArithmeticError)


class DynamicBuffer:
    """The home of a tensor whose shape is known only once its producer has run (the
    output of NonMaxSuppression, say). With a `capacity` (DRAM planned at the tensor's
    upper bound) the value is copied into its start; without one (no bound known) the
    produced array is kept as it is, in host memory. Consumers read it as an array."""

    def __init__(self, name: str, dtype: np.dtype, capacity: np.ndarray | None) -> None:
        self.name = name
        self.dtype = dtype
        self.capacity = capacity
        self.value: np.ndarray = np.empty(0, dtype)

    def accept(self, value: Any) -> None:
        array = np.asarray(value)
        if array.dtype != self.dtype:
            raise KernelError(f"output {self.name!r} is {array.dtype}, declared {self.dtype}")
        if self.capacity is None:
            self.value = array
            return
        if array.nbytes > self.capacity.nbytes:
            raise KernelError(
                f"output {self.name!r} of shape {array.shape} takes {array.nbytes} bytes, "
                f"past its planned bound of {self.capacity.nbytes}"
            )
        self.value = self.capacity[: array.nbytes].view(self.dtype).reshape(array.shape)
        np.copyto(self.value, array)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.value if dtype is None else self.value.astype(dtype)


def execute_program(
    program: LoadedProgram,
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
) -> None:
    """Run `program` in this thread, copying each program output into `outputs[name]`."""
    env = program.template.copy()
    bind_inputs(program, inputs, env)
    run_steps(program, env)
    copy_outputs(program, env, outputs)


def bind_inputs(
    program: LoadedProgram, inputs: Mapping[str, np.ndarray], env: list[Any]
) -> tuple[Shape, ...]:
    """Put the inputs in their slots; the tuple of their shapes keys the cost cache."""
    shapes = []
    for name, slot in program.input_slots:
        try:
            value = np.asarray(inputs[name])
        except KeyError:
            raise KernelError(f"missing input {name!r}") from None
        env[slot] = value
        shapes.append(value.shape)
    return tuple(shapes)


@dataclass(frozen=True, slots=True)
class InstrRecord:
    """One instruction of a recorded run: what it read and wrote, when it started (ns
    from its recorder's `origin_ns`, host wall clock) and how long it took on the host,
    and what the cost model counts for it."""

    index: int  # in its program
    op: str
    engine: str  # PE, ACT or POOL
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    start_ns: int
    host_ns: int
    macs: int
    cycles: int  # on its engine


class InstrRecorder(Protocol):
    """What a recorded run hands each instruction's `InstrRecord` to."""

    @property
    def origin_ns(self) -> int:
        """The `time.perf_counter_ns` the records' `start_ns` count from."""
        ...

    def record(self, instr: InstrRecord) -> None: ...


def run_steps(
    program: LoadedProgram, env: list[Any], recorder: InstrRecorder | None = None
) -> dict[int, Shape]:
    """Run the kernels in order, freeing each intermediate after its last reader (so a
    run holds only the tensors still needed); the shapes of the freed ones are returned.
    Like the hardware, arithmetic overflow and invalid operations give Inf/NaN silently
    (the runtime flags them), never a warning.

    With a `recorder`, each instruction is timed and costed as `LoadedProgram.cost_of`
    does (the same shapes, so the MACs and cycles add up to the run's counters), and its
    record handed to the recorder."""
    index = 0
    freed: dict[int, Shape] = {}
    release = program.release
    clock = time.perf_counter_ns
    begin = end = 0
    try:
        with np.errstate(all="ignore"):
            # `index` is read by the handler below, to name the failing instruction.
            for index, (fn, ins, outs, multi) in enumerate(program.steps):
                args = [env[i] for i in ins]
                if recorder is None:
                    result = fn(*args)
                else:
                    begin = clock()
                    result = fn(*args)
                    end = clock()
                if not multi:
                    env[outs[0]] = result
                else:
                    for slot, value in zip(outs, result, strict=False):
                        env[slot] = value
                if recorder is not None:
                    start = begin - recorder.origin_ns
                    recorder.record(_record(program, index, args, outs, env, start, end - begin))
                for slot in release[index]:
                    freed[slot] = np.shape(env[slot])
                    env[slot] = None
    except _KERNEL_FAILURES as exc:
        op = program.kernels[index].op
        raise KernelError(f"{type(exc).__name__}: {exc}", op=op, index=index) from exc
    return freed


def _record(
    program: LoadedProgram,
    index: int,
    args: list[Any],
    outs: tuple[int, ...],
    env: list[Any],
    start_ns: int,
    host_ns: int,
) -> InstrRecord:
    """The record of instruction `index`, which read `args` and wrote slots `outs`."""
    kern = program.kernels[index]
    in_shapes = tuple(tuple(np.shape(a)) if a is not None else () for a in args)
    out_shapes = tuple(tuple(np.shape(env[s])) for s in outs)
    macs = kern.macs(list(in_shapes), list(out_shapes), program.attrs[index])
    elements = sum(int(np.prod(shape)) for shape in out_shapes)
    return InstrRecord(
        index,
        kern.op,
        kern.engine.name,
        in_shapes,
        out_shapes,
        start_ns,
        host_ns,
        int(macs),
        engine_cycles(kern.engine, macs, elements),
    )


def copy_outputs(program: LoadedProgram, env: list[Any], outputs: Mapping[str, Any]) -> None:
    """Copy each program output into its array (or hand it to its DynamicBuffer)."""
    for name, slot, producer in program.output_slots:
        op = None if producer is None else program.kernels[producer].op
        try:
            target = outputs[name]
        except KeyError:
            raise KernelError(f"no array given for output {name!r}") from None
        store_output(name, env[slot], target, op, producer)


def store_output(
    name: str, value: Any, target: Any, op: str | None = None, index: int | None = None
) -> None:
    """Copy program output `name` into its array (or hand it to its DynamicBuffer);
    KernelError, naming the producing op at `index`, when it does not fit."""
    if isinstance(target, DynamicBuffer):
        target.accept(value)
        return
    if target.shape != np.shape(value):
        raise KernelError(
            f"output {name!r} has shape {np.shape(value)}, the array given for it {target.shape}",
            op=op,
            index=index,
        )
    try:
        np.copyto(target, value)
    except TypeError as exc:
        raise KernelError(f"output {name!r}: {exc}", op=op, index=index) from exc
