"""`LoadedModel` on its own (`neuron_rtd/runtime/model.py`): a slot's life, the bound of
`ninfer`, the pipeline, a run that fails, the NaN outcome and a stop at a step boundary,
ordered by the runs the gated device sees begin."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from answers import expected
from answers import slot_answer as answer
from fake_device import GatedDevice
from waiting import wait_until

import driver_sim
from neuron_rtd.errors import FailedState, InferCancelled, Nerr, NrtError, QueueFull
from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.runtime.job import JobState
from neuron_rtd.runtime.model import LoadedModel, ModelState

MakeModel = Callable[..., LoadedModel]  # the `make_model` fixture
WAIT_S = 30.0  # a bound on what must happen, on a loaded machine: a hang fails the test


def inputs(sample: SampleModel, seed: int) -> tuple[np.ndarray, dict[str, bytes]]:
    x = sample.random_inputs(seed)["x"]
    return x, {"x": x.tobytes()}


def test_a_slot_is_taken_filled_run_answered_and_given_back(
    make_model: MakeModel, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    for seed in (1, 2):  # the second inference has the slot the first gave back
        x, raw = inputs(mlp, seed)
        job = model.submit(raw)
        assert job.state is JobState.QUEUED and model.in_flight == 1
        model.run(job)
        assert job.done and job.error is None and job.code == Nerr.OK
        assert model.in_flight == 1  # held until it is answered
        np.testing.assert_allclose(answer(model, job, mlp), expected(mlp, x), rtol=1e-5)
        assert model.in_flight == 0


def test_ninfer_bounds_what_holds_a_slot(make_model: MakeModel, mlp: SampleModel) -> None:
    model = make_model(mlp, ninfer=2)
    _, raw = inputs(mlp, 1)
    first, second = model.submit(raw), model.submit(raw)
    with pytest.raises(QueueFull, match="ninfer 2"):
        model.submit(raw)
    model.run(first)
    with pytest.raises(QueueFull):  # ended, not yet answered: still held
        model.submit(raw)
    answer(model, first, mlp)
    third = model.submit(raw)
    assert {second.slot, third.slot} == {0, 1}
    for job in (second, third):
        model.release(job)
    assert model.in_flight == 0


def test_posted_inferences_overlap_stage_by_stage(
    make_model: MakeModel, gated: GatedDevice, two_stage: SampleModel
) -> None:
    """Two posted inferences of a two-NC model: while one waits on NC 1, the other is on
    NC 0 (a stage each at once), and each runs NC 0 before NC 1."""
    model = make_model(two_stage, ninfer=2)
    gated.hold()
    (x1, raw1), (x2, raw2) = inputs(two_stage, 1), inputs(two_stage, 2)
    jobs = [model.post(raw1), model.post(raw2)]
    assert sorted(gated.wait_begun(2)) == [0, 0]  # both at NC 0, neither let through
    gated.let(1)
    assert sorted(gated.wait_begun(3)) == [0, 0, 1]  # one on NC 1, the other on NC 0
    gated.open()
    assert all(job.wait_done(WAIT_S) for job in jobs)
    assert sorted(gated.begun) == [0, 0, 1, 1]
    for job, x in zip(jobs, (x1, x2), strict=True):
        np.testing.assert_allclose(answer(model, job, two_stage), expected(two_stage, x), rtol=1e-5)
    assert model.in_flight == 0


def test_a_failing_run_answers_its_error_and_gives_its_slot_back(
    make_model: MakeModel, gated: GatedDevice, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    x, raw = inputs(mlp, 1)
    gated.failing = driver_sim.DriverError("NC 0: DMA descriptor refused")
    job = model.infer(raw)
    assert isinstance(job.error, NrtError) and job.error.code == Nerr.FAIL
    assert str(job.error) == f"model {model.id} (mlp): NC 0: DMA descriptor refused"
    with pytest.raises(NrtError, match="DMA descriptor refused"):
        model.outputs(job)
    assert model.in_flight == 0 and model.state is ModelState.READY
    gated.failing = None
    np.testing.assert_allclose(answer(model, model.infer(raw), mlp), expected(mlp, x), rtol=1e-5)


def test_a_hardware_fault_stops_the_model(
    make_model: MakeModel, gated: GatedDevice, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    _, raw = inputs(mlp, 1)
    gated.failing = driver_sim.HwFault("NC 0: uncorrectable ECC error")
    job = model.infer(raw)
    with pytest.raises(NrtError, match="uncorrectable ECC error") as raised:
        model.outputs(job)
    assert raised.value.code == Nerr.HW_ERROR
    assert model.state is ModelState.FAILED and model.in_flight == 0
    with pytest.raises(FailedState, match="stopped after an error"):
        model.submit(raw)


def test_a_nan_in_an_output_is_the_inferences_outcome_code(
    make_model: MakeModel, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    x = np.full((1, 8), np.nan, np.float32)
    job = model.infer({"x": x.tobytes()})
    assert job.error is None and job.code == Nerr.INFER_COMPLETED_WITH_NUM_ERR
    assert np.isnan(answer(model, job, mlp)).all()  # answered, NaN and all
    _, raw = inputs(mlp, 1)
    job = model.infer(raw)  # the same slot: its code is its own
    assert job.code == Nerr.OK
    answer(model, job, mlp)


def test_a_stop_ends_a_running_inference_at_its_next_step(
    make_model: MakeModel, gated: GatedDevice, two_stage: SampleModel
) -> None:
    model = make_model(two_stage, ninfer=1)
    _, raw = inputs(two_stage, 1)
    gated.hold()
    job = model.post(raw)
    assert gated.wait_begun(1) == [0]
    cancelled: list[int] = []
    stopping = threading.Thread(target=lambda: cancelled.append(model.cancel("stopped")))
    stopping.start()
    wait_until(lambda: job.cancel is not None, WAIT_S, "the stop marks the inference")
    gated.open()  # its NC 0 run ends; it never begins on NC 1
    stopping.join(WAIT_S)
    assert cancelled == [1] and job.wait_done(WAIT_S)
    assert gated.begun == [0]
    with pytest.raises(InferCancelled, match="inference cancelled: stopped"):
        model.outputs(job)
    assert model.in_flight == 0
