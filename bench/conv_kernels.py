"""The NeuronCore's Conv kernel against onnxruntime on the conv shapes of ResNet-18 (and a
depthwise conv), side by side in one run.

    python bench/conv_kernels.py [--batches 1 8] [--rounds 15]

Each shape is a one-node Conv model (weights as initializers) run by onnxruntime with
two intra-op threads, and the same Conv run by the NC kernel (driver_sim.ops.conv) on the
same input. The two alternate call by call so machine noise hits both alike; the output
is checked against onnxruntime's first. Prints per shape both medians and their ratio,
then per batch size the sums over the ResNet-18 shapes. The NC kernel computes in numpy,
so its speed depends on the BLAS numpy uses (the OPENBLAS_* settings are printed).
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin for ~0.1 s after each call, which would slow the onnxruntime
# call that follows (and onnxruntime's pool is told not to spin, below); 2**4 cycles puts
# them to sleep at once. Set before numpy loads its BLAS.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from driver_sim import KERNELS
from neuron_rtd import onnxrt
from neuron_rtd.compiler.onnx_attrs import node_attrs

THREADS = 2


@dataclass(frozen=True)
class ConvShape:
    name: str
    cin: int
    cout: int
    size: int
    kernel: int
    stride: int
    group: int = 1
    resnet: bool = True

    @property
    def pad(self) -> int:
        return self.kernel // 2


SHAPES = (
    ConvShape("7x7 s2 3->64 @224", 3, 64, 224, 7, 2),
    ConvShape("3x3 64->64 @56", 64, 64, 56, 3, 1),
    ConvShape("3x3 s2 64->128 @56", 64, 128, 56, 3, 2),
    ConvShape("1x1 s2 64->128 @56", 64, 128, 56, 1, 2),
    ConvShape("3x3 128->128 @28", 128, 128, 28, 3, 1),
    ConvShape("3x3 256->256 @14", 256, 256, 14, 3, 1),
    ConvShape("3x3 512->512 @7", 512, 512, 7, 3, 1),
    ConvShape("dw 3x3 128 @56", 128, 128, 56, 3, 1, group=128, resnet=False),
)


def conv_node(shape: ConvShape) -> onnx.NodeProto:
    k, p, s = shape.kernel, shape.pad, shape.stride
    return helper.make_node(
        "Conv",
        ["x", "w", "b"],
        ["y"],
        group=shape.group,
        kernel_shape=[k, k],
        pads=[p, p, p, p],
        strides=[s, s],
    )


def onnxruntime_conv(
    node: onnx.NodeProto, x: np.ndarray, w: np.ndarray, b: np.ndarray
) -> Callable[[], np.ndarray]:
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    # no spinning between calls: a spinning pool thread would compete with numpy's BLAS
    session = onnxrt.session(model, threads=THREADS, spinning=onnxrt.WHILE_BUSY)
    return lambda: session.run(None, {"x": x})[0]


def nc_conv(
    node: onnx.NodeProto, x: np.ndarray, w: np.ndarray, b: np.ndarray
) -> Callable[[], np.ndarray]:
    kern = KERNELS["Conv"]
    compute = kern.bind(kern.parse_attrs(node_attrs(node)))
    return lambda: compute(x, w, b)


def timed(fn: Callable[[], np.ndarray]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(shape: ConvShape, batch: int, rounds: int) -> tuple[float, float]:
    """(NC median, onnxruntime median) in seconds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, shape.cin, shape.size, shape.size), dtype=np.float32)
    fan_in = shape.cin // shape.group * shape.kernel**2
    w = rng.standard_normal(
        (shape.cout, shape.cin // shape.group, shape.kernel, shape.kernel), dtype=np.float32
    ) / np.float32(np.sqrt(fan_in))
    b = rng.standard_normal(shape.cout, dtype=np.float32)
    node = conv_node(shape)
    ours, theirs = nc_conv(node, x, w, b), onnxruntime_conv(node, x, w, b)
    np.testing.assert_allclose(ours(), theirs(), rtol=1e-3, atol=1e-3, err_msg=shape.name)
    nc_times, ort_times = [], []
    for _ in range(rounds):
        nc_times.append(timed(ours))
        ort_times.append(timed(theirs))
    return statistics.median(nc_times), statistics.median(ort_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"):
        if name in os.environ:
            print(f"{name}={os.environ[name]}")
    print(f"onnxruntime {ort.__version__} with {THREADS} threads; medians of {args.rounds} calls")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes skew both sides)")
    for batch in args.batches:
        print(f"\nbatch {batch}:")
        print(f"  {'shape':<22} {'NC ms':>9} {'ORT ms':>9} {'NC/ORT':>7}")
        nc_sum = ort_sum = 0.0
        for shape in SHAPES:
            nc, theirs = bench(shape, batch, args.rounds)
            print(f"  {shape.name:<22} {nc * 1e3:9.2f} {theirs * 1e3:9.2f} {nc / theirs:7.2f}")
            if shape.resnet:
                nc_sum += nc
                ort_sum += theirs
        label = "ResNet-18 shapes, sum"
        print(f"  {label:<22} {nc_sum * 1e3:9.2f} {ort_sum * 1e3:9.2f} {nc_sum / ort_sum:7.2f}")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
