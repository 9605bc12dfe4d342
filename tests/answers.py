"""A runtime's answer read back as arrays, whether it carries bytes (the wire's shape) or
arrays, an answer taken straight from a loaded model's slot, and what a sample model must
answer."""

from __future__ import annotations

import numpy as np

from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.runtime.job import Job
from neuron_rtd.runtime.model import LoadedModel


def as_array(value: object, sample: SampleModel) -> np.ndarray:
    """An output of `sample` as the runtime answers it, as an array of its shape."""
    spec = sample.outputs[0]
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(value, spec.dtype).reshape(spec.shape)
    return np.asarray(value).reshape(spec.shape)


def expected(sample: SampleModel, x: np.ndarray) -> np.ndarray:
    """What `sample` answers for input `x`."""
    return sample.reference({sample.inputs[0].name: x})[sample.outputs[0].name]


def slot_answer(model: LoadedModel, job: Job, sample: SampleModel) -> np.ndarray:
    """An ended job's output, copied from its slot, and the slot given back (as the data
    path answers it); the job's error raised instead."""
    try:
        return as_array(model.outputs(job).popitem()[1].copy(), sample)
    finally:
        model.answered(job)
