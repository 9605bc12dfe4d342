"""`Inflight` on its own (`neuron_rtd/runtime/inflight.py`): cookies posted, waited for
once, named completed only once ended, bounded per session, kept apart by model, answered
with their error once their model is gone, swept when nobody collects them, and a wait
that gives up."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from answers import expected, slot_answer
from fake_device import GatedDevice

from neuron_rtd.errors import InferCancelled, InferTimeout, InvalidHandle, ResourceError
from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.runtime.inflight import Inflight, Posted
from neuron_rtd.runtime.model import LoadedModel

MakeModel = Callable[..., LoadedModel]  # the `make_model` fixture
WAIT_S = 30.0  # a bound on what must happen, on a loaded machine: a hang fails the test


@pytest.fixture
def inflight() -> Iterator[Inflight]:
    table = Inflight(ttl_s=60.0)
    yield table
    table.close()


def raw(sample: SampleModel, seed: int = 1) -> dict[str, bytes]:
    return {"x": sample.random_inputs(seed)["x"].tobytes()}


def collected(posted: Posted, sample: SampleModel) -> np.ndarray:
    """A waited-for inference's output, and its slot given back."""
    return slot_answer(posted.model, posted.job, sample)


def ended(inflight: Inflight, cookie: int) -> None:
    assert inflight.peek(cookie).job.wait_done(WAIT_S)


def test_a_cookie_is_answered_once(
    make_model: MakeModel, inflight: Inflight, mlp: SampleModel
) -> None:
    model = make_model(mlp)
    x = mlp.random_inputs(1)["x"]
    cookie = inflight.post(model, {"x": x.tobytes()}, extra="kept")
    assert cookie != 0 and model.in_flight == 1
    posted = inflight.wait(cookie)
    assert posted.model is model and posted.extra == "kept" and posted.done
    np.testing.assert_allclose(collected(posted, mlp), expected(mlp, x), rtol=1e-5)
    assert model.in_flight == 0
    for spent in (inflight.wait, inflight.peek):
        with pytest.raises(InvalidHandle, match=f"cookie {cookie} is unknown or was answered"):
            spent(cookie)
    inflight.close()
    with pytest.raises(InferCancelled, match="shutting down"):
        inflight.post(model, raw(mlp))


def test_completed_names_the_ended_cookies_only(
    make_model: MakeModel, inflight: Inflight, gated: GatedDevice, mlp: SampleModel
) -> None:
    model = make_model(mlp)
    first = inflight.post(model, raw(mlp))
    ended(inflight, first)
    gated.hold()
    second = inflight.post(model, raw(mlp))
    gated.wait_begun(2)  # the second one is on its NC, held there
    assert inflight.completed([second, first, 12345]) == [first]
    gated.open()
    ended(inflight, second)
    assert inflight.completed([second, first]) == [second, first]
    for cookie in (first, second):
        collected(inflight.wait(cookie), mlp)


def test_a_session_holds_at_most_its_limit_of_cookies(
    make_model: MakeModel, mlp: SampleModel
) -> None:
    inflight = Inflight(session_limit=1)
    try:
        mine, other = make_model(mlp, session_id=7), make_model(mlp, session_id=8)
        cookie = inflight.post(mine, raw(mlp))
        with pytest.raises(ResourceError, match="session_max_inflight 1"):
            inflight.post(mine, raw(mlp))
        collected(inflight.wait(inflight.post(other, raw(mlp))), mlp)  # its own count
        collected(inflight.wait(cookie), mlp)
        collected(inflight.wait(inflight.post(mine, raw(mlp))), mlp)  # room again
    finally:
        inflight.close()


def test_cookies_of_two_models_answer_each_its_own(
    make_model: MakeModel, inflight: Inflight, mlp: SampleModel, two_stage: SampleModel
) -> None:
    """Waited for in any order, each cookie answers its own model's inference; when one
    model goes, its cookie answers the error that ended it, once, and the other's stays."""
    one, two = make_model(mlp), make_model(two_stage)
    x1, x2 = mlp.random_inputs(1)["x"], two_stage.random_inputs(2)["x"]
    a1, a2 = inflight.post(one, {"x": x1.tobytes()}), inflight.post(two, {"x": x2.tobytes()})
    b1, b2 = inflight.post(one, {"x": x1.tobytes()}), inflight.post(two, {"x": x2.tobytes()})
    posted = inflight.wait(a2)
    assert posted.model is two
    np.testing.assert_allclose(collected(posted, two_stage), expected(two_stage, x2), rtol=1e-5)
    posted = inflight.wait(a1)
    assert posted.model is one
    np.testing.assert_allclose(collected(posted, mlp), expected(mlp, x1), rtol=1e-5)
    ended(inflight, b1)
    one.drop_all("the model was unloaded", WAIT_S)  # what unload does, then forget
    inflight.forget(one)
    assert inflight.completed([b1]) == [b1]
    with pytest.raises(InferCancelled, match="the model was unloaded"):
        inflight.wait(b1)
    with pytest.raises(InvalidHandle):
        inflight.wait(b1)
    np.testing.assert_allclose(
        collected(inflight.wait(b2), two_stage), expected(two_stage, x2), rtol=1e-5
    )


def test_an_uncollected_cookie_is_swept_and_its_slot_given_back(
    make_model: MakeModel, inflight: Inflight, gated: GatedDevice, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=2)
    done = inflight.post(model, raw(mlp))
    ended(inflight, done)
    gated.hold()
    running = inflight.post(model, raw(mlp))
    gated.wait_begun(2)
    later = inflight.peek(done).job.ended + inflight.ttl_s + 1
    assert inflight.sweep(now=later) == [done]  # not the one still running, however old
    assert model.in_flight == 1
    with pytest.raises(InvalidHandle):
        inflight.wait(done)
    gated.open()
    collected(inflight.wait(running), mlp)
    assert model.in_flight == 0


def test_a_wait_gives_up_and_the_slot_is_given_back_when_the_run_ends(
    make_model: MakeModel, inflight: Inflight, gated: GatedDevice, mlp: SampleModel
) -> None:
    """A wait lasts at most what every inference the model may hold could take (here
    0.05 s x 2 + 1 s); the inference, past its own timeout, ends with nobody to answer."""
    model = make_model(mlp, ninfer=1, timeout_s=0.05)
    gated.hold()
    cookie = inflight.post(model, raw(mlp))
    job = inflight.peek(cookie).job
    gated.wait_begun(1)
    with pytest.raises(InferTimeout, match=f"cookie {cookie}: .* has not ended after 1.1 s"):
        inflight.wait(cookie)
    assert model.in_flight == 1  # still running: its slot is its own
    gated.open()
    assert job.wait_done(WAIT_S)
    assert isinstance(job.error, InferTimeout) and model.in_flight == 0
