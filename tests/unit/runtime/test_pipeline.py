"""The per-model pipeline in process: inferences of a multi-NC model overlap stage by
stage, shared-NC mode runs one at a time, and posted inferences keep their slot until they
are collected (or dropped by the cookie sweep). Each NC run is gated (`GatedDevice`): the
tests see runs begin and let them through, so what they show holds on a loaded machine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_device import GatedDevice
from waiting import wait_until

from neuron_rtd.errors import InferCancelled, InvalidHandle, QueueFull
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.runtime import LoadMode, LocalRuntime

WAIT_S = 30.0  # a bound on what must happen, on a loaded machine: a hang fails the test


@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime("inf1.xlarge", wrap_device=GatedDevice) as rt:
        yield rt
        device(rt).open()  # nothing left held when it closes


def device(local: LocalRuntime) -> GatedDevice:
    first = local.devices[0]
    assert isinstance(first, GatedDevice)
    return first


@pytest.fixture(scope="module")
def four_stages() -> SampleModel:
    return build_mlp((32, 64, 64, 64, 8), batch=2, neuron_nodes=4, seed=5)


def collect(
    local: LocalRuntime,
    model: Any,
    sample: SampleModel,
    cookies: list[int],
    inputs: list[dict[str, np.ndarray]],
) -> None:
    """Wait for each posted inference: its outputs are the sample's."""
    for cookie, x in zip(cookies, inputs, strict=True):
        got = local.wait(model, cookie)
        for name, value in sample.reference(x).items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def test_stages_of_different_inferences_overlap(
    local: LocalRuntime, four_stages: SampleModel
) -> None:
    """Request 2 on NC 0 while request 1 is on NC 1: both held there at once."""
    model = local.load(four_stages.neff, ninfer=4)
    assert model.mode is LoadMode.NORMAL and len(model.vncs) == 4
    gated = device(local)
    gated.hold()
    inputs = [four_stages.random_inputs(seed=i) for i in range(2)]
    cookies = [local.post(model, x) for x in inputs]
    assert sorted(gated.wait_begun(2)) == [0, 0]
    gated.let(1)
    assert sorted(gated.wait_begun(3)) == [0, 0, 1]  # one on NC 1, the other on NC 0
    gated.open()
    collect(local, model, four_stages, cookies, inputs)
    assert sorted(gated.begun) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_shared_nc_mode_runs_one_inference_at_a_time(
    local: LocalRuntime, four_stages: SampleModel
) -> None:
    """Two inferences posted at once: their 8 runs begin one by one, each only once the
    one before was let through (none of the second while the first is under way)."""
    ncg = local.runtime.create_ncg(1)  # 4 Neuron nodes on 1 NC
    model = local.load(four_stages.neff, ninfer=4, ncg_id=ncg.id)
    local.runtime.start(model.id)
    assert model.mode is LoadMode.SHARED
    gated = device(local)
    gated.hold()
    inputs = [four_stages.random_inputs(seed=i) for i in range(2)]
    cookies = [local.post(model, x) for x in inputs]
    for runs in range(1, 9):
        assert len(gated.wait_begun(runs)) == runs
        assert len(gated.begun) == runs  # the run held is the only one begun
        gated.let(1)
    collect(local, model, four_stages, cookies, inputs)
    assert gated.begun == [0] * 8


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
    for cookie in (second, third):
        assert inflight.peek(cookie).job.wait_done(WAIT_S)
    later = max(inflight.peek(c).job.ended for c in (second, third)) + inflight.ttl_s + 1
    assert sorted(inflight.sweep(now=later)) == sorted([second, third])
    assert local.runtime.model(model.id).in_flight == 0  # both uncollected ones dropped
    for cookie in (second, third):
        with pytest.raises(InvalidHandle, match=f"cookie {cookie}"):
            local.wait(model, cookie)


def test_stop_cancels_posted_inferences(local: LocalRuntime, four_stages: SampleModel) -> None:
    """Four posted, the first held on its first NC: a stop ends them all, the first at its
    next step."""
    model = local.load(four_stages.neff, ninfer=4)
    gated = device(local)
    gated.hold()
    x = four_stages.random_inputs(seed=2)
    cookies = [local.post(model, x) for _ in range(4)]
    gated.wait_begun(1)
    loaded = local.runtime._models[model.id]
    stopping = threading.Thread(target=local.runtime.stop, args=(model.id,))
    stopping.start()
    wait_until(lambda: all(j.cancel for j in list(loaded._jobs)), WAIT_S, "the stop's marks")
    gated.open()
    stopping.join(WAIT_S)
    assert not stopping.is_alive()
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


def test_models_on_different_ncgs_run_in_parallel(local: LocalRuntime) -> None:
    """A run of each model held at once, on its own NC: neither waits for the other."""
    sample = build_mlp((32, 64, 8), batch=2, seed=6)
    first = local.load(sample.neff, ninfer=2)
    second = local.load(sample.neff, ninfer=2)
    assert first.ncg_id != second.ncg_id and set(first.vncs).isdisjoint(second.vncs)
    gated = device(local)
    gated.hold()
    x = sample.random_inputs(seed=1)
    cookies = [(m, local.post(m, x)) for m in (first, second)]
    assert sorted(gated.wait_begun(2)) == sorted([*first.vncs, *second.vncs])
    gated.open()
    for model, cookie in cookies:
        got = local.wait(model, cookie)
        np.testing.assert_allclose(got["probs"], sample.reference(x)["probs"], rtol=1e-5)
