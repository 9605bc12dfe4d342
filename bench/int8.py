"""Int8 against float through the daemon: nets as PyTorch exports them, quantized by
onnxruntime's own quantizer (QDQ per channel, QOperator per tensor), compiled and served,
beside onnxruntime running the same ONNX models, side by side in one run.

    python bench/int8.py [--nets mobilenet_v2,resnet18] [--calls 60] [--rounds 3]
                         [--cache DIR]

Each net (bench/torch_nets.py, seed 0) is exported at batch 1 (opset 17), prepared by
`quant_pre_process` and quantized by `quantize_static` on 8 random calibration samples
(cached in `--cache`, a temp folder by default). Every model is compiled by neuron-cc's
`compile_model` (the printed op counts say whether any op went to a CPU node) and loaded
on one daemon (a real `neuron-rtd` on a simulated inf1.6xlarge); calls alternate in rounds
between the models, each side's p50 is the median of all its calls. onnxruntime runs the
same ONNX files in this process with 2 intra-op threads. The last column compares each
int8 model with its float one: the agreement of their outputs (cosine), from the daemon.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime import quantization
from timing import alternate  # bench/timing.py (a script's folder is on its path)
from torch_nets import export  # bench/torch_nets.py (a script's folder is on its path)

from neuron_rtd import onnxrt
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler.compile import compile_model

VARIANTS = (("QDQ", True), ("QOperator", False))  # format, per channel


class Samples(quantization.CalibrationDataReader):
    """Random calibration inputs for the quantizer."""

    def __init__(self, name: str, shape: tuple[int, ...], count: int = 8) -> None:
        rng = np.random.default_rng(0)
        self.samples = iter(
            {name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


def models(net: str, cache: Path) -> dict[str, Path]:
    """The float model and its int8 variants, made (or reused) in `cache`."""
    float_path, prepared = cache / f"{net}.onnx", cache / f"{net}.pre.onnx"
    if not float_path.exists():
        export(net, str(float_path))
    if not prepared.exists():
        try:
            quantization.quant_pre_process(str(float_path), str(prepared))
        except Exception:  # its symbolic shape inference fails on some exports (a Reshape's)
            quantization.quant_pre_process(str(float_path), str(prepared), skip_symbolic_shape=True)
    graph_input = onnx.load(str(float_path)).graph.input[0]
    shape = tuple(d.dim_value for d in graph_input.type.tensor_type.shape.dim)
    made = {"float": float_path}
    for fmt, per_channel in VARIANTS:
        path = cache / f"{net}.{fmt}.onnx"
        if not path.exists():
            quantization.quantize_static(
                str(prepared),
                str(path),
                Samples(graph_input.name, shape),
                quant_format=getattr(quantization.QuantFormat, fmt),
                per_channel=per_channel,
            )
        made[f"int8 {fmt}"] = path
    return made


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def p50_ms(sides: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Each side's p50 in ms over `calls` calls, in alternating rounds."""
    times = alternate(sides, calls, rounds)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def compare(net: str, paths: dict[str, Path], client: Client, args: argparse.Namespace) -> None:
    """One net's float and int8 models: compiled, loaded, timed, compared (a table)."""
    loaded: dict[str, Any] = {}
    sessions: dict[str, Any] = {}
    for label, path in paths.items():
        summary = (result := compile_model(onnx.load(str(path)))).summary
        print(f"{net} {label}: {summary.nc_ops} ops on the NC, {summary.cpu_ops} on CPU")
        loaded[label] = client.load(result.neff)
        sessions[label] = onnxrt.session(path, threads=2)
    spec = loaded["float"].inputs[0]
    feeds = {spec.name: np.random.default_rng(1).standard_normal(spec.shape).astype(np.float32)}
    daemon_sides: dict[str, Callable[[], Any]] = {
        label: functools.partial(model.infer, feeds) for label, model in loaded.items()
    }
    ort_sides: dict[str, Callable[[], Any]] = {
        label: functools.partial(session.run, None, feeds) for label, session in sessions.items()
    }
    ours = p50_ms(daemon_sides, args.calls, args.rounds)
    theirs = p50_ms(ort_sides, args.calls, args.rounds)
    reference = next(iter(loaded["float"].infer(feeds).values()))
    print(
        f"{'':24}{'daemon ms':>11}{'x float':>9}{'onnxruntime ms':>16}{'x float':>9}"
        f"{'cosine to float':>17}"
    )
    for label, model in loaded.items():
        got = next(iter(model.infer(feeds).values()))
        print(
            f"{net + ' ' + label:24}{ours[label]:11.2f}{ours[label] / ours['float']:9.2f}"
            f"{theirs[label]:16.2f}{theirs[label] / theirs['float']:9.2f}"
            f"{cosine(got, reference):17.6f}"
        )
        model.unload()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="mobilenet_v2,resnet18")
    parser.add_argument("--calls", type=int, default=60, help="calls per side in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, help="where the ONNX models are kept")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nrt-int8-"))
    cache = args.cache or work
    cache.mkdir(parents=True, exist_ok=True)
    with DaemonProcess(sim_root=work / "sim") as daemon, Client(daemon.address) as client:
        for net in args.nets.split(","):
            compare(net, models(net, cache), client, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
