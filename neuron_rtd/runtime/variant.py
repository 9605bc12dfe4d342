"""A model's loaded graph, as it runs: its steps (a stage on an NC, or a CPU node on the
host) per variant (the model's only graph, or one bucket's), with the variant's I/O slots
and each step bound to a slot's arrays once, at load."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuron_rtd.neff import Bucket
from neuron_rtd.runtime.driver import DynamicBuffer, HostFn, RunFn


@dataclass(frozen=True)
class StageRun:
    """One stage loaded on its NC: `run(inputs, outputs, recorder)` with the slot's arrays
    gives the run's NC cycles (with a recorder, a profiled model's, each instruction is
    recorded)."""

    vnc: int
    run: RunFn
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    node: str = ""
    stage: int = 0


@dataclass(frozen=True)
class HostRun:
    """A CPU node: `run(inputs, outputs)` on the host."""

    node: str
    run: HostFn
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
        # Per slot, each step with its input and output arrays, bound once here; and
        # its plain arrays' bytes, which inputs of their full shape are copied into (a
        # string tensor has none: its elements are objects).
        self.bound = [[_bind(step, slot) for step in self.steps] for slot in self.slots]
        self.bytes = [
            {
                name: array.reshape(-1).view(np.uint8).data
                for name, array in slot.items()
                if isinstance(array, np.ndarray)
                and array.flags.c_contiguous
                and not array.dtype.hasobject  # a string tensor's elements are objects
            }
            for slot in self.slots
        ]
        # Per slot, its tensors whose arrays each run makes anew, each with an empty array
        # of its dtype: the slot lets go of those arrays once its job is answered.
        self.dynamic = [
            [(b, np.empty(0, b.dtype)) for b in slot.values() if isinstance(b, DynamicBuffer)]
            for slot in self.slots
        ]

    def holds(self, sizes: Mapping[str, int]) -> bool:
        return all(lo <= sizes[sym] <= hi for sym, (lo, hi) in self.bucket.symbols.items())


BoundStep = tuple[
    RunFn | HostFn,
    dict[str, Any],
    dict[str, Any],
]


def _bind(step: Step, slot: Mapping[str, Any]) -> BoundStep:
    ins = {n: slot[n] for n in step.inputs}
    outs = {n: slot[n] for n in step.outputs}
    return step.run, ins, outs
