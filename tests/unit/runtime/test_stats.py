"""The runtime's counters and metrics in process: outcomes, overflow, windows, buckets."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from neuron_rtd.errors import BadInput, HwError, InferCancelled, InferTimeout, Nerr
from neuron_rtd.proto import pb
from neuron_rtd.runtime.stats import (
    LATENCY_BOUNDS_US,
    ErrorSubtype,
    InferStatus,
    Metric,
    Stats,
    Tally,
    bucket_bound,
    outcome,
    summarize,
)


def job(error: object = None, code: Nerr = Nerr.OK) -> object:
    return SimpleNamespace(
        error=error, code=code, started=1.0, posted=0.5, ended=1.5, nc_ns=2000, cycles=7000
    )


def test_the_counters_enums_are_the_wires() -> None:
    """The transport-free runtime restates the nmgr wire's enums (the wire sends a value
    by its name, `pb.infer_status.Name`): every value, of the same name."""
    for ours, wire, prefix in (
        (InferStatus, pb.infer_status, "IST_"),
        (ErrorSubtype, pb.infer_error_subtype, "INFER_ERROR_SUBTYPE_"),
        (Metric, pb.metric_type, "NMGR_METRIC_"),
    ):
        theirs = {  # CYCLESx1k: the one name not in capitals
            name.removeprefix(prefix).upper().replace("CYCLESX1K", "CYCLES_X1K"): value
            for name, value in wire.items()
            if name != "NMGR_METRIC_NUM"  # a count, not a metric
        }
        assert {m.name: m.value for m in ours} == theirs


def test_outcomes() -> None:
    assert outcome(None, Nerr.OK) == (InferStatus.OK, ErrorSubtype.NONE)
    assert outcome(None, Nerr.INFER_COMPLETED_WITH_NUM_ERR) == (
        InferStatus.COMPLETED_WITH_NUM_ERR,
        ErrorSubtype.NUMERICAL,
    )
    assert outcome(InferTimeout("t"), Nerr.OK)[0] is InferStatus.TIMEOUT
    assert outcome(BadInput("b"), Nerr.OK)[0] is InferStatus.BAD_INPUT
    assert outcome(HwError("h"), Nerr.OK)[1] is ErrorSubtype.HW_ERROR
    assert outcome(InferCancelled("c"), Nerr.OK) == (InferStatus.UNKNOWN, ErrorSubtype.RT)


_model_ids = itertools.count(1)


def model() -> object:
    return SimpleNamespace(id=next(_model_ids))


def test_samples_overflow_and_a_read_takes_them() -> None:
    stats = Stats(capacity=3)
    for _ in range(5):
        stats.inference_done(model(), job())  # type: ignore[arg-type]
    stats.inference_done(model(), job(InferTimeout("late")))  # type: ignore[arg-type]
    counters = stats.snapshot()
    assert counters.infer_count == 6
    assert counters.infer_status == {InferStatus.OK: 5, InferStatus.TIMEOUT: 1}
    assert counters.error_subtype == {ErrorSubtype.TRANSIENT: 1}
    series = {s.metric: s for s in stats.read_metrics(0)}
    latency = series[Metric.INFER_LATENCY]
    assert len(latency.samples) == 3 and latency.overflow  # 6 came, 3 kept
    assert [v for _, v in latency.samples] == [1e6] * 3  # posted -> ended, microseconds
    assert [v for _, v in series[Metric.INFER_ON_INFA_CYCLES_X1K].samples] == [7.0] * 3
    assert not series[Metric.MODEL_SIZE].overflow and not series[Metric.MODEL_SIZE].samples
    again = {s.metric: s for s in stats.read_metrics(0)}
    assert not again[Metric.INFER_LATENCY].samples and not again[Metric.INFER_LATENCY].overflow


def test_tallies_and_latency_histograms_are_not_taken_by_a_read() -> None:
    stats = Stats(capacity=3)
    a, b = model(), model()
    for _ in range(4):
        stats.inference_done(a, job())  # type: ignore[arg-type]
    stats.inference_done(b, job(InferTimeout("late")))  # type: ignore[arg-type]
    stats.inference_done(b, job(code=Nerr.INFER_COMPLETED_WITH_NUM_ERR))  # type: ignore[arg-type]
    stats.rejected(b, BadInput("short"))  # type: ignore[arg-type]
    stats.queue_drop(b)  # type: ignore[arg-type]
    stats.read_metrics(0)  # takes the samples, not these
    assert stats.tallies([a, b]) == [  # type: ignore[list-item]
        Tally(completed=4),
        Tally(timed_out=1, completed_with_num_err=1, incorrect_input=1, failed_to_queue=1),
    ]
    total, on_nc = stats.latency()
    assert total.total == on_nc.total == 6 and total.sum == pytest.approx(6e6)
    # a value lands in the first bucket whose bound is at or above it: 1 s, 2 us
    assert total.counts[LATENCY_BOUNDS_US.index(2.0**20)] == 6  # 2**19.875 < 1e6 <= 2**20
    assert on_nc.counts[LATENCY_BOUNDS_US.index(2.0)] == 6


def test_windows_and_histogram() -> None:
    second = 1_000_000_000
    samples = [(10 * second + 1, 3.0), (10 * second + 5, 40.0), (11 * second, 7.0)]
    first, last = summarize(samples, second)
    assert (first.start_ns, first.count, first.min, first.max, first.sum) == (
        10 * second,
        2,
        3.0,
        40.0,
        43.0,
    )
    assert first.values == (5.0, 50.0) and first.counts == (1, 1)
    assert (last.start_ns, last.count, last.values) == (11 * second, 1, (10.0,))


@pytest.mark.parametrize(
    ("value", "bound"), [(0.0, 0.0), (1.0, 1.0), (1.5, 2.0), (3.0, 5.0), (7.0, 10.0), (0.03, 0.05)]
)
def test_bucket_bounds(value: float, bound: float) -> None:
    assert bucket_bound(value) == pytest.approx(bound)


def test_a_sample_ring_keeps_the_latest_samples_in_order_in_16_bytes_each() -> None:
    from neuron_rtd.runtime.stats import SampleRing

    ring = SampleRing(4)
    assert ring.drain() == []
    for i in range(6):  # two past its capacity: the oldest two are gone
        ring.append((i, i / 2))
    assert len(ring) == 4
    assert ring.drain() == [(2, 1.0), (3, 1.5), (4, 2.0), (5, 2.5)]
    assert len(ring) == 0 and ring.drain() == []
    ring.append((9, 4.5))
    assert ring.drain() == [(9, 4.5)]
    big = SampleRing(100_000)
    assert big._times.nbytes + big._values.nbytes == 16 * 100_000
