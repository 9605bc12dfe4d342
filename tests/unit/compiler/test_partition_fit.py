"""The compiler never emits a NEFF no machine can run: many Neuron islands between CPU
nodes either move into those CPU nodes (islands without multiply-accumulates) or share
NCs, so the NEFF takes at most `--num-neuroncores` NCs, or the smallest machine's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuron_rtd import onnxrt
from neuron_rtd.compiler import CompileError, compile_model
from neuron_rtd.compiler import cli as compiler_cli
from neuron_rtd.compiler.compile import nc_limit, shared_ncs
from neuron_rtd.compiler.partition import LARGEST_MACHINE_NCS, SMALLEST_MACHINE_NCS
from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff import NeffBuilder, StageSpec, read_neff
from neuron_rtd.runtime import LocalRuntime

F32 = TensorProto.FLOAT
ISLANDS = 80
WIDTH = 8


def host_only(source: str, output: str, name: str) -> onnx.NodeProto:
    """`output` = `source` negated when the model input `flag` is true, else `source`
    itself: an If, which runs on the host (the NC has no control flow)."""

    def branch(op: str) -> onnx.GraphProto:
        node = helper.make_node(op, [source], [f"{output}.{op}"])
        out = helper.make_tensor_value_info(f"{output}.{op}", F32, [2, WIDTH])
        return helper.make_graph([node], f"{name}.{op}", [], [out])

    return helper.make_node(
        "If", ["flag"], [output], name=name, then_branch=branch("Neg"), else_branch=branch("Abs")
    )


def model_of(
    nodes: list[onnx.NodeProto], weights: list[onnx.TensorProto], output: str
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "islands",
        [
            helper.make_tensor_value_info("x", F32, [2, WIDTH]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info(output, F32, [2, WIDTH])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def alternating(nc_op: str, islands: int = ISLANDS) -> onnx.ModelProto:
    """`islands` runs of `nc_op` (MatMul, or a unary op), each followed by an If (which the
    NC lacks), so that partitioning gives as many Neuron islands between CPU nodes."""
    rng = np.random.default_rng(7)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    current = "x"
    for i in range(islands):
        if nc_op == "MatMul":
            w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
            weights.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        else:
            nodes.append(helper.make_node(nc_op, [current], [f"m{i}"], name=f"nc{i}"))
        nodes.append(host_only(f"m{i}", f"c{i}", f"cpu{i}"))
        current = f"c{i}"
    return model_of(nodes, weights, current)


def infer_on(instance: str, neff: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with LocalRuntime(instance) as rt:
        return rt.infer(rt.load(neff), feeds)


def output_of(model: onnx.ModelProto) -> str:
    return model.graph.output[0].name


def feeds() -> dict[str, np.ndarray]:
    x = np.random.default_rng(3).standard_normal((2, WIDTH)).astype(np.float32)
    return {"x": x, "flag": np.array(True)}


def test_eighty_matmul_islands_share_the_smallest_machines_ncs() -> None:
    """80 MatMul islands stay on the NC, sharing 4 NCs: the NEFF loads on an inf1.xlarge
    and computes what onnxruntime does."""
    model = alternating("MatMul")
    result = compile_model(model)
    neff = read_neff(result.neff)
    assert len(neff.neuron_nodes) == ISLANDS and len(neff.cpu_nodes) == ISLANDS
    assert neff.nc_count == SMALLEST_MACHINE_NCS == result.summary.nc_count
    assert sorted({node.nc for node in neff.neuron_nodes}) == list(range(SMALLEST_MACHINE_NCS))
    assert [node.nc for node in neff.neuron_nodes] == sorted(n.nc for n in neff.neuron_nodes)
    text = str(result.summary)
    assert f"NeuronCores: 4 in normal mode ({ISLANDS} Neuron nodes sharing them, at most 4)" in text
    assert "moved to CPU nodes" not in text
    got = infer_on("inf1.xlarge", result.neff, feeds())[output_of(model)]
    want = onnxrt.run(onnxrt.session(model), feeds())[output_of(model)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_num_neuroncores_bounds_the_ncs_taken() -> None:
    model = alternating("MatMul", islands=6)
    for ncs in (1, 2, 5):
        result = compile_model(model, num_neuroncores=ncs)
        assert read_neff(result.neff).nc_count == ncs
        assert result.summary.as_json()["nc_limit"] == ncs
    got = infer_on("inf1.xlarge", compile_model(model, num_neuroncores=1).neff, feeds())
    want = onnxrt.run(onnxrt.session(model), feeds())
    np.testing.assert_allclose(got[output_of(model)], want[output_of(model)], rtol=1e-5, atol=1e-5)


def test_islands_without_macs_move_into_the_cpu_nodes_around_them(tmp_path: Path) -> None:
    """80 Relu islands: the NC saves them less than the copies cost, so, being more than
    the NCs, they go to the CPU nodes, which merge; the summary says which and why."""
    model = alternating("Relu")
    result = compile_model(model)
    neff = read_neff(result.neff)
    assert len(neff.neuron_nodes) <= SMALLEST_MACHINE_NCS and neff.nc_count <= 4
    assert len(neff.cpu_nodes) <= SMALLEST_MACHINE_NCS + 1
    moved = result.summary.sections[0][1].moved
    assert len(moved) >= ISLANDS - SMALLEST_MACHINE_NCS
    assert {m.op for m in moved} == {"Relu"} and moved[0].name.startswith("nc")
    assert "no multiply-accumulates" in moved[0].reason
    text = str(result.summary)
    assert f"moved to CPU nodes to fit at most 4 NCs: {len(moved)} ops the NC runs:" in text
    assert "Relu on CPU: moved to a CPU node:" in text
    got = infer_on("inf1.xlarge", result.neff, feeds())[output_of(model)]
    want = onnxrt.run(onnxrt.session(model), feeds())[output_of(model)]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_json_summary_lists_the_moved_ops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = alternating("Relu", islands=10)
    source, out = tmp_path / "relu.onnx", tmp_path / "relu.neff"
    onnx.save(model, source)
    assert compiler_cli.main(["compile", str(source), "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    moved = summary["buckets"][0]["moved_to_cpu"]
    assert summary["nc_limit"] == 4 and summary["nc_count"] <= 4
    assert len(moved) >= 6 and all(m["op"] == "Relu" for m in moved)
    assert all("no multiply-accumulates" in m["reason"] for m in moved)


def test_a_plain_model_is_partitioned_as_before() -> None:
    """Islands within the limit keep NCs of their own and nothing moves."""
    model = alternating("Relu", islands=3)
    result = compile_model(model)
    neff = read_neff(result.neff)
    assert [node.kind for node in neff.nodes] == ["neuron", "cpu"] * 3
    assert [node.nc for node in neff.neuron_nodes] == [0, 1, 2] and neff.nc_count == 3
    assert not result.summary.sections[0][1].moved


def test_more_neuroncores_than_the_largest_machine_is_refused() -> None:
    with pytest.raises(CompileError, match=f"1 to {LARGEST_MACHINE_NCS}"):
        compile_model(alternating("MatMul", islands=2), num_neuroncores=LARGEST_MACHINE_NCS + 1)
    with pytest.raises(CompileError, match="--num-neuroncores"):
        compile_model(alternating("MatMul", islands=2), num_neuroncores=0)
    assert nc_limit(None) == SMALLEST_MACHINE_NCS == 4 and LARGEST_MACHINE_NCS == 64


def test_shared_ncs_runs_consecutive_nodes_on_one_nc_by_cost() -> None:
    assert shared_ncs([1] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert shared_ncs([100, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]


def relu_neff(ncs: Sequence[int | None]) -> bytes:
    """Relu nodes in a chain, each on the NC `ncs` gives it (None: NCs of its own)."""
    builder = NeffBuilder("relus")
    builder.add_input("t0", np.float32, [4])
    for i, nc in enumerate(ncs):
        stage = StageSpec(instructions=[("Relu", [f"t{i}"], [f"t{i + 1}"])])
        builder.add_tensor(f"t{i + 1}", np.float32, [4])
        builder.add_node(f"relu{i}", "neuron", [f"t{i}"], [f"t{i + 1}"], [stage], nc=nc)
    builder.add_output(f"t{len(ncs)}", np.float32, [4])
    return builder.build()


def test_a_neff_says_which_nc_each_neuron_node_runs_on() -> None:
    assert read_neff(relu_neff([None, None, None])).nc_count == 3
    shared = read_neff(relu_neff([0, 0, 1]))
    assert shared.nc_count == 2 and [n.nc for n in shared.nodes] == [0, 0, 1]
    assert read_neff(relu_neff([None, 5, None])).nc_count == 7
    with pytest.raises(NeffInvalid, match="nc must be 0 or more"):
        relu_neff([0, -1])
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    got = infer_on("inf1.xlarge", relu_neff([0, 0, 0, 0]), {"t0": x})
    np.testing.assert_array_equal(got["t4"], np.maximum(x, 0))
