"""The gRPC front over an in-process serving core: a request of raw inputs with no
parameters is decoded in one pass (`kserve_messages.raw_inputs`), and answers, or is refused,
exactly as the general way (`lifted_inputs`, `decode`, `response_message`) answers it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from test_serving_repository import MLP, serve, write_repo

from neuron_rtd.proto import kserve_pb
from neuron_rtd.runtime import LocalRuntime, stranger
from neuron_rtd.server import kserve, kserve_messages
from neuron_rtd.server.kserve_codec import OutputIn, decode
from neuron_rtd.serving import Serving, ServingError

Request = kserve_pb.ModelInferRequest


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    """Model "m": the MLP (input "x", FP32 (1, 8); output "probs")."""
    with LocalRuntime() as local:
        serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}))
        yield serving
        serving.close()


def general(serving: Serving, request: Request) -> kserve_pb.ModelInferResponse:
    """The answer the general way gives (every request may take it)."""
    shm = serving.shm(stranger())
    inputs, _ = kserve_messages.lifted_inputs(request)
    outputs = [
        OutputIn(o.name, kserve_messages.parameters_of(o.parameters)) for o in request.outputs
    ]
    decoded = decode(
        request.model_name,
        request.model_version,
        request.id,
        kserve_messages.parameters_of(request.parameters),
        inputs,
        outputs,
        shm,
        kserve_messages.SOURCES,
    )
    return kserve_messages.response_message(request, decoded, serving.infer(decoded.request), shm)


def outcome(answer: Callable[[], kserve_pb.ModelInferResponse]) -> bytes | str:
    try:
        return answer().SerializeToString(deterministic=True)
    except ServingError as exc:
        return f"{exc.status.name}: {exc.message}"


def request(*inputs: tuple[str, str, list[int], bytes | None]) -> Request:
    message = Request(model_name="m", id="r1")
    for name, datatype, shape, data in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        if data is not None:
            message.raw_input_contents.append(data)
    return message


X = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32).tobytes()

REQUESTS = {
    "common": request(("x", "FP32", [1, 8], X)),
    "the same name twice": request(("x", "FP32", [1, 8], X), ("x", "FP32", [1, 8], X)),
    "a size that is not the shape's": request(("x", "FP32", [1, 8], X[:-4])),
    "an unknown datatype": request(("x", "FP33", [1, 8], X)),
    "a negative dimension": request(("x", "FP32", [-1, 8], X)),
    "another datatype": request(("x", "INT32", [1, 8], X)),
    "another shape": request(("x", "FP32", [2, 4], X)),
    "an input the model lacks": request(("x", "FP32", [1, 8], X), ("z", "FP32", [1], X[:4])),
    "no input": request(),
    "fewer raw contents than inputs": request(("x", "FP32", [1, 8], X), ("z", "FP32", [1], None)),
}


@pytest.mark.parametrize("case", REQUESTS)
def test_one_pass_answers_as_the_general_way(serving: Serving, case: str) -> None:
    message = REQUESTS[case]
    servicer = kserve.KServeServicer(serving)
    fast = outcome(lambda: servicer.infer(message, stranger))
    assert fast == outcome(lambda: general(serving, message))
    assert isinstance(fast, str) == (case != "common"), fast  # every other one refused
    if case == "common":
        assert kserve_messages.raw_inputs(message) is not None
        answer = kserve_pb.ModelInferResponse.FromString(fast)  # type: ignore[arg-type]
        assert [o.name for o in answer.outputs] == ["probs"]
        assert answer.id == "r1"
        expected = MLP.reference({"x": np.frombuffer(X, np.float32).reshape(1, 8)})["probs"]
        got = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_other_requests_take_the_general_way() -> None:
    """Typed contents, parameters, outputs named or request parameters: not one pass."""
    typed = request(("x", "FP32", [1, 8], None))
    typed.inputs[0].contents.fp32_contents.extend([0.0] * 8)
    assert kserve_messages.raw_inputs(typed) is None
    named = request(("x", "FP32", [1, 8], X))
    named.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert kserve_messages.raw_inputs(named) is None
    assert (
        kserve_messages.raw_inputs(request(("x", "FP32", [1, 8], X), ("y", "FP32", [1], None)))
        is None
    )


def test_an_answers_head_made_once_serves_each_request_as_its_own(serving: Serving) -> None:
    """`all_outputs` copies the head (model, version, outputs) it made for the first
    answer: later answers, with their own id or none, are as the general way makes
    them, and one head is kept for them all."""
    servicer = kserve.KServeServicer(serving)
    for request_id, version in (("r1", ""), ("", ""), ("r2", "1"), ("r3", "")):
        message = request(("x", "FP32", [1, 8], X))
        message.id = request_id
        message.model_version = version
        fast = outcome(lambda m=message: servicer.infer(m, stranger))  # type: ignore[misc]
        assert fast == outcome(lambda m=message: general(serving, m))  # type: ignore[misc]
    assert len(servicer._heads) == 1
