"""Inputs with free axes on the runtime (`neuron_rtd/runtime/shapes.py`): a size chosen
per inference along an axis the compile left free (-1), taken from the array an input
comes as, padded along the batch bucket's axis, answered at its own size; bytes that
cannot tell such a shape refused, saying so."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import NodeKind, read_neff
from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.runtime.api import Rows
from neuron_rtd.runtime.model import LoadedModel


def sample(
    nodes: list, elem: int, out_dims: list, shape: list[int], batch: bool, inits: Sequence[Any] = ()
) -> SampleModel:
    """INPUT0 (dims ["b", "n"]) to OUTPUT0 through `nodes`, compiled with `shape` (-1:
    free) and batch buckets 1..8 when `batch`."""
    graph = helper.make_graph(
        nodes,
        "free",
        [helper.make_tensor_value_info("INPUT0", elem, ["b", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.UNDEFINED, out_dims)],
        list(inits),
    )
    graph.output[0].type.tensor_type.elem_type = elem if elem else TensorProto.FLOAT
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ranges = bucket_ranges(1, 8) if batch else None
    neff = compile_model(model, input_shapes={"INPUT0": shape}, dynamic_batch=ranges).neff
    read = read_neff(neff)
    return SampleModel(neff, "free", read.inputs, read.outputs, {}, ())


def identity(elem: int, batch: bool = True, shape: tuple[int, ...] = (1, -1)) -> SampleModel:
    node = helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])
    return sample([node], elem, ["b", "n"], list(shape), batch)


def answer(model: LoadedModel, inputs: dict) -> np.ndarray:
    job = model.infer(inputs)
    try:
        return np.array(model.outputs(job)["OUTPUT0"])
    finally:
        model.answered(job)


def test_an_identity_takes_any_width_and_batch(make_model: Callable[..., LoadedModel]) -> None:
    made = identity(TensorProto.INT32)
    assert made.inputs[0].dynamic == (1,) and made.inputs[0].symbols == ("batch", None)
    model = make_model(made)
    assert all(node.kind == NodeKind.CPU for node in model.neff.all_nodes)
    for rows, width in ((1, 16), (3, 1), (5, 1000), (8, 0)):
        given = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
        got = answer(model, {"INPUT0": given})
        assert got.shape == (rows, width)
        np.testing.assert_array_equal(got, given)
    blocks = (np.ones((2, 7), np.int32), np.full((1, 7), 5, np.int32))  # a batch's rows
    np.testing.assert_array_equal(answer(model, {"INPUT0": Rows(blocks)}), np.concatenate(blocks))
    assert model.in_flight == 0
    held = [b.value.size for v in model.variants for slots in v.dynamic for b, _ in slots]
    assert held and not any(held)  # every slot let go of its arrays once answered


def test_the_bytes_of_an_output_varying_along_two_axes_need_the_batch_size() -> None:
    (spec,) = identity(TensorProto.INT32).outputs
    with pytest.raises(ValueError, match=r"varies along axes \[0, 1\], so its 24 bytes alone"):
        spec.array_from(np.arange(6, dtype=np.int32).tobytes())
    got = spec.array_from(np.arange(6, dtype=np.int32).tobytes(), {"batch": 2})
    np.testing.assert_array_equal(got, [[0, 1, 2], [3, 4, 5]])


def test_strings_of_any_width(make_model: Callable[..., LoadedModel]) -> None:
    model = make_model(identity(TensorProto.STRING))
    for width in (16, 3):
        given = np.array([[f"s{i}\x00x" for i in range(width)]] * 2, dtype=object)
        got = answer(model, {"INPUT0": given})
        assert got.shape == (2, width)
        assert got.tolist() == given.tolist()


def test_bytes_take_a_free_shape_only_when_one_axis_varies(
    make_model: Callable[..., LoadedModel],
) -> None:
    batched = make_model(identity(TensorProto.INT32))
    with pytest.raises(BadInput, match=r"varies along axes \[0, 1\], so its 24 bytes alone"):
        batched.infer({"INPUT0": np.arange(6, dtype=np.int32).tobytes()})
    assert batched.in_flight == 0
    single = make_model(identity(TensorProto.INT32, batch=False, shape=(2, -1)))
    got = answer(single, {"INPUT0": np.arange(6, dtype=np.int32).tobytes()})
    np.testing.assert_array_equal(got, [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(BadInput, match="not a whole number"):
        single.infer({"INPUT0": np.arange(5, dtype=np.int32).tobytes()})
    free = make_model(identity(TensorProto.INT32, batch=False, shape=(-1, -1)))
    for shape in ((0, 5), (5, 0), (2, 3)):  # no bytes at all say no shape: the array's does
        assert answer(free, {"INPUT0": np.zeros(shape, np.int32)}).shape == shape


def test_a_wrong_fixed_axis_or_batch_is_refused(make_model: Callable[..., LoadedModel]) -> None:
    single = make_model(identity(TensorProto.INT32, batch=False, shape=(2, -1)))
    with pytest.raises(BadInput, match=r"has shape \[3, 4\]; it takes int32\[2,\?\]"):
        single.infer({"INPUT0": np.zeros((3, 4), np.int32)})
    batched = make_model(identity(TensorProto.INT32))
    with pytest.raises(BadInput, match="has no bucket for batch=9"):
        batched.infer({"INPUT0": np.zeros((9, 4), np.int32)})


def test_the_nc_part_keeps_fixed_sizes(make_model: Callable[..., LoadedModel]) -> None:
    """A sum over the free axis runs on a CPU node; what follows it, fixed, on the NC."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    bias = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4), "bias")
    nodes = [
        helper.make_node("ReduceSum", ["INPUT0", "axes"], ["total"], keepdims=1),
        helper.make_node("Add", ["total", "bias"], ["OUTPUT0"]),
    ]
    made = sample(nodes, TensorProto.FLOAT, ["b", 4], [1, -1], True, [axes, bias])
    assert made.outputs[0].varying_axes == (0,)
    model = make_model(made)
    kinds = {node.kind for node in model.neff.all_nodes}
    assert kinds == {NodeKind.CPU, NodeKind.NEURON}
    for node in model.neff.neuron_nodes:
        for name in (*node.inputs, *node.outputs):
            assert not model.neff.variants()[0].tensors.get(name, made.outputs[0]).dynamic
    for width in (1, 10, 300):
        given = np.ones((3, width), np.float32)
        got = answer(model, {"INPUT0": given})
        np.testing.assert_allclose(got, width + np.arange(4, dtype=np.float32)[None].repeat(3, 0))
