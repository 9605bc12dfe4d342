"""A model a PyTorch user exports as PyTorch's own docs say, `torch.onnx.export(module,
args, path)` with its defaults (torch 2.13: the dynamo exporter, which imports onnxscript,
and weights in an external data file beside the model), compiles with `neuron-cc` and
answers as the module does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from neuron_rtd.runtime import LocalRuntime

pytest.importorskip("torch")

import torch
from torch import nn


def _net() -> Any:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    return Net().eval()


def test_torch_onnx_export_with_its_defaults_compiles_with_neuron_cc(tmp_path: Path) -> None:
    net, x = _net(), torch.randn(1, 3, 16, 16)
    model, neff = tmp_path / "net.onnx", tmp_path / "net.neff"
    torch.onnx.export(net, (x,), str(model), input_names=["x"], output_names=["y"])
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.compiler.cli", "compile", str(model), "-o", str(neff)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with torch.no_grad():
        want = net(x).numpy()
    with LocalRuntime() as rt:
        got = rt.infer(rt.load(neff.read_bytes()), {"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
