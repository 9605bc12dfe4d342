"""Every front checks an input's shape against the model's signature before anything is
sent or run, with the one checker (`neuron_rtd.neff.casting.input_array`): an array
whose byte count matches but whose shape does not (NHWC into an NCHW model, (28, 28)
into (1, 784)) is refused, naming the input, the shape given and the one expected; a
dynamic batch takes any size its buckets hold. Through the real daemon with shared
memory and inline, staged inputs too, and in-process (`LocalRuntime`)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import BadInput, Nerr
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.runtime import LocalRuntime

pytestmark = pytest.mark.daemon

NCHW = (1, 3, 64, 64)
NHWC = np.random.default_rng(0).random((1, 64, 64, 3)).astype(np.float32)
FLAT = np.zeros((28, 28), np.float32)  # 784 values, for a (1, 784) input

CASES = [
    pytest.param(
        "nchw",
        NHWC,
        "input 'x' has shape (1, 64, 64, 3); the model takes float32 "
        "(1, 3, 64, 64): give it an array of that shape",
        id="NHWC-into-NCHW",
    ),
    pytest.param(
        "mlp",
        FLAT,
        "input 'x' has shape (28, 28); the model takes float32 "
        "(1, 784): give it an array of that shape",
        id="28x28-into-1x784",
    ),
]


def _neffs() -> dict[str, bytes]:
    return {"nchw": build_relu(NCHW, name="nchw"), "mlp": build_mlp().neff}


def _dynamic() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return compile_model(model, dynamic_batch=bucket_ranges(1, 4)).neff


@pytest.fixture(scope="module", params=[True, False], ids=["shm", "inline"])
def client(request: pytest.FixtureRequest, daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.address, shm=request.param) as c:
        assert c.shm_enabled is request.param
        yield c


@pytest.mark.parametrize(("which", "x", "said"), CASES)
def test_the_client_refuses_a_wrong_shape_of_the_right_size(
    client: Client, which: str, x: np.ndarray, said: str
) -> None:
    model = client.load(_neffs()[which])
    try:
        assert x.nbytes == model.inputs[0].nbytes  # the daemon's byte check would pass it
        with pytest.raises(NrtClientError) as refused:
            model(x=x)
        assert refused.value.code == Nerr.INFER_BAD_INPUT
        assert str(refused.value) == f"infer: NERR_INFER_BAD_INPUT: {said}"
        with pytest.raises(NrtClientError, match="has shape"):
            model.infer_async({"x": x}, posted=False).result()
        with pytest.raises(NrtClientError, match="has shape"):
            model.infer_async({"x": x}).result()
        # nothing reached the daemon: its tally counts no refused input
        (info,) = [m for m in client.connection.snapshot().models if m.id == model.id]
        assert info.tally.incorrect_input == 0
        # the right shape runs
        assert model(x=x.reshape(model.inputs[0].shape))
    finally:
        model.unload()


def test_staged_inputs_are_of_the_model_s_shape(client: Client) -> None:
    model = client.load(build_mlp().neff)
    try:
        staged = model.stage()
        if staged is None:  # inline: nothing to stage
            assert not client.shm_enabled
            return
        assert staged.inputs["x"].shape == (1, 784)
        staged.inputs["x"][...] = 1.0
        assert model.infer(staged)["probs"].shape == (1, 10)
    finally:
        model.unload()


def test_a_dynamic_batch_takes_any_batch_its_buckets_hold(client: Client) -> None:
    model = client.load(_dynamic())
    try:
        for batch in (1, 3, 4):
            x = np.full((batch, 4), -1.0, np.float32)
            assert model(x=x)["y"].shape == (batch, 4)
        with pytest.raises(NrtClientError) as refused:
            model(x=np.zeros((2, 2, 4), np.float32))
        assert str(refused.value).endswith(
            "input 'x' has shape (2, 2, 4); the model takes float32 (batch<=4, 4): give it "
            "an array of that shape"
        )
        with pytest.raises(NrtClientError, match=r"has shape \(5, 4\)"):  # past its buckets
            model(x=np.zeros((5, 4), np.float32))
    finally:
        model.unload()


def test_the_repr_says_where_the_model_is(client: Client) -> None:
    model = client.load(build_mlp().neff)
    try:
        assert repr(model) == f"Model(id={model.id}, name='mlp', implicit NCG)"
    finally:
        model.unload()
    ncg, _ = client.create_ncg(1)
    try:
        model = client.load(build_mlp().neff, ncg=ncg)
        assert repr(model) == f"Model(id={model.id}, name='mlp', ncg={ncg})"
        model.unload()
    finally:
        client.destroy_ncg(ncg)


@pytest.mark.parametrize(("which", "x", "said"), CASES)
def test_local_runtime_refuses_them_alike(which: str, x: np.ndarray, said: str) -> None:
    with LocalRuntime() as rt:
        model = rt.load(_neffs()[which])
        with pytest.raises(BadInput) as refused:
            rt.infer(model, {"x": x})
        assert str(refused.value) == said
        with pytest.raises(BadInput, match="has shape"):
            rt.post(model, {"x": x})
        assert rt.infer(model, {"x": x.reshape(model.neff.inputs[0].shape)})
        dynamic = rt.load(_dynamic())
        assert rt.infer(dynamic, {"x": np.ones((3, 4), np.float32)})["y"].shape == (3, 4)
