"""The one path of an inference through the runtime: inputs resolved to sources, the job
submitted into a slot, run, and answered from the slot into the result or the client's
shared memory. `Runtime.infer`, `wait` and `poll` all end in `answer` here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from neuron_rtd.runtime.api import InferResult, Input, ShmInput, ShmOutputs
from neuron_rtd.runtime.model import Job, Model, Source
from neuron_rtd.runtime.shm import ShmTable


def sources(
    model: Model, inputs: Mapping[str, Input], shm: ShmTable
) -> dict[str, bytes | bytearray | memoryview | np.ndarray | Source]:
    """The inputs as the model reads them: bytes-like objects as they are, shared memory
    as a source read straight into the slot (as many bytes as the input takes; for an
    input whose size varies, the whole object)."""
    resolved: dict[str, bytes | bytearray | memoryview | np.ndarray | Source] = {}
    specs = model.input_specs
    for name, value in inputs.items():
        if isinstance(value, ShmInput):
            spec = specs.get(name)
            fixed = spec is not None and not spec.varying_axes
            size = spec.nbytes if spec is not None and fixed else None
            resolved[name] = shm.source(value.path, size, f"ifmap '{name}'")
        else:
            resolved[name] = value
    return resolved


def run(
    model: Model, inputs: Mapping[str, Input], shm: ShmTable, outputs: ShmOutputs
) -> InferResult:
    """One inference in the caller's thread, answered."""
    job = model.submit(sources(model, inputs, shm))
    model.run(job)
    return answer(model, job, shm, outputs)


def answer(model: Model, job: Job, shm: ShmTable, outputs: ShmOutputs) -> InferResult:
    """The result of an ended job: its outputs inline, or written from its slot straight
    to the client's shared memory when the call names any there (then only those)."""
    inline: dict[str, bytes] = {}
    values = model.outputs(job)
    try:
        for name, value in values.items():
            if name in outputs:
                data = np.ascontiguousarray(value).reshape(-1).view(np.uint8).data
                shm.write(outputs[name], data, f"shm_ofmap '{name}'")
            elif not outputs:
                inline[name] = value.tobytes()
    finally:
        model.answered(job)
    return InferResult(outputs=inline, code=job.code)
