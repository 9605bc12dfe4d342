"""ONNX models whose config leaves an axis free (-1), served in process as Triton serves
them: any size there per request (with max_batch_size 0, and beside the batch axis), the
ops on it compiled onto CPU nodes; requests of different widths never merged into one
dynamic batch; sequences of different widths side by side (direct and oldest); a shape
the config does not allow refused INVALID_ARGUMENT."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_serving_onnx import ONNX, onnx_repo
from test_serving_repository import W, linear_model, local, serve

from neuron_rtd.neff import NodeKind, read_neff
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.serving import InferRequest, ServingError, Status

__all__ = ["local"]  # the fixture, imported


def identity(elem: int) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0, both (batch, n): Triton's custom_identity_int32, simple_identity."""
    io = [helper.make_tensor_value_info(n, elem, ["b", "n"]) for n in ("INPUT0", "OUTPUT0")]
    node = helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])
    graph = helper.make_graph([node], "identity", io[:1], io[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def identity_config(kind: str, extra: str = "") -> str:
    return (
        ONNX
        + "max_batch_size: 8\n"
        + f'input {{ name: "INPUT0" data_type: {kind} dims: [-1] }}\n'
        + f'output {{ name: "OUTPUT0" data_type: {kind} dims: [-1] }}\n'
        + extra
    )


def refused(serving: object, request: InferRequest) -> ServingError:
    with pytest.raises(ServingError) as caught:
        serving.infer(request)  # type: ignore[attr-defined]
    return caught.value


def test_rows_left_free_with_no_batching(local: LocalRuntime, tmp_path: Path) -> None:
    """x dims [-1, 4], max_batch_size 0: the MatMul takes any number of rows (on a CPU
    node); a row of another width is refused."""
    config = ONNX + 'input { name: "x" data_type: TYPE_FP32 dims: [-1, 4] }'
    serving = serve(local, onnx_repo(tmp_path / "repo", linear_model(), config))
    (version,) = serving.repository_index()
    assert version.state == "READY", version
    (meta,) = serving.model_metadata("m").inputs
    assert tuple(meta.shape) == (-1, 4)
    for rows in (1, 7, 300):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        got = serving.infer(InferRequest("m", {"x": x})).outputs["y"]
        np.testing.assert_allclose(got, x @ W, rtol=1e-5)
    error = refused(serving, InferRequest("m", {"x": np.zeros((2, 5), np.float32)}))
    assert error.status is Status.INVALID_ARGUMENT
    assert "input 'x' has shape [2, 5]; model 'm' takes [-1, 4]" in error.message
    serving.close()


@pytest.mark.parametrize(
    ("kind", "elem", "make"),
    [
        ("TYPE_INT32", TensorProto.INT32, lambda n: np.arange(n, dtype=np.int32)),
        ("TYPE_STRING", TensorProto.STRING, lambda n: np.array([f"{i}\x00" for i in range(n)])),
    ],
)
def test_widths_beside_the_batch_axis(
    local: LocalRuntime, tmp_path: Path, kind: str, elem: int, make: object
) -> None:
    serving = serve(local, onnx_repo(tmp_path / "repo", identity(elem), identity_config(kind)))
    for rows, width in ((1, 16), (2, 1), (8, 100), (3, 4000)):
        row = make(rows * width).reshape(rows, width)  # type: ignore[operator]
        given = row.astype(object) if elem == TensorProto.STRING else row
        got = serving.infer(InferRequest("m", {"INPUT0": given})).outputs["OUTPUT0"]
        assert got.shape == (rows, width)
        if elem == TensorProto.STRING:
            assert [v.decode() for v in got.reshape(-1)] == list(row.reshape(-1))
        else:
            np.testing.assert_array_equal(got, row)
    for shape in ((9, 2), (2,), (2, 2, 2)):  # past max_batch_size, no batch axis, a rank more
        bad = make(int(np.prod(shape))).reshape(shape)  # type: ignore[operator]
        bad = bad.astype(object) if elem == TensorProto.STRING else bad
        error = refused(serving, InferRequest("m", {"INPUT0": bad}))
        assert error.status is Status.INVALID_ARGUMENT, error.message
    serving.close()


def test_requests_of_different_widths_are_batched_apart(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """Four requests at once, two of width 3 and two of width 5: two executions, one per
    width, each answering its own requests' rows."""
    extra = "dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [2] }"
    config = identity_config("TYPE_INT32", extra)
    serving = serve(local, onnx_repo(tmp_path / "repo", identity(TensorProto.INT32), config))
    inputs = [np.full((1, 3 + 2 * (i % 2)), i, np.int32) for i in range(4)]
    answers: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        answers[i] = serving.infer(InferRequest("m", {"INPUT0": inputs[i]})).outputs["OUTPUT0"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, given in enumerate(inputs):
        np.testing.assert_array_equal(answers[i], given)
    (stats,) = serving.model_statistics("m").model_stats
    assert (stats.inference_count, stats.execution_count) == (4, 2)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 2)]
    serving.close()


def test_the_compiled_model_runs_on_cpu_nodes(local: LocalRuntime, tmp_path: Path) -> None:
    config = identity_config("TYPE_INT32")
    root = onnx_repo(tmp_path / "repo", identity(TensorProto.INT32), config)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    (entry,) = (tmp_path / "cache").glob("*.neff")
    neff = read_neff(entry.read_bytes())
    assert {node.kind for node in neff.all_nodes} == {NodeKind.CPU}
    (spec,) = neff.inputs
    assert (spec.shape, spec.symbols, spec.dynamic) == ((8, 0), ("batch", None), (1,))
    serving.close()


@pytest.mark.parametrize(
    "strategy",
    ["direct { }", "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 200000 }"],
)
def test_sequences_of_different_widths(local: LocalRuntime, tmp_path: Path, strategy: str) -> None:
    """Three sequences at once, of widths 2, 5 and 2, through the sequence scheduler:
    OUTPUT = (INPUT + START) * READY for each, at its own width."""

    def io(name: str, width: str | int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["b", width])

    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["started"]),
        helper.make_node("Mul", ["started", "READY"], ["OUTPUT"]),
    ]
    inputs = [io("INPUT", "n"), io("START", 1), io("READY", 1)]
    graph = helper.make_graph(nodes, "q", inputs, [io("OUTPUT", "n")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    flags = ", ".join(
        f'{{ name: "{n}" control [ {{ kind: CONTROL_SEQUENCE_{n} int32_false_true: [ 0, 1 ] }} ] }}'
        for n in ("START", "READY")
    )
    config = (
        ONNX
        + f"max_batch_size: 4\nsequence_batching {{ {strategy} control_input [ {flags} ] }}\n"
        + 'input { name: "INPUT" data_type: TYPE_INT32 dims: [-1] }\n'
        + 'output { name: "OUTPUT" data_type: TYPE_INT32 dims: [-1] }\n'
    )
    serving = serve(local, onnx_repo(tmp_path / "repo", model, config))
    answers: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def run(sequence: int, width: int) -> None:
        try:
            for step in range(3):
                given = np.full((1, width), step, np.int32)
                flags = {"sequence_start": step == 0, "sequence_end": step == 2}
                request = InferRequest(
                    "m", {"INPUT": given}, parameters={"sequence_id": 100 + sequence, **flags}
                )
                answers[sequence, step] = serving.infer(request).outputs["OUTPUT"]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate((2, 5, 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for (sequence, step), got in answers.items():
        width = (2, 5, 2)[sequence]
        np.testing.assert_array_equal(got, np.full((1, width), step + (step == 0), np.int32))
    assert len(answers) == 9
    serving.close()
