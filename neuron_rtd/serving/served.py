"""One served model version: its copies on the runtime (`instance_group` counts summed,
each an ordinary runtime model on an NCG of its own), the checks a request passes before
it runs, and its executions (directly on the least busy copy, through the dynamic
batcher, or, for a model with `sequence_batching`, in its sequence's turn through the
sequence scheduler, `neuron_rtd/serving/sequence.py`), each timed into the version's
statistics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from queue import Empty, SimpleQueue

import numpy as np

from neuron_rtd.errors import (
    BadInput,
    FailedState,
    InferCancelled,
    InferTimeout,
    InvalidError,
    InvalidHandle,
    ModelNotRunning,
    Nerr,
    NrtError,
    QueueFull,
    ResourceError,
    ResourceNcError,
    Stopping,
)
from neuron_rtd.neff import Neff
from neuron_rtd.neff.strings import as_text
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import InferResult, Rows, Runtime
from neuron_rtd.serving.api import InferRequest, InferResponse, ServingError, Status, TensorMeta
from neuron_rtd.serving.batcher import Batcher, batch_rows, same_batch
from neuron_rtd.serving.classification import Labels
from neuron_rtd.serving.config import BatchBuckets
from neuron_rtd.serving.datatypes import datatype_of, datatype_of_config, dtype_of
from neuron_rtd.serving.sequence import SequenceScheduler
from neuron_rtd.serving.sequence_config import SequenceSettings
from neuron_rtd.serving.stats import VersionStats

ModelConfig = model_config_pb.ModelConfig

# Runtime errors that say the model cannot take the request now, not that it was wrong.
_UNAVAILABLE: tuple[type[NrtError], ...] = (
    InferTimeout,
    QueueFull,
    FailedState,
    InferCancelled,
    ModelNotRunning,
    InvalidHandle,
    ResourceError,
    ResourceNcError,
    Stopping,  # the daemon stops: the next one (systemd's restart) may take it
)
_UNAVAILABLE_CODES = {
    Nerr.TIMEOUT,
    Nerr.QUEUE_FULL,
    Nerr.FAILED_STATE,
    Nerr.INFER_CANCELLED,
    Nerr.HW_ERROR,
    Nerr.RESOURCE,
    Nerr.RESOURCE_NC,
    Nerr.INVALID_HANDLE,
}


def serving_error(exc: NrtError, what: str) -> ServingError:
    """A runtime error as the protocol says it, its nerr name and message kept: a bad
    request INVALID_ARGUMENT, a model that cannot take it now UNAVAILABLE, others
    INTERNAL."""
    if isinstance(exc, BadInput | InvalidError) and not isinstance(exc, InvalidHandle):
        status = Status.INVALID_ARGUMENT
    elif isinstance(exc, _UNAVAILABLE) or exc.code in _UNAVAILABLE_CODES:
        status = Status.UNAVAILABLE
    else:
        status = Status.INTERNAL
    return ServingError(status, f"{what}: NERR_{exc.code.name}: {exc.message}")


@dataclass(frozen=True)
class _Input:
    """What a request's input must be: its v2 datatype and shape (-1: any size; the
    batch axis included, first, when the model batches) and the NEFF's bound per axis."""

    name: str
    datatype: str
    dtype: np.dtype
    shape: tuple[int, ...]
    bound: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.datatype} {_shape(self.shape)}"


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class ServedVersion:
    """A version loaded: `copies` runtime model ids. Built by `load_version`."""

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        version: int,
        config: ModelConfig,
        neff: Neff,
        model_ids: Sequence[int],
        sequences: SequenceSettings | None = None,
        labels: Labels | None = None,
    ) -> None:
        self.runtime = runtime
        self.labels: Labels = labels or {}  # its outputs' classification labels
        self.name = name
        self.version = version
        self.version_text = str(version)
        self.config = config
        self.neff = neff
        self.model_ids = tuple(model_ids)
        self.stats = VersionStats(name, self.version_text)
        self.max_batch_size = config.max_batch_size
        self.min_batch_size = BatchBuckets.of(neff).low if self.max_batch_size > 0 else 0
        self.what = f"model '{name}' version {version}"
        self.model = f"model '{name}'"
        self._inputs = tuple(self._input(entry) for entry in config.input)
        self._input_names = {i.name for i in self._inputs}
        self._dtypes = {i.name: i.dtype for i in self._inputs}
        self._slot_dtypes = {t.name: t.dtype for t in neff.inputs}  # the NEFF's own
        # inputs with free axes: their arrays go as they are, their shape the runtime's
        # only word of their sizes (`runtime/shapes.py`)
        self._shaped = frozenset(t.name for t in neff.inputs if t.dynamic)
        self._output_names = tuple(entry.name for entry in config.output)
        self._output_set = frozenset(self._output_names)
        # the runtime answers every output in the NEFF's order: when that is the config's,
        # a request for all of them takes the runtime's answer as it is
        self._outputs_in_order = self._output_names == tuple(t.name for t in neff.outputs)
        self._symbol_axes = tuple(
            (spec.name, axis, symbol)
            for spec in neff.inputs
            for axis, symbol in enumerate(spec.symbols)
            if symbol is not None
        )
        # requests running on each copy, at most its ninfer (the runtime refuses more):
        # the others wait here, as in Triton's queue, their wait counted as queue time
        self._busy = [0] * len(self.model_ids)
        self._slots = runtime.model(self.model_ids[0]).params.ninfer if self.model_ids else 1
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)  # a slot was given back
        self._waiting = 0  # requests waiting for a slot (on `_free`, or for a token)
        # one copy: its free slots are tokens in a queue (taking one is one call of C; a
        # request that finds none waits in the queue, in turn)
        self._tokens: SimpleQueue[None] | None = None
        if len(self.model_ids) == 1:
            self._tokens = SimpleQueue()
            for _ in range(self._slots):
                self._tokens.put(None)
        self.batcher: Batcher | None = None
        if config.HasField("dynamic_batching"):
            batching = config.dynamic_batching
            self.batcher = Batcher(
                self.execute,
                copies=len(self.model_ids),
                max_batch_size=config.max_batch_size,
                preferred_batch_sizes=tuple(batching.preferred_batch_size),
                max_queue_delay_us=batching.max_queue_delay_microseconds,
                name=f"{name}:{version}",
                merge=self._rows,
                waits=runtime.compute_gate.waiting,
            )
        self.sequencer: SequenceScheduler | None = None
        if sequences is not None:
            self.sequencer = SequenceScheduler(
                sequences,
                self.execute,
                copies=len(self.model_ids),
                max_batch_size=config.max_batch_size,
                dtypes=self._slot_dtypes,
                model=self.model,
                name=f"{name}:{version}",
                waits=runtime.compute_gate.waiting,
            )

    def _input(self, entry: model_config_pb.ModelInput) -> _Input:
        spec = next(t for t in self.neff.inputs if t.name == entry.name)
        datatype = datatype_of_config(entry.data_type)
        dims = tuple(int(d) for d in entry.dims)
        shape = (-1, *dims) if self.max_batch_size > 0 else dims
        return _Input(entry.name, datatype, dtype_of(datatype), shape, spec.shape)

    def _rows(self, name: str, blocks: list[np.ndarray]) -> Rows:
        """A batch's rows of input `name` as the runtime reads them into its slot, one
        request's block after another (no concatenated copy first)."""
        dtype = self._dtypes[name]
        return Rows(tuple(np.ascontiguousarray(block, dtype=dtype) for block in blocks))

    # --- what the protocol tells of it --------------------------------------------------
    def tensors(self) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...]]:
        batch = (-1,) if self.max_batch_size > 0 else ()
        inputs = tuple(
            TensorMeta(e.name, datatype_of_config(e.data_type), (*batch, *e.dims))
            for e in self.config.input
        )
        outputs = tuple(
            TensorMeta(e.name, datatype_of_config(e.data_type), (*batch, *e.dims))
            for e in self.config.output
        )
        return inputs, outputs

    # --- a request ------------------------------------------------------------------------
    def infer(self, request: InferRequest, began_ns: int) -> InferResponse:
        """Check `request`, run it, and answer with the outputs it asked for; every
        outcome counted in the statistics (`began_ns`: when it came, perf_counter). Run
        directly, the request and its one execution are counted together, noted without
        a lock (`VersionStats.request_ran`)."""
        try:
            batch = self._check(request)
            asked = request.outputs
            wanted = self._output_names if asked is None else self._wanted(asked)
            if self.batcher is not None or self.sequencer is not None:
                if self.sequencer is not None:  # a sequence's request, in its turn
                    done = self.sequencer.submit(request, batch)
                else:
                    assert self.batcher is not None
                    done = self.batcher.submit(request.inputs, batch)
                outputs, code = done.outputs, done.code
                answer = {name: outputs[name] for name in wanted}
                self.stats.request_done(time.perf_counter_ns() - began_ns, batch, done.queue_ns)
                return InferResponse(self.name, self.version_text, request.id, answer, code)
            sent = self._as_sent(request.inputs)
            copy = self._take_copy()
            try:
                t0 = time.perf_counter_ns()
                result = self.runtime.infer(self.model_ids[copy], sent)
                t1 = time.perf_counter_ns()
            finally:
                self._give_back(copy)
            queue_ns = t0 - began_ns
        except ServingError:
            self.stats.request_failed(time.perf_counter_ns() - began_ns)
            raise
        except NrtError as exc:
            self.stats.request_failed(time.perf_counter_ns() - began_ns)
            raise serving_error(exc, self.what) from None
        outputs = result.outputs
        if wanted is not self._output_names or not self._outputs_in_order:
            outputs = {name: outputs[name] for name in wanted}
        end = time.perf_counter_ns()
        self.stats.request_ran(end - began_ns, batch, queue_ns, t1 - t0, end - t1)
        return InferResponse(self.name, self.version_text, request.id, outputs, result.code)

    def _as_sent(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | bytes]:
        """The inputs as the runtime takes them: an array that lies over all of a
        request's bytes (a raw input as the decoder saw it), of the slot's own dtype, as
        those bytes, which the runtime copies into the slot as it copies nmgr's; any other
        array as it is (the runtime makes it as the slot takes it), as is an input with
        free axes, whose bytes would not tell its shape."""
        sent: dict[str, np.ndarray | bytes] = {}
        slot_dtypes = self._slot_dtypes
        for name, array in inputs.items():
            owner = array.base
            if name in self._shaped:
                sent[name] = array
            elif (
                type(owner) is bytes
                and array.dtype == slot_dtypes[name]
                and len(owner) == array.nbytes
                and array.flags.c_contiguous
            ):
                sent[name] = owner
            else:
                sent[name] = array
        return sent

    def _take_copy(self) -> int:
        """The least busy copy, once one has a free slot (taken); of one copy, a free
        slot's token taken, or awaited."""
        tokens = self._tokens
        if tokens is not None:
            try:
                tokens.get(block=False)
            except Empty:  # none free: wait in turn, counted as pending
                with self._lock:
                    self._waiting += 1
                try:
                    tokens.get()
                finally:
                    with self._lock:
                        self._waiting -= 1
            return 0
        busy = self._busy
        with self._lock:
            while (least := min(busy)) >= self._slots:
                self._waiting += 1
                self._free.wait()
                self._waiting -= 1
            copy = busy.index(least)
            busy[copy] += 1
        return copy

    def pending(self) -> int:
        """Requests that came and have not begun executing: queued for a dynamic batch,
        or waiting for a free slot (Triton's pending request count)."""
        if self.batcher is not None:
            return self.batcher.pending
        return self._waiting

    def _give_back(self, copy: int) -> None:
        tokens = self._tokens
        if tokens is not None:
            tokens.put(None)
            return
        with self._lock:
            self._busy[copy] -= 1
            if self._waiting:  # (a notify with nobody waiting still costs a call)
                self._free.notify()

    def _check(self, request: InferRequest) -> int:
        """The request's batch size (1 for a model that does not batch), once its inputs
        are those of the model, of its datatypes and shapes."""
        given = request.inputs
        if given.keys() != self._input_names:
            self._refuse_names(given)
        batch = 1
        first = ""
        for spec in self._inputs:
            array = given[spec.name]
            if array.dtype != spec.dtype:
                got = datatype_of(array.dtype)
                if got != spec.datatype:
                    raise ServingError(
                        Status.INVALID_ARGUMENT,
                        f"input '{spec.name}' has datatype {got}; model '{self.name}' takes "
                        f"{spec.datatype}",
                    )
            rows = self._check_shape(spec, array.shape)
            if self.max_batch_size > 0:
                batch, first = same_batch(spec.name, rows, first, batch)
            if array.dtype.hasobject:  # strings: UTF-8 text, said before a batch takes them
                try:
                    as_text(array, f"input '{spec.name}'")
                except BadInput as exc:
                    raise ServingError(Status.INVALID_ARGUMENT, exc.message) from None
        return batch

    def _check_shape(self, spec: _Input, shape: tuple[int, ...]) -> int:
        expected = spec.shape
        if shape == expected:  # a fixed shape, as the model takes it
            return 1
        batched = self.max_batch_size > 0
        check_shape(spec.name, shape, expected, self.model, self.max_batch_size)
        rows = 1
        if batched:
            rows = batch_rows(
                spec.name, shape, self.model, self.max_batch_size, self.min_batch_size
            )
        start = 1 if batched else 0
        for axis in range(start, len(shape)):
            if expected[axis] == -1 and 0 < spec.bound[axis] < shape[axis]:  # 0: free
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"input '{spec.name}' has {shape[axis]} on axis {axis}; model "
                    f"'{self.name}' takes at most {spec.bound[axis]} there",
                )
        return rows

    def _refuse_names(self, given: Mapping[str, np.ndarray]) -> None:
        for name in given:
            if name not in self._input_names:
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"model '{self.name}' has no input named '{name}'; its inputs: "
                    + ", ".join(f"'{i.name}' ({i.describe()})" for i in self._inputs),
                )
        missing = [i for i in self._inputs if i.name not in given]
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"model '{self.name}' needs input(s) the request lacks: "
            + ", ".join(f"'{i.name}' ({i.describe()})" for i in missing),
        )

    def _wanted(self, outputs: Sequence[str] | None) -> Sequence[str]:
        return wanted_outputs(outputs, self._output_names, self._output_set, self.model)

    # --- one execution ---------------------------------------------------------------------
    def execute(self, copy: int, inputs: Mapping[str, np.ndarray | Rows]) -> InferResult:
        """One runtime inference of `inputs` on copy `copy` (the batcher's `execute`),
        timed into the statistics: the runtime's result as it is (every output an array of
        its true shape, and its code: a NaN/Inf outcome is kept). The inputs go to the
        runtime as they are: it makes each as its slot takes it (`Runtime.infer`)."""
        t0 = time.perf_counter_ns()
        try:
            result = self.runtime.infer(self.model_ids[copy], inputs)
        except NrtError as exc:
            raise serving_error(exc, self.what) from None
        t1 = time.perf_counter_ns()
        rows = next(iter(inputs.values())).shape[0] if self.max_batch_size > 0 and inputs else 1
        self.stats.execution(rows, 0, t1 - t0, time.perf_counter_ns() - t1)
        return result

    # --- its end -------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Stop batching (queued requests fail UNAVAILABLE) and unload every copy; what
        went wrong, if anything (each copy is unloaded whatever the others do)."""
        if self.batcher is not None:
            self.batcher.close()
        if self.sequencer is not None:
            self.sequencer.close()
        return unload_copies(self.runtime, self.model_ids)


def check_shape(
    name: str, shape: Sequence[int], expected: Sequence[int], model: str, max_batch_size: int
) -> None:
    """INVALID_ARGUMENT unless input `name`'s `shape` fits `expected` (-1: any size; a
    batch axis, when `max_batch_size` > 0, at least 1 row) of `model` ("model 'm'")."""
    batched = max_batch_size > 0
    fits = len(shape) == len(expected) and all(
        got == want or (want == -1 and got >= (1 if axis == 0 and batched else 0))
        for axis, (got, want) in enumerate(zip(shape, expected, strict=True))
    )
    if not fits:
        limit = f" (max_batch_size {max_batch_size})" if batched else ""
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"input '{name}' has shape {_shape(shape)}; {model} takes {_shape(expected)}{limit}",
        )


def wanted_outputs(
    outputs: Sequence[str] | None, names: Sequence[str], known: frozenset[str], model: str
) -> Sequence[str]:
    """The outputs a request asks for (`outputs`; None: all), in the model's order
    (`names`, as a set `known`); INVALID_ARGUMENT naming one `model` has not."""
    if outputs is None:
        return names
    for name in outputs:
        if name not in known:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"{model} has no output named '{name}'; its outputs: "
                + ", ".join(f"'{n}'" for n in names),
            )
    asked = set(outputs)
    return [name for name in names if name in asked]


def unload_copies(runtime: Runtime, model_ids: Sequence[int]) -> list[str]:
    problems = []
    for model_id in model_ids:
        try:
            runtime.unload(model_id)
        except NrtError as exc:
            problems.append(f"model {model_id}: NERR_{exc.code.name}: {exc.message}")
    return problems
