"""CPU nodes: the parts of a NEFF that run on the host, not on a NeuronCore.

A CPU node's stage program has the same form as an NC's; the host runs it with the same
kernels, in the inference's own thread, counting nothing on any device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

import driver_sim
from neuron_rtd.neff import Stage
from neuron_rtd.runtime.driver import driver_errors

HostFn = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], None]


def compile_host_stage(node: str, stage: Stage) -> HostFn:
    """Validate the CPU node's program once; return what runs it."""
    program = driver_sim.NcProgram(
        instructions=[
            driver_sim.Instr(i.op, tuple(i.inputs), tuple(i.outputs), i.attrs)
            for i in stage.instructions
        ],
        weights=dict(stage.weights),
        inputs=list(stage.inputs),
        outputs=list(stage.outputs),
    )
    owner = f"host (CPU node '{node}')"
    with driver_errors(f"CPU node '{node}'"):
        loaded = driver_sim.load_program(owner, program)

    def run(inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        driver_sim.execute_program(loaded, inputs, outputs)

    return run
