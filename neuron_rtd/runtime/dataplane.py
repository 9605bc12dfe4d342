"""The data path: one inference's way through the runtime, run in the caller's thread
(`infer`) or posted to the model's workers and collected by its cookie (`post`, then
`wait` or `poll`). Either way its inputs are resolved (bytes as they are; client shared
memory, named in the session the call presents, read straight into the slot), the model
takes a slot and fills it (`LoadedModel.submit`), runs (`LoadedModel.run`; both at once
in the caller's thread, `LoadedModel.infer`), and the result is answered from the slot
inline, as arrays over one copy each (`InferResult`), or into the client's shared memory
(`LoadedModel.outputs`, then `LoadedModel.answered` gives the slot back). Callers see
these calls, never the slot.

A string tensor takes the same path as an array of objects: given as an array or as bytes
in Triton's encoding (`neuron_rtd/neff/strings.py`), it is made an array of str before the
model checks its shape (by its element count) and takes it into the slot; it is answered
as an array of bytes, or encoded into shared memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from neuron_rtd.errors import NrtError
from neuron_rtd.neff import TensorSpec
from neuron_rtd.neff.dtypes import is_narrow
from neuron_rtd.neff.strings import as_bytes, as_text, decode, encode
from neuron_rtd.runtime.api import InferResult, Input, Rows, ShmInput, ShmOutputs
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.job import Job, Source
from neuron_rtd.runtime.model import LoadedModel
from neuron_rtd.runtime.sessions import SessionId
from neuron_rtd.runtime.shm import ShmMapping, ShmTable

ShmSinks = Mapping[str, ShmMapping]  # output name -> the mapping it is written to


class DataPath:
    """`presented` below: the session the call presents (None: none; see `ShmTable.find`)."""

    def __init__(self, shm: ShmTable, inflight: Inflight) -> None:
        self._shm = shm
        self._inflight = inflight

    def infer(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Input],
        outputs: ShmOutputs,
        presented: SessionId | None,
    ) -> InferResult:
        """One inference in the caller's thread, answered."""
        sinks = self._sinks(model, outputs, presented)
        job = model.infer(self._sources(model, inputs, presented))
        return self._answer(model, job, sinks)

    def post(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Input],
        outputs: ShmOutputs,
        presented: SessionId | None,
    ) -> int:
        """Queue an inference (inputs checked and copied into its slot before this
        returns); its cookie (see `Inflight`)."""
        sinks = self._sinks(model, outputs, presented)
        return self._inflight.post(model, self._sources(model, inputs, presented), sinks)

    def wait(self, cookie: int, outputs: ShmOutputs, presented: SessionId | None) -> InferResult:
        """The result of a posted inference once it has ended; the cookie is spent. Its
        outputs go to the shared memory named here, else to that named by the post."""
        posted = self._inflight.wait(cookie)
        try:
            sinks = self._sinks(posted.model, outputs, presented)
        except NrtError:
            posted.model.answered(posted.job)  # the cookie is spent: its slot goes back
            raise
        return self._answer(posted.model, posted.job, sinks or posted.extra or {})

    def poll(
        self, cookie: int, outputs: ShmOutputs, presented: SessionId | None
    ) -> InferResult | None:
        """As `wait` once the inference has ended; None (the cookie kept) until then."""
        if not self._inflight.peek(cookie).done:
            return None
        return self.wait(cookie, outputs, presented)

    def completed(self, cookies: Iterable[int]) -> list[int]:
        """The cookies, of those given, whose inferences have ended."""
        return self._inflight.completed(cookies)

    def _sinks(
        self, model: LoadedModel, outputs: ShmOutputs, presented: SessionId | None
    ) -> dict[str, ShmMapping]:
        if not outputs:  # the common case: all answered inline
            return {}
        return {
            name: self._shm.find(path, presented, model.session_id, f"shm_ofmap '{name}'")
            for name, path in outputs.items()
        }

    def _sources(
        self, model: LoadedModel, inputs: Mapping[str, Input], presented: SessionId | None
    ) -> dict[str, bytes | bytearray | memoryview | np.ndarray | Source]:
        """The inputs as the model reads them: bytes-like objects as they are (a numpy
        caller's arrays as `array_input` makes them), shared memory
        (named in the session the call presents, `presented`, see `ShmTable.find`) as a source
        read straight into the slot (as many bytes as the input takes; for an input whose
        size varies, the whole object)."""
        resolved: dict[str, bytes | bytearray | memoryview | np.ndarray | Source] = {}
        specs = model.input_specs
        for name, value in inputs.items():
            spec = specs.get(name)
            if spec is not None and spec.dtype.hasobject:
                resolved[name] = self._strings(model, spec, value, presented)
            elif isinstance(value, ShmInput):
                fixed = spec is not None and not spec.varying_axes
                size = spec.nbytes if spec is not None and fixed else None
                what = f"ifmap '{name}'"
                mapping = self._shm.find(value.path, presented, model.session_id, what)
                resolved[name] = self._shm.source(mapping, size, what)
            elif type(value) is np.ndarray and name in specs:
                resolved[name] = array_input(value, specs[name])
            else:
                resolved[name] = value
        return resolved

    def _strings(
        self, model: LoadedModel, spec: TensorSpec, value: Input, presented: SessionId | None
    ) -> np.ndarray:
        """A string input as the slot takes it, an array of str (`as_text`), from an array
        (a batch's row blocks joined), or from bytes in Triton's encoding (inline, or all
        of a shared memory object): as many elements as its shape takes, or, for an input
        whose size varies, those the bytes hold, at most its bound's."""
        what = f"input '{spec.name}'"
        if isinstance(value, Rows):
            return as_text(np.concatenate(value.blocks), what)
        if isinstance(value, np.ndarray):
            return as_text(value, what)
        if isinstance(value, ShmInput):
            found = self._shm.find(value.path, presented, model.session_id, f"ifmap '{spec.name}'")
            value = self._shm.read(found, self._shm.size(found, what), what)
        whole = math.prod(spec.shape)
        if spec.varying_axes:  # at most its bound's (a free axis has none: 0)
            return as_text(decode(value, what, most=whole or None), what)
        return as_text(decode(value, what, count=whole), what).reshape(spec.shape)

    def _answer(self, model: LoadedModel, job: Job, outputs: ShmSinks) -> InferResult:
        """The result of an ended job: its outputs inline, or written from its slot straight
        to the client's shared memory when the call names any there (then only those)."""
        inline: dict[str, np.ndarray] = {}
        values = model.outputs(job)
        try:
            for name, value in values.items():
                if value.dtype.hasobject:  # a string output: bytes elements, or their encoding
                    if name in outputs:
                        self._shm.write(outputs[name], encode(value), f"shm_ofmap '{name}'")
                    elif not outputs:
                        inline[name] = as_bytes(value)
                elif name in outputs:
                    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8).data
                    self._shm.write(outputs[name], data, f"shm_ofmap '{name}'")
                elif not outputs:  # the one copy out of the slot, over bytes a wire sends
                    inline[name] = np.frombuffer(value.tobytes(), value.dtype).reshape(value.shape)
        finally:
            model.answered(job)
        return InferResult(outputs=inline, code=job.code)


def array_input(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A numpy caller's input (`LocalRuntime`, the serving core) as the slot takes it:
    C-contiguous, in the NEFF's byte order (an array of the same type in the other order
    is converted), an array of a narrow type of ml_dtypes, which offers no buffer, as its
    bytes. Its dtype and shape are the model's to check, as for any input's bytes."""
    dtype = spec.dtype
    if array.dtype != dtype and array.dtype.newbyteorder("=") == dtype.newbyteorder("="):
        array = array.astype(dtype)
    elif not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array.view(np.uint8) if is_narrow(array.dtype) else array
