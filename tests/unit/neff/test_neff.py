"""NEFF round trips, zero-copy weights, determinism, the builder and the sample MLP."""

from __future__ import annotations

import mmap
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff import (
    ALLOWED_DTYPES,
    FEATURE_GZIP,
    HEADER_SIZE,
    NEFF_VERSION,
    Instruction,
    Neff,
    NeffBuilder,
    NodeKind,
    StageSpec,
    TensorSpec,
    build_mlp,
    read_neff,
    read_neff_file,
    write_neff,
)

FIXED_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def two_node_builder() -> NeffBuilder:
    """x -> [neuron 'core': 2 stages] -> h -> [cpu 'post'] -> y, weights of every dtype."""
    rng = np.random.default_rng(7)
    builder = NeffBuilder("tiny")
    builder.add_input("x", "float32", (2, 3))
    builder.add_output("y", "float32", (2, 3))
    builder.add_tensor("mid", np.float32, (2, 3))
    builder.add_tensor("h", "float32", (2, 3))
    extra = {f"k_{name}": rng.integers(0, 2, size=(3, 2)).astype(name) for name in ALLOWED_DTYPES}
    first = StageSpec(
        instructions=[("MatMul", ["x", "w"], ["m"]), ("Add", ["m", "b"], ["mid"], {"k": [1, 2]})],
        weights={"w": rng.standard_normal((3, 3)).astype(np.float32), "b": np.ones(3, np.float32)},
        inputs=["x"],
        outputs=["mid"],
    )
    second = StageSpec(
        instructions=[Instruction("Relu", ("mid",), ("h",), {})],
        weights=extra,
        inputs=["mid"],
        outputs=["h"],
    )
    builder.add_node("core", NodeKind.NEURON, ["x"], ["h"], [first, second])
    post = StageSpec(instructions=[("Softmax", ["h"], ["y"], {"axis": -1})])
    builder.add_node("post", "cpu", ["h"], ["y"], [post])
    return builder


def all_weights(neff: Neff) -> dict[str, np.ndarray]:
    return {
        f"{node.name}/{j}/{name}": array
        for node in neff.nodes
        for j, stage in enumerate(node.stages)
        for name, array in stage.weights.items()
    }


# -- round trip -------------------------------------------------------------------------


def test_round_trip_header_fields() -> None:
    data = two_node_builder().build(
        uuid=FIXED_UUID, build_version="test-build 9", requested_nc_count=4
    )
    neff = read_neff(data)
    header = neff.header
    assert data[:8] == b"NEFF\x00RTD"
    assert (header.package_version, header.header_size) == (1, HEADER_SIZE)
    assert header.data_size == len(data) - HEADER_SIZE
    assert (header.major, header.minor) == NEFF_VERSION
    assert header.build_version == "test-build 9"
    assert header.uuid == FIXED_UUID
    assert header.name == "tiny"
    assert (header.nc_count, header.ncs_per_node, header.requested_nc_count) == (2, 2, 4)
    assert header.features == 0
    assert len(header.sha256) == 32
    assert neff.size == len(data)


def test_default_build_version_and_requested_count() -> None:
    header = read_neff(two_node_builder().build()).header
    assert header.build_version.startswith("neuron-rtd-")
    assert header.requested_nc_count == header.nc_count == 2


def test_round_trip_graph() -> None:
    neff = read_neff(two_node_builder().build())
    f32 = np.dtype("float32")
    assert neff.name == "tiny"
    assert neff.inputs == (TensorSpec("x", f32, (2, 3)),)
    assert neff.outputs == (TensorSpec("y", f32, (2, 3)),)
    assert set(neff.tensors) == {"x", "y", "mid", "h"}
    assert neff.tensors["h"].nbytes == 24
    core, post = neff.nodes
    assert (core.name, core.kind, core.inputs, core.outputs) == ("core", "neuron", ("x",), ("h",))
    assert (post.kind, post.nc_count, core.nc_count) == (NodeKind.CPU, 0, 2)
    assert neff.neuron_nodes == (core,) and neff.cpu_nodes == (post,)
    assert (neff.nc_count, neff.max_node_ncs) == (2, 2)
    first, second = core.stages
    assert (first.inputs, first.outputs, second.inputs, second.outputs) == (
        ("x",),
        ("mid",),
        ("mid",),
        ("h",),
    )
    assert first.instructions[1] == Instruction("Add", ("m", "b"), ("mid",), {"k": [1, 2]})
    assert post.stages[0].instructions[0].attrs == {"axis": -1}
    np.testing.assert_array_equal(first.weights["b"], np.ones(3, np.float32))


def test_weights_of_every_dtype_round_trip() -> None:
    builder = two_node_builder()
    neff = read_neff(builder.build())
    weights = neff.nodes[0].stages[1].weights
    for name in ALLOWED_DTYPES:
        array = weights[f"k_{name}"]
        assert array.dtype == np.dtype(name) and array.shape == (3, 2)
    assert neff.weight_bytes == sum(int(w.nbytes) for w in all_weights(neff).values())


# -- zero copy --------------------------------------------------------------------------


def test_weights_are_read_only_views_of_the_buffer() -> None:
    data = two_node_builder().build()
    neff = read_neff(data)
    whole = np.frombuffer(data, np.uint8)
    for name, array in all_weights(neff).items():
        assert np.shares_memory(array, whole), name
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[...] = 0


def test_weights_from_a_bytearray_are_views_and_read_only() -> None:
    data = bytearray(two_node_builder().build())
    neff = read_neff(data)
    whole = np.frombuffer(data, np.uint8)
    for array in all_weights(neff).values():
        assert np.shares_memory(array, whole)
        assert not array.flags.writeable


def test_weights_are_64_byte_aligned_in_the_buffer() -> None:
    data = two_node_builder().build()
    start = np.frombuffer(data, np.uint8).ctypes.data
    for array in all_weights(read_neff(data)).values():
        assert (array.ctypes.data - start) % 64 == 0


def test_read_neff_file_views_the_mmap(tmp_path: Path) -> None:
    path = tmp_path / "model.neff"
    write_neff(path, two_node_builder().build())
    neff = read_neff_file(path)
    assert neff.buffer is not None and isinstance(neff.buffer.obj, mmap.mmap)
    whole = np.frombuffer(neff.buffer, np.uint8)
    for array in all_weights(neff).values():
        assert np.shares_memory(array, whole)
        assert not array.flags.writeable
    assert neff.size == path.stat().st_size


def test_write_neff_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "m.neff"
    path.write_bytes(b"old")
    data = two_node_builder().build()
    write_neff(path, data)
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["m.neff"]


# -- gzip and determinism ---------------------------------------------------------------


def test_gzip_round_trip() -> None:
    plain = read_neff(two_node_builder().build())
    packed_data = two_node_builder().build(gzip=True)
    packed = read_neff(packed_data)
    assert packed.header.features & FEATURE_GZIP
    assert packed.nodes == plain.nodes
    assert packed.tensors == plain.tensors
    whole = np.frombuffer(packed_data, np.uint8)
    for array in all_weights(packed).values():
        assert not array.flags.writeable
        assert not np.shares_memory(array, whole)


@pytest.mark.parametrize("gzip", [False, True])
def test_build_is_deterministic(gzip: bool) -> None:
    one = two_node_builder().build(gzip=gzip, uuid=FIXED_UUID)
    two = two_node_builder().build(gzip=gzip, uuid=FIXED_UUID)
    assert one == two
    three = two_node_builder().build(gzip=gzip)
    assert three[HEADER_SIZE:] == one[HEADER_SIZE:]
    assert read_neff(three).header.uuid != FIXED_UUID


# -- builder refusals -------------------------------------------------------------------


def test_builder_refuses_what_the_reader_would() -> None:
    builder = NeffBuilder("bad")
    builder.add_input("x", "float32", (1,))
    builder.add_output("y", "float32", (1,))
    builder.add_node("n", "neuron", ["nope"], ["y"], [StageSpec([("Relu", ["nope"], ["y"])])])
    with pytest.raises(NeffInvalid, match="input 'nope' is neither a model input"):
        builder.build()


def test_builder_refuses_unknown_dtype_and_long_name() -> None:
    builder = NeffBuilder("m")
    builder.add_input("x", "float8", (1,))
    builder.add_output("y", "float32", (1,))
    builder.add_node("n", "cpu", ["x"], ["y"], [StageSpec([("Relu", ["x"], ["y"])])])
    with pytest.raises(NeffInvalid, match="unknown dtype 'float8'"):
        builder.build()
    with pytest.raises(NeffInvalid, match="name is 300 bytes"):
        NeffBuilder("n" * 300).build()


def test_builder_refuses_a_tensor_declared_two_ways() -> None:
    builder = NeffBuilder("m")
    builder.add_tensor("t", "float32", (2,))
    builder.add_tensor("t", "float32", (2,))
    with pytest.raises(NeffInvalid, match="tensor 't' declared twice"):
        builder.add_tensor("t", "int8", (2,))


# -- sample MLP -------------------------------------------------------------------------


def run_graph(neff: Neff, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A tiny interpreter for the four MLP ops, stage by stage, in float64."""
    env = {name: np.asarray(v, np.float64) for name, v in inputs.items()}
    for node in neff.nodes:
        for stage in node.stages:
            local = {name: env[name] for name in stage.inputs}
            local |= {name: w.astype(np.float64) for name, w in stage.weights.items()}
            for ins in stage.instructions:
                args = [local[name] for name in ins.inputs]
                local[ins.outputs[0]] = apply_op(ins, args)
            env |= {name: local[name] for name in stage.outputs}
    return {spec.name: env[spec.name] for spec in neff.outputs}


def apply_op(ins: Instruction, args: list[np.ndarray]) -> np.ndarray:
    if ins.op == "MatMul":
        return args[0] @ args[1]
    if ins.op == "Add":
        return args[0] + args[1]
    if ins.op == "Relu":
        return np.maximum(args[0], 0)
    assert ins.op == "Softmax" and ins.attrs == {"axis": -1}
    e = np.exp(args[0] - args[0].max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    ("nodes", "stages", "cpu_softmax", "gzip"),
    [(1, 1, False, False), (1, 2, True, False), (2, 1, False, True), (2, 2, True, True)],
)
def test_build_mlp_nc_counts(nodes: int, stages: int, cpu_softmax: bool, gzip: bool) -> None:
    model = build_mlp(
        (12, 10, 9, 8, 7, 5),
        batch=2,
        neuron_nodes=nodes,
        stages_per_node=stages,
        cpu_softmax=cpu_softmax,
        gzip=gzip,
    )
    neff = read_neff(model.neff)
    assert neff.nc_count == neff.header.nc_count == nodes * stages
    assert neff.max_node_ncs == neff.header.ncs_per_node == stages
    assert len(neff.neuron_nodes) == nodes
    assert len(neff.cpu_nodes) == (1 if cpu_softmax else 0)
    assert bool(neff.header.features & FEATURE_GZIP) == gzip
    ops = [i.op for n in neff.nodes for s in n.stages for i in s.instructions]
    assert set(ops) == {"MatMul", "Add", "Relu", "Softmax"}
    assert ops.count("MatMul") == 5 and ops.count("Relu") == 4 and ops[-1] == "Softmax"
    if cpu_softmax:
        assert neff.nodes[-1].stages[0].instructions[0].op == "Softmax"
    x = model.random_inputs(3)
    np.testing.assert_allclose(run_graph(neff, x)["probs"], model.reference(x)["probs"], 1e-5)


def test_build_mlp_layers_split_evenly() -> None:
    neff = read_neff(build_mlp((4, 4, 4, 4, 4, 4, 4, 4), neuron_nodes=2, stages_per_node=2).neff)
    per_stage = [
        sum(i.op == "MatMul" for i in s.instructions) for n in neff.nodes for s in n.stages
    ]
    assert per_stage == [2, 2, 2, 1]


def test_build_mlp_needs_a_layer_per_stage() -> None:
    with pytest.raises(ValueError, match="2 layers cannot fill 1 nodes x 3 stages"):
        build_mlp((4, 4, 4), stages_per_node=3)
    with pytest.raises(ValueError):
        build_mlp((4,))
    with pytest.raises(ValueError):
        build_mlp(dtype="int32")


def test_build_mlp_default_shapes_and_weights_in_the_neff() -> None:
    model = build_mlp()
    neff = read_neff(model.neff)
    assert model.name == neff.name == "mlp"
    assert model.inputs == neff.inputs == (TensorSpec("x", np.dtype("float32"), (1, 784)),)
    assert model.outputs == neff.outputs == (TensorSpec("probs", np.dtype("float32"), (1, 10)),)
    stored = {n: w for s in neff.nodes[0].stages for n, w in s.weights.items()}
    assert set(stored) == set(model.weights) == {"w0", "b0", "w1", "b1"}
    for name, array in model.weights.items():
        np.testing.assert_array_equal(stored[name], array)


def test_reference_matches_a_hand_written_forward() -> None:
    model = build_mlp((6, 5, 4, 3), batch=4, seed=11)
    w = {n: a for s in read_neff(model.neff).nodes[0].stages for n, a in s.weights.items()}
    x = model.random_inputs(5)["x"]
    assert x.shape == (4, 6) and x.dtype == np.float32
    h = np.maximum(x @ w["w0"] + w["b0"], 0)
    h = np.maximum(h @ w["w1"] + w["b1"], 0)
    logits = h @ w["w2"] + w["b2"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    got = model.reference({"x": x})["probs"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


def test_build_mlp_float16_and_seeds() -> None:
    model = build_mlp((8, 6, 4), dtype="float16", seed=1)
    neff = read_neff(model.neff)
    assert neff.inputs[0].dtype == np.float16
    assert model.reference(model.random_inputs())["probs"].dtype == np.float16
    assert (
        build_mlp((8, 6, 4), seed=1).neff[HEADER_SIZE:] != build_mlp((8, 6, 4)).neff[HEADER_SIZE:]
    )
    assert build_mlp((8, 6, 4)).neff[HEADER_SIZE:] == build_mlp((8, 6, 4)).neff[HEADER_SIZE:]
