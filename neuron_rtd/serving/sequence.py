"""Sequence batching, as Triton's sequence batcher does it: the scheduler of a model
whose config has `sequence_batching` (its settings: `neuron_rtd/serving/sequence_config.py`),
in front of the served version's one execution path.

A request names its sequence by the parameter `sequence_id` (an unsigned integer, or a
string; 0 and "" mean none) and flags its first and last request with `sequence_start`
and `sequence_end`. A sequence starts on a START request and takes a sequence slot of
one copy for its life (the lowest free slot, so sequences spread over the copies first;
none free: it waits in the backlog, in order, until a sequence ends); its requests run
one after another, in the order they came, each a batch of one row. It ends after its
END request, or once no request of it came for `max_sequence_idle_microseconds` (its
slot freed for the backlog); a later request of it without START is refused, as one of a
sequence never started is, in Triton's words. START for a live sequence goes on in its
slot, the state started afresh (Triton logs the conflict and does the same).

Each request is given the control inputs the config maps (START, END, READY true,
CORRID its sequence id, a string one as its UTF-8 bytes) and the implicit states of its
sequence (their initial value at START, else the state outputs of the request before),
and the new states are kept from its outputs; the client sees neither. The copies run
the rows by the strategy: `direct`, each slot a row of its copy's batches
(`neuron_rtd/serving/sequence_direct.py`), or `oldest`, the ready requests of a copy's
sequences merged by the dynamic batcher (`Batcher`, one per copy).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from neuron_rtd.errors import shown
from neuron_rtd.runtime import Rows
from neuron_rtd.serving.api import InferRequest, ServingError, Status
from neuron_rtd.serving.batcher import Batched, Batcher, Executed
from neuron_rtd.serving.sequence_config import CORRID, END, READY, START, SequenceSettings
from neuron_rtd.serving.sequence_direct import DirectLane, Inputs

log = logging.getLogger("nrtd.KSERVE")

SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = "sequence_id", "sequence_start", "sequence_end"
_U64 = 1 << 64
Key = int | str
Execute = Callable[[int, Mapping[str, np.ndarray | Rows]], Executed]


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


def sequence_flags(parameters: Mapping[str, object]) -> tuple[Key, bool, bool]:
    """A request's sequence id (0 or "": none) and its START and END flags, from its
    parameters as plain values. An integer id is read as an unsigned 64-bit one (a
    negative int64, as gRPC's `int64_param` carries an id past 2^63, wraps, as Triton
    reads it)."""
    value = parameters.get(SEQUENCE_ID, 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _invalid(
            f"invalid value type for '{SEQUENCE_ID}' parameter, expected an unsigned integer "
            f"(gRPC int64_param) or a string, got {shown(repr(value))}"
        )
    if isinstance(value, int):
        if not -(1 << 63) <= value < _U64:
            raise _invalid(f"'{SEQUENCE_ID}' {value} is not a 64-bit sequence id")
        value %= _U64
    flags = []
    for name in (SEQUENCE_START, SEQUENCE_END):
        flag = parameters.get(name, False)
        if not isinstance(flag, bool):
            raise _invalid(
                f"invalid value type for '{name}' parameter, expected a boolean (gRPC "
                f"bool_param), got {shown(repr(flag))}"
            )
        flags.append(flag)
    return value, flags[0], flags[1]


class _Item:
    """A request of a sequence, queued in its sequence until its turn."""

    __slots__ = ("arrival_ns", "end", "error", "inputs", "start", "turn")

    def __init__(self, inputs: Mapping[str, np.ndarray], start: bool, end: bool) -> None:
        self.inputs = inputs
        self.start = start
        self.end = end
        self.arrival_ns = time.monotonic_ns()
        self.error: ServingError | None = None
        self.turn = threading.Event()  # set when it may run (or `error` says why not)


class _Sequence:
    """A live sequence: its slot (copy and index; None in the backlog), its requests in
    order (the first running once `running`), its states, and its last request's time."""

    __slots__ = ("copy", "items", "key", "last_ns", "running", "slot", "states")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.copy = -1
        self.slot = -1
        self.items: deque[_Item] = deque()
        self.running = False
        self.last_ns = time.monotonic_ns()
        self.states: dict[str, np.ndarray] = {}

    @property
    def placed(self) -> bool:
        return self.slot >= 0


class SequenceScheduler:
    """The sequences of one served version over its `copies` copies (see the module doc).
    `execute(copy, inputs)` is the version's one execution; `dtypes` its NEFF's input
    dtypes; `waits` how a request's thread waits (the compute gate's `waiting`)."""

    def __init__(
        self,
        settings: SequenceSettings,
        execute: Execute,
        *,
        copies: int,
        max_batch_size: int,
        dtypes: Mapping[str, np.dtype],
        model: str,
        name: str,
        waits: Callable[[], AbstractContextManager[object]],
    ) -> None:
        self.settings = settings
        self._execute = execute
        self._batched = max_batch_size > 0
        self._dtypes = dtypes
        corrid = settings.corrid
        self._string_ids = corrid is not None and corrid.dtype.hasobject  # a string CORRID
        self._model = model
        self._waits = waits
        self._lock = threading.Lock()
        self._live: dict[Key, _Sequence] = {}  # by id: those a request may still join
        self._held: set[_Sequence] = set()  # every sequence with a slot or in the backlog
        self._free = [(slot, copy) for slot in range(settings.slots) for copy in range(copies)]
        heapq.heapify(self._free)
        self._backlog: deque[_Sequence] = deque()
        self._closed = False
        self._wake = threading.Condition(self._lock)  # the reaper's
        self._lanes: list[DirectLane] = []
        self._batchers: list[Batcher] = []
        self._copy_locks = [threading.Lock() for _ in range(copies)]
        if settings.strategy == "direct":
            self._lanes = [
                DirectLane(
                    copy,
                    settings.slots,
                    execute,
                    self._filler,
                    batched=self._batched,
                    max_queue_delay_us=settings.max_queue_delay_us,
                    minimum_slot_utilization=settings.minimum_slot_utilization,
                    name=name,
                    waits=waits,
                )
                for copy in range(copies)
            ]
        elif self._batched:
            self._batchers = [
                Batcher(
                    _on_copy(execute, copy),
                    copies=1,
                    max_batch_size=max_batch_size,
                    preferred_batch_sizes=settings.preferred_batch_sizes,
                    max_queue_delay_us=settings.max_queue_delay_us,
                    name=f"{name}-{copy}",
                    merge=self._rows,
                    waits=waits,
                )
                for copy in range(copies)
            ]
        self._reaper = threading.Thread(
            target=self._reap, name=f"neuron-sequence-reaper-{name}", daemon=True
        )
        self._reaper.start()

    # --- a request ------------------------------------------------------------------------
    def submit(self, request: InferRequest, batch: int) -> Batched:
        """Run `request` (checked: its inputs are the model's, `batch` rows) in its
        sequence, in turn; block until it ran. Its outputs include no state output the
        config hides (the caller picks those asked for)."""
        key, start, end = self._check(request, batch)
        item = _Item(request.inputs, start, end)
        with self._lock:
            if self._closed:
                raise _unloading(self._model)
            sequence = self._live.get(key)
            if sequence is None:
                if not start:
                    raise _invalid(
                        f"inference request for sequence {shown(str(key))} to {self._model} must "
                        "specify the START flag on the first request of the sequence (no live "
                        "sequence has this id: it never started, it ended, or it was idle "
                        "longer than max_sequence_idle_microseconds, "
                        f"{self.settings.idle_ns // 1000} us, and was ended)"
                    )
                sequence = self._live[key] = _Sequence(key)
                self._held.add(sequence)
                self._place(sequence)
            elif start:
                log.warning(
                    "Sequence %s of %s started again before it ended: it goes on from this "
                    "request, its state started afresh",
                    shown(str(key)),
                    self._model,
                    extra={"fn": "sequence"},
                )
            sequence.items.append(item)
            sequence.last_ns = item.arrival_ns
            if end:  # a request after it with this id starts another sequence
                del self._live[key]
            self._grant(sequence)
        with self._waits():
            item.turn.wait()
        if item.error is not None:
            raise item.error
        try:
            return self._run(sequence, item)
        finally:
            with self._lock:
                sequence.items.popleft()
                sequence.running = False
                sequence.last_ns = time.monotonic_ns()
                if item.end:
                    self._release(sequence)
                else:
                    self._grant(sequence)

    def _check(self, request: InferRequest, batch: int) -> tuple[Key, bool, bool]:
        key, start, end = sequence_flags(request.parameters)
        if key in (0, ""):
            raise _invalid(
                f"inference request to {self._model} must specify a non-zero or non-empty "
                f"correlation ID: it serves sequences (parameter '{SEQUENCE_ID}', with "
                f"'{SEQUENCE_START}' on a sequence's first request and '{SEQUENCE_END}' on "
                "its last)"
            )
        if batch != 1:
            raise _invalid(
                f"inference request to {self._model} must specify batch-size 1 due to "
                f"requirements of sequence batcher (it has batch size {batch})"
            )
        corrid = self.settings.corrid
        if corrid is not None and isinstance(key, str) != corrid.dtype.hasobject:
            given, wanted = ("BYTES", "integers") if isinstance(key, str) else ("UINT64", "strings")
            expected = "BYTES" if corrid.dtype.hasobject else corrid.datatype_name()[5:]
            raise _invalid(
                f"sequence batching control '{corrid.name}' data-type is '{given}', but "
                f"{self._model} expects '{expected}': its sequence ids are {wanted}"
            )
        if isinstance(key, str) and not key.isascii():
            try:  # a string CORRID carries it to the model, whose strings are UTF-8
                key.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _invalid(
                    f"'{SEQUENCE_ID}' is no UTF-8 text ({exc.reason} at character {exc.start})"
                ) from None
        return key, start, end

    # --- slots and turns (under the lock) -----------------------------------------------------
    def _place(self, sequence: _Sequence) -> None:
        if self._free:
            sequence.slot, sequence.copy = heapq.heappop(self._free)
        else:
            self._backlog.append(sequence)

    def _grant(self, sequence: _Sequence) -> None:
        """Its first request may run, if it has a slot and nothing of it runs."""
        if sequence.placed and not sequence.running and sequence.items:
            sequence.running = True
            sequence.items[0].turn.set()

    def _release(self, sequence: _Sequence) -> None:
        """The sequence is over: its slot goes to the oldest in the backlog, or is free."""
        self._held.discard(sequence)
        slot, copy = sequence.slot, sequence.copy
        sequence.slot = sequence.copy = -1
        if self._backlog:
            waiting = self._backlog.popleft()
            waiting.slot, waiting.copy = slot, copy
            self._grant(waiting)
        else:
            heapq.heappush(self._free, (slot, copy))

    # --- one request's run ------------------------------------------------------------------
    def _run(self, sequence: _Sequence, item: _Item) -> Batched:
        settings = self.settings
        if item.start:
            sequence.states = {s.input_name: s.initial for s in settings.states}
        inputs = self._full(item, sequence)
        copy = sequence.copy
        if self._lanes:
            share = self._lanes[copy].run(sequence.slot, inputs)
            outputs, code, start_ns = share.outputs, share.code, share.start_ns
        elif self._batchers:
            submitted = time.monotonic_ns()
            done = self._batchers[copy].submit(inputs, 1)
            outputs, code, start_ns = done.outputs, done.code, submitted + done.queue_ns
        else:  # oldest, a model that does not batch: one request at a time per copy
            lock = self._copy_locks[copy]
            with self._waits():  # for the copy, off the compute gate's turns
                lock.acquire()
            try:
                start_ns = time.monotonic_ns()
                result = self._execute(copy, dict(inputs))
            finally:
                lock.release()
            outputs, code = dict(result.outputs), result.code
        for state in settings.states:
            value = outputs.get(state.output_name)
            if value is not None:
                sequence.states[state.input_name] = np.array(value[0] if self._batched else value)
        return Batched(outputs, start_ns - item.arrival_ns, 1, code)

    def _full(self, item: _Item, sequence: _Sequence) -> Inputs:
        """The request's inputs, its controls and its states, as the copy takes them."""
        inputs = dict(item.inputs)
        inputs.update(self._controls(item.start, item.end, True, sequence.key))
        for name, value in sequence.states.items():
            inputs[name] = value[np.newaxis] if self._batched else value
        return inputs

    def _controls(self, start: bool, end: bool, ready: bool, corrid: Key | None) -> Inputs:
        """The control inputs of one row; CORRID the sequence id `corrid` (the model's
        type checked in `_check`: an integer cast to its dtype, a string as its UTF-8
        bytes), left out when None."""
        made: Inputs = {}
        rows = (1,) if self._batched else ()
        for control in self.settings.controls:
            shape = (*rows, *control.row)
            if control.kind != CORRID:
                flag = {START: start, END: end, READY: ready}[control.kind]
                value = np.array(control.false_true[flag], control.dtype)
                made[control.name] = np.full(shape, value, control.dtype)
            elif isinstance(corrid, str):
                made[control.name] = np.full(shape, corrid.encode("utf-8"), object)
            elif corrid is not None:
                value = np.array(corrid, np.uint64).astype(control.dtype)
                made[control.name] = np.full(shape, value, control.dtype)
        return made

    def _filler(self, model: Inputs) -> Inputs:
        """A direct batch's row for a slot with no request ready, made like `model` (a
        ready row of the batch): READY (and START, END) false, numbers zeros (CORRID 0),
        strings (a string CORRID too) a copy of `model`'s. Triton gives a filler's
        strings empty, but a model that casts a string to a number refuses an empty one,
        failing the whole batch; a real row's strings it takes, and the filler's answer
        is dropped, as a padded row's is (`copy_padded`)."""
        filler = {
            name: array.copy() if array.dtype.hasobject else np.zeros_like(array)
            for name, array in model.items()
        }
        filler.update(self._controls(False, False, False, None if self._string_ids else 0))
        return filler

    def _rows(self, name: str, blocks: list[np.ndarray]) -> Rows:
        dtype = self._dtypes[name]
        return Rows(tuple(np.ascontiguousarray(block, dtype=dtype) for block in blocks))

    # --- idle sequences -----------------------------------------------------------------------
    def _reap(self) -> None:
        """End each placed sequence with nothing queued that has been idle for
        max_sequence_idle_microseconds; sleep until the next may be."""
        idle_ns = self.settings.idle_ns
        with self._lock:
            while not self._closed:
                now = time.monotonic_ns()
                next_ns = now + idle_ns
                for key, sequence in list(self._live.items()):
                    if not sequence.placed or sequence.items:
                        continue
                    due = sequence.last_ns + idle_ns
                    if due <= now:
                        del self._live[key]
                        self._release(sequence)
                        log.info(
                            "Sequence %s of %s idle for more than %d us: ended, its slot freed",
                            shown(str(key)),
                            self._model,
                            idle_ns // 1000,
                            extra={"fn": "sequence"},
                        )
                    else:
                        next_ns = min(next_ns, due)
                self._wake.wait(max(next_ns - now, 1_000_000) / 1e9)

    # --- its end ----------------------------------------------------------------------------
    def close(self) -> None:
        """Fail every request waiting for its turn (UNAVAILABLE), let those running
        finish, and end the threads."""
        with self._lock:
            self._closed = True
            waiting = [
                item
                for sequence in self._held
                for index, item in enumerate(sequence.items)
                if index or not sequence.running
            ]
            self._live.clear()
            self._backlog.clear()
            self._wake.notify_all()
        for item in waiting:
            item.error = _unloading(self._model)
            item.turn.set()
        for lane in self._lanes:
            lane.close()
        for batcher in self._batchers:
            batcher.close()
        if self._reaper is not threading.current_thread():
            self._reaper.join()


def _on_copy(execute: Execute, copy: int) -> Callable[[int, dict[str, Any]], Executed]:
    """`execute` on copy `copy`, as a one-copy batcher calls it (its copy index is 0)."""
    return lambda _, inputs: execute(copy, inputs)


def _unloading(model: str) -> ServingError:
    return ServingError(
        Status.UNAVAILABLE,
        f"{model} is being unloaded; the request was not run, retry once the model is loaded again",
    )
