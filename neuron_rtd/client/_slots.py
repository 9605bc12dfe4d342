"""A model's shared-memory slots on the client's side: one per inference in flight, a
buffer per input and (when every output's size follows from the inputs') per output,
made when first needed, reused, and freed once the model is gone.

`Staged` lends a slot's input buffers as arrays for a caller to fill in place
(`Model.stage`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from neuron_rtd.client._shm import ShmBuffer
from neuron_rtd.neff import TensorSpec

if TYPE_CHECKING:
    from neuron_rtd.client._connection import Connection
    from neuron_rtd.client.model import Model


class Slot:
    """The shm buffers of one in-flight inference; `views`: its inputs as lent to a
    caller by `Model.stage` (None: not lent); `sizes`: the sizes its inputs gave the
    NEFF's symbols (`batch`: 8), which size its outputs."""

    def __init__(self, inputs: dict[str, ShmBuffer], outputs: dict[str, ShmBuffer]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.views: dict[str, np.ndarray] | None = None
        self.sizes: dict[str, int] = {}
        # The request naming only this slot's objects, by its inputs' names (the model's
        # `_request`); sent again as it is (a request is never changed once made).
        self.request: tuple[tuple[str, ...], Any] | None = None

    def buffers(self) -> list[ShmBuffer]:
        return [*self.inputs.values(), *self.outputs.values()]


class Staged:
    """A model's input tensors in shared memory, lent by `Model.stage()`: fill `inputs`
    in place, then pass this to the model's `infer` or `infer_async`, which send them
    with no copy (each input whole, at the shape of its NEFF). Sent once; after it, the
    arrays belong to the model again (they serve its next inferences): do not touch
    them. One never sent is given back with `Model.unstage`."""

    def __init__(self, model: Model, slot: Slot) -> None:
        self.model = model
        self.inputs: dict[str, np.ndarray] = dict(slot.views or {})
        self._slot: Slot | None = slot

    def take(self, model: Model) -> Slot:
        """The slot, for `model` to send (once)."""
        if model is not self.model:
            raise ValueError(f"these inputs were staged for {self.model!r}, not {model!r}")
        slot, self._slot = self._slot, None
        if slot is None:
            raise ValueError("these staged inputs were sent (or given back) already")
        return slot


class Slots:
    """One model's slots: `inputs` always in shared memory, `outputs` those that are
    (none when an output's size is known only from its answer). `session`: the id of the
    session its objects are shared in, asked when a slot is made."""

    def __init__(
        self,
        connection: Connection,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        session: Any,
    ) -> None:
        self.connection = connection
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self._session = session
        self._lock = threading.Lock()
        self._idle: list[Slot] = []
        self.released = False  # the model is gone: slots given back are freed

    def take(self) -> Slot | None:
        """An idle slot, else a new one; None when tensors go inline (shared memory off,
        or it could not be made)."""
        with self._lock:
            slot = self._idle.pop() if self._idle else None
        if slot is None and self.connection.shm_enabled:
            slot = self._new()
        return slot

    def give_back(self, slot: Slot | None, keep: bool) -> None:
        """A slot an inference is done with: kept for the next (`keep`), or dropped (after
        a transport error the daemon may still write into the buffers)."""
        if slot is None:
            return
        slot.views = None  # lent no more: the next inference in it copies its inputs in
        with self._lock:
            if keep and not self.released:
                self._idle.append(slot)
                return
        self.connection.unshare(slot.buffers())

    def release(self, *, unmap: bool) -> None:
        """The model is gone: free the idle slots now, busy ones when they come back."""
        with self._lock:
            self.released = True
            idle, self._idle = self._idle, []
        for slot in idle:
            self.connection.unshare(slot.buffers(), unmap=unmap)

    def _new(self) -> Slot | None:
        made: list[ShmBuffer] = []
        try:
            passed = self.connection.passes_objects()
            ins = {t.name: _made(made, t, passed) for t in self.inputs}
            outs = {t.name: _made(made, t, passed) for t in self.outputs}
        except OSError as exc:
            for buffer in made:
                buffer.close()
            self.connection.shm_failed(f"cannot make shared memory: {exc}")
            return None
        try:
            shared = self.connection.share(made, self._session())
        except BaseException:  # a daemon stopping or gone meanwhile: none of them is its
            for buffer in made:
                buffer.close()
            raise
        return Slot(ins, outs) if shared else None


def _made(made: list[ShmBuffer], tensor: TensorSpec, passed: bool) -> ShmBuffer:
    """A buffer for `tensor` (its whole size), added to `made`; a passed one of a fixed
    size is sealed at that size, for the daemon to map (`ShmBuffer`)."""
    buffer = ShmBuffer(tensor.nbytes, passed=passed, fixed=not tensor.varying_axes)
    made.append(buffer)
    return buffer
