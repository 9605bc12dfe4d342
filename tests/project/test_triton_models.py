"""scripts/triton_models.py, the repository of Triton's example models that
scripts/triton_examples.py serves: every config reads as Triton's ModelConfig and names
Triton's tensors, every ONNX model answers as Triton's example programs check (on
onnxruntime), and `simple` compiled with --neff answers as numpy does on the runtime.
About 5 s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from neuron_rtd.runtime import LocalRuntime

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "triton_models.py"

# Each model the examples call, with its inputs and outputs as Triton's configs name them.
TENSORS = {
    "simple": ({"INPUT0", "INPUT1"}, {"OUTPUT0", "OUTPUT1"}),
    "simple_int8": ({"INPUT0", "INPUT1"}, {"OUTPUT0", "OUTPUT1"}),
    "simple_string": ({"INPUT0", "INPUT1"}, {"OUTPUT0", "OUTPUT1"}),
    "simple_identity": ({"INPUT0"}, {"OUTPUT0"}),
    "simple_sequence": ({"INPUT"}, {"OUTPUT"}),
    "simple_dyna_sequence": ({"INPUT"}, {"OUTPUT"}),
    "simple_string_dyna_sequence": ({"INPUT"}, {"OUTPUT"}),
    "densenet_onnx": ({"data_0"}, {"fc6_1"}),
    "inception_onnx": ({"input:0"}, {"InceptionV3/Predictions/Softmax:0"}),
    "custom_identity_int32": ({"INPUT0"}, {"OUTPUT0"}),
    "repeat_int32": ({"IN", "DELAY", "WAIT"}, {"OUT", "IDX"}),
}


def build(out: Path, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    build(out)
    return out


def config(repo: Path, name: str) -> mc.ModelConfig:
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), mc.ModelConfig())


def session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "1" / "model.onnx"))


def test_every_model_has_tritons_config_and_an_onnx_model(repo: Path) -> None:
    assert sorted(p.name for p in repo.iterdir()) == sorted(TENSORS)
    for name, (inputs, outputs) in TENSORS.items():
        cfg = config(repo, name)
        assert cfg.name == name and cfg.platform == "onnxruntime_onnx"
        assert {t.name for t in cfg.input} == inputs and {t.name for t in cfg.output} == outputs
        onnx_inputs = {i.name for i in session(repo, name).get_inputs()}
        assert inputs <= onnx_inputs
    simple = config(repo, "simple")
    assert simple.max_batch_size == 8 and list(simple.input[0].dims) == [16]
    assert simple.input[0].data_type == mc.TYPE_INT32
    dense = config(repo, "densenet_onnx")
    assert list(dense.input[0].reshape.shape) == [1, 3, 224, 224]
    assert dense.output[0].label_filename == "densenet_labels.txt"
    labels = (repo / "densenet_onnx" / "densenet_labels.txt").read_text().splitlines()
    assert len(labels) == 1000
    assert config(repo, "repeat_int32").model_transaction_policy.decoupled
    dyna = config(repo, "simple_dyna_sequence").sequence_batching
    assert dyna.HasField("oldest")
    kinds = {c.name: c.control[0].kind for c in dyna.control_input}
    assert kinds["CORRID"] == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
    state = config(repo, "simple_string_dyna_sequence").sequence_batching.state[0]
    assert (state.input_name, state.output_name) == ("INPUT_STATE", "OUTPUT_STATE")


def test_the_simple_models_add_and_subtract_as_the_examples_check(repo: Path) -> None:
    a = np.arange(16, dtype=np.int32)[None]
    b = np.ones((1, 16), np.int32)
    total, difference = session(repo, "simple").run(None, {"INPUT0": a, "INPUT1": b})
    assert np.array_equal(total, a + b) and np.array_equal(difference, a - b)
    total, difference = session(repo, "simple_int8").run(
        None, {"INPUT0": a.astype(np.int8), "INPUT1": b.astype(np.int8)}
    )
    assert total.dtype == np.int8 and np.array_equal(difference, (a - b).astype(np.int8))
    words = {"INPUT0": a.astype(str).astype(object), "INPUT1": b.astype(str).astype(object)}
    total, difference = session(repo, "simple_string").run(None, words)
    assert [int(x) for x in total[0]] == list(range(1, 17))
    assert [int(x) for x in difference[0]] == list(range(-1, 15))


def flags(**values: int) -> dict[str, np.ndarray]:
    return {k: np.array([[v]], np.int32) for k, v in values.items()}


def test_the_sequence_models_answer_as_the_sequence_examples_expect(repo: Path) -> None:
    """The examples send 0 (or 100, or 20) then 11, 7, 5, 3, 2, 0, 1 (or their
    negatives), and expect 1 + the first, then each value; with --dyna, the last answer
    plus the correlation id, and the string-id model's running sum."""
    values = [11, 7, 5, 3, 2, 0, 1]
    plain, dyna = session(repo, "simple_sequence"), session(repo, "simple_dyna_sequence")
    for i, value in enumerate([100, *values]):
        start, end = int(i == 0), int(i == len(values))
        (out,) = plain.run(None, flags(INPUT=value, START=start, READY=1))
        assert out[0, 0] == (101 if i == 0 else value)
        feeds = flags(INPUT=value, START=start, END=end, READY=1)
        feeds["CORRID"] = np.array([[1001]], np.uint64)
        (out,) = dyna.run(None, feeds)
        assert out[0, 0] == (101 if i == 0 else value) + (1001 if end else 0)
    (idle,) = plain.run(None, flags(INPUT=5, START=0, READY=0))
    assert idle[0, 0] == 0
    accumulator = session(repo, "simple_string_dyna_sequence")
    state, answers = np.zeros((1, 1), np.int32), []
    sent = [20, *(-v for v in values)]
    for i, value in enumerate(sent):
        feeds = flags(INPUT=value, START=int(i == 0), END=int(i == len(values)), READY=1)
        feeds["CORRID"] = np.array([["1002"]], object)
        out, state = accumulator.run(None, {**feeds, "INPUT_STATE": state})
        answers.append(int(out[0, 0]))
    assert answers == [20, 9, 2, -3, -6, -8, -8, -9 + 1002]


def test_the_image_stand_ins_have_tritons_shapes(repo: Path) -> None:
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    (scores,) = session(repo, "densenet_onnx").run(None, {"data_0": image})
    assert scores.shape == (1, 1000, 1, 1)
    nhwc = np.random.default_rng(1).random((1, 299, 299, 3), dtype=np.float32)
    (probs,) = session(repo, "inception_onnx").run(None, {"input:0": nhwc})
    assert probs.shape == (1, 1001) and abs(float(probs.sum()) - 1) < 1e-4


def test_simple_compiled_with_neff_serves_the_sum_and_difference(tmp_path: Path) -> None:
    said = build(tmp_path, "--neff", "--only", "simple")
    assert said.strip() == "simple: model.neff"
    assert not (tmp_path / "simple" / "1" / "model.onnx").exists()
    assert "platform" not in (tmp_path / "simple" / "config.pbtxt").read_text()
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    with LocalRuntime() as runtime:
        model = runtime.load((tmp_path / "simple" / "1" / "model.neff").read_bytes())
        out = runtime.infer(model, {"INPUT0": a, "INPUT1": b})
    assert np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)
