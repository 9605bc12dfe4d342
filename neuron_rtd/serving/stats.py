"""Per model version statistics, as the protocol's `ModelStatistics` reports them.

- a request: `success` (count, ns of the whole request) or `fail`; `queue` (waiting in
  the dynamic batcher, or for a copy); `inference_count` adds its batch size and
  `last_inference` its end (ms since the epoch).
- an execution (one `runtime.infer`; several requests share one when batched):
  `execution_count`, `compute_input` (making the runtime's inputs: concatenation,
  copies), `compute_infer` (the runtime's inference), `compute_output` (reshaping the
  outputs), and the same three per execution batch size in `batch_stats`.

So `compute_*` counts executions, not requests (as many when nothing is batched).
Updates take one short lock (a request run on its own, and its execution, one together);
nothing is built until a reader asks.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from neuron_rtd.proto import kserve_pb


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to(self, message: kserve_pb.StatisticDuration) -> None:
        message.count = self.count
        message.ns = self.ns


@dataclass
class _Compute:
    input: _Duration = field(default_factory=_Duration)
    infer: _Duration = field(default_factory=_Duration)
    output: _Duration = field(default_factory=_Duration)

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input.add(input_ns)
        self.infer.add(infer_ns)
        self.output.add(output_ns)


class VersionStats:
    """One served version's statistics; every method may be called from any thread."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._last_ms = 0
        self._inferences = 0
        self._executions = 0
        self._success = _Duration()
        self._fail = _Duration()
        self._queue = _Duration()
        self._compute = _Compute()
        self._batches: dict[int, _Compute] = {}

    def request_done(self, ns: int, batch_size: int, queue_ns: int) -> None:
        """A request answered, `ns` after it came, `queue_ns` of which it waited."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._success.add(ns)
            self._queue.add(queue_ns)
            self._inferences += batch_size
            self._last_ms = now_ms

    def request_ran(
        self, ns: int, batch_size: int, queue_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """A request answered by an execution of its own (no batcher): `request_done`
        and `execution` at once, under the lock once (its fields added in place: this is
        every direct request's cost)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            success, queue, compute = self._success, self._queue, self._compute
            success.count += 1
            success.ns += ns
            queue.count += 1
            queue.ns += queue_ns
            self._inferences += batch_size
            self._last_ms = now_ms
            self._executions += 1
            per_size = self._batches.get(batch_size)
            if per_size is None:
                per_size = self._batches[batch_size] = _Compute()
            for each in (compute, per_size):
                each.input.count += 1
                each.infer.count += 1
                each.infer.ns += infer_ns
                each.output.count += 1
                each.output.ns += output_ns

    def request_failed(self, ns: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._fail.add(ns)
            self._last_ms = now_ms

    def execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One runtime execution of `batch_size` rows (1 for a model without batching)."""
        with self._lock:
            self._executions += 1
            self._compute.add(input_ns, infer_ns, output_ns)
            per_size = self._batches.get(batch_size)
            if per_size is None:
                per_size = self._batches[batch_size] = _Compute()
            per_size.add(input_ns, infer_ns, output_ns)

    def message(self) -> kserve_pb.ModelStatistics:
        stats = kserve_pb.ModelStatistics(name=self.name, version=self.version)
        with self._lock:
            stats.last_inference = self._last_ms
            stats.inference_count = self._inferences
            stats.execution_count = self._executions
            infer = stats.inference_stats
            self._success.to(infer.success)
            self._fail.to(infer.fail)
            self._queue.to(infer.queue)
            self._compute.input.to(infer.compute_input)
            self._compute.infer.to(infer.compute_infer)
            self._compute.output.to(infer.compute_output)
            for size in sorted(self._batches):
                compute = self._batches[size]
                batch = stats.batch_stats.add(batch_size=size)
                compute.input.to(batch.compute_input)
                compute.infer.to(batch.compute_infer)
                compute.output.to(batch.compute_output)
        return stats
