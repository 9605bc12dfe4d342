"""The PyTorch plugin's cost: a traced module's call against `Client.infer` of the same
NEFF with the same inputs (the plugin's own overhead: structure, checks, tensor views) on
the very model the module loaded (the same client, NCG and NC: a copy loaded elsewhere
runs on an NC of its own, whose thread choice may differ), beside the least any
tensor-in, tensor-out call adds to the client's (`tensor.numpy()` of the input and
`torch.from_numpy` of the output: the floor), against eager PyTorch on the same number of
threads as an NC computes with; and DataParallel over 4 NCGs at batch 32 against one NCG.

    python bench/torch_plugin.py [--calls 400] [--rounds 5] [--threads 1]

The daemon runs on a private simulated inf1.6xlarge. Calls alternate in rounds, so the
machine's noise hits every side alike; p50 and p99 per side, and the ratios. The goal for
the plugin's overhead: its p50 at most 1.05x the client's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from timing import alternate, report  # bench/timing.py (a script's folder is on its path)
from torch import nn

import neuron_rtd.torch as neuron
from neuron_rtd.cli.spawn import DaemonProcess


class ResidualCNN(nn.Module):
    """A small residual CNN (BatchNorm folded at export), 3x32x32 in, 10 classes out."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 1)
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.relu(y + self.body(y))
        return self.head(y.mean((2, 3)))


def overhead(net: nn.Module, x: torch.Tensor, args: argparse.Namespace) -> None:
    """The traced module against Client.infer of its NEFF and against eager PyTorch."""
    traced = neuron.trace(net, x)
    traced(x)  # loaded now, through the plugin's own Client
    model = traced.loaded.model
    assert model is not None
    torch.set_num_threads(args.threads)
    feeds = {"input0": x.numpy()}
    output = model.outputs[0].name
    sides = {
        "traced module (neuron_rtd.torch)": lambda: traced(x),
        "Client.infer, same loaded NEFF": lambda: model.infer(feeds),
        # the least a tensor-in, tensor-out call adds to the client's: torch's view of the
        # input as an array, and a tensor over the output array (no checks, no structure)
        "floor: Client.infer + torch views": lambda: torch.from_numpy(
            model.infer({"input0": x.numpy()})[output]
        ),
        f"eager PyTorch, {args.threads} thread(s)": lambda: net(x),
    }
    print(f"batch 1, {args.calls} calls per side in {args.rounds} rounds:")
    with torch.no_grad():
        report(alternate(sides, args.calls, args.rounds), "Client.infer, same loaded NEFF")


def data_parallel(net: nn.Module, args: argparse.Namespace) -> None:
    """DataParallel over 4 NCGs at batch 32 against the traced module on one NCG (both
    compiled with buckets up to 32: one NCG runs the batch in one inference)."""
    x = torch.randn(1, 3, 32, 32)
    batched = neuron.trace(
        net, x, dynamic_batch_size=True, compiler_args=["--dynamic-batch", "1:32"]
    )
    parallel = neuron.DataParallel(batched, device_ids=[0, 1, 2, 3])
    big = torch.randn(32, 3, 32, 32)
    sides = {"DataParallel, 4 NCGs": lambda: parallel(big), "one NCG": lambda: batched(big)}
    calls = max(args.rounds, args.calls // 10)
    print(f"batch 32, {calls} calls per side in {args.rounds} rounds:")
    report(alternate(sides, calls, args.rounds), "one NCG")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per side in all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="eager PyTorch's threads (an NC's share: 1)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    net = ResidualCNN()
    with torch.no_grad():
        net(torch.randn(8, 3, 32, 32))  # running statistics worth folding
    net.eval()
    work = Path(tempfile.mkdtemp(prefix="nrt-bench-"))
    with DaemonProcess(sim_root=work / "sim") as daemon:
        os.environ["NEURON_RTD_ADDRESS"] = daemon.address
        os.environ.pop("NEURONCORE_GROUP_SIZES", None)
        overhead(net, torch.randn(1, 3, 32, 32), args)
        data_parallel(net, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
