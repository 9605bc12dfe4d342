"""WinogradConv (driver_sim.ops.winograd) against the NC's Conv kernel and onnxruntime on
the 3x3 stride-1 convs of ResNet-18, side by side in one run.

    python bench/winograd.py [--batches 1 8] [--rounds 7] [--calls 3] [--extra]

Per shape (pads 1, Cin = Cout as in ResNet-18; `--extra` adds smaller and odd ones) three
sides run on the same input: the NC's Conv kernel (driver_sim.ops.conv), WinogradConv with
its weights transformed beforehand (as the compiler does), and onnxruntime on a one-node
Conv model (weights as initializers, two intra-op threads, no spinning). Each round runs
every side `--calls` times, the sides' order rotating round to round, after a pause that
lets the thread pools of the side before (OpenBLAS's spin ~0.1 s after a call) go to
sleep; the medians over all calls are printed with their ratios, and whether
`winograd_pays` picks the rewrite. Per batch size the sums over ResNet-18's 3x3 stride-1
convs follow (each shape counted as often as the network has it: 4, 3, 3, 3), for Conv
everywhere and for Conv with the rewrite where `winograd_pays` says so.

The outputs are checked first: WinogradConv and Conv against a float64 Conv (max |error|
over max |output|, printed) and against onnxruntime. The process sets glibc's heap
thresholds as the daemon does (`--glibc-defaults` leaves them). The NC kernels compute
in numpy, so their speed depends on the BLAS numpy uses (the OPENBLAS_* settings are
printed); with OPENBLAS_THREAD_TIMEOUT=4 in the environment OpenBLAS's thread sleeps
right after each call, which costs WinogradConv (16 GEMMs a call) a wake-up per GEMM.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

# The sibling bench (this folder is on sys.path); numpy is loaded already, so its
# OPENBLAS_THREAD_TIMEOUT setting does not reach this bench's BLAS.
from conv_kernels import onnxruntime_conv
from onnx import helper

from driver_sim import KERNELS
from driver_sim.ops.winograd import winograd_pays, winograd_weights
from neuron_rtd.daemon.memory import keep_freed_memory

THREADS = 2
SETTLE_S = 0.25
SIDES = ("conv", "winograd", "onnxruntime")


@dataclass(frozen=True)
class Shape:
    cin: int
    cout: int
    size: int
    count: int = 0  # how many ResNet-18 has (0: not one of its shapes)

    @property
    def name(self) -> str:
        channels = f"{self.cin}" if self.cin == self.cout else f"{self.cin}->{self.cout}"
        return f"3x3 {channels} @{self.size}"


RESNET = (
    Shape(64, 64, 56, 4),
    Shape(128, 128, 28, 3),
    Shape(256, 256, 14, 3),
    Shape(512, 512, 7, 3),
)
EXTRA = (
    Shape(16, 16, 56),
    Shape(32, 32, 56),
    Shape(32, 32, 28),
    Shape(64, 64, 28),
    Shape(64, 64, 14),
    Shape(128, 128, 14),
    Shape(256, 256, 28),
    Shape(512, 512, 14),
    Shape(64, 64, 7),
    Shape(256, 256, 7),
    Shape(96, 48, 33),
)


def onnxruntime_3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Callable[[], np.ndarray]:
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]
    )
    return onnxruntime_conv(node, x, w, b)


def nc_kernel(op: str, *arrays: np.ndarray) -> Callable[[], np.ndarray]:
    kern = KERNELS[op]
    compute = kern.bind(kern.parse_attrs({"pads": [1, 1, 1, 1]}))
    return lambda: compute(*arrays)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def bench(shape: Shape, batch: int, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per side; prints the accuracy check."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, shape.cin, shape.size, shape.size), dtype=np.float32)
    w = rng.standard_normal((shape.cout, shape.cin, 3, 3), dtype=np.float32)
    w *= np.float32(np.sqrt(2 / (9 * shape.cin)))
    b = rng.standard_normal(shape.cout, dtype=np.float32) / np.float32(10)
    u = winograd_weights(w)
    fns = {
        "conv": nc_kernel("Conv", x, w, b),
        "winograd": nc_kernel("WinogradConv", x, u, b),
        "onnxruntime": onnxruntime_3x3(x, w, b),
    }
    wide = nc_kernel("Conv", x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    reference = wide()
    outputs = {side: fn() for side, fn in fns.items()}
    errors = {side: relative_error(out, reference) for side, out in outputs.items()}
    np.testing.assert_allclose(
        outputs["winograd"], outputs["onnxruntime"], rtol=1e-3, atol=1e-3, err_msg=shape.name
    )
    del outputs, reference
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for round_index in range(rounds):
        shift = round_index % len(SIDES)
        for side in SIDES[shift:] + SIDES[:shift]:
            time.sleep(SETTLE_S)
            for _ in range(calls):
                start = time.perf_counter()
                fns[side]()
                times[side].append(time.perf_counter() - start)
    medians = {side: statistics.median(values) for side, values in times.items()}
    print(
        f"  {shape.name:<18} {medians['conv'] * 1e3:8.2f} {medians['winograd'] * 1e3:8.2f} "
        f"{medians['onnxruntime'] * 1e3:8.2f} {medians['conv'] / medians['winograd']:9.2f} "
        f"{medians['winograd'] / medians['onnxruntime']:8.2f} "
        f"{medians['conv'] / medians['onnxruntime']:8.2f}  "
        f"{'yes' if pays(shape, batch) else 'no':>4}   "
        f"{errors['conv']:.1e} {errors['winograd']:.1e} {errors['onnxruntime']:.1e}",
        flush=True,
    )
    return medians


def pays(shape: Shape, batch: int) -> bool:
    return winograd_pays(batch, shape.cin, shape.cout, shape.size, shape.size)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3, help="calls per side per round")
    parser.add_argument("--extra", action="store_true", help="also smaller and odd shapes")
    parser.add_argument("--glibc-defaults", action="store_true", help="leave malloc as is")
    args = parser.parse_args()
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"):
        if name in os.environ:
            print(f"{name}={os.environ[name]}")
    if not args.glibc_defaults:
        print(f"glibc heap thresholds raised as in the daemon: {keep_freed_memory()}")
    print(
        f"onnxruntime {ort.__version__} with {THREADS} threads; medians of "
        f"{args.rounds} rounds x {args.calls} calls per side"
    )
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes skew all sides)")
    shapes = RESNET + (EXTRA if args.extra else ())
    for batch in args.batches:
        print(f"\nbatch {batch}:")
        print(
            f"  {'shape':<18} {'Conv ms':>8} {'Wino ms':>8} {'ORT ms':>8} {'Conv/Wino':>9} "
            f"{'Wino/ORT':>8} {'Conv/ORT':>8}  pays   max|err|/max|y| vs f64: Conv Wino ORT"
        )
        conv_sum = chosen_sum = ort_sum = 0.0
        for shape in shapes:
            medians = bench(shape, batch, args.rounds, args.calls)
            if shape.count:
                conv_sum += shape.count * medians["conv"]
                ort_sum += shape.count * medians["onnxruntime"]
                best = medians["winograd"] if pays(shape, batch) else medians["conv"]
                chosen_sum += shape.count * best
        print(
            f"  ResNet-18 3x3 s1 convs (4+3+3+3): Conv {conv_sum * 1e3:.2f} ms, with the "
            f"rewrite where it pays {chosen_sum * 1e3:.2f} ms ({conv_sum / chosen_sum:.2f}x), "
            f"onnxruntime {ort_sum * 1e3:.2f} ms (NC/ORT {chosen_sum / ort_sum:.2f}x, "
            f"was {conv_sum / ort_sum:.2f}x)"
        )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
