"""The M copies of the model a run sends its batches to: each batch staged on the least
busy copy, sent when it has a free place, and no batch sent after an inference fails."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from neuron_rtd.client import Model, Staged


class _Copies:
    """The M copies of the model (one per NCG), each taking `ninfer` inferences in flight.
    A batch takes a place on the least busy copy first (`stage`: its input arrays in that
    copy's shared memory, to be decoded into), at most one beyond the `ninfer` in flight,
    and is sent once that copy has a free place (`send`), so that each is sent at once,
    none queued in the client's pool. The first inference that fails is told to `failed`
    at once, and no batch is sent after it (_Stopped): a daemon gone stops the run in one
    reconnection wait, not one per batch."""

    def __init__(
        self,
        models: Sequence[Model],
        ninfer: int,
        failed: Callable[[BaseException], None],
        *,
        stage: bool = True,
        cast: bool = False,
    ) -> None:
        self._models = list(models)
        self._cast = cast  # numpy's unsafe cast of inputs the dtype policy refuses
        self._ninfer = ninfer
        self._failed = failed
        self._stage = stage  # else the batches are decoded into arrays of their own
        self._placed = [0] * len(models)  # batches staged or in flight
        self._busy = [0] * len(models)  # in flight
        self._broken = False
        self._changed = threading.Condition()

    def stage(self) -> tuple[int, Staged | None]:
        """A place on the least busy copy: its index and input arrays in its shared memory
        (None: not to be decoded in place, or the client's tensors go inline)."""
        with self._changed:
            self._changed.wait_for(lambda: self._broken or min(self._placed) <= self._ninfer)
            if self._broken:
                raise _Stopped
            index = self._placed.index(min(self._placed))
            self._placed[index] += 1
        try:
            return index, self._models[index].stage() if self._stage else None
        except BaseException:
            self.unstage(index, None)
            raise

    def unstage(self, index: int, staged: Staged | None) -> None:
        """A place given back unsent."""
        if staged is not None:
            self._models[index].unstage(staged)
        with self._changed:
            self._placed[index] -= 1
            self._changed.notify_all()

    def send(
        self, index: int, inputs: Staged | dict[str, np.ndarray]
    ) -> Future[dict[str, np.ndarray]]:
        """The batch staged on copy `index` sent, once that copy has a free place."""
        with self._changed:
            self._changed.wait_for(lambda: self._broken or self._busy[index] < self._ninfer)
            broken = self._broken
            if not broken:
                self._busy[index] += 1
        if broken:
            self.unstage(index, inputs if isinstance(inputs, Staged) else None)
            raise _Stopped
        try:
            future = self._models[index].infer_async(inputs, posted=False, cast=self._cast)
        except BaseException:
            self._done(index, None)
            raise
        future.add_done_callback(lambda done: self._done(index, done))
        return future

    def _done(self, index: int, future: Future[dict[str, np.ndarray]] | None) -> None:
        error = None if future is None or future.cancelled() else future.exception()
        if error is not None:
            self._failed(error)  # first: the run's failure is this, not a _Stopped after it
        with self._changed:
            self._busy[index] -= 1
            self._placed[index] -= 1
            self._broken = self._broken or error is not None
            self._changed.notify_all()


class _Stopped(Exception):
    """Another channel failed: this one stops, its unit undone."""
