"""The one dtype policy (`neuron_rtd.neff.casting`, docs/dtypes.md) and every path that
applies it: the policy as a function, `LocalRuntime`, the client against the real daemon
(shared memory and inline, sync and async), `neuron-cli infer` and `validate`, and
neuron-batch's feature specs and record values."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.compiler import compile_model
from neuron_rtd.errors import BadInput, Nerr
from neuron_rtd.neff import TensorSpec, as_input, safe_cast
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import tf_pb
from neuron_rtd.records.features import (
    DecodeError,
    SpecMismatch,
    check_specs,
    decode_record,
    parse_feature,
)
from neuron_rtd.runtime import LocalRuntime

F4, F8, I4, I8, U1 = (np.dtype(t) for t in ("<f4", "<f8", "<i4", "<i8", "u1"))
OUT_OF_RANGE = "is out of its range"


# --- the policy -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "dtype", "taken"),
    [
        (np.array([0.5, -0.0, np.nan, np.inf]), F4, [0.5, -0.0, np.nan, np.inf]),  # exact
        (np.arange(3, dtype=np.int32), I8, [0, 1, 2]),  # safe casts
        (np.ones(2, np.float16), F4, [1.0, 1.0]),
        (np.array([0, 255], np.uint8), F4, [0.0, 255.0]),
        (np.array([True, False]), F4, [1.0, 0.0]),
        (np.array([1, 2**31 - 1]), I4, [1, 2**31 - 1]),  # int64 values int32 holds
        (np.array([2.0, -7.0]), I4, [2, -7]),  # whole floats for an integer input
        (np.array([1.0, 0.0]), np.dtype(bool), [True, False]),
        (np.array([2**40]), F4, [2.0**40]),  # an int64 float32 holds exactly
        ([0.1, 2], F4, [np.float32(0.1), 2.0]),  # Python numbers: rounded, as numpy rounds
        (3, F4, 3.0),
        ([[1, 2]], U1, [[1, 2]]),
    ],
)
def test_values_the_dtype_holds_are_taken(value: Any, dtype: np.dtype, taken: Any) -> None:
    array = as_input(value, dtype, "x")
    assert array.dtype == dtype
    np.testing.assert_array_equal(array, np.asarray(taken, dtype))


@pytest.mark.parametrize(
    ("value", "dtype", "what"),
    [
        (
            np.full((1, 784), 1e300),
            F4,
            f"is float64, the model takes float32, which cannot "
            f"hold its values (1e+300 {OUT_OF_RANGE})",
        ),
        (np.array([0.1]), F4, "(0.1 would become 0.10000000149011612)"),
        (np.float64(0.1), F4, "is float64"),  # a numpy scalar has its dtype: no rounding
        (
            [1e300],
            F4,
            f"holds Python numbers, the model takes float32, which cannot hold its "
            f"values (1e+300 {OUT_OF_RANGE})",
        ),
        (np.array([2**40]), I4, f"(1099511627776 {OUT_OF_RANGE}, -2147483648 to 2147483647)"),
        (np.array([-1]), U1, f"(-1 {OUT_OF_RANGE}, 0 to 255)"),
        ([300], U1, f"(300 {OUT_OF_RANGE}, 0 to 255)"),
        (np.array([1.5]), I4, "(1.5 would become 1)"),
        (np.array([np.nan]), I4, "(nan would become"),
        (np.array([2.0]), np.dtype(bool), "(2.0 would become True)"),
        (np.array([2**53 + 1]), F8, "(9007199254740993 would become 9007199254740992.0)"),
        (np.array(["1"]), F4, "input 'x' is <U1: the model takes float32 numbers"),
    ],
)
def test_what_the_dtype_cannot_hold_is_refused_saying_why(
    value: Any, dtype: np.dtype, what: str
) -> None:
    with pytest.raises(BadInput) as info:
        as_input(value, dtype, "x")
    assert info.value.code == Nerr.INFER_BAD_INPUT
    text = str(info.value)
    assert text.startswith("input 'x' ") and what in text
    if "numbers" not in what:
        assert text.endswith(
            f": convert them (.astype('{dtype.name}')) or pass cast=True for numpy's unsafe "
            "cast (precision lost, out-of-range values become inf or wrap)"
        )
    with pytest.raises(BadInput, match="or pass --cast for"):
        as_input(np.array([0.1]), F4, "x", option="--cast")


def test_the_own_dtype_costs_nothing_and_cast_is_numpys_unsafe_cast() -> None:
    x = np.zeros((2, 3), np.float32)
    assert as_input(x, F4, "x") is x  # the array itself: no copy, no check
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: numpy's overflow warning is not said
        assert np.isinf(as_input(np.full(2, 1e300), F4, "x", cast=True)).all()
        np.testing.assert_array_equal(as_input([300, -1], U1, "x", cast=True), [44, 255])
        np.testing.assert_array_equal(as_input(np.array([1.7]), I4, "x", cast=True), [1])


def test_safe_casts_are_numpys_less_integers_wider_than_the_mantissa() -> None:
    assert safe_cast(I4, I8) and safe_cast(np.dtype("f2"), F4) and safe_cast(I4, F8)
    assert safe_cast(np.dtype(bool), np.dtype("f2")) and safe_cast(U1, np.dtype("f2"))
    assert not safe_cast(I8, F8)  # numpy calls it safe; 2**53 + 1 is no float64
    assert not safe_cast(I4, F4) and not safe_cast(F8, F4) and not safe_cast(I8, I4)


# --- LocalRuntime -----------------------------------------------------------------------
def twice_int32() -> bytes:
    """y = ids + ids, int32 (4,)."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [4])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [4])
    graph = helper.make_graph([helper.make_node("Add", ["ids", "ids"], ["y"])], "twice", [ids], [y])
    return compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])).neff


def test_local_runtime_takes_and_refuses_as_the_client_does() -> None:
    with LocalRuntime("inf1.xlarge") as rt:
        model = rt.load(twice_int32())
        for ids in (np.arange(4, dtype=np.int32), np.arange(4), np.arange(4.0), [0, 1, 2, 3]):
            np.testing.assert_array_equal(rt.infer(model, {"ids": ids})["y"], [0, 2, 4, 6])
        big = np.array([2**40, 0, 0, 0])
        with pytest.raises(BadInput, match=f"1099511627776 {OUT_OF_RANGE}"):
            rt.infer(model, {"ids": big})
        with pytest.raises(BadInput, match=r"1\.5 would become 1"):
            rt.post(model, {"ids": [1.5, 0, 0, 0]})
        np.testing.assert_array_equal(rt.infer(model, {"ids": big}, cast=True)["y"], [0] * 4)


# --- the client, on the real daemon -----------------------------------------------------
@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    return build_mlp((16, 32, 8), batch=2, seed=5)


@pytest.mark.daemon
@pytest.mark.parametrize("shm", [True, False])
def test_the_client_refuses_before_sending_and_casts_when_asked(
    daemon: DaemonProcess, mlp: SampleModel, shm: bool
) -> None:
    x = mlp.random_inputs(3)["x"]
    want = mlp.reference({"x": x})["probs"]
    with Client(daemon.address, shm=shm) as client, client.load(mlp.neff) as model:
        for taken in (x, x.astype(np.float64), x.astype(np.float16).astype(np.float32)):
            got = model(x=taken)["probs"]
            np.testing.assert_allclose(got, mlp.reference({"x": taken})["probs"], rtol=1e-5)
        np.testing.assert_allclose(model(x=x.tolist())["probs"], want, rtol=1e-5)
        refused = np.full(x.shape, 1e300)
        calls: list[Any] = [
            lambda: model(x=refused),
            lambda: model.infer({"x": refused}),
            lambda: model.infer_async({"x": refused}).result(timeout=30),
            lambda: model.infer_async({"x": refused}, posted=False).result(timeout=30),
        ]
        for call in calls:
            with pytest.raises(NrtClientError) as info:
                call()
            assert info.value.nerr is Nerr.INFER_BAD_INPUT and info.value.method == "infer"
            assert (
                f"input 'x' is float64, the model takes float32, which cannot hold its "
                f"values (1e+300 {OUT_OF_RANGE})" in info.value.details
            )
            assert "or pass cast=True for numpy's unsafe cast" in info.value.details
        stats = {m.id: m for m in client.connection.snapshot().models}[model.id]
        assert stats.tally.incorrect_input == 0  # nothing was sent
        inf_in = model(x=refused, cast=True)["probs"]
        assert np.isnan(inf_in).all()  # what was asked: inf in, NaN out
        future = model.infer_async({"x": refused}, posted=False, cast=True)
        assert np.isnan(future.result(timeout=30)["probs"]).all()
        np.testing.assert_allclose(model(x=x)["probs"], want, rtol=1e-5)  # still serving


# --- the tools --------------------------------------------------------------------------
def tool(*args: str | Path | int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.daemon
def test_neuron_cli_infer_takes_what_the_client_takes_and_casts_with_cast(
    daemon: DaemonProcess, mlp: SampleModel, work: Path
) -> None:
    (work / "mlp.neff").write_bytes(mlp.neff)
    with Client(daemon.address, session=False) as client:
        model_id = client.load(work / "mlp.neff").id
    cli = ("neuron_rtd.cli.neuron_cli", "infer", model_id, "-a", daemon.address)
    x = mlp.random_inputs(4)["x"]
    try:
        np.savez(work / "ok.npz", x=x.astype(np.float64))  # values float32 holds: taken
        done = tool(*cli, "--inputs", work / "ok.npz", "--outputs", work / "out.npz")
        assert done.returncode == 0, done.stderr
        with np.load(work / "out.npz") as out:
            np.testing.assert_allclose(out["probs"], mlp.reference({"x": x})["probs"], rtol=1e-5)

        np.savez(work / "big.npz", x=np.full(x.shape, 1e300))
        done = tool(*cli, "--inputs", work / "big.npz")
        assert done.returncode != 0 and done.stdout == "" and "Traceback" not in done.stderr
        assert done.stderr.startswith(
            f"neuron-cli: {work}/big.npz: input 'x' is float64, the model takes float32, which "
            f"cannot hold its values (1e+300 {OUT_OF_RANGE}): convert them (.astype('float32')) "
            "or pass --cast for numpy's unsafe cast"
        )
        done = tool(*cli, "--inputs", work / "big.npz", "--cast", "--json")
        assert done.returncode == 0, done.stderr
        assert '"nonfinite": 16' in done.stdout  # inf in, NaN out: what was asked
    finally:
        with Client(daemon.address) as client:
            client.unload(model_id)


@pytest.mark.daemon
def test_validate_and_profile_take_npz_inputs_by_the_policy(
    daemon: DaemonProcess, work: Path
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx_model.ir_version = 8  # one onnxruntime reads
    (work / "m.onnx").write_bytes(onnx_model.SerializeToString())
    (work / "m.neff").write_bytes(compile_model(onnx_model).neff)
    np.savez(work / "halves.npz", x=np.full((2, 4), 0.5))  # float64 that float32 holds
    np.savez(work / "tenths.npz", x=np.full((2, 4), 0.1))
    validate = ("neuron_rtd.cli.neuron_cli", "validate", work / "m.onnx", work / "m.neff")
    profile = ("neuron_rtd.cli.neuron_cli", "profile", work / "m.neff", "--runs", "1")
    for command in (validate, profile):
        done = tool(*command, "-a", daemon.address, "--inputs", work / "halves.npz")
        assert done.returncode == 0, done.stderr
        done = tool(*command, "-a", daemon.address, "--inputs", work / "tenths.npz")
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert (
            f"--inputs {work}/tenths.npz: input 'x' is float64, the model takes float32, "
            "which cannot hold its values (0.1 would become 0.10000000149011612)" in done.stderr
        )
        assert "or pass --cast for numpy's unsafe cast" in done.stderr
        done = tool(*command, "-a", daemon.address, "--inputs", work / "tenths.npz", "--cast")
        assert done.returncode == 0, done.stderr


def test_neuron_batch_features_follow_the_policy() -> None:
    x = TensorSpec("x", F4, (4, 3))
    with pytest.raises(SpecMismatch) as info:
        check_specs([parse_feature("x:float64:3")], [x])
    assert str(info.value) == (
        "--feature x: float64 for the model's input 'x', float32, which cannot hold every "
        "float64 value: declare the feature float32 (the records' values are checked as they "
        "are decoded) or pass --cast for numpy's unsafe cast"
    )
    cast = parse_feature("x:float64:3")
    assert check_specs([dataclasses.replace(cast, cast=True)], [x]) == 4
    assert check_specs([parse_feature("x:float16:3")], [x]) == 4  # safe

    example = tf_pb.Example()
    example.features.feature["ids"].int64_list.value.extend([1, 300, 2])
    record = example.SerializeToString()
    spec = parse_feature("ids:uint8:3:list")
    with pytest.raises(DecodeError) as decode:
        decode_record(record, "f@0", [spec])
    assert str(decode.value) == (
        "f@0: feature 'ids' has int64 values the feature's uint8 cannot hold (300 is out of its "
        "range, 0 to 255): pass --cast for numpy's unsafe cast"
    )
    casted = decode_record(record, "f@0", [dataclasses.replace(spec, cast=True)])["ids"]
    np.testing.assert_array_equal(casted, [1, 44, 2])
    fits = decode_record(record, "f@0", [parse_feature("ids:int32:3:list")])["ids"]
    np.testing.assert_array_equal(fits, [1, 300, 2])


def test_neuron_batch_refuses_a_lossy_feature_before_it_connects(work: Path) -> None:
    neff = work / "m.neff"
    neff.write_bytes(build_mlp((16, 8), batch=2, seed=1).neff)
    args = ("neuron_rtd.cli.neuron_batch", "--neff", neff, "--input", work / "none")
    done = tool(*args, "--feature", "x:float64:16", "--output", work / "out")
    assert done.returncode == 2 and done.stdout == ""
    assert "--feature x: float64 for the model's input 'x', float32" in done.stderr
    assert "or pass --cast" in done.stderr
