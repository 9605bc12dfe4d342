"""What node profiling costs an inference: the same model loaded three times on one
in-process runtime (LocalRuntime, the daemon's runtime without gRPC, so only the runtime's
own cost is measured), once with enable_node_profiling and twice without, inferences
interleaved in rounds so that machine noise hits all alike.

    python bench/profile_overhead.py [--calls 2000] [--rounds 5] [--engine fast|reference]

Prints p50/p99 per model and the ratios: profiled / unprofiled (what profiling ON costs:
its NC programs run instruction by instruction on the reference kernels, timed), and
unprofiled B / unprofiled A (the noise floor; profiling OFF runs the same loop as profiling
ON with no recorder handed down: a test per step is all it costs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from timing import percentile  # bench/timing.py (a script's folder is on its path)

from neuron_rtd.compiler import compile_model
from neuron_rtd.models import resnet
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.runtime import LocalRuntime, ModelInfo


def bench(local: LocalRuntime, title: str, neff: bytes, calls: int, rounds: int) -> None:
    parsed = read_neff(neff)
    models: dict[str, ModelInfo] = {
        "off A": local.load(parsed),
        "on": local.load(parsed, profile=True),
        "off B": local.load(parsed),
    }
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.random(t.shape).astype(t.dtype) for t in parsed.inputs}
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():  # warm up (the fast engine's first run measures costs)
        for _ in range(5):
            local.infer(model, inputs)
    per_round = max(1, calls // rounds)
    for _ in range(rounds):
        for name, model in models.items():
            for _ in range(per_round):
                begin = time.perf_counter()
                local.infer(model, inputs)
                times[name].append(time.perf_counter() - begin)
    print(f"\n{title}: {per_round * rounds} inferences per model")
    print(f"{'model':8} {'p50 us':>10} {'p99 us':>10} {'mean us':>10}")
    for name, values in times.items():
        print(
            f"{name:8} {percentile(values, 0.5) * 1e6:10.1f} {percentile(values, 0.99) * 1e6:10.1f}"
            f" {statistics.fmean(values) * 1e6:10.1f}"
        )
    off = percentile(times["off A"], 0.5)
    print(f"profiling on / off      (p50): {percentile(times['on'], 0.5) / off:.2f}x")
    print(f"off B / off A, the noise (p50): {percentile(times['off B'], 0.5) / off:.3f}x")
    for model in models.values():
        local.unload(model)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="inferences per model in all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine", default="fast", choices=("fast", "reference"))
    args = parser.parse_args()
    with LocalRuntime("inf1.6xlarge", engine=args.engine) as local:
        print(f"NC engine: {args.engine}")
        bench(local, "MLP 784-128-10", build_mlp().neff, args.calls, args.rounds)
        small = resnet.build((1, 1), num_classes=10, batch=1, width=16, image=64)
        bench(
            local,
            "ResNet-like, 2 stages of 1 block, width 16, 64x64",
            compile_model(small).neff,
            max(50, args.calls // 10),
            args.rounds,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
