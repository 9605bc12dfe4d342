"""A runtime's answer read back as arrays, whether it carries bytes (the wire's shape) or
arrays, and what a sample model must answer."""

from __future__ import annotations

import numpy as np

from neuron_rtd.neff.samples import SampleModel


def as_array(value: object, sample: SampleModel) -> np.ndarray:
    """An output of `sample` as the runtime answers it, as an array of its shape."""
    spec = sample.outputs[0]
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(value, spec.dtype).reshape(spec.shape)
    return np.asarray(value).reshape(spec.shape)


def expected(sample: SampleModel, x: np.ndarray) -> np.ndarray:
    """What `sample` answers for input `x`."""
    return sample.reference({sample.inputs[0].name: x})[sample.outputs[0].name]
