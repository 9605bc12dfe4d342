"""The narrow element types of ml_dtypes (bfloat16, float8, float4, int4/uint4,
int2/uint2) in a NEFF and on every path a tensor takes: named and stored one element a
byte (docs/dtypes.md), compiled onto the NC, fed as ml_dtypes arrays or Python numbers
under the one dtype policy, computed by both engines alike, and sent by the client to
the daemon (inline and through shared memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import compile_model
from neuron_rtd.errors import BadInput, NeffInvalid
from neuron_rtd.neff import ALLOWED_DTYPES, NeffBuilder, NodeKind, StageSpec, as_input, read_neff
from neuron_rtd.neff import safe_cast as safe
from neuron_rtd.neff.dtypes import NARROW_DTYPES, dtype_name, parse_dtype
from neuron_rtd.runtime import LocalRuntime

BF16, E4M3FN, E8M0, F4, I4, U4, I2 = (
    np.dtype(t)
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.int4,
        ml_dtypes.uint4,
        ml_dtypes.int2,
    )
)
F4_, I8 = np.dtype(np.float32), np.dtype(np.int8)


# --- the NEFF ---------------------------------------------------------------------------
def test_every_type_has_a_name_that_reads_back_and_others_are_refused() -> None:
    assert set(NARROW_DTYPES) <= set(ALLOWED_DTYPES)
    for name in ALLOWED_DTYPES:
        dtype = parse_dtype(name, "tensor 'x'")
        assert dtype_name(dtype) == name and dtype.byteorder in "<|="
    assert parse_dtype("int4", "x") == I4 and parse_dtype("bfloat16", "x") == BF16
    with pytest.raises(
        NeffInvalid, match=r"^tensor 'x': unknown dtype 'float8' \(allowed: float16"
    ):
        parse_dtype("float8", "tensor 'x'")


def narrow_neff(shared_weights: bool) -> bytes:
    """A NEFF whose input, output and weights are narrow: a weight of each narrow type,
    and an int4 and a uint4 weight of the very same bytes."""
    builder = NeffBuilder("narrow")
    builder.add_input("x", "int4", (2, 3))
    builder.add_output("y", "float8_e4m3fn", (2, 3))
    weights = {name: np.arange(-3, 3).reshape(2, 3).astype(name) for name in NARROW_DTYPES}
    weights["same_bytes"] = np.array([-1, 7], I4).view(U4)  # bytes 0x0f 0x07, as int4's
    weights["int4_twin"] = np.array([-1, 7], I4)
    stage = StageSpec(instructions=[("Cast", ["x"], ["y"], {"to": 17})], weights=weights)
    builder.add_node("nc", NodeKind.NEURON, ["x"], ["y"], [stage])
    return builder.build(shared_weights=shared_weights)


@pytest.mark.parametrize("shared", [False, True])
def test_narrow_weights_and_tensors_round_trip_one_element_a_byte(shared: bool) -> None:
    neff = read_neff(narrow_neff(shared))
    (x,), (y,) = neff.inputs, neff.outputs
    assert (x.dtype, x.nbytes, y.dtype, y.nbytes) == (I4, 6, E4M3FN, 6)
    weights = neff.nodes[0].stages[0].weights
    for name in NARROW_DTYPES:
        want = np.arange(-3, 3).reshape(2, 3).astype(name)
        got = weights[name]
        assert got.dtype == want.dtype and got.nbytes == got.size * want.dtype.itemsize
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    # equal bytes of two types are two weights, each of its own type
    assert weights["same_bytes"].dtype == U4 and weights["same_bytes"].tolist() == [15, 7]
    assert weights["int4_twin"].dtype == I4 and weights["int4_twin"].tolist() == [-1, 7]
    assert read_neff(narrow_neff(shared)).nodes == neff.nodes  # e8m0 holds NaN: still equal


# --- the policy -------------------------------------------------------------------------
def test_safe_casts_of_narrow_types_are_those_that_keep_every_value() -> None:
    for source, target in [(I4, I8), (np.dtype(bool), F4), (E4M3FN, np.dtype(np.float16))]:
        assert safe(source, target), (source, target)
    assert safe(BF16, F4_) and safe(np.dtype(np.uint8), BF16) and safe(I2, F4)
    # ml_dtypes calls these safe; they are not (127 is no float8, -1 no uint4)
    assert not safe(I8, E4M3FN) and not safe(I4, U4) and not safe(E4M3FN, I4)
    assert not safe(F4_, BF16) and not safe(np.dtype(bool), E8M0)  # e8m0 has no zero


@pytest.mark.parametrize(
    ("value", "dtype", "taken"),
    [
        (np.array([1.5, -2.0]), BF16, [1.5, -2.0]),  # float64 values bfloat16 holds
        ([0.1, 2], BF16, [0.10009765625, 2.0]),  # Python numbers: rounded
        ([[1, -8]], I4, [[1, -8]]),
        (np.array([0.5, -6.0], np.float32), F4, [0.5, -6.0]),
        (np.array([3, 4], np.int8), E4M3FN, [3, 4]),
    ],
)
def test_values_a_narrow_type_holds_are_taken(value: Any, dtype: np.dtype, taken: Any) -> None:
    array = as_input(value, dtype, "x")
    assert array.dtype == dtype
    np.testing.assert_array_equal(array.astype(np.float64), taken)


@pytest.mark.parametrize(
    ("value", "dtype", "what"),
    [
        (np.array([0.1]), BF16, "is float64, the model takes bfloat16, which cannot hold its "
         "values (0.1 would become 0.10009765625)"),
        ([1000.0], E4M3FN, "holds Python numbers, the model takes float8_e4m3fn, which cannot "
         "hold its values (1000.0 is out of its range)"),
        (np.array([9]), I4, "(9 is out of its range, -8 to 7)"),
        (np.array([-1, 7], I4), U4, "is int4, the model takes uint4, which cannot hold its "
         "values (-1 is out of its range, 0 to 15)"),
        (np.array([0.5], np.float32), I2, "(0.5 would become 0)"),
        (np.array(["1"]), BF16, "input 'x' is <U1: the model takes bfloat16 numbers"),
    ],
)  # fmt: skip
def test_what_a_narrow_type_cannot_hold_is_refused_saying_why(
    value: Any, dtype: np.dtype, what: str
) -> None:
    with pytest.raises(BadInput) as info:
        as_input(value, dtype, "x")
    assert what in str(info.value)
    if "numbers" not in what:
        assert str(info.value).endswith(f"convert them (.astype('{dtype.name}')) or pass cast=True "
                                        "for numpy's unsafe cast (precision lost, out-of-range "
                                        "values become inf or wrap)")  # fmt: skip


def test_cast_true_converts_as_numpy_and_ml_dtypes_do() -> None:
    assert as_input(np.array([9, -9]), I4, "x", cast=True).tolist() == [-7, 7]  # wraps
    assert as_input(np.array([-1], I4), U4, "x", cast=True).tolist() == [15]  # no direct cast
    big = as_input(np.array([1000.0]), E4M3FN, "x", cast=True)
    assert np.isnan(big.astype(np.float32)).all()  # numpy's cast: no saturation asked


def test_an_npz_file_of_ml_dtypes_arrays_feeds_them_as_they_were(work: Path) -> None:
    np.savez(work / "in.npz", a=A, q=Q)
    with np.load(work / "in.npz") as saved:
        assert saved["a"].dtype == np.dtype("V2")  # npz keeps the bytes, not the type
        a, q = as_input(saved["a"], BF16, "a"), as_input(saved["q"], I4, "q")
        with pytest.raises(BadInput, match=r"^input 'q' is \|V1: the model takes bfloat16"):
            as_input(saved["q"], BF16, "q")  # bytes of another size are no bfloat16
    assert a.dtype == BF16 and a.tobytes() == A.tobytes()
    assert q.dtype == I4 and q.tolist() == Q.tolist()


# --- compiled, run on both engines -----------------------------------------------------
def mixed_model() -> bytes:
    """s = float(a: bfloat16) + float(q: int4); y = s as float8_e4m3fn (saturating);
    r = s through float8_e4m3fn and back to float32 (narrow inside, float32 outside)."""
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2, 3]),
        helper.make_tensor_value_info("q", TensorProto.INT4, [2, 3]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2, 3]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3]),
    ]
    nodes = [
        helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT),
        helper.make_node("CastLike", ["q", "af"], ["qf"]),
        helper.make_node("Add", ["af", "qf"], ["s"]),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["s"], ["s8"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["s8"], ["r"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "mixed", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return compile_model(model).neff


def internal_model() -> bytes:
    """r = x through float8_e4m3fn (saturating) and back: float32 at both ends."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Cast", ["x"], ["x8"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["x8"], ["r"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "internal", [x], [r])
    return compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])).neff


A = np.array([[0.5, 1.5, 300.0], [-2.0, 1e4, 0.1]], BF16)
Q = np.array([[1, -8, 7], [0, 3, -1]], I4)


def expected_mixed() -> dict[str, np.ndarray]:
    s = A.astype(np.float32) + Q.astype(np.float32)
    y = np.clip(s, -448, 448).astype(E4M3FN)
    return {"y": y, "r": y.astype(np.float32)}


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_narrow_tensors_compile_onto_the_nc_and_both_engines_compute_them(engine: str) -> None:
    neff = mixed_model()
    assert not read_neff(neff).cpu_nodes  # every op on the NC
    want = expected_mixed()
    with LocalRuntime("inf1.xlarge", engine=engine) as rt:
        model = rt.load(neff)
        for feeds in (
            {"a": A, "q": Q},
            {"a": A.astype(np.float32), "q": Q.astype(np.int64)},  # values they hold
            {"a": A.astype(np.float32).tolist(), "q": Q.tolist()},
        ):
            got = rt.infer(model, feeds)
            assert got["y"].dtype == E4M3FN and got["r"].dtype == np.float32
            np.testing.assert_array_equal(got["y"].astype(np.float32), want["y"].astype(np.float32))
            np.testing.assert_array_equal(got["r"], want["r"])
        with pytest.raises(BadInput, match=r"input 'q' holds Python numbers, the model takes int4"):
            rt.infer(model, {"a": A, "q": [[8, 0, 0], [0, 0, 0]]})
        narrow_inside = rt.load(internal_model())
        x = np.array([1.0, 500.0, -np.inf, 0.3], np.float32)
        r = rt.infer(narrow_inside, {"x": x})["r"]
        np.testing.assert_array_equal(r, [1.0, 448.0, -448.0, 0.3125])


# --- the client, on the real daemon -----------------------------------------------------
@pytest.mark.daemon
@pytest.mark.parametrize("shm", [True, False])
def test_the_client_sends_ml_dtypes_arrays_and_gets_them_back(
    daemon: DaemonProcess, shm: bool
) -> None:
    want = expected_mixed()
    with Client(daemon.address, shm=shm) as client, client.load(mixed_model()) as model:
        for feeds in ({"a": A, "q": Q}, {"a": A.astype(np.float32).tolist(), "q": Q.tolist()}):
            got = model.infer(feeds)
            assert got["y"].dtype == E4M3FN
            np.testing.assert_array_equal(got["y"].astype(np.float32), want["y"].astype(np.float32))
            np.testing.assert_array_equal(got["r"], want["r"])
        got = model.infer_async({"a": A, "q": Q}).result(timeout=30)
        np.testing.assert_array_equal(got["r"], want["r"])
