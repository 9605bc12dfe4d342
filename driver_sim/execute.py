"""Executing a loaded program's steps: inputs into slots, kernels in order, outputs out.

`NeuronCore.run` wraps this with its lock, fault checks and counters; `execute_program`
is the bare form, for the host (CPU nodes run the same kernels, counting nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from driver_sim.errors import KernelError
from driver_sim.kernels import Shape
from driver_sim.program import LoadedProgram

_KERNEL_FAILURES = (ValueError, TypeError, IndexError, ArithmeticError)


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


def run_steps(program: LoadedProgram, env: list[Any]) -> None:
    """Run the kernels in order. Like the hardware, arithmetic overflow and invalid
    operations give Inf/NaN silently (the runtime flags them), never a warning."""
    index = 0
    try:
        with np.errstate(all="ignore"):
            # `index` is read by the handler below, to name the failing instruction.
            for index, (fn, ins, outs, multi) in enumerate(program.steps):  # noqa: B007
                result = fn(*[env[i] for i in ins])
                if not multi:
                    env[outs[0]] = result
                else:
                    for slot, value in zip(outs, result, strict=False):
                        env[slot] = value
    except _KERNEL_FAILURES as exc:
        op = program.kernels[index].op
        raise KernelError(f"{type(exc).__name__}: {exc}", op=op, index=index) from exc


def copy_outputs(program: LoadedProgram, env: list[Any], outputs: Mapping[str, np.ndarray]) -> None:
    for name, slot, producer in program.output_slots:
        op = None if producer is None else program.kernels[producer].op
        try:
            target = outputs[name]
        except KeyError:
            raise KernelError(f"no array given for output {name!r}") from None
        value = env[slot]
        if target.shape != np.shape(value):
            raise KernelError(
                f"output {name!r} has shape {np.shape(value)}, "
                f"the array given for it {target.shape}",
                op=op,
                index=producer,
            )
        try:
            np.copyto(target, value)
        except TypeError as exc:
            raise KernelError(f"output {name!r}: {exc}", op=op, index=producer) from exc
