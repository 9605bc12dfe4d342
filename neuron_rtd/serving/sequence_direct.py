"""The `direct` strategy's executions on one copy (Triton's direct sequence batcher): each
live sequence holds a batch slot of the copy for its life, and an execution takes the
ready request of every slot at once, row i of the batch being slot i's; a slot with no
request ready (or one whose shapes differ from the batch's) gets a filler row whose READY
control says false, so the others keep their rows. A model that does not batch has one
slot, and each execution runs its one request.

One thread per copy forms and runs the batches (through the served version's one
execution path, `ServedVersion.execute`); a request's own thread waits for its share.
With `max_queue_delay_us` and `minimum_slot_utilization` both set, a batch that fills
fewer than that share of the slots waits, up to that delay from its oldest request, for
more (Triton's rule); otherwise it runs at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

import numpy as np

from neuron_rtd.errors import Nerr
from neuron_rtd.runtime import Rows
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.batcher import Executed

Inputs = dict[str, np.ndarray]
Execute = Callable[[int, Mapping[str, np.ndarray | Rows]], Executed]
# a filler row made like a given request's: zeros, its controls false (READY false)
Filler = Callable[[Inputs], Inputs]


class Share:
    """One request's place in a direct batch; its thread blocks on `wait` until run."""

    __slots__ = ("_done", "arrival_ns", "code", "error", "inputs", "outputs", "start_ns")

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.arrival_ns = time.monotonic_ns()
        self.start_ns = 0
        self.outputs: dict[str, np.ndarray] = {}
        self.code = Nerr.OK
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def finish(self) -> None:
        self._done.release()

    def wait(self) -> None:
        self._done.acquire()
        if self.error is not None:
            raise self.error


def _signature(inputs: Inputs) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((name, array.shape) for name, array in inputs.items()))


class DirectLane:
    """The batch slots of copy `copy` and the thread that runs them."""

    def __init__(
        self,
        copy: int,
        slots: int,
        execute: Execute,
        filler: Filler,
        *,
        batched: bool,
        max_queue_delay_us: int,
        minimum_slot_utilization: float,
        name: str,
        waits: Callable[[], AbstractContextManager[object]],
    ) -> None:
        self.copy = copy
        self._execute = execute
        self._filler = filler
        self._batched = batched
        self._waits = waits
        self._delay_ns = max_queue_delay_us * 1000
        self._utilization = minimum_slot_utilization
        self._slots = slots
        self._ready: list[Share | None] = [None] * slots
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._thread = threading.Thread(
            target=self._work, name=f"neuron-sequence-{name}-{copy}", daemon=True
        )
        self._thread.start()

    def run(self, slot: int, inputs: Inputs) -> Share:
        """Run `inputs` (one row, controls and state included) in slot `slot`'s row of
        some execution; block until it ran. Raises what the execution raised."""
        share = Share(inputs)
        with self._cond:
            if self._closed:
                raise _unloading()
            self._ready[slot] = share
            self._cond.notify()
        with self._waits():
            share.wait()
        return share

    def close(self) -> None:
        """Fail the shares waiting for a batch, let the one running finish, end the thread."""
        with self._cond:
            self._closed = True
            dropped = [share for share in self._ready if share is not None]
            self._ready = [None] * self._slots
            self._cond.notify_all()
        for share in dropped:
            share.error = _unloading()
            share.finish()
        if self._thread is not threading.current_thread():
            self._thread.join()

    # --- the lane's thread --------------------------------------------------------------
    def _take(self) -> dict[int, Share] | None:
        """Block until a batch is due; its shares by slot, taken. None once closed."""
        with self._cond:
            while not self._closed:
                ready = {slot: s for slot, s in enumerate(self._ready) if s is not None}
                if not ready:
                    self._cond.wait()
                    continue
                wait_s = self._wait_s(ready)
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
                first = _signature(next(iter(ready.values())).inputs)
                taken = {slot: s for slot, s in ready.items() if _signature(s.inputs) == first}
                for slot in taken:
                    self._ready[slot] = None
                return taken
        return None

    def _wait_s(self, ready: Mapping[int, Share]) -> float:
        """How long the ready shares wait for more before they run (0: run now)."""
        if self._delay_ns == 0 or self._utilization == 0.0:
            return 0.0
        if len(ready) / self._slots >= self._utilization:
            return 0.0
        oldest = min(share.arrival_ns for share in ready.values())
        return max(0, oldest + self._delay_ns - time.monotonic_ns()) / 1e9

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            self._run(taken)

    def _run(self, taken: dict[int, Share]) -> None:
        start_ns = time.monotonic_ns()
        try:
            if not self._batched:
                (share,) = taken.values()
                result = self._execute(self.copy, dict(share.inputs))
                share.outputs = dict(result.outputs)
            else:
                result = self._execute(self.copy, self._batch(taken))
                for slot, share in taken.items():
                    share.outputs = {
                        name: array[slot : slot + 1] for name, array in result.outputs.items()
                    }
        except BaseException as error:  # every waiter must be answered
            for share in taken.values():
                share.error = error
                share.finish()
            return
        for share in taken.values():
            share.start_ns = start_ns
            share.code = result.code
            share.finish()

    def _batch(self, taken: dict[int, Share]) -> Inputs:
        """Rows 0..the highest slot taken: each slot's request, or a filler row."""
        model = next(iter(taken.values())).inputs
        filler: Inputs | None = None
        rows: list[Inputs] = []
        for slot in range(max(taken) + 1):
            share = taken.get(slot)
            if share is None:
                filler = filler or self._filler(model)
                rows.append(filler)
            else:
                rows.append(share.inputs)
        if len(rows) == 1:
            return dict(rows[0])
        return {name: np.concatenate([row[name] for row in rows]) for name in model}


def _unloading() -> ServingError:
    return ServingError(
        Status.UNAVAILABLE,
        "the model is being unloaded; the request was not run, retry once the model is "
        "loaded again",
    )
