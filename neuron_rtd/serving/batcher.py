"""Dynamic batching, as Triton's dynamic batcher does it on the model's batch axis 0.

Requests submitted from any threads wait in a queue, grouped by signature (input names,
dtypes and shapes beyond axis 0: only requests of one signature can be concatenated).
Groups are served oldest first (by their oldest request). From a group, requests are
gathered in arrival order up to the one that would take the rows past `max_batch_size`;
with P the largest preferred batch size (`max_batch_size` when none is given):

- when some prefix of them makes a preferred batch size, the largest such prefix runs at
  once; the rest wait for the next batch;
- when they cannot usefully grow (their rows reach P, or the next request would not fit),
  they run at once: those within P, or all of them if the first alone passes P;
- otherwise they wait for more until `max_queue_delay_us` has passed since the oldest of
  them arrived (no wait when it is 0), then all of them run.

A younger group whose batch is due runs while an older one still waits out its delay.

Each copy's executions are serial; different copies run in parallel. There is one worker
thread per copy; a worker is not tied to a copy but takes any idle one. A request that
finds the queue empty, a copy idle and nothing to wait for runs its execution on the
submitting thread itself: the lone request of a lightly loaded model pays no hand-off
between threads. Workers sleep on one condition variable (a timed wait only while a group
waits out its delay): no polling.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from neuron_rtd.errors import Nerr
from neuron_rtd.serving.api import ServingError, Status

Execute = Callable[[int, dict[str, Any]], "Executed"]
# an input's blocks of rows (the batch's requests', in order) as one execution takes them
Merge = Callable[[str, list[np.ndarray]], Any]
# input names, dtypes and shapes beyond axis 0, by name
Signature = tuple[tuple[str, np.dtype, tuple[int, ...]], ...]

THREAD_PREFIX = "neuron-batcher"


class Executed(Protocol):
    """What one execution answers (the runtime's `InferResult`): its outputs, axis 0 of
    each the merged rows, and its code."""

    @property
    def outputs(self) -> Mapping[str, np.ndarray]: ...

    @property
    def code(self) -> Nerr: ...


@dataclass(frozen=True, slots=True)
class Batched:
    """One request's share of the execution it ran in."""

    outputs: dict[str, np.ndarray]  # this request's rows of each output
    queue_ns: int  # from submit until its batch began executing
    batch_size: int  # rows of the execution it ran in
    code: Nerr = Nerr.OK  # the execution's (a NaN/Inf in any of its rows)


class _Request:
    """A queued request; its submitter blocks on `_done` until a worker answers it."""

    __slots__ = (
        "_done",
        "arrival_ns",
        "batch_rows",
        "code",
        "error",
        "inputs",
        "offset",
        "outputs",
        "rows",
        "signature",
        "start_ns",
    )

    def __init__(self, inputs: dict[str, np.ndarray], rows: int, arrival_ns: int) -> None:
        self.inputs = inputs
        self.rows = rows
        self.arrival_ns = arrival_ns
        self.signature = _signature(inputs)
        self.outputs: Mapping[str, np.ndarray] = {}
        self.code = Nerr.OK
        self.offset = 0
        self.start_ns = 0
        self.batch_rows = 0
        self.error: BaseException | None = None
        # a one-shot latch: held from birth, released once by whoever answers
        self._done = threading.Lock()
        self._done.acquire()

    def succeed(self, result: Executed, offset: int, start_ns: int, batch_rows: int) -> None:
        self.outputs = result.outputs
        self.code = result.code
        self.offset = offset
        self.start_ns = start_ns
        self.batch_rows = batch_rows
        self._done.release()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.release()

    def wait(self) -> Batched:
        """Block until answered; this request's rows (cut here, on the submitter's own
        thread, to keep the worker's share of the work small) or its error."""
        self._done.acquire()
        if self.error is not None:
            raise self.error
        outputs = dict(self.outputs)
        if self.rows != self.batch_rows:
            start, stop = self.offset, self.offset + self.rows
            outputs = {name: array[start:stop] for name, array in outputs.items()}
        return Batched(outputs, self.start_ns - self.arrival_ns, self.batch_rows, self.code)


def _signature(inputs: dict[str, np.ndarray]) -> Signature:
    return tuple(sorted((name, array.dtype, array.shape[1:]) for name, array in inputs.items()))


class Batcher:
    """Merges concurrent requests of one model into executions of up to `max_batch_size`
    rows on its `copies` copies (each input's rows by `merge`: concatenated, unless the
    caller's execution takes them as they are). `execute(copy_index, merged_inputs)` runs
    one execution on copy `copy_index` and returns its result (`Executed`), axis 0 of
    each output being the merged rows; it is called from the workers and from submitting
    threads, never twice at once for one copy."""

    def __init__(
        self,
        execute: Execute,
        *,
        copies: int,
        max_batch_size: int,
        preferred_batch_sizes: Sequence[int] = (),
        max_queue_delay_us: int = 0,
        name: str = "",
        merge: Merge | None = None,
        waits: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        _check_config(copies, max_batch_size, preferred_batch_sizes, max_queue_delay_us)
        self._execute = execute
        # how a request queued for a batch waits (the runtime's compute gate's `waiting`:
        # it computes nothing meanwhile, and another call may)
        self._waits = waits
        self._merge = merge or _concatenate
        self._copies = copies
        self._max_batch_size = max_batch_size
        self._preferred = frozenset(preferred_batch_sizes)
        # a batch this large runs at once: waiting could not reach a preferred size
        self._max_preferred = max(self._preferred, default=max_batch_size)
        self._delay_ns = max_queue_delay_us * 1000
        self._name = name
        self._model = f"model {name}" if name else "the model"
        self._cond = threading.Condition(threading.Lock())
        # guarded by _cond
        self._groups: dict[Signature, deque[_Request]] = {}
        self._queued = 0
        self._idle = list(reversed(range(copies)))  # pop() takes copy 0 first
        self._closed = False
        self._workers = [
            threading.Thread(
                target=self._work,
                name=f"{THREAD_PREFIX}-{name or 'model'}-{index}",
                daemon=True,
            )
            for index in range(copies)
        ]
        for worker in self._workers:
            worker.start()

    @property
    def pending(self) -> int:
        """Requests waiting in the queue (not those executing)."""
        with self._cond:
            return self._queued

    def submit(self, inputs: Mapping[str, np.ndarray], rows: int = 0) -> Batched:
        """Run `inputs` (axis 0 of each the request's rows) in some execution; block until
        it has run. Raises what `execute` raised for that execution, or a ServingError.
        `rows`: the request's batch size when its caller checked it by the batch rules
        (`batch_rows`), else 0 and they are checked here."""
        arrival_ns = time.monotonic_ns()
        merged = dict(inputs)
        rows = rows or self._rows(merged)
        with self._cond:
            if self._closed:
                raise self._unloading()
            if self._groups or not self._idle or not self._runs_alone(rows):
                request = _Request(merged, rows, arrival_ns)
                group = self._groups.get(request.signature)
                if group is None:
                    self._groups[request.signature] = deque((request,))
                else:
                    group.append(request)
                self._queued += 1
                self._cond.notify()
                copy = -1
            else:
                copy = self._idle.pop()
        if copy < 0:
            with self._waits():
                return request.wait()
        # the fast path: nothing queued, a copy idle, nothing worth waiting for
        try:
            start_ns = time.monotonic_ns()
            result = self._execute(copy, merged)
        finally:
            self._give_back(copy)
        self._check_outputs(result.outputs, rows)
        return Batched(dict(result.outputs), start_ns - arrival_ns, rows, result.code)

    def close(self) -> None:
        """Fail every queued request (UNAVAILABLE), refuse new ones, wait for the
        executions under way to finish (their requests get their answers), and end the
        workers. Idempotent; not to be called from `execute`."""
        with self._cond:
            dropped: list[_Request] = []
            if not self._closed:
                self._closed = True
                for group in self._groups.values():
                    dropped.extend(group)
                self._groups.clear()
                self._queued = 0
                self._cond.notify_all()
        error = self._unloading()
        for request in dropped:
            request.fail(error)
        with self._cond:
            while len(self._idle) < self._copies:
                self._cond.wait()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join()

    # -- checks

    def _rows(self, inputs: dict[str, np.ndarray]) -> int:
        if not inputs:
            raise ServingError(Status.INVALID_ARGUMENT, f"a request to {self._model} has no inputs")
        batch = 0
        first = ""
        for name, array in inputs.items():
            rows = batch_rows(name, array.shape, self._model, self._max_batch_size)
            batch, first = same_batch(name, rows, first, batch)
        return batch

    def _check_outputs(self, outputs: Mapping[str, np.ndarray], rows: int) -> None:
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != rows:
                got = "no batch axis" if array.ndim == 0 else f"{array.shape[0]} rows"
                raise ServingError(
                    Status.INTERNAL,
                    f"output '{name}' of {self._model} has {got} for an execution of "
                    f"{rows} rows; it cannot be cut back per request",
                )

    def _unloading(self) -> ServingError:
        return ServingError(
            Status.UNAVAILABLE,
            f"{self._model} is being unloaded; the request was not run, retry once the "
            "model is loaded again",
        )

    # -- scheduling (every method below that touches the queue runs under _cond)

    def _runs_alone(self, rows: int) -> bool:
        """Whether a lone request of `rows` runs at once rather than wait for others."""
        return self._delay_ns == 0 or rows in self._preferred or rows >= self._max_preferred

    def _take_batch(self, now_ns: int) -> tuple[list[_Request], int]:
        """The requests of the next batch, taken off the queue; or none and how long to
        wait (ns) before one is due, if no request arrives meanwhile."""
        groups = list(self._groups.values())
        if len(groups) > 1:
            groups.sort(key=lambda group: group[0].arrival_ns)
        wait_ns = -1
        for group in groups:
            count, due_ns = self._plan(group, now_ns)
            if count:
                batch = [group.popleft() for _ in range(count)]
                if not group:
                    del self._groups[batch[0].signature]
                self._queued -= count
                return batch, 0
            if wait_ns < 0 or due_ns - now_ns < wait_ns:
                wait_ns = due_ns - now_ns
        return [], wait_ns

    def _plan(self, group: deque[_Request], now_ns: int) -> tuple[int, int]:
        """How many requests from the head of `group` to run now (0: none yet), and when
        the group is due otherwise (ns, monotonic)."""
        total = 0
        count = 0
        best = 0  # requests making the largest preferred batch size reached
        full = False  # the batch cannot grow
        for request in group:
            if total + request.rows > self._max_batch_size:
                full = True
                break
            if total + request.rows > self._max_preferred and not best:
                best = count
            total += request.rows
            count += 1
            if total in self._preferred:
                best = count
        due_ns = group[0].arrival_ns + self._delay_ns
        if now_ns >= due_ns or full or total >= self._max_preferred:
            # keep to a preferred size while the delay allows it; otherwise run it all
            return (best if best and now_ns < due_ns else count), due_ns
        return best, due_ns

    def _next_batch(self) -> tuple[int, list[_Request]] | None:
        """Block until a batch is due and a copy idle; take both. None once closed."""
        with self._cond:
            while not self._closed:
                if not self._groups or not self._idle:
                    self._cond.wait()
                    continue
                batch, wait_ns = self._take_batch(time.monotonic_ns())
                if not batch:
                    self._cond.wait(wait_ns / 1e9)
                    continue
                copy = self._idle.pop()
                if self._groups and self._idle:
                    self._cond.notify()  # more work and a copy for it: another worker
                return copy, batch
        return None

    def _give_back(self, copy: int) -> None:
        with self._cond:
            self._idle.append(copy)
            if self._closed:
                self._cond.notify_all()  # close() waits for every copy to be idle
            elif self._groups:
                self._cond.notify()

    # -- the workers

    def _work(self) -> None:
        while (taken := self._next_batch()) is not None:
            copy, batch = taken
            try:
                self._run(copy, batch)
            finally:
                self._give_back(copy)

    def _run(self, copy: int, batch: list[_Request]) -> None:
        """One execution of `batch` on `copy`; every request of it gets its rows, or the
        execution's error (the same exception object for all)."""
        rows = sum(request.rows for request in batch)
        start_ns = time.monotonic_ns()
        try:
            if len(batch) == 1:
                merged = batch[0].inputs
            else:
                merged = {
                    name: self._merge(name, [request.inputs[name] for request in batch])
                    for name in batch[0].inputs
                }
            result = self._execute(copy, merged)
            self._check_outputs(result.outputs, rows)
        except BaseException as error:  # every waiter must be answered, whatever happened
            for request in batch:
                request.fail(error)
            return
        offset = 0
        for request in batch:
            request.succeed(result, offset, start_ns, rows)
            offset += request.rows


def _concatenate(name: str, blocks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(blocks)


def batch_rows(
    name: str, shape: tuple[int, ...], model: str, max_batch_size: int, min_batch_size: int = 1
) -> int:
    """The batch rules for input `name` of `shape` of a request to `model` (the words the
    request is refused in): its rows on the batch axis (axis 0), from `min_batch_size`
    (1, or the NEFF's smallest batch bucket) to `max_batch_size`."""
    if not shape:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' is a scalar; {model} batches on axis 0, so every input needs at "
            "least one axis",
        )
    rows = shape[0]
    if rows > max_batch_size:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has batch size {rows}, more than the max_batch_size "
            f"{max_batch_size} of {model}: split the request",
        )
    if rows < max(min_batch_size, 1):
        buckets = " (its NEFF's batch buckets)" if min_batch_size > 1 else ""
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has batch size {rows}; {model} takes "
            f"{max(min_batch_size, 1)}..{max_batch_size}{buckets}",
        )
    return rows


def same_batch(name: str, rows: int, first: str, batch: int) -> tuple[int, str]:
    """The batch rule across a request's inputs: input `name` has as many rows as the
    `first` input checked (`batch` of them); the batch size and the first input's name."""
    if not first:
        return rows, name
    if rows != batch:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has batch size {rows}, input '{first}' {batch}: the inputs of a "
            "request share their batch size (axis 0)",
        )
    return batch, first


def _check_config(
    copies: int, max_batch_size: int, preferred: Sequence[int], max_queue_delay_us: int
) -> None:
    if copies < 1:
        raise ServingError(
            Status.INVALID_ARGUMENT, f"instance_group count {copies}: at least 1 copy is needed"
        )
    if max_batch_size < 1:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"max_batch_size {max_batch_size}: dynamic batching needs a max_batch_size of "
            "at least 1",
        )
    for size in preferred:
        if not 1 <= size <= max_batch_size:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"dynamic_batching.preferred_batch_size {size} is not within 1.."
                f"{max_batch_size} (max_batch_size)",
            )
    if max_queue_delay_us < 0:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"dynamic_batching.max_queue_delay_microseconds {max_queue_delay_us} is negative",
        )
