"""The three model families, compiled and run through the real daemon as a user would:
outputs match onnxruntime, with dynamic batch (CNN), dynamic sequence length (encoder) and
a variable number of detections (detector); 4 NCs give the same outputs as 1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import pytest

from neuron_rtd import models, onnxrt
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.client.client import NrtClientError
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import Nerr
from neuron_rtd.runtime import LocalRuntime

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c
        c.unload_all()


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    return onnxrt.run(onnxrt.session(model), feeds)


def assert_matches(got: np.ndarray, want: np.ndarray) -> None:
    """Same shape and dtype, cosine >= 0.9999, elementwise within ONNX-test tolerances."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    a, b = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    if a.size:
        cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0)
        assert cosine >= 0.9999, cosine
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_cnn_with_dynamic_batch(client: Client) -> None:
    onnx_model = models.resnet.build(**models.resnet.SMALL, seed=1)
    neff = compile_model(onnx_model, dynamic_batch=bucket_ranges(1, 4)).neff
    model = client.load(neff)
    try:
        feeds = models.random_inputs(onnx_model, seed=2, N=4)
        want = onnxruntime_outputs(onnx_model, feeds)["probs"]
        for n in (1, 3, 4):
            got = model(input=feeds["input"][:n])
            assert_matches(got["probs"], want[:n])
        with pytest.raises(NrtClientError) as info:
            model(input=np.zeros((5, 3, 64, 64), np.float32))
        assert (
            info.value.code == Nerr.INFER_BAD_INPUT
            and "the model takes float32 (batch<=4, 3, 64, 64)" in info.value.details
        )
    finally:
        model.unload()


def test_encoder_with_dynamic_sequence_length(client: Client) -> None:
    onnx_model = models.bert.build(**models.bert.SMALL, seed=3)
    neff = compile_model(
        onnx_model, dynamic={"B": [(1, 1)], "S": bucket_ranges(1, 32, "8,16,32")}
    ).neff
    model = client.load(neff)
    try:
        for seq in (5, 16, 29):
            feeds = models.random_inputs(onnx_model, seed=seq, B=1, S=seq)
            got = model(**feeds)
            for name, want in onnxruntime_outputs(onnx_model, feeds).items():
                assert_matches(got[name], want)
    finally:
        model.unload()


def test_detector_gives_a_variable_number_of_detections(client: Client) -> None:
    onnx_model = models.ssd.build(**models.ssd.SMALL)
    model = client.load(compile_model(onnx_model).neff)
    counts = set()
    try:
        for seed in range(4):
            feeds = models.random_inputs(onnx_model, seed=seed)
            got = model(**feeds)
            want = onnxruntime_outputs(onnx_model, feeds)
            for name in ("boxes", "scores", "classes"):
                assert_matches(got[name], want[name])
            counts.add(len(got["scores"]))
    finally:
        model.unload()
    assert len(counts) > 1 and 0 not in counts


def one_and_four_nc_outputs(
    family: str, infer: Callable[[bytes, dict[str, np.ndarray]], dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """A model of `family` compiled for 1 and for 4 NCs, run by `infer(neff, feeds)`."""
    onnx_model = models.MODELS[family](**models.SMALL[family], seed=4)
    if family == "resnet":
        dims: dict[str, int] = {"N": 2}
        options: dict[str, Any] = {"input_shapes": {"input": [2, 3, 64, 64]}}
    else:
        dims = {"B": 1, "S": 16}
        options = {"input_shapes": {"input_ids": [1, 16], "attention_mask": [1, 16]}}
    feeds = models.random_inputs(onnx_model, seed=5, **dims)
    results = []
    for ncs in (1, 4):
        result = compile_model(onnx_model, num_neuroncores=ncs, **options)
        assert result.summary.nc_count == ncs
        results.append(infer(result.neff, feeds))
    return results


@pytest.mark.parametrize("family", ["resnet", "bert"])
def test_four_neuroncores_give_the_outputs_of_one(client: Client, family: str) -> None:
    """On the daemon's (fast) engine, each stage is its own onnxruntime graph, fused on
    its own: the same numbers within fp32 rounding."""

    def infer(neff: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with client.load(neff) as model:
            return model(**feeds)

    one, four = one_and_four_nc_outputs(family, infer)
    for name in one:
        np.testing.assert_allclose(four[name], one[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["resnet", "bert"])
def test_four_neuroncores_give_the_bits_of_one_on_the_reference_engine(family: str) -> None:
    """The reference kernels compute each op the same way wherever its stage runs."""
    with LocalRuntime(engine="reference") as rt:

        def infer(neff: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            model = rt.load(neff)
            try:
                return rt.infer(model, feeds)
            finally:
                rt.unload(model)

        one, four = one_and_four_nc_outputs(family, infer)
    for name in one:
        np.testing.assert_array_equal(four[name], one[name])
