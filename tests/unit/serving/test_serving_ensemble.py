"""Ensembles in the serving core, in process: a chain and a fan-out/fan-in of NEFF models
answering as their steps computed by hand, independent steps running at once, the
statistics of the steps and of the ensemble, every refusal at load (Triton's words first)
and of a request, a step's error named, and an ensemble following its composing models
as they are unloaded and loaded again."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from test_serving_repository import index, refusal, serve, write_repo

from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import ComputeGate, LocalRuntime
from neuron_rtd.serving import InferRequest, InferResponse, Serving, ServingError, Status
from neuron_rtd.serving.ensemble import EnsembleVersion, StepPool
from neuron_rtd.serving.ensemble_config import check_ensemble_fields, complete_ensemble
from neuron_rtd.serving.stats import STEPS, VersionStats

RNG = np.random.default_rng(11)
W_PRE, W_LEFT, W_RIGHT = (RNG.standard_normal((4, 4)).astype(np.float32) for _ in range(3))


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    ins: list[str],
    outs: list[str],
    weights: dict[str, np.ndarray],
    batch: str | int = "N",
) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4]) for n in ins]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4]) for n in outs]
    init = [numpy_helper.from_array(w, n) for n, w in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def layer(name: str, activation: str, w: np.ndarray, batch: str | int = "N") -> bytes:
    """y = activation(x @ w): x, y (batch, 4) float32."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node(activation, ["h"], ["y"]),
    ]
    model = _model(name, nodes, ["x"], ["y"], {"w": w}, batch)
    buckets = bucket_ranges(1, 8) if batch == "N" else None
    return compile_model(model, dynamic_batch=buckets, name=name).neff


def join() -> bytes:
    """s = a + b: (batch, 4) float32 each."""
    model = _model("join", [helper.make_node("Add", ["a", "b"], ["s"])], ["a", "b"], ["s"], {})
    return compile_model(model, dynamic_batch=bucket_ranges(1, 8), name="join").neff


NEFFS = {
    "pre": layer("pre", "Relu", W_PRE),
    "left": layer("left", "Sigmoid", W_LEFT),
    "right": layer("right", "Tanh", W_RIGHT),
    "join": join(),
    "fixed": layer("fixed", "Relu", W_PRE, batch=1),  # x [1, 4], no batch axis
}


def by_hand(x: np.ndarray) -> dict[str, np.ndarray]:
    h = np.maximum(x @ W_PRE, 0)
    left, right = 1 / (1 + np.exp(-(h @ W_LEFT))), np.tanh(h @ W_RIGHT)
    return {"h": h, "left": left, "right": right, "sum": left + right}


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def ensemble(
    *steps: str,
    inputs: str = "IN",
    outputs: str = "OUT",
    batch: int = 8,
    data_type: str = "TYPE_FP32",
    extra: str = "",
) -> str:
    """An ensemble's config.pbtxt: FP32 [4] inputs and outputs (comma-separated names)."""

    def tensors(names: str) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: {data_type} dims: [ 4 ] }}' for n in names.split(",")
        )

    return (
        f'platform: "ensemble"\nmax_batch_size: {batch}\n{extra}\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


CHAIN = ensemble(step("pre", {"x": "IN"}, {"y": "h"}), step("left", {"x": "h"}, {"y": "OUT"}))
FAN = ensemble(
    step("pre", {"x": "IN"}, {"y": "H"}),  # H: read by two steps, and an output too
    step("left", {"x": "H"}, {"y": "l"}),
    step("right", {"x": "H"}, {"y": "r"}, version=1),
    step("join", {"a": "l", "b": "r"}, {"s": "OUT"}),
    outputs="OUT,H",
)


def repository(root: Path, **ensembles: str) -> Path:
    """The composing models' NEFFs, and each ensemble's config with an empty `1/`."""
    write_repo(root, {name: {1: neff} for name, neff in NEFFS.items()}, **ensembles)
    for name in ensembles:
        (root / name / "1").mkdir()
    return root


@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


@pytest.fixture
def serving(local: LocalRuntime, tmp_path: Path) -> Iterator[Serving]:
    served = serve(local, repository(tmp_path, chain=CHAIN, fan=FAN))
    yield served
    served.close()


def x_of(rows: int) -> np.ndarray:
    return RNG.standard_normal((rows, 4)).astype(np.float32)


# --- answers -------------------------------------------------------------------------------
def test_a_chain_answers_as_its_steps_computed_by_hand(serving: Serving) -> None:
    x = x_of(3)
    response = serving.infer(InferRequest("chain", {"IN": x}, id="r1"))
    assert (response.model, response.version, response.id) == ("chain", "1", "r1")
    assert list(response.outputs) == ["OUT"]
    np.testing.assert_allclose(response.outputs["OUT"], by_hand(x)["left"], rtol=1e-5, atol=1e-6)


def test_a_fan_out_and_fan_in_answers_as_by_hand_and_its_outputs_as_asked(
    serving: Serving,
) -> None:
    x = x_of(2)
    expected = by_hand(x)
    both = serving.infer(InferRequest("fan", {"IN": x})).outputs
    assert list(both) == ["OUT", "H"]  # the config's order
    np.testing.assert_allclose(both["OUT"], expected["sum"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(both["H"], expected["h"], rtol=1e-5, atol=1e-6)
    one = serving.infer(InferRequest("fan", {"IN": x}, outputs=["H"])).outputs
    assert list(one) == ["H"]
    np.testing.assert_allclose(one["H"], expected["h"], rtol=1e-5, atol=1e-6)


def test_an_ensemble_is_described_by_its_config(serving: Serving) -> None:
    metadata = serving.model_metadata("fan")
    assert (metadata.platform, metadata.versions) == ("ensemble", ("1",))
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs] == [("IN", "FP32", (-1, 4))]
    assert [t.name for t in metadata.outputs] == ["OUT", "H"]
    config = serving.model_config("fan")
    assert (config.name, config.platform, config.backend) == ("fan", "ensemble", "")
    assert [s.model_name for s in config.ensemble_scheduling.step] == [
        "pre",
        "left",
        "right",
        "join",
    ]
    assert config.version_policy.latest.num_versions == 1


# --- statistics ----------------------------------------------------------------------------
def test_steps_count_in_their_models_and_the_ensemble_once_with_their_compute_summed(
    serving: Serving,
) -> None:
    serving.infer(InferRequest("fan", {"IN": x_of(3)}))
    serving.infer(InferRequest("fan", {"IN": x_of(2)}))
    steps = {
        name: serving.model_statistics(name).model_stats[0]
        for name in ("pre", "left", "right", "join")
    }
    for name, stats in steps.items():
        assert (stats.inference_count, stats.execution_count) == (5, 2), name
        assert stats.inference_stats.success.count == 2, name
    (fan,) = serving.model_statistics("fan").model_stats
    infer = fan.inference_stats
    assert (fan.inference_count, fan.execution_count) == (5, 2)
    assert (infer.success.count, infer.fail.count, infer.queue.count) == (2, 0, 2)
    assert infer.compute_infer.count == 2
    for part in ("compute_input", "compute_infer", "compute_output"):
        summed = sum(getattr(s.inference_stats, part).ns for s in steps.values())
        assert getattr(infer, part).ns == summed, part
    assert [(b.batch_size, b.compute_infer.count) for b in fan.batch_stats] == [(2, 1), (3, 1)]


def test_an_ensembles_own_count_goes_to_the_ensemble_it_is_a_step_of() -> None:
    """A nested ensemble is a step: its steps' compute times go on to the outer tally."""
    outer = [0] * 6
    STEPS.tally = outer
    try:
        VersionStats("inner", "1").ensemble_ran(100, 2, 1, [1, 5, 1, 40, 1, 7])
    finally:
        STEPS.tally = None
    assert outer == [1, 5, 1, 40, 1, 7]


# --- steps at once -------------------------------------------------------------------------
class _Waiting:
    """A composing version whose infer waits (up to 10 s) until `parties` run at once."""

    def __init__(self, barrier: threading.Barrier, config: model_config_pb.ModelConfig) -> None:
        self.barrier = barrier
        self.config = config
        self.threads: list[str] = []

    def infer(self, request: InferRequest, began_ns: int) -> InferResponse:
        self.threads.append(threading.current_thread().name)
        self.barrier.wait(timeout=10)
        (array,) = request.inputs.values()
        return InferResponse(request.model, "1", request.id, {"y": array + 1})


class _Held:
    def __init__(self, version: _Waiting) -> None:
        self.versions = {1: version}
        self.failed: dict[int, str] = {}
        self.reason = ""


class _Failing(_Waiting):
    def infer(self, request: InferRequest, began_ns: int) -> InferResponse:
        raise ServingError(Status.INVALID_ARGUMENT, "input 'x' is not to its liking")


def both(a: _Waiting, b: _Waiting, pool: StepPool) -> EnsembleVersion:
    """Ensemble "both": steps a and b, each reading IN, independent of each other."""
    text = ensemble(
        step("a", {"x": "IN"}, {"y": "A"}), step("b", {"x": "IN"}, {"y": "B"}), outputs="A,B"
    )
    user = text_format.Parse(text, model_config_pb.ModelConfig())
    plan = check_ensemble_fields(user, "both", "test")
    models = {"a": _Held(a), "b": _Held(b)}
    config = complete_ensemble(user, "both")
    version = EnsembleVersion("both", 1, config, plan, models, pool, ComputeGate(2))
    version.check()
    return version


def _one() -> model_config_pb.ModelConfig:
    one = model_config_pb.ModelConfig(max_batch_size=8)
    one.input.add(name="x", data_type=model_config_pb.TYPE_FP32, dims=[4])
    one.output.add(name="y", data_type=model_config_pb.TYPE_FP32, dims=[4])
    return one


def test_independent_steps_run_at_once_one_on_the_requests_own_thread() -> None:
    barrier = threading.Barrier(2)
    a, b = _Waiting(barrier, _one()), _Waiting(barrier, _one())
    pool = StepPool()
    x = x_of(2)
    try:
        answer = both(a, b, pool).infer(InferRequest("both", {"IN": x}), 0)  # both at once
    finally:
        pool.close()
    np.testing.assert_array_equal(answer.outputs["A"], x + 1)
    np.testing.assert_array_equal(answer.outputs["B"], x + 1)
    ran_on = [*a.threads, *b.threads]
    assert threading.current_thread().name in ran_on, ran_on
    assert any(name.startswith("neuron-ensemble") for name in ran_on), ran_on


def test_a_failing_step_fails_the_request_once_the_others_have_ended() -> None:
    barrier = threading.Barrier(1)  # (no wait)
    a, b = _Failing(barrier, _one()), _Waiting(barrier, _one())
    pool = StepPool()
    version = both(a, b, pool)
    try:
        with pytest.raises(ServingError) as caught:
            version.infer(InferRequest("both", {"IN": x_of(1)}), 0)
    finally:
        pool.close()
    assert caught.value.status == Status.INVALID_ARGUMENT
    assert caught.value.message == (
        "in ensemble 'both', step 1 (model 'a'): input 'x' is not to its liking"
    )
    assert version.stats.message().inference_stats.fail.count == 1


# --- refused at load -----------------------------------------------------------------------
PRE = step("pre", {"x": "IN"}, {"y": "h"})
LEFT = step("left", {"x": "h"}, {"y": "OUT"})


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (  # a tensor no step produces
            ensemble(PRE, step("join", {"a": "h", "b": "ghost"}, {"s": "OUT"})),
            [
                "in ensemble 'e', ensemble tensor 'ghost' is not connected",
                "step 2 (model 'join') reads it, and it is neither an input of the ensemble",
            ],
        ),
        (  # a cycle: join reads what left writes, left reads what join writes
            ensemble(
                PRE,
                step("join", {"a": "h", "b": "t2"}, {"s": "t1"}),
                step("left", {"x": "t1"}, {"y": "t2"}),
                step("right", {"x": "t2"}, {"y": "OUT"}),
            ),
            [
                "is not written: its steps form a cycle (step 2 (model 'join') -> 't1' -> "
                "step 3 (model 'left') -> 't2' -> step 2 (model 'join'))"
            ],
        ),
        (
            ensemble(PRE, LEFT, step("right", {"x": "h"}, {"y": "spare"})),
            ["ensemble tensor 'spare' is unused in ensemble 'e'", "step 3 (model 'right')"],
        ),
        (
            ensemble(PRE, inputs="IN,IN2", outputs="h"),
            ["ensemble input 'IN2' for ensemble e' is not used"],
        ),
        (ensemble(PRE, LEFT, outputs="OUT,O2"), ["output 'O2' for ensemble 'e' is not written"]),
        (
            ensemble(PRE, step("left", {"x": "h"}, {"y": "h"})),
            ["ensemble tensor 'h' can appear in an output map only once for ensemble 'e' step 2"],
        ),
        (
            ensemble(PRE, LEFT, extra="instance_group { count: 2 }"),
            ["instance group should not be specified for ensemble 'e'"],
        ),
        (ensemble(batch=8), ["must specify 'step' for ensemble 'e'"]),
        (
            ensemble(PRE, LEFT, extra="model_transaction_policy { decoupled: true }"),
            ["ensemble 'e' sets model_transaction_policy decoupled"],
        ),
        (
            ensemble(PRE, step("nowhere", {"x": "h"}, {"y": "OUT"})),
            ["ensemble e contains models that are not available or ambiguous: nowhere"],
        ),
        (
            ensemble(PRE, step("left", {"x": "h"}, {"y": "OUT"}, version=2)),
            ["ensemble 'e' depends on 'left' whose required version 2 is not loaded"],
        ),
        (
            ensemble(PRE, LEFT, data_type="TYPE_INT32"),
            [
                "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_INT32 is "
                "inferred from model 'e' while TYPE_FP32 is inferred from model 'pre'"
            ],
        ),
        (
            ensemble(PRE, LEFT, batch=9),
            [
                "ensemble e allows maximum batch size 9, but it contains model pre which only "
                "allows maximum batch size to be 8"
            ],
        ),
        (
            ensemble(step("pre", {"x": "IN", "z": "IN"}, {"y": "h"}), LEFT),
            ["ensemble tensor IN is mapping to non-existing input z in model pre"],
        ),
        (
            ensemble(PRE, step("join", {"a": "h"}, {"s": "OUT"})),
            ["in ensemble e, input b in model join is not mapped to any ensemble tensors"],
        ),
        (
            ensemble(PRE, step("left", {"x": "h"}, {"z": "OUT"})),
            ["ensemble tensor OUT is mapped from non-existing output z in model left"],
        ),
        (
            ensemble(PRE, LEFT).replace(
                'platform: "ensemble"', 'platform: "ensemble" backend: "x"'
            ),
            ["Ensemble model 'e' must have platform type 'ensemble' and empty backend type"],
        ),
    ],
)
def test_an_ensemble_that_cannot_run_is_unavailable_saying_why(
    local: LocalRuntime, tmp_path: Path, config: str, words: list[str]
) -> None:
    serving = serve(local, repository(tmp_path, e=config))
    try:
        reason = refusal(serving, "e")
        assert all(w in reason for w in words), reason
        with pytest.raises(ServingError) as caught:
            serving.infer(InferRequest("e", {"IN": x_of(1)}))
        assert caught.value.status == Status.UNAVAILABLE
        assert ("pre", "1", "READY") in index(serving)  # the others are served
    finally:
        serving.close()


def test_an_ensemble_without_a_version_folder_says_it_needs_an_empty_one(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = repository(tmp_path)
    (root / "e").mkdir()
    (root / "e" / "config.pbtxt").write_text(CHAIN)
    serving = serve(local, root)
    try:
        assert f"no numeric version directory (like {root}/e/1/, an ensemble's is empty)" in (
            refusal(serving, "e")
        )
    finally:
        serving.close()


def test_ensembles_composed_of_each_other_are_refused_naming_the_circle(
    local: LocalRuntime, tmp_path: Path
) -> None:
    first = ensemble(step("e2", {"IN": "IN"}, {"OUT": "OUT"}))
    second = ensemble(step("e1", {"IN": "IN"}, {"OUT": "OUT"}))
    serving = serve(local, repository(tmp_path, e1=first, e2=second))
    try:
        for name in ("e1", "e2"):
            assert "circular dependency between ensembles" in refusal(serving, name)
    finally:
        serving.close()


def test_an_ensemble_may_be_a_step_of_another(serving: Serving, tmp_path: Path) -> None:
    outer = ensemble(
        step("chain", {"IN": "IN"}, {"OUT": "c"}), step("right", {"x": "c"}, {"y": "OUT"})
    )
    (tmp_path / "outer" / "1").mkdir(parents=True)
    (tmp_path / "outer" / "config.pbtxt").write_text(outer)
    serving.poll_once()  # (the repository read again, as poll mode does)
    x = x_of(2)
    answer = serving.infer(InferRequest("outer", {"IN": x})).outputs["OUT"]
    np.testing.assert_allclose(answer, np.tanh(by_hand(x)["left"] @ W_RIGHT), rtol=1e-5, atol=1e-6)
    (chain,) = serving.model_statistics("chain").model_stats
    assert chain.inference_count == 2


# --- refused requests ------------------------------------------------------------------------
def test_a_request_that_does_not_fit_the_ensemble_is_refused_naming_it(serving: Serving) -> None:
    def refused(request: InferRequest) -> str:
        with pytest.raises(ServingError) as caught:
            serving.infer(request)
        assert caught.value.status == Status.INVALID_ARGUMENT, caught.value.message
        return caught.value.message

    assert "ensemble 'chain' has no input named 'x'; its inputs: 'IN' (FP32 [-1, 4])" in refused(
        InferRequest("chain", {"x": x_of(1)})
    )
    assert "input 'IN' has shape [2, 5]; ensemble 'chain' takes [-1, 4]" in refused(
        InferRequest("chain", {"IN": np.zeros((2, 5), np.float32)})
    )
    assert "input 'IN' has datatype INT32; ensemble 'chain' takes FP32" in refused(
        InferRequest("chain", {"IN": np.zeros((2, 4), np.int32)})
    )
    assert "more than the max_batch_size 8 of ensemble 'chain'" in refused(
        InferRequest("chain", {"IN": x_of(9)})
    )
    assert "ensemble 'chain' has no output named 'h'; its outputs: 'OUT'" in refused(
        InferRequest("chain", {"IN": x_of(1)}, outputs=["h"])
    )
    (stats,) = serving.model_statistics("chain").model_stats
    assert stats.inference_stats.fail.count == 5


def test_a_steps_error_comes_back_naming_the_step_and_its_model(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """A batching ensemble may hold a model that does not batch (its [1, 4] is the
    ensemble tensor's full shape): a request of 2 rows passes the ensemble, not the step."""
    config = ensemble(PRE, step("fixed", {"x": "h"}, {"y": "OUT"}))
    serving = serve(local, repository(tmp_path, e=config))
    try:
        x = x_of(1)
        np.testing.assert_allclose(
            serving.infer(InferRequest("e", {"IN": x})).outputs["OUT"],
            np.maximum(by_hand(x)["h"] @ W_PRE, 0),
            rtol=1e-5,
            atol=1e-6,
        )
        with pytest.raises(ServingError) as caught:
            serving.infer(InferRequest("e", {"IN": x_of(2)}))
        assert caught.value.status == Status.INVALID_ARGUMENT
        assert caught.value.message.startswith("in ensemble 'e', step 2 (model 'fixed'): ")
        assert "input 'x' has shape [2, 4]; model 'fixed' takes [1, 4]" in caught.value.message
        (stats,) = serving.model_statistics("e").model_stats
        assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (1, 1)
    finally:
        serving.close()


# --- loading, as Triton does -------------------------------------------------------------------
def test_loading_an_ensemble_loads_its_composing_models_and_follows_them(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = repository(tmp_path, chain=CHAIN, fan=FAN)
    serving = serve(local, root, control_mode="explicit", load_models=["chain"])
    try:
        assert [row for row in index(serving) if row[2] == "READY"] == [
            ("chain", "1", "READY"),
            ("left", "1", "READY"),
            ("pre", "1", "READY"),
        ]
        serving.load_model("fan")
        assert ("fan", "1", "READY") in index(serving)
        assert ("right", "1", "READY") in index(serving)
        serving.unload_model("left")  # both ensembles lose a step
        for name in ("chain", "fan"):
            assert "depends on 'left' which has no loaded version (unloaded)" in refusal(
                serving, name
            )
        with pytest.raises(ServingError) as caught:
            serving.infer(InferRequest("chain", {"IN": x_of(1)}))
        assert caught.value.status == Status.UNAVAILABLE
        serving.load_model("left")
        x = x_of(1)
        np.testing.assert_allclose(
            serving.infer(InferRequest("fan", {"IN": x})).outputs["OUT"],
            by_hand(x)["sum"],
            rtol=1e-5,
            atol=1e-6,
        )
    finally:
        serving.close()


def test_an_ensemble_waiting_for_a_composing_model_is_served_once_it_is_loaded(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """As Triton retries an ensemble when a model it lacked appears: here one loaded from
    a request's files, not in the repository."""
    config = ensemble(PRE, step("late", {"x": "h"}, {"y": "OUT"}))
    serving = serve(local, repository(tmp_path, e=config), control_mode="explicit")
    try:
        with pytest.raises(ServingError) as caught:
            serving.load_model("e")
        assert "contains models that are not available or ambiguous: late" in caught.value.message
        assert ("pre", "1", "READY") in index(serving)  # brought by the ensemble's load
        serving.load_model("late", files={"1/model.neff": NEFFS["left"]})
        x = x_of(2)
        answer = serving.infer(InferRequest("e", {"IN": x})).outputs["OUT"]
        np.testing.assert_allclose(answer, by_hand(x)["left"], rtol=1e-5, atol=1e-6)
    finally:
        serving.close()


def test_polling_follows_an_ensembles_composing_models_and_its_config(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = repository(tmp_path, chain=CHAIN)
    serving = serve(local, root, control_mode="poll", poll_s=3600)
    try:
        assert ("chain", "1", "READY") in index(serving)
        (root / "left" / "1" / "model.neff").rename(tmp_path / "left.neff")
        (root / "left" / "1").rmdir()
        (root / "left").rmdir()
        serving.poll_once()  # left removed: chain lacks a step
        assert "depends on 'left' which has no loaded version" in refusal(serving, "chain")
        write_repo(root, {"left": {1: NEFFS["left"]}})
        serving.poll_once()
        assert ("chain", "1", "READY") in index(serving)
        (root / "chain" / "config.pbtxt").write_text(CHAIN.replace('"left"', '"right"'))
        os.utime(root / "chain" / "config.pbtxt", ns=(1, 1))  # a stamp of its own
        serving.poll_once()  # the ensemble's config changed: it now ends with right
        x = x_of(1)
        answer = serving.infer(InferRequest("chain", {"IN": x})).outputs["OUT"]
        np.testing.assert_allclose(answer, by_hand(x)["right"], rtol=1e-5, atol=1e-6)
    finally:
        serving.close()


def test_two_loads_of_a_circle_of_ensembles_at_once_both_end_refused(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """The circle is seen in the repository's configs before either load takes a lock a
    composing model's load would wait for."""
    first = ensemble(step("e2", {"IN": "IN"}, {"OUT": "OUT"}))
    second = ensemble(step("e1", {"IN": "IN"}, {"OUT": "OUT"}))
    serving = serve(local, repository(tmp_path, e1=first, e2=second), control_mode="explicit")
    said: dict[str, str] = {}

    def load(name: str) -> None:
        try:
            serving.load_model(name)
        except ServingError as exc:
            said[name] = exc.message

    loads = [threading.Thread(target=load, args=(name,)) for name in ("e1", "e2")]
    try:
        for thread in loads:
            thread.start()
        for thread in loads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in loads)
        assert "circular dependency between ensembles: e1 -> ... -> e2 -> e1" in said["e1"]
        assert "circular dependency between ensembles: e2 -> ... -> e1 -> e2" in said["e2"]
    finally:
        serving.close()
