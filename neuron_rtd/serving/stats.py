"""Per model version statistics, as the protocol's `ModelStatistics` reports them.

- a request: `success` (count, ns of the whole request) or `fail`; `queue` (waiting in
  the dynamic batcher, or for a copy); `inference_count` adds its batch size and
  `last_inference` its end (ms since the epoch).
- an execution (one `runtime.infer`; several requests share one when batched):
  `execution_count`, `compute_input` (making the runtime's inputs: concatenation,
  copies), `compute_infer` (the runtime's inference), `compute_output` (reshaping the
  outputs), and the same three per execution batch size in `batch_stats`.

So `compute_*` counts executions, not requests (as many when nothing is batched).
Updates take one short lock; a request run on its own (and its execution) takes none: it
is noted, and counted with the others noted when a reader asks (or every FOLD_AFTER).
Nothing is built until a reader asks.

An ensemble's request is counted as Triton counts it: once, as a request and one
execution of its batch size, whose compute times are the sums of its steps' (each step's
request, counted by its own model as any request, also adds its compute times to the
tally its ensemble set on the step's thread: `STEPS.tally`).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from neuron_rtd.proto import kserve_pb

# The counters of `ModelStatistics`, each a (count, ns) pair at these places of a flat
# list (one list per version, and one per execution batch size for the three compute
# ones): a request's update is a few additions in place, no call.
SUCCESS, FAIL, QUEUE = 0, 2, 4
INPUT, INFER, OUTPUT = 0, 2, 4  # in a compute list
FOLD_AFTER = 256  # requests run on their own noted before they are counted, at most


class _StepTally(threading.local):
    """Where the requests run on this thread add their compute times, when an ensemble
    runs them as its steps (a compute list, or None)."""

    tally: list[int] | None = None


STEPS = _StepTally()


def _executed(compute: list[int], count: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
    """`count` executions added to a compute list, with their times summed (a request
    run on its own has its input made by the runtime itself: no input time)."""
    compute[INPUT] += count
    compute[INPUT + 1] += input_ns
    compute[INFER] += count
    compute[INFER + 1] += infer_ns
    compute[OUTPUT] += count
    compute[OUTPUT + 1] += output_ns


def _duration(into: kserve_pb.StatisticDuration, counters: list[int], at: int) -> None:
    into.count = counters[at]
    into.ns = counters[at + 1]


class VersionStats:
    """One served version's statistics; every method may be called from any thread."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._last_ms = 0
        self._inferences = 0
        self._executions = 0
        self._requests = [0] * 6  # SUCCESS, FAIL, QUEUE
        self._compute = [0] * 6  # INPUT, INFER, OUTPUT
        self._batches: dict[int, list[int]] = {}  # batch size -> INPUT, INFER, OUTPUT
        # requests run on their own, not yet counted: (ns, batch size, queue ns, infer ns,
        # output ns, their end in ns since the epoch)
        self._ran: deque[tuple[int, int, int, int, int, int]] = deque()

    def request_done(self, ns: int, batch_size: int, queue_ns: int) -> None:
        """A request answered, `ns` after it came, `queue_ns` of which it waited."""
        self._answered(ns, batch_size, queue_ns)
        tally = STEPS.tally
        if tally is not None:  # a step of an ensemble: its execution's time, from its batch's
            _executed(tally, 1, 0, ns - queue_ns, 0)

    def _answered(self, ns: int, batch_size: int, queue_ns: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            requests = self._requests
            requests[SUCCESS] += 1
            requests[SUCCESS + 1] += ns
            requests[QUEUE] += 1
            requests[QUEUE + 1] += queue_ns
            self._inferences += batch_size
            self._last_ms = now_ms

    def request_ran(
        self, ns: int, batch_size: int, queue_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """A request answered by an execution of its own (no batcher): `request_done`
        and `execution` at once. It is noted without the lock (a deque's append is one
        step) and counted when the statistics are read, or once FOLD_AFTER are noted."""
        ran = self._ran
        ran.append((ns, batch_size, queue_ns, infer_ns, output_ns, time.time_ns()))
        tally = STEPS.tally
        if tally is not None:
            _executed(tally, 1, 0, infer_ns, output_ns)
        if len(ran) >= FOLD_AFTER:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Count the requests `request_ran` noted (under the lock): those noted when it
        starts (others noted meanwhile wait for the next fold), summed column by column."""
        ran = self._ran
        count = len(ran)
        if not count:
            return
        take = ran.popleft
        noted = [take() for _ in range(count)]
        ns, sizes, queue_ns, infer_ns, output_ns, ends = zip(*noted, strict=True)
        requests = self._requests
        requests[SUCCESS] += count
        requests[SUCCESS + 1] += sum(ns)
        requests[QUEUE] += count
        requests[QUEUE + 1] += sum(queue_ns)
        self._inferences += sum(sizes)
        self._executions += count
        _executed(self._compute, count, 0, sum(infer_ns), sum(output_ns))
        batches = self._batches
        if min(sizes) == max(sizes):  # one batch size (always, for a model that does not batch)
            size = sizes[0]
            per_size = batches.get(size) or batches.setdefault(size, [0] * 6)
            _executed(per_size, count, 0, sum(infer_ns), sum(output_ns))
        else:
            for _, size, _, infer, output, _ in noted:
                per_size = batches.get(size) or batches.setdefault(size, [0] * 6)
                _executed(per_size, 1, 0, infer, output)
        self._last_ms = max(self._last_ms, max(ends) // 1_000_000)

    def request_failed(self, ns: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._requests[FAIL] += 1
            self._requests[FAIL + 1] += ns
            self._last_ms = now_ms

    def execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One runtime execution of `batch_size` rows (1 for a model without batching)."""
        with self._lock:
            self._executions += 1
            per_size = self._batches.get(batch_size)
            if per_size is None:
                per_size = self._batches[batch_size] = [0] * 6
            _executed(self._compute, 1, input_ns, infer_ns, output_ns)
            _executed(per_size, 1, input_ns, infer_ns, output_ns)

    def ensemble_ran(self, ns: int, batch_size: int, queue_ns: int, steps: list[int]) -> None:
        """An ensemble's request answered: a request, and one execution whose compute
        times are its steps' summed (`steps`, a compute list), as Triton counts it."""
        times = (steps[INPUT + 1], steps[INFER + 1], steps[OUTPUT + 1])
        self._answered(ns, batch_size, queue_ns)
        self.execution(batch_size, *times)
        tally = STEPS.tally
        if tally is not None:  # itself a step of an ensemble: its steps' times, to that one
            _executed(tally, 1, *times)

    def message(self) -> kserve_pb.ModelStatistics:
        stats = kserve_pb.ModelStatistics(name=self.name, version=self.version)
        with self._lock:
            self._fold()
            stats.last_inference = self._last_ms
            stats.inference_count = self._inferences
            stats.execution_count = self._executions
            infer = stats.inference_stats
            _duration(infer.success, self._requests, SUCCESS)
            _duration(infer.fail, self._requests, FAIL)
            _duration(infer.queue, self._requests, QUEUE)
            _duration(infer.compute_input, self._compute, INPUT)
            _duration(infer.compute_infer, self._compute, INFER)
            _duration(infer.compute_output, self._compute, OUTPUT)
            for size in sorted(self._batches):
                compute = self._batches[size]
                batch = stats.batch_stats.add(batch_size=size)
                _duration(batch.compute_input, compute, INPUT)
                _duration(batch.compute_infer, compute, INFER)
                _duration(batch.compute_output, compute, OUTPUT)
        return stats
