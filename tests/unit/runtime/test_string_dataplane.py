"""A string tensor on the data path on its own (`neuron_rtd/runtime/dataplane.py`): read
whole from a client's shared-memory object and decoded there (a malformed one refused
before a slot is held), and an output encoded into one; on a shm table over a temp
folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.compiler import compile_model
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.neff.strings import decode, encode
from neuron_rtd.runtime.api import ShmInput
from neuron_rtd.runtime.dataplane import DataPath
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.model import LoadedModel
from neuron_rtd.runtime.shm import ShmTable

READ_WRITE = 3  # PROT_READ | PROT_WRITE


def cast_add() -> SampleModel:
    """sum = string(int32(a) + int32(b)), a and b strings [1, 4]."""
    io = [helper.make_tensor_value_info(n, TensorProto.STRING, [1, 4]) for n in ("a", "b", "sum")]
    nodes = [
        helper.make_node("Cast", ["a"], ["ia"], to=TensorProto.INT32),
        helper.make_node("Cast", ["b"], ["ib"], to=TensorProto.INT32),
        helper.make_node("Add", ["ia", "ib"], ["total"]),
        helper.make_node("Cast", ["total"], ["sum"], to=TensorProto.STRING),
    ]
    graph = helper.make_graph(nodes, "cast_add", io[:2], io[2:])
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    neff = compile_model(made).neff
    read = read_neff(neff)
    return SampleModel(neff, "cast_add", read.inputs, read.outputs, {}, ())


def test_strings_from_shared_memory_and_into_it(
    make_model: Callable[..., LoadedModel], tmp_path: Path
) -> None:
    model = make_model(cast_add(), ninfer=1)
    a = np.array([[b"1", b"2", b"3", b"400"]], dtype=object)
    b = np.array([[b"10", b"20", b"30", b"40"]], dtype=object)
    total = [[b"11", b"22", b"33", b"440"]]
    table = ShmTable(root=tmp_path)
    inflight = Inflight()
    try:
        data = DataPath(table, inflight)
        (tmp_path / "a").write_bytes(encode(a))
        (tmp_path / "sum").write_bytes(bytes(64))
        table.map("/a", READ_WRITE)
        table.map("/sum", READ_WRITE)
        answer = data.infer(model, {"a": ShmInput("/a"), "b": encode(b)}, {}, None)
        np.testing.assert_array_equal(answer.outputs["sum"], total)
        into = data.infer(model, {"a": ShmInput("/a"), "b": b}, {"sum": "/sum"}, None)
        assert into.outputs == {}
        size = len(encode(answer.outputs["sum"]))
        written = (tmp_path / "sum").read_bytes()
        assert decode(written[:size], "sum", count=4).tolist() == total[0]
        (tmp_path / "a").write_bytes(encode(a)[:-1])  # the last element cut short
        with pytest.raises(BadInput, match="input 'a': string element 3 declares 3 bytes"):
            data.infer(model, {"a": ShmInput("/a"), "b": b}, {}, None)
        assert model.in_flight == 0
    finally:
        inflight.close()
        table.close()
