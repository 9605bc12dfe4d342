"""The one path of an inference through the runtime: inputs resolved to sources, the job
submitted into a slot, run, and answered from the slot into the result or the client's
shared memory. `Runtime.infer`, `wait` and `poll` all end in `answer` here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from neuron_rtd.runtime.api import InferResult, Input, ShmInput
from neuron_rtd.runtime.model import Job, Model, Source
from neuron_rtd.runtime.shm import ShmMapping, ShmTable

ShmSinks = Mapping[str, ShmMapping]  # output name -> the mapping it is written to


def sources(
    model: Model, inputs: Mapping[str, Input], shm: ShmTable, caller: int | None
) -> dict[str, bytes | bytearray | memoryview | np.ndarray | Source]:
    """The inputs as the model reads them: bytes-like objects as they are, shared memory
    (named in the session the call presents, `caller`, see `ShmTable.find`) as a source
    read straight into the slot (as many bytes as the input takes; for an input whose
    size varies, the whole object)."""
    resolved: dict[str, bytes | bytearray | memoryview | np.ndarray | Source] = {}
    specs = model.input_specs
    for name, value in inputs.items():
        if isinstance(value, ShmInput):
            spec = specs.get(name)
            fixed = spec is not None and not spec.varying_axes
            size = spec.nbytes if spec is not None and fixed else None
            what = f"ifmap '{name}'"
            mapping = shm.find(value.path, caller, model.session_id, what)
            resolved[name] = shm.source(mapping, size, what)
        else:
            resolved[name] = value
    return resolved


def run(
    model: Model,
    inputs: Mapping[str, Input],
    shm: ShmTable,
    outputs: ShmSinks,
    caller: int | None,
) -> InferResult:
    """One inference in the caller's thread, answered."""
    job = model.submit(sources(model, inputs, shm, caller))
    model.run(job)
    return answer(model, job, shm, outputs)


def answer(model: Model, job: Job, shm: ShmTable, outputs: ShmSinks) -> InferResult:
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
