"""The runtime's own counters (`nmgr_counters`) and metrics (`read_all_metrics`).

Counters count from the runtime's start. Metrics are samples kept per metric type in a
bounded buffer; a read takes the samples gathered since the previous read and sums them
up over windows of `summarize_period` seconds (0: every sample as it is). When more samples
came than the buffer holds, the oldest are lost and that metric says `overflow`.

Units: latencies in microseconds, sizes in bytes, cycles in thousands.

Besides, for observers that must not take each other's samples (neuron-monitor,
neuron-top, several at once), counts that only grow: each model's `Tally` of how its
inferences ended, and a `Histogram` of every inference's latency (total and on the NCs)
in fine fixed buckets. An observer diffs two reads: rates and percentiles over its own
interval.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from neuron_rtd.errors import (
    BadInput,
    HwError,
    InferCancelled,
    InferError,
    InferTimeout,
    Nerr,
    NrtError,
)

if TYPE_CHECKING:
    from neuron_rtd.runtime.job import Job
    from neuron_rtd.runtime.model import LoadedModel


class InferStatus(enum.IntEnum):  # the wire's `infer_status`
    OK = 0
    COMPLETED_WITH_NUM_ERR = 1
    COMPLETED_WITH_ERR = 2
    BAD_INPUT = 3
    TIMEOUT = 4
    UNKNOWN = 15


class ErrorSubtype(enum.IntEnum):  # the wire's `infer_error_subtype`
    NONE = 0
    NUMERICAL = 1
    MODEL = 2
    TRANSIENT = 3
    HW_ERROR = 4
    RT = 5


class Metric(enum.IntEnum):  # the wire's `metric_type`
    INFER_LATENCY = 0
    INFER_ON_INFA_LATENCY = 1
    MODEL_START_LATENCY = 2
    MODEL_STOP_LATENCY = 3
    MODEL_LOAD_LATENCY = 4
    MODEL_UNLOAD_LATENCY = 5
    MODEL_SIZE = 6
    MODEL_NUM_NC = 7
    MODEL_MAJOR_VERSION = 8
    INFER_ON_INFA_CYCLES_X1K = 9


# What most inferences end as, looked up once (an enum member costs a lookup through its
# class each time it is named).
_NERR_OK = Nerr.OK
_IST_OK = InferStatus.OK
_NO_SUBTYPE = ErrorSubtype.NONE

_PER_INFERENCE = (
    Metric.INFER_LATENCY,
    Metric.INFER_ON_INFA_LATENCY,
    Metric.INFER_ON_INFA_CYCLES_X1K,
)
METRIC_CAPACITY = 100_000  # samples kept per metric type between two reads
# Upper bounds of the latency histogram's buckets, in microseconds: 2**(k/8), from 1 us to
# about 134 s, each 9% above the one before (a percentile read from them is within 9%).
LATENCY_BOUNDS_US = tuple(2.0 ** (k / 8) for k in range(8 * 27 + 1))


@dataclass
class NmgrCounters:
    infer_status: Counter[InferStatus] = field(default_factory=Counter)
    error_subtype: Counter[ErrorSubtype] = field(default_factory=Counter)
    infer_queue_drop_count: int = 0
    infer_count: int = 0
    model_start_count: int = 0
    model_stop_count: int = 0
    model_load_count: int = 0
    model_unload_count: int = 0
    neff_version_max: tuple[int, int] = (0, 0)
    neff_version_min: tuple[int, int] = (0, 0)
    neff_size_bytes_max: int = 0
    neff_num_ncs_max: int = 0


@dataclass(frozen=True)
class Aggregate:
    start_ns: int  # the window's start
    min: float
    max: float
    count: int
    sum: float
    values: tuple[float, ...]  # histogram: each bucket's upper bound (1-2-5 series) ...
    counts: tuple[int, ...]  # ... and how many samples fell in it


@dataclass
class MetricSeries:
    metric: Metric
    samples: list[tuple[int, float]]  # (time ns since the epoch, value), summarize_period 0
    aggregates: list[Aggregate]
    overflow: bool


@dataclass
class Tally:
    """How one model's inferences ended, counted since it was loaded (the names of
    neuron-monitor's `inference_summary`)."""

    completed: int = 0
    completed_with_err: int = 0
    completed_with_num_err: int = 0
    timed_out: int = 0
    incorrect_input: int = 0
    failed_to_queue: int = 0
    cancelled: int = 0

    def count(self, status: InferStatus) -> None:
        name = _TALLIED[status]
        setattr(self, name, getattr(self, name) + 1)


_TALLIED = {
    InferStatus.OK: "completed",
    InferStatus.COMPLETED_WITH_NUM_ERR: "completed_with_num_err",
    InferStatus.COMPLETED_WITH_ERR: "completed_with_err",
    InferStatus.BAD_INPUT: "incorrect_input",
    InferStatus.TIMEOUT: "timed_out",
    InferStatus.UNKNOWN: "cancelled",
}


@dataclass
class Histogram:
    """Counts of values per bucket of `LATENCY_BOUNDS_US` (the last bucket: above them)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_US) + 1))
    total: int = 0
    sum: float = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BOUNDS_US, value)] += 1
        self.total += 1
        self.sum += value

    def copy(self) -> Histogram:
        return Histogram(list(self.counts), self.total, self.sum)


def outcome(error: NrtError | None, code: Nerr) -> tuple[InferStatus, ErrorSubtype]:
    """How an inference that ended with `error` (or result `code`) is counted."""
    if error is None:
        if code == Nerr.INFER_COMPLETED_WITH_NUM_ERR:
            return InferStatus.COMPLETED_WITH_NUM_ERR, ErrorSubtype.NUMERICAL
        return InferStatus.OK, ErrorSubtype.NONE
    if isinstance(error, BadInput):
        return InferStatus.BAD_INPUT, ErrorSubtype.MODEL
    if isinstance(error, InferTimeout):
        return InferStatus.TIMEOUT, ErrorSubtype.TRANSIENT
    if isinstance(error, HwError):
        return InferStatus.COMPLETED_WITH_ERR, ErrorSubtype.HW_ERROR
    if isinstance(error, InferCancelled):
        return InferStatus.UNKNOWN, ErrorSubtype.RT
    if isinstance(error, InferError):
        return InferStatus.COMPLETED_WITH_ERR, ErrorSubtype.MODEL
    return InferStatus.COMPLETED_WITH_ERR, ErrorSubtype.RT


class LogCounter(logging.Handler):
    """Counts the warnings and errors logged under `nrtd`."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.warnings = 0
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors += 1
        else:
            self.warnings += 1


class SampleRing:
    """The latest `capacity` samples (time in ns, value) of one metric type, in two
    arrays: 16 bytes a sample, whose memory is taken as the ring first fills and never
    more (a deque of tuples took about 130 bytes a sample)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._times = np.empty(capacity, np.int64)
        self._values = np.empty(capacity, np.float64)
        # The arrays as a sample is written into them: an item set through a memoryview
        # makes no call into numpy (slow on the caches an inference has just had).
        self._time_items = self._times.data.cast("B").cast("q")
        self._value_items = self._values.data.cast("B").cast("d")
        self._next = 0
        self._held = 0

    def append(self, sample: tuple[int, float]) -> None:
        at = self._next
        self._time_items[at], self._value_items[at] = sample
        self._next = at + 1 if at + 1 < self.capacity else 0
        if self._held < self.capacity:
            self._held += 1

    def __len__(self) -> int:
        return self._held

    def drain(self) -> list[tuple[int, float]]:
        """The samples held, oldest first; the ring is empty afterwards."""
        held, start = self._held, (self._next - self._held) % self.capacity
        order = (np.arange(held) + start) % self.capacity
        taken = list(zip(self._times[order].tolist(), self._values[order].tolist(), strict=True))
        self._held = 0
        return taken


class Stats:
    """Counters and metrics of one runtime; every method is thread-safe."""

    def __init__(self, capacity: int = METRIC_CAPACITY) -> None:
        self._lock = threading.Lock()
        self.counters = NmgrCounters()
        self._capacity = capacity
        self._samples = {m: SampleRing(capacity) for m in Metric}
        # Those every inference adds to, at hand.
        self._infer_latency = self._samples[Metric.INFER_LATENCY]
        self._infer_nc_latency = self._samples[Metric.INFER_ON_INFA_LATENCY]
        self._infer_cycles = self._samples[Metric.INFER_ON_INFA_CYCLES_X1K]
        self._seen: Counter[Metric] = Counter()  # samples added since the last read
        self._seen_infer = 0  # ... of the three per-inference metrics, each
        self.logs = LogCounter()
        self._latency = Histogram()  # INFER_LATENCY, never drained
        self._nc_latency = Histogram()  # INFER_ON_INFA_LATENCY, never drained
        self._tallies: dict[int, Tally] = {}  # each model's, by id, since it was built

    # --- what happens -----------------------------------------------------------
    def inference_done(self, model: LoadedModel, job: Job) -> None:
        error, code = job.error, job.code
        now = time.time_ns()
        with self._lock:
            if error is None and code == _NERR_OK:  # the common case, quickly
                self._count(model, _IST_OK, _NO_SUBTYPE)
            else:
                self._count(model, *outcome(error, code))
            if job.started:
                latency_us, nc_us = (job.ended - job.posted) * 1e6, job.nc_ns / 1e3
                self._infer_latency.append((now, latency_us))
                self._infer_nc_latency.append((now, nc_us))
                self._infer_cycles.append((now, job.cycles / 1e3))
                self._seen_infer += 1
                self._latency.add(latency_us)
                self._nc_latency.add(nc_us)

    def queue_drop(self, model: LoadedModel) -> None:
        with self._lock:
            self.counters.infer_queue_drop_count += 1
            self._tally(model).failed_to_queue += 1

    def rejected(self, model: LoadedModel, error: NrtError) -> None:
        with self._lock:
            self._count(model, *outcome(error, error.code))

    def _count(self, model: LoadedModel, status: InferStatus, subtype: ErrorSubtype) -> None:
        """An inference that ended as `status`, `subtype` (under the lock)."""
        c = self.counters
        c.infer_count += 1
        c.infer_status[status] += 1
        if subtype is not _NO_SUBTYPE:
            c.error_subtype[subtype] += 1
        self._tally(model).count(status)

    def model_loaded(self, model: LoadedModel, seconds: float) -> None:
        neff = model.neff
        version = (neff.header.major, neff.header.minor)
        size = neff.header.header_size + neff.header.data_size
        now = time.time_ns()
        with self._lock:
            c = self.counters
            first = c.model_load_count == 0
            c.model_load_count += 1
            c.neff_version_max = version if first else max(c.neff_version_max, version)
            c.neff_version_min = version if first else min(c.neff_version_min, version)
            c.neff_size_bytes_max = max(c.neff_size_bytes_max, size)
            c.neff_num_ncs_max = max(c.neff_num_ncs_max, neff.nc_count)
            self._add(Metric.MODEL_LOAD_LATENCY, now, seconds * 1e6)
            self._add(Metric.MODEL_SIZE, now, float(size))
            self._add(Metric.MODEL_NUM_NC, now, float(neff.nc_count))
            self._add(Metric.MODEL_MAJOR_VERSION, now, float(version[0]))

    def model_built(self, model_id: int) -> None:
        """Model `model_id` was built (a load, or a reload after a reset): its tally
        starts from nothing."""
        with self._lock:
            self._tallies[model_id] = Tally()

    def model_gone(self, model_id: int) -> None:
        """Model `model_id` was unloaded: its tally goes with it."""
        with self._lock:
            self._tallies.pop(model_id, None)

    def _tally(self, model: LoadedModel) -> Tally:
        """The tally of `model` (under the lock)."""
        tally = self._tallies.get(model.id)
        if tally is None:
            tally = self._tallies[model.id] = Tally()
        return tally

    def model_event(self, metric: Metric, seconds: float) -> None:
        """A start, stop or unload that took `seconds`."""
        count = {
            Metric.MODEL_START_LATENCY: "model_start_count",
            Metric.MODEL_STOP_LATENCY: "model_stop_count",
            Metric.MODEL_UNLOAD_LATENCY: "model_unload_count",
        }[metric]
        with self._lock:
            setattr(self.counters, count, getattr(self.counters, count) + 1)
            self._add(metric, time.time_ns(), seconds * 1e6)

    def _add(self, metric: Metric, ts_ns: int, value: float) -> None:
        self._samples[metric].append((ts_ns, value))
        self._seen[metric] += 1

    # --- reads ----------------------------------------------------------------------
    def snapshot(self) -> NmgrCounters:
        with self._lock:
            return _copy_counters(self.counters)

    def tallies(self, models: list[LoadedModel]) -> list[Tally]:
        """A copy of each model's tally, all read at one instant."""
        with self._lock:
            return [dataclasses.replace(self._tallies.get(m.id, Tally())) for m in models]

    def latency(self) -> tuple[Histogram, Histogram]:
        """Copies of the latency histograms: total, and on the NCs."""
        with self._lock:
            return self._latency.copy(), self._nc_latency.copy()

    def read_metrics(self, summarize_period_s: int) -> list[MetricSeries]:
        """Every metric type with the samples since the last read: as they are
        (`summarize_period_s` 0) or summed up per window of that many seconds."""
        with self._lock:
            taken = {m: ring.drain() for m, ring in self._samples.items()}
            for metric in _PER_INFERENCE:
                self._seen[metric] += self._seen_infer
            overflow = {m: self._seen[m] > self._capacity for m in Metric}
            self._seen.clear()
            self._seen_infer = 0
        series = []
        for metric in Metric:
            samples = taken[metric]
            if summarize_period_s <= 0:
                series.append(MetricSeries(metric, samples, [], overflow[metric]))
            else:
                aggs = summarize(samples, summarize_period_s * 1_000_000_000)
                series.append(MetricSeries(metric, [], aggs, overflow[metric]))
        return series


def _copy_counters(c: NmgrCounters) -> NmgrCounters:
    fields = dict(c.__dict__)
    fields["infer_status"] = Counter(c.infer_status)
    fields["error_subtype"] = Counter(c.error_subtype)
    return NmgrCounters(**fields)


def summarize(samples: list[tuple[int, float]], period_ns: int) -> list[Aggregate]:
    """The samples grouped by window of `period_ns` (aligned to the epoch), each window's
    min, max, count, sum and histogram."""
    windows: dict[int, list[float]] = {}
    for ts, value in samples:
        windows.setdefault(ts - ts % period_ns, []).append(value)
    result = []
    for start, values in sorted(windows.items()):
        buckets = Counter(bucket_bound(v) for v in values)
        bounds = sorted(buckets)
        result.append(
            Aggregate(
                start_ns=start,
                min=min(values),
                max=max(values),
                count=len(values),
                sum=math.fsum(values),
                values=tuple(bounds),
                counts=tuple(buckets[b] for b in bounds),
            )
        )
    return result


def bucket_bound(value: float) -> float:
    """The smallest number of the 1-2-5 series (..., 0.5, 1, 2, 5, 10, ...) >= `value`."""
    if value <= 0:
        return 0.0
    decade = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 5.0, 10.0):
        bound = step * decade
        if value <= bound * (1 + 1e-12):
            return bound
    return 10 * decade
