"""What two ext snapshots say about the interval between them (neuron_rtd.client.observe):
percentiles from histogram buckets, NC utilization, rates, vCPU; and a Watch on a daemon."""

from __future__ import annotations

import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.client.observe import Watch, interval, origin, percentiles
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import ext_pb
from neuron_rtd.runtime import LATENCY_BOUNDS_US, Histogram


def histogram(values: list[float]) -> ext_pb.ext_histogram:
    h = Histogram()
    for value in values:
        h.add(value)
    return ext_pb.ext_histogram(
        bounds_us=LATENCY_BOUNDS_US, counts=h.counts, total=h.total, sum_us=h.sum
    )


def test_percentiles_of_the_values_added_between_two_reads_within_a_bucket() -> None:
    early = [5.0] * 50
    late = [100.0 + k for k in range(100)]  # 100 .. 199 us
    before, after = histogram(early), histogram(early + late)
    got = percentiles(before, after)
    assert got is not None
    for name, want in (("p0", 100.0), ("p50", 149.5), ("p99", 198.0), ("p100", 199.0)):
        assert got[name] == pytest.approx(want, rel=0.09), name
    assert percentiles(after, after) is None  # nothing added
    assert percentiles(None, before) == pytest.approx({k: 5.0 for k in got}, rel=0.09)


def snap(
    time_s: float, busy_ms: list[int], completed: int, cpu_s: float
) -> ext_pb.snapshot_response:
    return ext_pb.snapshot_response(
        time_ns=int(time_s * 1e9),
        cpu_user_s=cpu_s,
        cpu_system_s=cpu_s / 2,
        ncs=[ext_pb.ext_nc(vnc=i, busy_ns=ms * 1_000_000) for i, ms in enumerate(busy_ms)],
        models=[ext_pb.ext_model(id=10001, tally=ext_pb.ext_infer_tally(completed=completed))],
        latency=histogram([]),
        nc_latency=histogram([]),
    )


def test_interval_utilization_rates_and_vcpu() -> None:
    before = snap(10.0, [0, 500, 900], completed=4, cpu_s=1.0)
    after = snap(12.0, [1000, 500, 100], completed=24, cpu_s=1.5)  # NC 2 was reset
    got = interval(before, after)
    assert got.seconds == pytest.approx(2.0)
    assert got.nc_utilization == pytest.approx({0: 50.0, 1: 0.0, 2: 5.0})
    assert got.model_tallies[10001]["completed"] == 20
    assert got.model_rates == pytest.approx({10001: 10.0})
    assert (got.vcpu_user, got.vcpu_system) == pytest.approx((25.0, 12.5))
    assert got.latency_us is None


def test_a_watch_of_no_daemon_says_so(tmp_path: object) -> None:
    no_daemon = pytest.raises(NrtClientError, match=r"no runtime answers at unix:.*none\.sock")
    with Watch(f"unix:{tmp_path}/none.sock", timeout_s=1) as watch, no_daemon:
        watch.snapshot()


def test_an_interval_from_the_origin_is_the_time_since_the_start() -> None:
    now = snap(12.0, [1000, 0], completed=4, cpu_s=1.0)
    now.latency.CopyFrom(histogram([100.0, 200.0]))
    got = interval(origin(10_000_000_000, now), now)
    assert got.seconds == pytest.approx(2.0)
    assert got.nc_utilization == pytest.approx({0: 50.0, 1: 0.0})
    assert got.model_tallies[10001]["completed"] == 4
    assert (got.vcpu_user, got.vcpu_system) == pytest.approx((50.0, 25.0))
    assert got.latency_us is not None and got.latency_us["p100"] == pytest.approx(200.0, rel=0.09)
    assert got.nc_latency_us is None


def test_a_watch_reads_the_daemons_counters(daemon: DaemonProcess) -> None:
    sample = build_mlp((16, 8), name="counted")
    with Watch(daemon.address) as watch, Client(daemon.address) as client:
        model = client.load(sample.neff)
        before = watch.counters().infer_count
        model.infer(sample.random_inputs(0))
        model.infer(sample.random_inputs(1))
        after = watch.counters()
    assert after.infer_count == before + 2
    assert after.model_load_count >= 1
