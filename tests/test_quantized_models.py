"""Quantized models from onnxruntime's own quantizer (quant_pre_process, quantize_static,
QDQ and QOperator formats, per tensor and per channel) compile onto the NC with no CPU
node (QDQ fused into int8 instructions) and give onnxruntime's numbers on both engines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from onnxruntime import quantization

from neuron_rtd import onnxrt
from neuron_rtd.compiler.compile import compile_model
from neuron_rtd.runtime import LocalRuntime

CACHE = Path("/tmp/neuron_rtd_quantized_models")
BENCH = Path(__file__).resolve().parents[1] / "bench"


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, shape: tuple[int, ...]) -> None:
        rng = np.random.default_rng(0)
        self.samples = iter(
            [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


def _small_cnn() -> Any:
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c, c * 2, 1),
                nn.ReLU6(),
                nn.Conv2d(c * 2, c * 2, 3, padding=1, groups=c * 2),
                nn.ReLU(),
                nn.Conv2d(c * 2, c, 1),
            )

        def forward(self, x: Any) -> Any:
            return x + self.body(x)

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        Block(16),
        Block(16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _mobilenet_v2() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        from torch_nets import MobileNetV2
    finally:
        sys.path.remove(str(BENCH))
    return MobileNetV2()


def _quantized(name: str, shape: tuple[int, ...], fmt: str, per_channel: bool) -> Path:
    """The model exported (opset 17) and quantized by onnxruntime, cached."""
    CACHE.mkdir(exist_ok=True)
    float_path, pre = CACHE / f"{name}.onnx", CACHE / f"{name}.pre.onnx"
    if not pre.exists():
        torch.manual_seed(0)
        net = {"small": _small_cnn, "mobilenet_v2": _mobilenet_v2}[name]()
        with torch.no_grad():  # batch-norm statistics of one pass, then inference mode
            net.train()
            net(torch.randn(8, *shape[1:]))
        net.eval()
        torch.onnx.export(
            net,
            (torch.randn(*shape),),
            str(float_path),
            dynamo=False,
            opset_version=17,
            input_names=["input"],
            output_names=["logits"],
        )
        quantization.quant_pre_process(str(float_path), str(pre))
    out = CACHE / f"{name}.{fmt}.{int(per_channel)}.onnx"
    if not out.exists():
        quantization.quantize_static(
            str(pre),
            str(out),
            _Reader(shape),
            quant_format=getattr(quantization.QuantFormat, fmt),
            per_channel=per_channel,
        )
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _check(path: Path, shape: tuple[int, ...], engines: tuple[str, ...]) -> None:
    compiled = compile_model(path.read_bytes(), name=path.stem)
    kinds = [node.kind for _, emitted in compiled.summary.sections for node in emitted.nodes]
    assert kinds == ["neuron"], kinds  # one Neuron node, no CPU node
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = onnxrt.session(path.read_bytes(), threads=2).run(None, {"input": x})[0]
    for engine in engines:
        with LocalRuntime(engine=engine) as rt:
            got = rt.infer(rt.load(compiled.neff), {"input": x})["logits"]
        assert _cosine(got, want) >= 0.999
        assert got.argmax() == want.argmax()
        np.testing.assert_array_equal(got, want)  # in fact bit-exact: the same integers


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_small_cnn_on_the_nc(fmt: str, per_channel: bool) -> None:
    shape = (1, 3, 32, 32)
    _check(_quantized("small", shape, fmt, per_channel), shape, ("reference", "fast"))


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_mobilenet_v2_on_the_nc(fmt: str) -> None:
    shape = (1, 3, 224, 224)
    _check(_quantized("mobilenet_v2", shape, fmt, fmt == "QDQ"), shape, ("fast",))
