"""`neuron-cli validate`: the metrics as a pure function, and the command against the real
daemon, run as a user runs it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuron_rtd import models
from neuron_rtd.cli.neuron_cli import main
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client.client import Client
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.neff import TensorSpec
from neuron_rtd.tools.validate import (
    Thresholds,
    UsageError,
    compare,
    cosine_similarity,
    input_shapes,
    random_inputs,
    sqnr_db,
)
from neuron_rtd.tools.validate.inputs import int_ranges
from neuron_rtd.tools.validate.model_facts import classifier_outputs, implied_int_ranges

# --- metrics -------------------------------------------------------------------------


def test_identical_outputs_are_perfect() -> None:
    ref = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (report,) = compare({"y": ref}, {"y": ref.copy()})
    assert report.passed and report.failures == []
    assert report.kind == "float"
    assert report.cosine == 1.0
    assert report.sqnr_db == math.inf
    assert report.max_abs_error == 0.0
    assert report.top1 == 1.0 and report.top1_rows == 3
    assert report.to_json()["sqnr_db"] == "inf"


def test_known_perturbation_gives_the_hand_computed_sqnr() -> None:
    ref = np.array([3.0, 4.0, 0.0, 0.0])
    got = ref + np.array([0.1, -0.2, 0.0, 0.0])
    # signal 9 + 16 = 25, noise 0.01 + 0.04 = 0.05: 10*log10(500)
    (report,) = compare({"y": ref}, {"y": got})
    assert report.sqnr_db == pytest.approx(26.989700043360187)
    assert sqnr_db(ref, got) == pytest.approx(10 * math.log10(500))
    assert report.max_abs_error == pytest.approx(0.2)
    dot = 3 * 3.1 + 4 * 3.8
    assert report.cosine == pytest.approx(dot / (5 * math.hypot(3.1, 3.8)))
    assert report.top1 is None  # rank 1: not classifier-like
    assert not report.passed  # cosine 0.99805 < 0.9999
    assert "cosine" in report.failures[0]
    # The same outputs pass looser thresholds, and fail an SQNR or error bound.
    assert compare({"y": ref}, {"y": got}, Thresholds(min_cosine=0.99))[0].passed
    strict = compare({"y": ref}, {"y": got}, Thresholds(0.99, min_sqnr_db=30, max_abs_error=0.1))
    assert [f.split()[0] for f in strict[0].failures] == ["SQNR", "max"]


def test_top1_agreement_on_a_crafted_case() -> None:
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.3, 0.3, 0.4], [0.5, 0.2, 0.3]])
    got = ref.copy()
    got[2] = [0.5, 0.3, 0.2]  # row 2's argmax moves from 2 to 0
    (report,) = compare({"probs": ref.astype(np.float32)}, {"probs": got.astype(np.float32)})
    assert report.top1 == 0.75 and report.top1_rows == 4
    assert not report.passed


def test_integer_outputs_use_the_exact_match_fraction() -> None:
    ref = np.array([1, 2, 3, 4], dtype=np.int64)
    (report,) = compare({"ids": ref}, {"ids": np.array([1, 2, 0, 4], dtype=np.int64)})
    assert report.kind == "exact"
    assert report.match_fraction == 0.75 and report.cosine is None and report.sqnr_db is None
    assert report.max_abs_error == 3.0
    assert "1 of 4 elements differ" in report.failures[0]
    (same,) = compare({"m": np.array([True, False])}, {"m": np.array([True, False])})
    assert same.passed and same.match_fraction == 1.0


def test_shape_differences_and_missing_outputs_fail() -> None:
    ref = {"a": np.zeros((2, 3), np.float32), "b": np.ones(2, np.float32)}
    got = {"a": np.zeros((2, 4), np.float32), "c": np.ones(2, np.float32)}
    reports = {r.name: r for r in compare(ref, got)}
    assert reports["a"].failures == ["shape (2, 4) from the NEFF, (2, 3) from onnxruntime"]
    assert reports["a"].cosine is None
    assert "no output" in reports["b"].failures[0]
    assert "ONNX model has no output" in reports["c"].failures[0]


def test_nan_must_agree() -> None:
    ref = np.array([1.0, np.nan, 2.0], np.float32)
    assert compare({"y": ref}, {"y": ref.copy()})[0].passed
    (report,) = compare({"y": ref}, {"y": np.array([1.0, 0.0, 2.0], np.float32)})
    assert report.nonfinite_mismatches == 1 and not report.passed
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0


def test_random_inputs_follow_range_and_shapes() -> None:
    specs = [
        TensorSpec("ids", np.dtype("int32"), (8, 16), symbols=("batch", None)),
        TensorSpec("mask", np.dtype("bool"), (8, 16), symbols=("batch", None)),
        TensorSpec("x", np.dtype("float32"), (8, 4), symbols=("batch", None)),
    ]
    shapes = input_shapes(specs, {"ids": (3, 16)})
    assert shapes == {"ids": (3, 16), "mask": (3, 16), "x": (3, 4)}  # the symbol follows
    arrays = random_inputs(specs, shapes, (0, 1000), 1, int_ranges(specs, {}, (0, 1000)))
    assert arrays["ids"].dtype == np.int32 and arrays["ids"].min() >= 0
    assert arrays["ids"].max() < 1000 and arrays["ids"].max() > 1
    assert arrays["mask"].dtype == np.bool_
    assert arrays["x"].dtype == np.float32 and 0 <= arrays["x"].min() <= arrays["x"].max() <= 1000
    with pytest.raises(UsageError, match="axis 0 is 9"):
        input_shapes(specs, {"x": (9, 4)})
    with pytest.raises(UsageError, match="declares"):
        input_shapes(specs, {"x": (2, 5)})
    with pytest.raises(UsageError, match="holds no integer"):
        int_ranges(specs, {}, (0.2, 0.9))
    implied = {"ids": (0, 7)}  # what the model implies wins over --range
    assert int_ranges(specs, implied, (0, 1000)) == {"ids": (0, 7)}
    arrays = random_inputs(specs, shapes, None, 1, int_ranges(specs, implied, None))
    assert set(np.unique(arrays["ids"])) == set(range(7)) and arrays["x"].max() <= 1
    with pytest.raises(UsageError, match=r"'ids' \(int32\): the model implies no range.*--range"):
        int_ranges(specs, {}, None)


def test_the_model_implies_id_and_mask_ranges_and_which_outputs_classify() -> None:
    bert = models.bert.build(**models.bert.SMALL)
    assert implied_int_ranges(bert.graph) == {"input_ids": (0, 1000), "attention_mask": (0, 2)}
    assert classifier_outputs(bert.graph) == set()  # hidden states, not scores
    ssd = models.ssd.build(**models.ssd.SMALL)
    assert classifier_outputs(ssd.graph) == set()  # boxes, scores and classes of detections
    assert classifier_outputs(mlp(0).graph) == {"logits", "probs"}
    boxes = np.random.default_rng(0).random((5, 4)).astype(np.float32)
    (report,) = compare({"boxes": boxes}, {"boxes": boxes}, classifiers=set())
    assert report.top1 is None  # a [D, 4] float matrix, yet no classifier's


# --- the command against the daemon --------------------------------------------------


def mlp(seed: int) -> onnx.ModelProto:
    """x[N,16] -> MatMul, Add, Relu -> Gemm -> logits[N,10] -> Softmax -> probs[N,10]."""
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("Gemm", ["h2", "W2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10]),
        ],
        [weight("W1", 16, 32), weight("b1", 32), weight("W2", 32, 10), weight("b2", 10)],
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@dataclass
class Files:
    onnx: Path
    neff: Path  # static, batch 4
    bucketed: Path  # batch 1..8 in log2 buckets
    other: Path  # the same I/O, other weights


@pytest.fixture(scope="module")
def files(module_work: Path) -> Files:
    model = mlp(0)
    out = Files(
        onnx=module_work / "mlp.onnx",
        neff=module_work / "mlp.neff",
        bucketed=module_work / "mlp_dyn.neff",
        other=module_work / "other.neff",
    )
    onnx.save(model, out.onnx)
    out.neff.write_bytes(compile_model(model, input_shapes={"x": [4, 16]}).neff)
    out.bucketed.write_bytes(compile_model(model, dynamic_batch=bucket_ranges(1, 8)).neff)
    out.other.write_bytes(compile_model(mlp(1), input_shapes={"x": [4, 16]}).neff)
    return out


def neuron_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "neuron-cli"
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "neuron_rtd.cli.neuron_cli"]
    )
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    return subprocess.run(
        [*command, *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )


def table(stdout: str) -> dict[str, list[str]]:
    """The report's rows by output name."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("OUTPUT "))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


@pytest.fixture
def clean(daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """The validation leaves nothing loaded: its implicit NCG is gone afterwards."""
    yield daemon
    with Client(daemon.address) as client:
        assert client.list_ncgs() == []


@pytest.mark.daemon
def test_validate_passes_on_random_inputs(files: Files, clean: DaemonProcess) -> None:
    done = neuron_cli("validate", files.onnx, files.neff, "-a", clean.address)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    assert set(rows) == {"logits", "probs"}
    for name, cells in rows.items():
        assert cells[-1] == "ok", name
        assert float(cells[4]) >= 0.9999  # OUTPUT DTYPE SHAPE(2 cells) COSINE ...
        assert cells[4].startswith(("1.0000", "0.9999"))
    assert "random, seed 0; floats in 0:1" in done.stdout
    assert "x  float32 (4, 16)" in done.stdout
    assert "PASS: all 2 output(s)" in done.stdout


@pytest.mark.daemon
def test_validate_with_an_npz_and_json(files: Files, clean: DaemonProcess, work: Path) -> None:
    inputs = work / "inputs.npz"
    np.savez(inputs, x=np.random.default_rng(5).uniform(-2, 2, (4, 16)).astype(np.float32))
    done = neuron_cli(
        "validate", files.onnx, files.neff, "--inputs", inputs, "-a", clean.address, "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["passed"] is True and doc["inputs"]["source"] == "npz"
    assert doc["inputs"]["tensors"] == {"x": {"dtype": "float32", "shape": [4, 16]}}
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert set(by_name) == {"logits", "probs"}
    assert all(o["cosine"] >= 0.9999 and o["top1"] == 1.0 for o in by_name.values())


@pytest.mark.daemon
def test_validate_a_bucketed_neff_at_a_smaller_batch(files: Files, clean: DaemonProcess) -> None:
    args = ("validate", files.onnx, files.bucketed, "-a", clean.address)
    done = neuron_cli(*args, "--input-shape", "x=3,16", "--seed", "7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "x  float32 (3, 16)" in done.stdout
    assert {cells[2] + cells[3] for cells in table(done.stdout).values()} == {"(3,10)"}
    bad = neuron_cli(*args, "--input-shape", "x=9,16")
    assert bad.returncode == 2 and "axis 0 is 9" in bad.stderr


@pytest.mark.daemon
def test_validate_fails_on_other_weights(files: Files, clean: DaemonProcess) -> None:
    done = neuron_cli("validate", files.onnx, files.other, "-a", clean.address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL: output 'logits': cosine" in done.stdout
    assert "FAIL: output 'probs': cosine" in done.stdout
    assert {cells[-1] for cells in table(done.stdout).values()} == {"FAIL"}


@pytest.mark.daemon
def test_usage_errors_exit_2(files: Files, clean: DaemonProcess, work: Path) -> None:
    wrong = work / "wrong.npz"
    np.savez(wrong, y=np.zeros((4, 16), np.float32))
    done = neuron_cli("validate", files.onnx, files.neff, "--inputs", wrong, "-a", clean.address)
    assert done.returncode == 2
    assert "missing key(s) 'x'" in done.stderr and "unknown key(s) 'y'" in done.stderr
    assert done.stdout == ""

    nobody = f"unix:{work}/nobody.sock"
    done = neuron_cli("validate", files.onnx, files.neff, "-a", nobody)
    assert done.returncode == 1  # no daemon: a failure, not a usage error, as in every tool
    assert f"no runtime answers at {nobody}: no socket {work}/nobody.sock" in done.stderr


def test_bad_files_exit_2_in_process(
    files: Files, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"unix:{work}/nobody.sock"
    assert main(["validate", str(files.onnx), str(work / "none.neff"), "-a", address]) == 2
    assert "none.neff: no such NEFF file" in capsys.readouterr().err
    (work / "bad.neff").write_bytes(b"not a neff" * 200)
    assert main(["validate", str(files.onnx), str(work / "bad.neff"), "-a", address]) == 2
    assert "bad.neff: not a valid NEFF" in capsys.readouterr().err
    text = work / "inputs.npz"
    text.write_text("hello")
    argv = ["validate", str(files.onnx), str(files.neff), "--inputs", str(text), "-a", address]
    assert main(argv) == 2
    assert "inputs.npz: not an npz archive" in capsys.readouterr().err
    argv = ["validate", str(files.onnx), str(files.neff), "--timeout", "0", "-a", address]
    assert main(argv) == 2
    assert "--timeout must be at least 1 second, got 0" in capsys.readouterr().err


def test_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_cli", "validate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--min-cosine" in done.stdout


def token_model(through_gather: bool) -> onnx.ModelProto:
    """ids[2,8] (int64) -> Gather from a [50, 4] table -> ReduceSum -> y[2,4]; or, without
    the table, ids -> Cast -> y (no range implied)."""
    table = numpy_helper.from_array(
        np.random.default_rng(3).standard_normal((50, 4)).astype(np.float32), "table"
    )
    if through_gather:
        nodes = [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=0),
        ]
        inits = [table, numpy_helper.from_array(np.array([1], np.int64), "axes")]
    else:
        nodes, inits = [helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT)], []
    graph = helper.make_graph(
        nodes,
        "tokens",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 8])],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [2, 4] if through_gather else [2, 8]
            )
        ],
        inits,
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.daemon
def test_integer_inputs_take_the_range_the_model_implies(clean: DaemonProcess, work: Path) -> None:
    for through_gather in (True, False):
        model = token_model(through_gather)
        onnx.save(model, work / "tokens.onnx")
        (work / "tokens.neff").write_bytes(compile_model(model).neff)
        args = ("validate", work / "tokens.onnx", work / "tokens.neff", "-a", clean.address)
        done = neuron_cli(*args, "--json")
        if through_gather:  # ids index a 50-row table: drawn from [0, 50), not all zero
            assert done.returncode == 0, done.stdout + done.stderr
            assert json.loads(done.stdout)["inputs"]["int_ranges"] == {"ids": [0, 50]}
            text = neuron_cli(*args).stdout
            assert "ids in [0, 50) (implied by the model)" in text
            assert table(text)["y"][-2] == "-"  # a [2, 4] float matrix, but no classifier's
        else:  # nothing implies a range: asked for, then taken from --range
            assert done.returncode == 2 and "--range LOW:HIGH" in done.stderr
            ranged = neuron_cli(*args, "--range", "0:9", "--json")
            assert json.loads(ranged.stdout)["inputs"]["int_ranges"] == {"ids": [0, 9]}
