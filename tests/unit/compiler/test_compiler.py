"""The compiler in process: ONNX in, NEFF out, run on the simulated machine, compared with
onnxruntime on the same inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from terminal import on_a_terminal

from neuron_rtd import onnxrt
from neuron_rtd.compiler import CompileError, bucket_ranges, compile_model
from neuron_rtd.compiler import cli as compiler_cli
from neuron_rtd.compiler.emit import split_by_cost
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import read_neff
from neuron_rtd.runtime import LocalRuntime

F32 = TensorProto.FLOAT


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    weights: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    weights = dict(weights or {})
    if any("first" in node.input for node in nodes):
        weights.setdefault("first", FIRST)  # host_only's index
    graph = helper.make_graph(
        list(nodes),
        "test",
        list(inputs),
        list(outputs),
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return onnxrt.run(onnxrt.session(model), feeds)


@pytest.fixture(scope="module")
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as rt:
        yield rt


def run(local: LocalRuntime, neff: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model = local.load(neff)
    try:
        return local.infer(model, feeds)
    finally:
        local.unload(model)


HOST_OP = "SequenceAt"  # the NC holds no sequences
FIRST = np.array(0, np.int64)  # the weight `first` host_only reads (make_model adds it)


def host_only(x: str, y: str) -> list[onnx.NodeProto]:
    """`y = x` through a sequence of one tensor: ops the NC library lacks and onnxruntime
    runs, what makes a CPU node in these tests."""
    return [
        helper.make_node("SequenceConstruct", [x], [f"{x}.seq"]),
        helper.make_node("SequenceAt", [f"{x}.seq", "first"], [y]),
    ]


def mlp_with_cpu_op() -> onnx.ModelProto:
    """MatMul-Relu on the NC, a sequence round trip on the CPU (no NC kernel), Add-Softmax
    on the NC."""
    rng = np.random.default_rng(0)
    return make_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            *host_only("r", "s"),
            helper.make_node("Add", ["s", "r"], ["y"]),
            helper.make_node("Softmax", ["y"], ["p"], axis=-1),
        ],
        [helper.make_tensor_value_info("x", F32, ["N", 16])],
        [helper.make_tensor_value_info("p", F32, ["N", 8])],
        {"W": rng.standard_normal((16, 8)).astype(np.float32)},
    )


def test_nc_and_cpu_nodes_match_onnxruntime(local: LocalRuntime) -> None:
    model = mlp_with_cpu_op()
    result = compile_model(model, input_shapes={"x": [4, 16]})
    neff = read_neff(result.neff)
    assert [node.kind for node in neff.nodes] == ["neuron", "cpu", "neuron"]
    assert "SequenceAt on CPU: no NC kernel for this op" in str(result.summary)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    got = run(local, result.neff, {"x": x})
    np.testing.assert_allclose(got["p"], reference(model, {"x": x})["p"], rtol=1e-5, atol=1e-6)


def test_partitioning_keeps_transitions_few() -> None:
    """Two independent chains, each NC -> CPU: the model order interleaves them, the
    partitioner groups both NC ops, then both CPU ops (2 nodes, not 4)."""
    model = make_model(
        [
            helper.make_node("Relu", ["a"], ["a1"]),
            *host_only("a1", "a2"),
            helper.make_node("Relu", ["b"], ["b1"]),
            *host_only("b1", "b2"),
        ],
        [helper.make_tensor_value_info(n, F32, [3]) for n in "ab"],
        [helper.make_tensor_value_info(n, F32, [3]) for n in ("a2", "b2")],
    )
    neff = read_neff(compile_model(model).neff)
    assert [node.kind for node in neff.nodes] == ["neuron", "cpu"]


def test_dynamic_batch_refuses_a_model_that_fixes_its_batch_inside() -> None:
    """A Reshape to a constant (1, 12): every bucket would answer one row, so the batch
    cannot be dynamic, and the compiler says so instead of writing that NEFF."""
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", F32, [1, 3, 4])],
        [helper.make_tensor_value_info("y", F32, [1, 12])],
        {"shape": np.array([1, 12], dtype=np.int64)},
    )
    with pytest.raises(CompileError) as caught:
        compile_model(model, dynamic_batch=bucket_ranges(1, 4))
    assert "model output(s) 'y' (1, 12) keep a fixed shape whatever the batch size" in str(
        caught.value
    )


def test_buckets_pad_and_cut_the_batch(local: LocalRuntime) -> None:
    model = mlp_with_cpu_op()
    result = compile_model(model, dynamic_batch=bucket_ranges(1, 8, "log2"))
    neff = read_neff(result.neff)
    assert [b.symbols["batch"] for b in neff.buckets] == [(1, 1), (2, 2), (3, 4), (5, 8)]
    assert neff.inputs[0].symbols == ("batch", None)
    assert neff.outputs[0].symbols == ("batch", None)
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32)
    expected = reference(model, {"x": x})["p"]
    loaded = local.load(result.neff)
    try:
        for n in (1, 2, 3, 5, 8):
            got = local.infer(loaded, {"x": x[:n]})["p"]
            assert got.shape == (n, 8)
            np.testing.assert_allclose(got, expected[:n], rtol=1e-5, atol=1e-6)
        with pytest.raises(
            BadInput, match=r"has shape \(9, 16\); the model takes float32 \(batch<=8, 16\)"
        ):
            local.infer(loaded, {"x": np.zeros((9, 16), np.float32)})
        with pytest.raises(BadInput, match="not a whole number"):
            local.runtime.infer(loaded.id, {"x": bytes(4 * 16 + 4)})
    finally:
        local.unload(loaded)


def test_bucket_schemes() -> None:
    assert bucket_ranges(1, 8) == [(1, 1), (2, 2), (3, 4), (5, 8)]
    assert bucket_ranges(3, 10) == [(3, 4), (5, 8), (9, 10)]
    assert bucket_ranges(1, 12, "uniform:3") == [(1, 4), (5, 8), (9, 12)]
    assert bucket_ranges(1, 128, "16,64,128") == [(1, 16), (17, 64), (65, 128)]
    assert bucket_ranges(4, 4, "single") == [(4, 4)]
    with pytest.raises(CompileError, match="must rise and cover"):
        bucket_ranges(1, 128, "64,16")


def conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "bias": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, 4).astype(np.float32),
        "fc": rng.standard_normal((4 * 8 * 8, 10)).astype(np.float32),
    }
    return make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node(
                "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], epsilon=1e-3
            ),
            helper.make_node("Relu", ["bn"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("MatMul", ["f", "fc"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F32, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F32, [2, 10])],
        weights,
    )


def test_batchnorm_folds_into_conv(local: LocalRuntime) -> None:
    model = conv_bn_model()
    result = compile_model(model)
    ops = [
        i.op for node in read_neff(result.neff).nodes for s in node.stages for i in s.instructions
    ]
    assert "BatchNormalization" not in ops and ops.count("Conv") == 1
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = run(local, result.neff, {"x": x})
    np.testing.assert_allclose(got["y"], reference(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_four_stages_give_the_same_outputs_as_one(local: LocalRuntime) -> None:
    model = conv_bn_model()
    one = compile_model(model, num_neuroncores=1)
    four = compile_model(model, num_neuroncores=4)
    neff = read_neff(four.neff)
    assert neff.nc_count == 4 and [n.nc_count for n in neff.nodes] == [1, 1, 1, 1]
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(
        run(local, one.neff, {"x": x})["y"], run(local, four.neff, {"x": x})["y"]
    )


def test_split_by_cost_balances_and_keeps_every_stage_non_empty() -> None:
    assert split_by_cost([10, 10, 10, 10], 2) == [0, 2, 4]
    assert split_by_cost([100, 1, 1, 1], 2) == [0, 1, 4]
    assert split_by_cost([1, 1, 1, 100], 4) == [0, 1, 2, 3, 4]
    assert split_by_cost([5, 5], 4) == [0, 1, 2]


def test_value_dependent_output_is_cut_to_its_true_size(local: LocalRuntime) -> None:
    """NonMaxSuppression (a CPU node) selects a data-dependent number of boxes; the
    compiler plans its bound, the output comes back at its true length."""
    model = make_model(
        [
            helper.make_node(
                "NonMaxSuppression", ["boxes", "scores", "max", "iou", "thr"], ["sel"]
            ),
            helper.make_node("Gather", ["sel", "col"], ["idx2"], axis=1),
            helper.make_node("Cast", ["idx2"], ["idx"], to=TensorProto.INT64),
            helper.make_node("Squeeze", ["idx", "one"], ["picked"]),
        ],
        [
            helper.make_tensor_value_info("boxes", F32, [1, 6, 4]),
            helper.make_tensor_value_info("scores", F32, [1, 1, 6]),
        ],
        [helper.make_tensor_value_info("picked", TensorProto.INT64, ["D"])],
        {
            "max": np.array([5], np.int64),
            "iou": np.array([0.5], np.float32),
            "thr": np.array([0.3], np.float32),
            "col": np.array([2], np.int64),
            "one": np.array([1], np.int64),
        },
    )
    result = compile_model(model)
    spec = read_neff(result.neff).outputs[0]
    assert spec.dynamic == (0,)
    boxes = np.array(
        [
            [
                [0, 0, 1, 1],
                [0, 0.1, 1, 1.1],
                [0, 5, 1, 6],
                [0, 10, 1, 11],
                [3, 3, 4, 4],
                [7, 7, 8, 8],
            ]
        ],
        np.float32,
    )
    for scores in ([0.9, 0.8, 0.7, 0.2, 0.6, 0.1], [0.9, 0.1, 0.1, 0.1, 0.1, 0.1]):
        feeds = {"boxes": boxes, "scores": np.array([[scores]], np.float32)}
        got = run(local, result.neff, feeds)["picked"]
        np.testing.assert_array_equal(got, reference(model, feeds)["picked"])
    assert run(local, result.neff, feeds)["picked"].shape == (1,)


def test_unfixed_dimension_is_refused_with_advice() -> None:
    with pytest.raises(CompileError, match=r"'N' \(x\[0\]\) is not fixed.*--dynamic N="):
        compile_model(mlp_with_cpu_op())


def test_op_no_runtime_knows_is_unsupported_naming_the_node() -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob1")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", F32, [2])],
        [helper.make_tensor_value_info("y", F32, [2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    model.ir_version = 8
    with pytest.raises(CompileError, match=r"node 'frob1' \(Frobnicate\): unsupported") as info:
        compile_model(model)
    assert info.value.node == "frob1" and info.value.op == "Frobnicate"


def test_invalid_onnx_is_refused() -> None:
    with pytest.raises(CompileError, match="not an ONNX model"):
        compile_model(b"this is not protobuf at all \xff\xfe")
    broken = mlp_with_cpu_op()
    broken.graph.node[0].input[1] = "missing_weight"
    with pytest.raises(CompileError, match="checker rejects"):
        compile_model(broken, input_shapes={"x": [1, 16]})


def compile_the_mlp(tmp_path: Path) -> list[str]:
    """`neuron-cc compile` of the MLP with a CPU op (saved as model.onnx in `tmp_path`), its
    further arguments to follow."""
    source = tmp_path / "model.onnx"
    onnx.save(mlp_with_cpu_op(), str(source))
    return [sys.executable, "-m", "neuron_rtd.compiler.cli", "compile", str(source)]


def test_cli_writes_the_neff_and_prints_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "model.neff"
    done = subprocess.run(
        [*compile_the_mlp(tmp_path), "-o", str(out), "--dynamic-batch", "1:4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "bucket batch=3..4" in done.stdout and "SequenceAt on CPU" in done.stdout
    assert read_neff(out.read_bytes()).buckets


def test_cli_failure_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "model.neff"
    done = subprocess.run(
        [*compile_the_mlp(tmp_path), "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "neuron-cc: error:" in done.stderr and "'N'" in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "model.onnx"]


def test_shape_functions_bound_value_dependent_outputs(local: LocalRuntime) -> None:
    """NonZero is bounded by its input's size; a Range to a run-time limit has no bound
    and lives in host memory; Reshape to a run-time shape keeps the element count."""
    model = make_model(
        [
            helper.make_node("NonZero", ["x"], ["nz"]),
            helper.make_node("Range", ["zero", "n", "step"], ["r"]),
            helper.make_node("Concat", ["two", "minus1"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["x2"]),
            *host_only("x2", "s"),  # a CPU node: x2 crosses a boundary
            helper.make_node("ReduceSum", ["s"], ["total"], keepdims=0),
        ],
        [
            helper.make_tensor_value_info("x", F32, [6]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("two", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("nz", TensorProto.INT64, [1, "K"]),
            helper.make_tensor_value_info("r", TensorProto.INT64, ["R"]),
            helper.make_tensor_value_info("total", F32, []),
        ],
        {
            "zero": np.array(0, np.int64),
            "step": np.array(1, np.int64),
            "minus1": np.array([-1], np.int64),
        },
    )
    neff = compile_model(model).neff
    specs = read_neff(neff).tensors
    assert (specs["nz"].shape, specs["nz"].dynamic) == ((1, 6), (1,))
    assert (specs["r"].shape, specs["r"].dynamic) == ((0,), (0,))
    assert (specs["x2"].shape, specs["x2"].dynamic) == ((6, 6), (0, 1))
    x = np.array([0, 1.5, 0, -2, 3, 0], np.float32)
    feeds: dict[str, np.ndarray] = {
        "x": x,
        "n": np.array(4, np.int64),
        "two": np.array([2], np.int64),
    }
    got = run(local, neff, feeds)
    want = reference(model, feeds)
    np.testing.assert_array_equal(got["nz"], want["nz"])
    np.testing.assert_array_equal(got["r"], want["r"])
    np.testing.assert_allclose(got["total"], want["total"], rtol=1e-6)


def test_gelu_and_matmul_bias_are_fused(local: LocalRuntime) -> None:
    """x * 0.5 * (1 + erf(x / sqrt 2)) in both usual orders becomes one Gelu, and
    MatMul + Add of a constant bias one MatMulBias; the outputs stay the same."""
    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["bias", "h"], ["hb"]),
        # gelu, form 1: (x * (1 + erf(x / sqrt2))) * 0.5
        helper.make_node("Div", ["hb", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["hb", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["g1"]),
        # gelu, form 2: (x * 0.5) * (1 + erf(x * (1 / sqrt2)))
        helper.make_node("Mul", ["g1", "inv_sqrt2"], ["d2"]),
        helper.make_node("Erf", ["d2"], ["e2"]),
        helper.make_node("Add", ["one", "e2"], ["e21"]),
        helper.make_node("Mul", ["g1", "half"], ["x_half"]),
        helper.make_node("Mul", ["x_half", "e21"], ["y"]),
    ]
    scalars = {
        "sqrt2": np.float32(np.sqrt(2)),
        "inv_sqrt2": np.float32(1 / np.sqrt(2)),
        "one": np.float32(1),
        "half": np.float32(0.5),
    }
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2, 5, 8])],
        [helper.make_tensor_value_info("y", F32, [2, 5, 16])],
        {
            "w": rng.standard_normal((8, 16)).astype(np.float32),
            "bias": rng.standard_normal(16).astype(np.float32),
            **{k: np.array(v) for k, v in scalars.items()},
        },
    )
    neff = compile_model(model).neff
    ops = [i.op for node in read_neff(neff).nodes for s in node.stages for i in s.instructions]
    assert ops == ["MatMulBias", "Gelu", "Gelu"]
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    got = run(local, neff, {"x": x})["y"]
    np.testing.assert_allclose(got, reference(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_3x3_stride_1_conv_is_lowered_to_winograd(local: LocalRuntime) -> None:
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["c", "w"], ["y"], pads=[0, 1, 1, 0], strides=[2, 2]),
        ],
        [helper.make_tensor_value_info("x", F32, [2, 16, 17, 16])],
        [helper.make_tensor_value_info("y", F32, [2, 16, 8, 8])],
        {"w": w, "b": rng.standard_normal(16).astype(np.float32)},
    )
    neff = compile_model(model).neff
    stage = read_neff(neff).nodes[0].stages[0]
    assert [i.op for i in stage.instructions] == ["WinogradConv", "Conv"]  # stride 2 stays
    assert stage.weights["w.winograd"].shape == (16, 16, 16)
    x = rng.standard_normal((2, 16, 17, 16)).astype(np.float32)
    got = run(local, neff, {"x": x})["y"]
    np.testing.assert_allclose(got, reference(model, {"x": x})["y"], rtol=1e-4, atol=1e-5)


def test_cli_dynamic_symbol_and_argument_errors(tmp_path: Path) -> None:
    out = tmp_path / "model.neff"
    cli = [*compile_the_mlp(tmp_path), "-o", str(out)]
    done = subprocess.run(
        [*cli, "--dynamic", "N=1:4:uniform:2", "-q"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert [b.symbols["N"] for b in read_neff(out.read_bytes()).buckets] == [(1, 2), (3, 4)]
    done = subprocess.run([*cli, "--input-shape", "x"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "expected NAME=D0,D1,..." in done.stderr
    done = subprocess.run(
        [*cli, "--input-shape", "y=1,16"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1 and "--input-shape names y; the inputs are x" in done.stderr


def test_cli_refuses_a_negative_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative --input-shape size is a bad argument (exit 2), as in `neuron-cli validate`,
    refused before the model is read."""
    out = tmp_path / "model.neff"
    args = ["compile", str(tmp_path / "none.onnx"), "-o", str(out), "--input-shape", "x=-1,16"]
    with pytest.raises(SystemExit) as exited:
        compiler_cli.main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "expected NAME=D0,D1,... (e.g. input=1,3,224,224), got 'x=-1,16'" in err
    assert not out.exists()


def two_symbol_relu() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F32, ["N", "M"])],
        [helper.make_tensor_value_info("y", F32, ["N", "M"])],
    )


def test_progress_is_told_each_phase_and_bucket_in_order() -> None:
    seen: list[tuple[str, int, int]] = []
    compile_model(
        mlp_with_cpu_op(),
        dynamic_batch=bucket_ranges(1, 4, "log2"),
        progress=lambda what, done, total: seen.append((what, done, total)),
    )
    assert seen == [
        ("loading and checking the model", 0, 1),
        ("compiling bucket batch=1..1", 1, 5),
        ("compiling bucket batch=2..2", 2, 5),
        ("compiling bucket batch=3..4", 3, 5),
        ("writing the NEFF", 4, 5),
        ("done", 5, 5),
    ]


def test_an_output_varying_along_two_axes_is_refused_before_any_bucket() -> None:
    seen: list[str] = []
    with pytest.raises(CompileError, match=r"'y' would vary along 2 axes \(axis 0 follows N"):
        compile_model(
            two_symbol_relu(),
            dynamic={"N": bucket_ranges(1, 8), "M": bucket_ranges(1, 8)},
            progress=lambda what, done, total: seen.append(what),
        )
    assert seen == ["loading and checking the model"]
    # one of them fixed at a single size: it compiles
    result = compile_model(two_symbol_relu(), dynamic={"N": bucket_ranges(1, 4), "M": [(3, 3)]})
    assert len(read_neff(result.neff).buckets) == 3


def test_dynamic_naming_a_fixed_axis_says_what_is_free() -> None:
    with pytest.raises(CompileError, match=r"names M, which is no free dimension.*free: N"):
        compile_model(
            make_model(
                [helper.make_node("Relu", ["x"], ["y"])],
                [helper.make_tensor_value_info("x", F32, ["N", 3])],
                [helper.make_tensor_value_info("y", F32, ["N", 3])],
            ),
            dynamic={"N": bucket_ranges(1, 2), "M": bucket_ranges(1, 4)},
        )


def test_cli_json_summary_and_progress_only_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "model.neff"
    cli = [*compile_the_mlp(tmp_path), "-o", str(out)]
    done = subprocess.run(
        [*cli, "--dynamic-batch", "1:4", "--json"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr  # piped: no progress
    summary = json.loads(done.stdout)
    assert (summary["output"], summary["nc_count"]) == (
        str(out),
        read_neff(out.read_bytes()).nc_count,
    )
    assert [b["bucket"] for b in summary["buckets"]] == ["batch=1..1", "batch=2..2", "batch=3..4"]
    nodes = summary["buckets"][0]["nodes"]
    assert {n["on"] for n in nodes} == {"nc", "cpu"}
    assert HOST_OP in next(n for n in nodes if n["on"] == "cpu")["cpu_reasons"]
    assert summary["nc_ops"] + summary["cpu_ops"] == sum(
        sum(n["ops"].values()) for b in summary["buckets"] for n in b["nodes"]
    )
    # on a terminal (script(1) gives the command one), progress shows each bucket
    typescript = tmp_path / "typescript"
    command = " ".join([*cli, "--dynamic-batch", "1:4"]) + " > /dev/null"
    screen = on_a_terminal(command, typescript)
    assert "compiling bucket batch=3..4" in screen and "writing the NEFF" in screen


def test_summary_states_ncs_and_shared_weights_truly() -> None:
    split = compile_model(mlp_with_cpu_op(), input_shapes={"x": [1, 16]})  # NC, CPU, NC
    text = str(split.summary)
    assert "NeuronCores: 2 in normal mode (2 Neuron nodes: 1 + 1), 1 in shared-NC mode" in text
    assert "(--num-neuroncores 1, but each Neuron node takes NCs of its own)" in text
    assert read_neff(split.neff).nc_count == split.summary.nc_count == 2
    buckets = compile_model(mlp_with_cpu_op(), dynamic_batch=bucket_ranges(1, 4))
    summary = buckets.summary
    assert summary.stored_weight_bytes == read_neff(buckets.neff).stored_weight_bytes
    listed = sum(n.weight_bytes for _, e in summary.sections for n in e.nodes)
    per_bucket = [sum(n.weight_bytes for n in e.nodes) for _, e in summary.sections]
    assert max(per_bucket) <= summary.stored_weight_bytes < listed  # shared, stored once
    assert "(stored once; the buckets below list" in str(summary)


def test_cli_checks_the_output_path_before_compiling(tmp_path: Path) -> None:
    cli = compile_the_mlp(tmp_path)
    for output, why in (
        (tmp_path / "nodir" / "m.neff", "there is no directory"),
        (tmp_path, "it is a directory"),
    ):
        done = subprocess.run(
            [*cli, "-o", str(output), "--input-shape", "x=1,16", "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2 and done.stdout == ""  # bad input, as in every command
        assert done.stderr == f"neuron-cc: error: cannot write {output}: {why}" + (
            f" {output.parent}\n" if why.startswith("there") else "\n"
        )


def test_cli_says_what_the_model_path_is_when_it_is_not_a_file(tmp_path: Path) -> None:
    for model, why in (
        (tmp_path / "none.onnx", "no such ONNX file"),
        (tmp_path, "a directory, not an ONNX file"),
    ):
        cli = [sys.executable, "-m", "neuron_rtd.compiler.cli", "compile", str(model)]
        done = subprocess.run(
            [*cli, "-o", str(tmp_path / "m.neff")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == f"neuron-cc: error: {model}: {why}\n"
