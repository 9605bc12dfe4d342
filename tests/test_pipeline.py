"""The per-model pipeline in process: inferences of a multi-NC model overlap stage by
stage, shared-NC mode runs one at a time, and posted inferences keep their slot until they
are collected (or dropped by the cookie sweep)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from fake_device import WrappedDevice

from neuron_rtd.errors import InferCancelled, InvalidHandle, QueueFull
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.runtime import DeviceApi, InstrRecorder, LoadMode, LocalRuntime, RunFn

Runs = list[tuple[int, float, float]]  # (NC index, start, end) of each NC run


class TimedDevice(WrappedDevice):
    """Its NC runs are timed: from the start of the run (where an injected delay sleeps)
    to the end of its outputs' copy, one run at a time per NC as on the NC itself."""

    def __init__(self, device: DeviceApi, runs: Runs) -> None:
        super().__init__(device)
        self._runs = runs
        self._locks = [threading.Lock() for _ in range(device.spec.nc_count)]

    def wrap_run(self, nc: int, run: RunFn) -> RunFn:
        lock = self._locks[nc]

        def timed(
            inputs: Mapping[str, Any],
            outputs: Mapping[str, Any],
            recorder: InstrRecorder | None = None,
        ) -> int:
            with lock:
                start = time.monotonic()
                cycles = run(inputs, outputs, recorder)
                self._runs.append((nc, start, time.monotonic()))
            return cycles

        return timed


@pytest.fixture
def nc_runs() -> Runs:
    return []


@pytest.fixture
def local(nc_runs: Runs) -> Iterator[LocalRuntime]:
    with LocalRuntime("inf1.xlarge", wrap_device=lambda d: TimedDevice(d, nc_runs)) as rt:
        yield rt


def device(local: LocalRuntime) -> TimedDevice:
    first = local.devices[0]
    assert isinstance(first, TimedDevice)
    return first


@pytest.fixture(scope="module")
def four_stages() -> SampleModel:
    return build_mlp((32, 64, 64, 64, 8), batch=2, neuron_nodes=4, seed=5)


def overlapping_pairs(runs: list[tuple[int, float, float]]) -> int:
    """How many pairs of runs on different NCs were running at the same time."""
    return sum(
        1
        for i, (nc_a, a0, a1) in enumerate(runs)
        for nc_b, b0, b1 in runs[i + 1 :]
        if nc_a != nc_b and a0 < b1 and b0 < a1
    )


def run_posted(local: LocalRuntime, model: Any, sample: SampleModel, n: int) -> None:
    inputs = [sample.random_inputs(seed=i) for i in range(n)]
    cookies = [local.post(model, x) for x in inputs]
    for cookie, x in zip(cookies, inputs, strict=True):
        got = local.wait(model, cookie)
        for name, value in sample.reference(x).items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def test_stages_of_different_inferences_overlap(
    local: LocalRuntime, four_stages: SampleModel, nc_runs: list[tuple[int, float, float]]
) -> None:
    model = local.load(four_stages.neff, ninfer=4)
    assert model.mode is LoadMode.NORMAL and len(model.vncs) == 4
    device(local).inject("nc_delay_ms=40")  # each stage long enough to be seen
    run_posted(local, model, four_stages, 4)
    assert len(nc_runs) == 16
    assert overlapping_pairs(nc_runs) >= 3  # request k+1 on NC i while request k on NC i+1
    for nc in range(4):  # each NC still runs one thing at a time
        mine = sorted((a, b) for n, a, b in nc_runs if n == nc)
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(mine))


def test_shared_nc_mode_runs_one_inference_at_a_time(
    local: LocalRuntime, four_stages: SampleModel, nc_runs: list[tuple[int, float, float]]
) -> None:
    ncg = local.runtime.create_ncg(1)  # 4 Neuron nodes on 1 NC
    model = local.load(four_stages.neff, ninfer=4, ncg_id=ncg.id)
    local.runtime.start(model.id)
    assert model.mode is LoadMode.SHARED
    device(local).inject("nc_delay_ms=10")
    run_posted(local, model, four_stages, 4)
    assert len(nc_runs) == 16
    runs = sorted(nc_runs, key=lambda r: r[1])
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(runs))


def test_slot_is_held_until_collected_and_swept_when_never(
    local: LocalRuntime, four_stages: SampleModel
) -> None:
    model = local.load(four_stages.neff, ninfer=2)
    x = four_stages.random_inputs(seed=1)
    first, second = local.post(model, x), local.post(model, x)
    with pytest.raises(QueueFull, match="ninfer 2"):
        local.post(model, x)
    local.wait(model, first)
    third = local.post(model, x)  # the collected one's slot
    inflight = local.runtime._inflight  # the cookie table's sweep, made to run now
    inflight.ttl_s = 0.0
    deadline = time.monotonic() + 10
    while len(inflight.sweep()) < 2 and time.monotonic() < deadline:
        inflight.ttl_s = 0.0
        time.sleep(0.01)
    assert local.runtime.model(model.id).in_flight == 0  # both uncollected ones dropped
    for cookie in (second, third):
        with pytest.raises(InvalidHandle, match=f"cookie {cookie}"):
            local.wait(model, cookie)


def test_stop_cancels_posted_inferences(local: LocalRuntime, four_stages: SampleModel) -> None:
    model = local.load(four_stages.neff, ninfer=4)
    device(local).inject("nc_delay_ms=50")
    x = four_stages.random_inputs(seed=2)
    cookies = [local.post(model, x) for _ in range(4)]
    local.runtime.stop(model.id)
    for cookie in cookies:
        with pytest.raises(InferCancelled, match="stopped"):
            local.wait(model, cookie)
    assert local.runtime.model(model.id).in_flight == 0


def test_nc_runs_side_by_side_share_the_blas_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs in progress share the BLAS threads; the fast engine's cores are shared
    by the most runs in progress at once within the last OVERLAP_MEMORY_S (a run alone
    between two that took turns side by side does not take them all)."""
    from driver_sim import blas

    clock = [1000.0]
    monkeypatch.setattr("driver_sim.blas.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("driver_sim.blas._peak_until", 0.0)
    most = blas.threads()
    assert blas.run_starts(4) == 4  # one run alone has them all
    assert blas.threads() == most
    assert blas.run_starts(4) == 2  # two share them
    assert blas.threads() == max(1, most // 2)
    blas.run_ends()
    assert blas.threads() == most
    blas.run_ends()
    clock[0] += blas.OVERLAP_MEMORY_S / 2
    assert blas.run_starts(4) == 2  # alone, but two ran at once a moment ago
    assert blas.threads() == most
    blas.run_ends()
    clock[0] += blas.OVERLAP_MEMORY_S
    assert blas.run_starts(4) == 4  # alone for a while: all of them again
    blas.run_ends()


def test_models_on_different_ncgs_run_in_parallel(
    local: LocalRuntime, nc_runs: list[tuple[int, float, float]]
) -> None:
    sample = build_mlp((32, 64, 8), batch=2, seed=6)
    first = local.load(sample.neff, ninfer=2)
    second = local.load(sample.neff, ninfer=2)
    assert first.ncg_id != second.ncg_id and set(first.vncs).isdisjoint(second.vncs)
    device(local).inject("nc_delay_ms=40")
    x = sample.random_inputs(seed=1)
    cookies = [(m, local.post(m, x)) for _ in range(2) for m in (first, second)]
    for model, cookie in cookies:
        got = local.wait(model, cookie)
        np.testing.assert_allclose(got["probs"], sample.reference(x)["probs"], rtol=1e-5)
    assert len(nc_runs) == 4
    assert overlapping_pairs(nc_runs) >= 1  # the two models' NCs were busy at once
