"""Random ops on the NC: what they draw, their attributes, and seeding per NCG."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.compiler import compile_model
from neuron_rtd.runtime import LocalRuntime


@pytest.fixture(scope="module")
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime("inf1.xlarge") as rt:
        yield rt


def random_model() -> bytes:
    f, d = TensorProto.FLOAT, TensorProto.DOUBLE
    x = helper.make_tensor_value_info("x", f, [1000])
    p = helper.make_tensor_value_info("p", f, [1000])
    outs = [
        helper.make_tensor_value_info(n, t, [1000])
        for n, t in (("u", f), ("n", d), ("ul", f), ("nl", f), ("b", TensorProto.INT32))
    ]
    nodes = [
        helper.make_node("RandomUniform", [], ["u"], shape=[1000], low=2.0, high=3.0),
        helper.make_node("RandomNormal", [], ["n"], shape=[1000], mean=5.0, scale=0.5, dtype=d),
        helper.make_node("RandomUniformLike", ["x"], ["ul"], low=-1.0, high=0.0),
        helper.make_node("RandomNormalLike", ["x"], ["nl"], seed=7.0),
        helper.make_node("Bernoulli", ["p"], ["b"], dtype=TensorProto.INT32),
    ]
    graph = helper.make_graph(nodes, "random", [x, p], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = compile_model(model.SerializeToString())
    assert "0 on the CPU" in str(result.summary)  # all five run on the NC
    return bytes(result.neff)


def test_random_ops_draw_what_their_attributes_say(local: LocalRuntime) -> None:
    model = local.load(random_model())
    feeds = {"x": np.zeros(1000, np.float32), "p": np.linspace(0, 1, 1000, dtype=np.float32)}
    a, b = local.infer(model, feeds), local.infer(model, feeds)
    assert a["u"].dtype == np.float32 and a["u"].min() >= 2.0 and a["u"].max() < 3.0
    assert a["n"].dtype == np.float64 and abs(a["n"].mean() - 5.0) < 0.1
    assert abs(a["n"].std() - 0.5) < 0.1
    assert a["ul"].min() >= -1.0 and a["ul"].max() < 0.0
    assert a["b"].dtype == np.int32 and set(np.unique(a["b"])) <= {0, 1}
    assert a["b"][:50].sum() < 10 and a["b"][-50:].sum() > 40  # p near 0, then near 1
    for name in ("u", "n", "ul", "b"):
        assert not np.array_equal(a[name], b[name])  # a new draw every run
    np.testing.assert_array_equal(a["nl"], b["nl"])  # its seed attribute: the same draws
    local.unload(model)


def test_seeding_the_ncg_repeats_the_draws(local: LocalRuntime) -> None:
    model = local.load(random_model())
    feeds = {"x": np.zeros(1000, np.float32), "p": np.full(1000, 0.5, np.float32)}
    runs = []
    for _ in range(2):
        local.runtime.random_seed(model.ncg_id, 42)
        runs.append([local.infer(model, feeds) for _ in range(2)])
    for name in ("u", "n", "ul", "b"):
        np.testing.assert_array_equal(runs[0][0][name], runs[1][0][name])
        np.testing.assert_array_equal(runs[0][1][name], runs[1][1][name])
        assert not np.array_equal(runs[0][0][name], runs[0][1][name])
    local.unload(model)
