"""Where a batch is decoded: in the channel, straight into the input arrays a copy of the
model staged in its shared memory (when the specs are its inputs' dtypes and shapes), or
in a decode worker process and copied into them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from neuron_rtd.neff import Neff
from neuron_rtd.records.features import FeatureSpec, decode_batch

Fill = Callable[[dict[str, np.ndarray] | None], dict[str, np.ndarray]]


def _decoder(rows: list[tuple[bytes, str]], specs: list[FeatureSpec], batch: int) -> Fill:
    """A batch decoded into the arrays given (None: new ones)."""
    return lambda out: decode_batch(rows, specs, batch, out)


def _copier(decoding: Future[dict[str, np.ndarray]]) -> Fill:
    """A batch decoded elsewhere, copied into the arrays given (None: as it came)."""

    def fill(out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        decoded = decoding.result()
        if out is None:
            return decoded
        for name, array in out.items():
            array[...] = decoded[name]
        return out

    return fill


def _decodes_in_place(specs: Sequence[FeatureSpec], neff: Neff, batch: int) -> bool:
    """Whether the batches decode straight into the model's input buffers: each spec of
    its input's dtype and shape (not a smaller one of a varying axis, not scalars)."""
    inputs = {t.name: t for t in neff.inputs}
    return all(
        spec.input_name in inputs
        and inputs[spec.input_name].dtype == spec.dtype
        and tuple(inputs[spec.input_name].shape) == (batch, *spec.shape)
        for spec in specs
    )
