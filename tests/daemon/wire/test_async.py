"""infer_post / infer_wait / infer_poll / infer_check_completion through the real daemon."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from test_wire import assert_nerr, infer, load, outputs

from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import pb, pb_grpc

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def sample() -> SampleModel:
    return build_mlp((16, 32, 8), batch=2, seed=11)


def post(stub: Any, model: Any, inputs: dict[str, np.ndarray]) -> Any:
    return stub.infer_post(
        pb.infer_request(
            h_nn=model, ifmap=[pb.infer_io(name=k, buf=v.tobytes()) for k, v in inputs.items()]
        )
    )


def test_post_then_wait_answers_each_cookie_once(stub: Any, sample: SampleModel) -> None:
    model = load(stub, sample.neff).h_nn
    x = sample.random_inputs(seed=1)
    posted = post(stub, model, x)
    assert posted.status.code == Nerr.OK and posted.cookie > 0
    answer = stub.infer_wait(pb.infer_wait_request(cookie=posted.cookie))
    assert answer.status.code == Nerr.OK
    inline = infer(stub, model.id, x)
    for name, value in outputs(inline, sample).items():
        np.testing.assert_array_equal(outputs(answer, sample)[name], value)
    again = stub.infer_wait(pb.infer_wait_request(cookie=posted.cookie))
    assert_nerr(again.status, Nerr.INVALID_HANDLE, f"cookie {posted.cookie}")
    unknown = stub.infer_poll(pb.infer_wait_request(cookie=987654))
    assert_nerr(unknown.status, Nerr.INVALID_HANDLE, "cookie 987654")
    stub.unload(pb.unload_request(h_nn=model))


def test_poll_and_check_completion(stub: Any, sample: SampleModel) -> None:
    model = load(stub, sample.neff, ninfer=4).h_nn
    cookies = [post(stub, model, sample.random_inputs(seed=i)).cookie for i in range(3)]
    deadline = time.monotonic() + 30
    done: list[int] = []
    while len(done) < 3 and time.monotonic() < deadline:
        done = list(
            stub.infer_check_completion(pb.infer_check_completion_request(cookie=cookies)).cookie
        )
    assert sorted(done) == sorted(cookies)
    for cookie in cookies:
        answer = stub.infer_poll(pb.infer_wait_request(cookie=cookie))
        assert answer.status.code == Nerr.OK and len(answer.ofmap) == 1
        assert_nerr(
            stub.infer_poll(pb.infer_wait_request(cookie=cookie)).status, Nerr.INVALID_HANDLE
        )
    stub.unload(pb.unload_request(h_nn=model))


def test_bad_input_and_full_queue_are_answered_by_the_post(stub: Any) -> None:
    slow = build_mlp((1024, 4096, 4096, 16), batch=64, seed=12)  # tens of ms per inference
    model = load(stub, slow.neff, ninfer=1).h_nn
    wrong = post(stub, model, {"x": np.zeros((3, 5), np.float32)})
    assert_nerr(wrong.status, Nerr.INFER_BAD_INPUT, "expected")
    x = slow.random_inputs(seed=1)
    first = post(stub, model, x)
    second = post(stub, model, x)
    assert first.status.code == Nerr.OK
    assert_nerr(second.status, Nerr.QUEUE_FULL, "ninfer 1")
    assert stub.infer_wait(pb.infer_wait_request(cookie=first.cookie)).status.code == Nerr.OK
    third = post(stub, model, x)  # the slot is free again
    assert stub.infer_wait(pb.infer_wait_request(cookie=third.cookie)).status.code == Nerr.OK
    stub.unload(pb.unload_request(h_nn=model))


def test_infer_stream_answers_each_request_in_order(
    channel: Any, stub: Any, sample: SampleModel
) -> None:
    model = load(stub, sample.neff).h_nn
    inputs = [sample.random_inputs(seed=i) for i in range(5)]
    requests = [
        pb.infer_request(h_nn=model, ifmap=[pb.infer_io(name="x", buf=x["x"].tobytes())])
        for x in inputs
    ]
    requests.insert(2, pb.infer_request(h_nn=pb.h_nn(id=424242)))  # a bad one in between
    answers = list(pb_grpc.nmgr_streamStub(channel).infer_stream(iter(requests)))
    assert [a.status.code for a in answers] == [0, 0, Nerr.INVALID_HANDLE, 0, 0, 0]
    good = [a for a in answers if a.status.code == 0]
    for x, answer in zip(inputs, good, strict=True):
        expected = outputs(infer(stub, model.id, x), sample)
        for name, value in expected.items():
            np.testing.assert_array_equal(outputs(answer, sample)[name], value)
    stub.unload(pb.unload_request(h_nn=model))
