"""Input axes left free (-1 in `input_shapes`): any size per inference. The compiler puts
every op on a tensor of such a size on a CPU node and keeps the NC parts fixed; the NEFF
declares the axis dynamic on the model input, beside the batch symbol when there is one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuron_rtd.compiler import CompileError, bucket_ranges, compile_model
from neuron_rtd.neff import NodeKind, read_neff


def model(
    nodes: list[onnx.NodeProto], out: list[int | str], inits: list[onnx.TensorProto]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "free",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        inits,
    )
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = 8
    return made


def relu() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"])], ["b", "n"], [])


def test_a_free_axis_beside_the_batch_buckets() -> None:
    neff = read_neff(
        compile_model(relu(), input_shapes={"x": [1, -1]}, dynamic_batch=bucket_ranges(1, 4)).neff
    )
    (x,), (y,) = neff.inputs, neff.outputs
    assert (x.shape, x.symbols, x.dynamic) == ((4, 0), ("batch", None), (1,))
    assert (y.shape, y.symbols, y.dynamic) == ((4, 0), ("batch", None), (1,))
    assert len(neff.buckets) == 3  # 1, 2, 3-4: the free axis makes none
    assert {node.kind for node in neff.all_nodes} == {NodeKind.CPU}  # a Relu the NC runs else


def test_without_free_axes_the_same_op_goes_to_the_nc() -> None:
    neff = read_neff(compile_model(relu(), input_shapes={"x": [2, 5]}).neff)
    assert {node.kind for node in neff.all_nodes} == {NodeKind.NEURON}


def test_every_axis_free_with_no_batch() -> None:
    neff = read_neff(compile_model(relu(), input_shapes={"x": [-1, -1]}).neff)
    (x,) = neff.inputs
    assert (x.shape, x.symbols, x.dynamic) == ((0, 0), (), (0, 1))
    assert not neff.buckets


def test_the_nc_part_after_a_reduction_stays_fixed() -> None:
    """ReduceSum over the free axis on a CPU node; the MatMul of its fixed result on the NC."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    w = numpy_helper.from_array(np.ones((1, 3), np.float32), "w")
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
        helper.make_node("MatMul", ["s", "w"], ["y"]),
    ]
    made = model(nodes, ["b", 3], [axes, w])
    neff = read_neff(
        compile_model(made, input_shapes={"x": [1, -1]}, dynamic_batch=bucket_ranges(1, 2)).neff
    )
    assert {node.kind for node in neff.all_nodes} == {NodeKind.CPU, NodeKind.NEURON}
    for bucket in neff.buckets:
        for node in bucket.nodes:
            if node.kind == NodeKind.NEURON:
                assert all(not bucket.tensors[n].dynamic for n in (*node.inputs, *node.outputs))
    (y,) = neff.outputs
    assert (y.symbols, y.dynamic) == (("batch", None), ())


def test_a_size_below_minus_one_is_refused() -> None:
    with pytest.raises(CompileError, match=r"\[1, -2\] does not fit .* -1 leaves an axis free"):
        compile_model(relu(), input_shapes={"x": [1, -2]})
