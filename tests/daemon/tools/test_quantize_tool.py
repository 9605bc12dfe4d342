"""`neuron-cc quantize`: a float ResNet quantized to int8 QDQ on a calibration npz, or on
TFRecord shards of Examples read through neuron-batch's feature specs, compiled, and
validated against the float model on the daemon; each calibration method; and what bad
input gets (a clear error and its exit code, no file written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from terminal import on_a_terminal

from neuron_rtd import onnxrt
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import quantize
from neuron_rtd.compiler.cli import main as neuron_cc
from neuron_rtd.models import resnet
from neuron_rtd.proto import tf_pb
from neuron_rtd.records.tfrecord import Writer, build_index
from neuron_rtd.tools.validate import cosine_similarity, top1_agreement

IMAGE = 32
BATCH = 8  # the compiled NEFF's batch: top-1 over 8 rows


def images(seed: int, count: int) -> np.ndarray:
    """`count` normalised random images, as the ResNet takes them."""
    pixels = np.random.default_rng(seed).random((count, 3, IMAGE, IMAGE), np.float32)
    return resnet.normalise(pixels)


@dataclass
class Files:
    float_onnx: Path
    calibration: Path  # 16 images, along the input's own batch axis
    eval_inputs: Path  # one batch of BATCH other images


@pytest.fixture(scope="module")
def files(module_work: Path) -> Files:
    out = Files(
        float_onnx=module_work / "resnet.onnx",
        calibration=module_work / "calibration.npz",
        eval_inputs=module_work / "eval.npz",
    )
    # a small ResNet: stem, max pool, one basic block in each of two stages, classifier
    model = resnet.build((1, 1), num_classes=10, width=8, image=IMAGE)
    onnx.save(model, out.float_onnx)
    np.savez(out.calibration, input=images(1, 16))
    np.savez(out.eval_inputs, input=images(2, BATCH))
    return out


def run(command: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / command
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    return subprocess.run(
        [str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


def float_and_int8(float_onnx: Path, int8_onnx: Path, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """The float and the int8 model's probabilities for `x`, on onnxruntime."""
    return tuple(
        onnxrt.session(str(path), threads=1).run(None, {"input": x})[0]
        for path in (float_onnx, int8_onnx)
    )


# --- quantize, compile, validate against float ---------------------------------------


@pytest.mark.daemon
def test_quantized_resnet_compiles_and_validates_against_float(
    files: Files, daemon: DaemonProcess, work: Path
) -> None:
    int8_onnx, neff = work / "resnet.int8.onnx", work / "resnet.int8.neff"
    done = run("neuron-cc", "quantize", files.float_onnx, "-o", int8_onnx)
    assert done.returncode == 2 and "--calibration" in done.stderr  # it is required

    done = run(
        "neuron-cc", "quantize", files.float_onnx, "-o", int8_onnx,
        "--calibration", files.calibration, "-j",
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    summary = json.loads(done.stdout)
    assert (summary["method"], summary["per_channel"], summary["samples"]) == ("minmax", True, 16)
    assert (summary["format"], summary["activations"], summary["weights"]) == (
        "QDQ",
        "int8",
        "int8",
    )
    assert summary["int8_ops"]["Conv"] == 6 and summary["int8_ops"]["Gemm"] == 1
    assert summary["qdq_nodes"] > 0 and summary["output"] == str(int8_onnx)
    ops = {node.op_type for node in onnx.load(str(int8_onnx)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops

    done = run(
        "neuron-cc", "compile", int8_onnx, "-o", neff, "--input-shape", f"input={BATCH},3,32,32"
    )
    assert done.returncode == 0, done.stderr
    assert neff.exists()

    args = ("validate", files.float_onnx, neff, "--inputs", files.eval_inputs, "-a", daemon.address)
    done = run("neuron-cli", *args, "-j")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["int8_against_float"]["ops"]["QuantizeLinear"] > 0
    assert doc["thresholds"]["min_cosine"] == 0.99  # a quantized model's, not fp32's
    (probs,) = doc["outputs"]
    assert probs["name"] == "probs" and probs["passed"]
    assert probs["cosine"] >= 0.99 and probs["sqnr_db"] > 10
    assert probs["top1_rows"] == BATCH and probs["top1"] >= 0.75
    assert probs["max_abs_error"] < 0.1

    # the same figures as text, with what is compared against what
    text = run("neuron-cli", *args)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "int8 against float: the NEFF computes" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.startswith("probs "))
    assert f"/{BATCH})" in row and row.endswith("ok")  # TOP-1: "100.0% (8/8)"
    assert "PASS: all 1 output(s) meet cosine >= 0.99" in text.stdout

    # against the int8 ONNX it was compiled from, the NEFF is held to fp32's default
    same = run("neuron-cli", "validate", int8_onnx, neff, "--inputs", files.eval_inputs,
               "-a", daemon.address, "-j")  # fmt: skip
    doc = json.loads(same.stdout)
    assert doc["int8_against_float"] is None and doc["thresholds"]["min_cosine"] == 0.9999


# --- the calibration methods ----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "min_cosine"),
    [
        (["--method", "minmax", "--per-tensor"], 0.99),
        # KL-divergence ranges clip this random-weight net's activations about 2x (half of
        # minmax's scales): further from float, yet close
        (["--method", "entropy", "--samples", "8"], 0.95),
        (["--method", "percentile", "--percentile", "99.99"], 0.99),
    ],
)
def test_each_method_gives_an_int8_model_close_to_float(
    files: Files,
    work: Path,
    options: list[str],
    min_cosine: float,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = work / "q.onnx"
    argv = ["quantize", str(files.float_onnx), "-o", str(out)]
    assert neuron_cc([*argv, "--calibration", str(files.calibration), *options, "-j"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == options[1]
    assert summary["per_channel"] is ("--per-tensor" not in options)
    assert summary["samples"] == (8 if "--samples" in options else 16)
    assert summary["samples_given"] == 16
    assert summary["percentile"] == (99.99 if options[1] == "percentile" else None)
    reference, got = float_and_int8(files.float_onnx, out, images(3, BATCH))
    assert cosine_similarity(reference, got) >= min_cosine
    assert top1_agreement(reference, got) >= 0.75


def test_the_methods_calibrate_different_ranges(files: Files, work: Path) -> None:
    """Each method is onnxruntime's own and gives ranges of its own (entropy's histogram
    has more bins than its quantized ones, so its KL search has candidates)."""
    scales = {}
    for method in quantize.METHODS:
        out = work / f"{method}.onnx"
        argv = ["quantize", str(files.float_onnx), "-o", str(out), "--method", method]
        assert neuron_cc([*argv, "--calibration", str(files.calibration), "-q"]) == 0
        graph = onnx.load(str(out)).graph
        constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
        scales[method] = [
            float(constants[node.input[1]])
            for node in graph.node
            if node.op_type == "QuantizeLinear"
        ]
    assert len({tuple(s) for s in scales.values()}) == 3
    # entropy and percentile clip what minmax keeps whole: no larger scale, some smaller
    for method in ("entropy", "percentile"):
        pairs = list(zip(scales[method], scales["minmax"], strict=True))
        assert all(s <= m * (1 + 1e-6) for s, m in pairs) and any(s < m for s, m in pairs)


def test_text_summary_and_calibration_samples_along_an_axis_of_their_own(
    files: Files, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stacked = work / "stacked.npz"  # [S, 1, 3, 32, 32]: a sample axis in front
    np.savez(stacked, input=images(1, 4)[:, None])
    out = work / "q.onnx"
    assert neuron_cc(["quantize", str(files.float_onnx), "-o", str(out), "--calibration",
                      str(stacked)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "QDQ, activations int8, weights int8 per channel" in text
    assert "calibration: minmax on 4 sample(s)" in text
    assert "Conv x6" in text and f"wrote {out}" in text


def test_progress_on_a_terminal(files: Files, work: Path) -> None:
    typescript = work / "typescript"
    script = Path(sys.executable).parent / "neuron-cc"
    command = (
        f"{script} quantize {files.float_onnx} -o {work / 'q.onnx'} "
        f"--calibration {files.calibration} > /dev/null"
    )
    screen = on_a_terminal(command, typescript)
    assert "pre-processing" in screen and "calibrating" in screen and "16/16" in screen


def test_help_lists_the_quantize_options() -> None:
    done = run("neuron-cc", "--help")
    assert done.returncode == 0
    for option in ("--calibration", "--method", "--per-tensor", "--percentile", "--samples"):
        assert option in done.stdout, option


# --- bad input ------------------------------------------------------------------------


def two_inputs() -> onnx.ModelProto:
    """a[N, 4] + b[N, 4] -> MatMul W -> y[N, 2]."""
    w = onnx.numpy_helper.from_array(np.ones((4, 2), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("MatMul", ["s", "W"], ["y"])],
        "two",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bad_input_is_a_clear_error_and_writes_nothing(
    files: Files, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = work / "q.onnx"
    np.savez(work / "wrong_key.npz", x=images(1, 4))
    np.savez(work / "wrong_shape.npz", input=np.zeros((4, 3, 31, 32), np.float32))
    np.savez(work / "float64.npz", input=images(1, 4).astype(np.float64) / 3)
    np.savez(work / "empty.npz", input=np.zeros((0, 3, 32, 32), np.float32))
    (work / "text.npz").write_text("not an npz")
    (work / "text.onnx").write_text("not an onnx model")
    onnx.save(two_inputs(), work / "two.onnx")
    np.savez(work / "uneven.npz", a=np.ones((3, 4), np.float32), b=np.ones((5, 4), np.float32))

    def quantize(model: Path, calibration: Path, *more: str) -> tuple[int, str]:
        """neuron-cc quantize's exit code and stderr; it wrote nothing unless it succeeded."""
        code = neuron_cc(["quantize", str(model), "-o", str(out), "--calibration",
                          str(calibration), *more])  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0 or (captured.out == "" and not out.exists())
        return code, captured.err

    model = files.float_onnx
    cases = [
        ((model, work / "none.npz"), 2, "none.npz: no such calibration file"),
        ((model, work), 2, "a directory, not a calibration file"),
        ((model, work / "text.npz"), 2, "text.npz: not an npz archive (numpy.savez writes one)"),
        (
            (model, work / "wrong_key.npz"),
            2,
            "no array for input(s) 'input'; array(s) 'x' name no input: give one array per "
            "input, named as the input (the model's inputs: input float32 [N,3,32,32])",
        ),
        (
            (model, work / "wrong_shape.npz"),
            2,
            "array 'input' of shape (4, 3, 31, 32) holds no samples of input input float32 "
            "[N,3,32,32]: give its samples along axis 0",
        ),
        ((model, work / "float64.npz"), 2, "input 'input' is float64, the model takes float32"),
        ((model, work / "empty.npz"), 2, "it holds no samples"),
        ((work / "two.onnx", work / "uneven.npz"), 2, "different numbers of samples (a: 3, b: 5)"),
        ((work / "text.onnx", files.calibration), 1, "text.onnx is not an ONNX model"),
        ((work / "none.onnx", files.calibration), 2, "none.onnx: no such ONNX file"),
    ]
    for (model_path, calibration), code, message in cases:
        got, err = quantize(model_path, calibration)
        assert got == code and message in err, err
        assert err.startswith("neuron-cc: error: ") and "Traceback" not in err
    code, err = quantize(model, files.calibration, "--percentile", "99")
    assert code == 2 and "--percentile applies to --method percentile, not minmax" in err
    for bad, why in (
        (["--method", "kl"], "invalid choice: 'kl'"),
        (["--samples", "0"], "expected a whole number of 1 or more, got '0'"),
        (["--method", "percentile", "--percentile", "101"], "at most 100 (e.g. 99.99)"),
        (["--per-channel", "--per-tensor"], "not allowed with argument --per-channel"),
    ):
        with pytest.raises(SystemExit) as stop:
            quantize(model, files.calibration, *bad)
        assert stop.value.code == 2 and why in capsys.readouterr().err

    # --cast takes the float64 samples numpy's way; the int8 model it writes is refused
    # as a model to quantize, naming what it has
    assert quantize(model, work / "float64.npz", "--cast", "-q") == (0, "")
    int8 = work / "int8.onnx"
    out.rename(int8)
    code, err = quantize(int8, files.calibration)
    assert code == 1 and "int8.onnx is quantized already (it has DequantizeLinear, " in err


# --- calibration on TFRecord shards ---------------------------------------------------

SPEC = "image=input:float32:3,32,32"  # a record: one image, fed as a batch of one


def example(**features: np.ndarray) -> bytes:
    """An Example of raw float32 features (a float list for a name ending in _list)."""
    message = tf_pb.Example()
    for name, array in features.items():
        feature = message.features.feature[name]
        if name.endswith("_list"):
            feature.float_list.value.extend(array.reshape(-1).tolist())
        else:
            feature.bytes_list.value.append(array.tobytes())
    return message.SerializeToString()


def write_shards(folder: Path, pictures: np.ndarray, names: list[str], **extra: str) -> Path:
    """`pictures` one per record as feature `image` (and as a float list `image_list`),
    split over shards `names` in order (.gz ones compressed); the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = np.array_split(pictures, len(names))
    for name, part in zip(names, parts, strict=True):
        with Writer(folder / name) as writer:
            for picture in part:
                writer.write(example(image=picture, image_list=picture))
    for name, text in extra.items():
        (folder / name).write_text(text)
    return folder


def quantize_scales(path: Path) -> list[float]:
    graph = onnx.load(str(path)).graph
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    return [float(constants[n.input[1]]) for n in graph.node if n.op_type == "QuantizeLinear"]


def test_tfrecord_shards_calibrate_as_the_same_samples_in_an_npz_do(
    files: Files, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The npz's 16 images as Examples in three shards (one GZIP): the same ranges, so the
    same QuantizeLinear scales, whether decoded raw or from a list, fed as a batch of one
    or at the input's whole shape; --samples stops reading."""
    shards = write_shards(
        work / "shards", images(1, 16), ["a.tfrecord", "b.tfrecord.gz", "c.tfrecord"]
    )
    reference = work / "from_npz.onnx"
    base = ["quantize", str(files.float_onnx), "--per-tensor"]
    assert neuron_cc([*base, "-o", str(reference), "--calibration", str(files.calibration),
                      "-q"]) == 0  # fmt: skip
    expected = quantize_scales(reference)
    assert expected

    for calibration, spec in (
        ([str(shards / "*.tfrecord*")], SPEC),  # a glob, sorted: a, b, c
        ([str(shards / n) for n in ("a.tfrecord", "b.tfrecord.gz", "c.tfrecord")], SPEC),
        ([str(shards / "*")], "image_list=input:float32:3,32,32:list"),
        ([str(shards / "*")], "image=input:float32:1,3,32,32"),  # the input's whole shape
    ):
        out = work / "from_tfrecord.onnx"
        argv = [*base, "-o", str(out), "--calibration", *calibration, "--feature", spec, "-j"]
        assert neuron_cc(argv) == 0, capsys.readouterr().err
        summary = json.loads(capsys.readouterr().out)
        assert (summary["samples"], summary["samples_given"]) == (16, 16)
        assert quantize_scales(out) == pytest.approx(expected, rel=1e-6), (calibration, spec)

    # --samples N: the first N records, and no more read
    out = work / "five.onnx"
    argv = [*base, "-o", str(out), "--calibration", str(shards / "*"), "--feature", SPEC]
    assert neuron_cc([*argv, "--samples", "5", "-j"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["samples"], summary["samples_given"]) == (5, 5)
    np.savez(work / "first5.npz", input=images(1, 16)[:5])
    assert neuron_cc([*base, "-o", str(reference), "--calibration", str(work / "first5.npz"),
                      "-q"]) == 0  # fmt: skip
    assert quantize_scales(out) == pytest.approx(quantize_scales(reference), rel=1e-6)
    assert quantize_scales(out) != pytest.approx(expected, rel=1e-6)


@pytest.mark.daemon
def test_int8_from_tfrecord_shards_compiles_and_validates_against_float(
    files: Files, daemon: DaemonProcess, work: Path
) -> None:
    shards = write_shards(work / "shards", images(1, 16), ["a.tfrecord", "b.tfrecord.gz"])
    int8_onnx, neff = work / "resnet.int8.onnx", work / "resnet.int8.neff"
    done = run(
        "neuron-cc", "quantize", files.float_onnx, "-o", int8_onnx,
        "--calibration", shards / "a.tfrecord", shards / "b.tfrecord.gz", "--feature", SPEC,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "calibration: minmax on 16 sample(s)" in done.stdout
    done = run(
        "neuron-cc", "compile", int8_onnx, "-o", neff, "--input-shape", f"input={BATCH},3,32,32"
    )
    assert done.returncode == 0, done.stderr
    args = ("validate", files.float_onnx, neff, "--inputs", files.eval_inputs, "-a", daemon.address)
    done = run("neuron-cli", *args, "-j")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["int8_against_float"]["ops"]["QuantizeLinear"] > 0
    (probs,) = doc["outputs"]
    assert probs["passed"] and probs["cosine"] >= 0.99 and probs["sqnr_db"] > 10
    assert probs["top1"] >= 0.75 and probs["max_abs_error"] < 0.1


def test_bad_tfrecord_calibration_is_a_clear_error_and_writes_nothing(
    files: Files, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pictures = images(1, 4)
    shards = write_shards(work / "shards", pictures, ["good.tfrecord"], **{"empty.tfrecord": ""})
    with Writer(shards / "other.tfrecord") as writer:  # Examples without `image`
        writer.write(example(label=np.zeros(1, np.float32)))
    corrupt = shards / "corrupt.tfrecord"  # the second record's data: one byte flipped
    data = bytearray((shards / "good.tfrecord").read_bytes())
    (offset, _), (second, _) = build_index(shards / "good.tfrecord")[:2]
    data[second + 12 + 5] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    with Writer(shards / "float64.tfrecord") as writer:
        writer.write(example(image=pictures[0].astype(np.float64)))
    out = work / "q.onnx"

    def quantize(*more: str | Path) -> tuple[int, str]:
        code = neuron_cc(["quantize", str(files.float_onnx), "-o", str(out),
                          *map(str, more)])  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0 or (captured.out == "" and not out.exists())
        return code, captured.err

    good = shards / "good.tfrecord"
    cases = [
        (
            ("--calibration", good),
            "good.tfrecord: not an npz archive; TFRecord shards need --feature "
            "FEATURE[=INPUT]:DTYPE:D0,D1,...[:raw|list|image] for each model input (its "
            "inputs: input float32 [N,3,32,32])",
        ),
        (
            ("--calibration", good, "--feature", "image:float32:3,32,32"),
            "--feature image: the model has no input 'image' (its inputs: input float32 "
            "[N,3,32,32]); feed one with FEATURE=INPUT:DTYPE:SHAPE",
        ),
        (
            ("--calibration", corrupt, "--feature", SPEC),
            f"corrupt.tfrecord: corrupt record at offset {second}: the data's CRC does not match",
        ),
        (
            ("--calibration", good, shards / "other.tfrecord", "--feature", SPEC),
            "other.tfrecord@0: no feature 'image' (the record has label)",
        ),
        (("--calibration", shards / "empty.tfrecord", "--feature", SPEC), "no records in 1 shard"),
        (("--calibration", shards / "*.none", "--feature", SPEC), "*.none: no file matches"),
        (
            ("--calibration", shards / "none.tfrecord", "--feature", SPEC),
            "no such calibration file",
        ),
        (
            ("--calibration", "s3://bucket/part-0.tfrecord", "--feature", SPEC),
            "neuron-cc reads local TFRecord files only",
        ),
        (
            ("--calibration", files.calibration, "--feature", SPEC),
            "is an npz, whose arrays are named as the inputs: leave --feature out",
        ),
        (
            ("--calibration", good, "--feature", "image=input:float32:3,31,32"),
            "--feature image: the model's input is input float32 [N,3,32,32], so a record is "
            "3,32,32 (fed as a batch of one) or N,3,32,32, not 3,31,32",
        ),
        (
            (
                "--calibration",
                shards / "float64.tfrecord",
                "--feature",
                "image=input:float64:3,32,32",
            ),
            "--feature image: float64 for the model's input input float32 [N,3,32,32], which "
            "cannot hold every float64 value",
        ),
        (
            (
                "--calibration",
                good,
                "--feature",
                SPEC,
                "--feature",
                "image_list=input:float32:3,32,32:list",
            ),
            "the model's input 'input' is fed already, by --feature image",
        ),
    ]
    for args, message in cases:
        code, err = quantize(*args)
        assert code == 2 and message in err, err
        assert err.startswith("neuron-cc: error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err

    with pytest.raises(SystemExit) as stop:  # neuron-batch's parser says what is wrong
        quantize("--calibration", good, "--feature", "image:float32")
    assert stop.value.code == 2
    assert "expected NAME:DTYPE:D0,D1,...[:raw|list|image]" in capsys.readouterr().err

    # the corrupt shard's first record is whole: --samples 1 stops before the bad one;
    # --cast takes float64 records numpy's way
    assert quantize("--calibration", corrupt, "--feature", SPEC, "--samples", "1", "-q") == (0, "")
    spec64 = "image=input:float64:3,32,32"
    assert quantize("--calibration", shards / "float64.tfrecord", "--feature", spec64, "--cast",
                    "-q") == (0, "")  # fmt: skip
    assert offset == 0
