"""Latency of compiled NEFFs on the daemon against onnxruntime running the same ONNX model
on the same machine with the same thread count, side by side in one run.

    python bench/vs_onnxruntime.py [--cases resnet-b1,bert-b1,...] [--rounds 5] [--quick]
                                   [--engine fast|reference]

Per case the ONNX model is compiled to a NEFF (the summary's last line says how many ops
run on the NC and how many on the CPU) and run three ways:

- onnxruntime: an InferenceSession on the ONNX model (CPU provider, `--threads` intra-op
  threads, one inter-op thread);
- in-process: the NEFF on `LocalRuntime` (the runtime in this process, no gRPC), which
  separates the compute from the transport;
- daemon: the NEFF on a real `neuron-rtd` child process on a unix socket, through the
  Python client (`Client.load`, `model.infer`), the way an application sees it.

The daemon's outputs are compared with onnxruntime's once per case (max abs error and
cosine), so the bench also shows the numbers agree. Calls alternate in rounds (the order
of the three sides rotating each round) so machine noise hits all alike; each side makes
enough calls per round to take about `--budget` seconds (at least `--min-calls`), after a
short pause that lets the thread pools the previous side left spinning go to sleep.
Prints per case the p50 latencies, the ratios daemon/onnxruntime and in-process/onnxruntime,
and the aim (ratio <= 1.3x for the MLP and the encoder, <= 2x for the CNN).

The header states the threads: onnxruntime's; the runtime's CPU nodes run on onnxruntime
with NEURON_RTD_HOST_THREADS (set to `--threads` here and for the daemon); the NCs compute
with `--engine` (fast: an onnxruntime session per NC program; reference: numpy, whose BLAS
keeps its default thread count unless `--blas-threads` is given).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import driver_sim
from neuron_rtd import models, onnxrt
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import compile_model
from neuron_rtd.neff import read_neff
from neuron_rtd.runtime import NC_ENGINES, LocalRuntime

Outputs = Mapping[str, np.ndarray]
SIDES = ("onnxruntime", "in-process", "daemon")
# OpenBLAS's and onnxruntime's pools spin a while after a call before they sleep; without
# a pause the first calls after a switch of side ran up to 2x slower
SETTLE_S = 0.25
INFER_TIMEOUT_S = 600  # the daemon's default (2 s per inference) is too short for some


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], onnx.ModelProto]
    input_shapes: dict[str, list[int]]
    dims: dict[str, int]  # symbolic dims for random_inputs
    aim: float  # the ratio daemon/onnxruntime the issue aims at


def mlp(batch: int = 64, sizes: tuple[int, int, int] = (1024, 4096, 1024)) -> onnx.ModelProto:
    """MatMul + Add + Relu, MatMul + Add: an MLP written with onnx.helper."""
    rng = np.random.default_rng(0)
    d_in, d_hidden, d_out = sizes

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    inits = [
        init("fc1.weight", (d_in, d_hidden), d_in**-0.5),
        init("fc1.bias", (d_hidden,), 0.1),
        init("fc2.weight", (d_hidden, d_out), d_hidden**-0.5),
        init("fc2.bias", (d_out,), 0.1),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "fc2.weight"], ["y0"], name="fc2"),
        helper.make_node("Add", ["y0", "fc2.bias"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, d_in])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, d_out])],
        inits,
    )
    model = helper.make_model(
        graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench"
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _bert_shapes(batch: int, seq: int) -> dict[str, list[int]]:
    return {"input_ids": [batch, seq], "attention_mask": [batch, seq]}


CASES = {
    c.name: c
    for c in (
        Case("resnet-b1", models.resnet.build, {"input": [1, 3, 224, 224]}, {"N": 1}, 2.0),
        Case("resnet-b8", models.resnet.build, {"input": [8, 3, 224, 224]}, {"N": 8}, 2.0),
        Case("bert-b1", models.bert.build, _bert_shapes(1, 128), {"B": 1, "S": 128}, 1.3),
        Case("bert-b8", models.bert.build, _bert_shapes(8, 128), {"B": 8, "S": 128}, 1.3),
        Case("mlp-b64", mlp, {"x": [64, 1024]}, {}, 1.3),
    )
}


@dataclasses.dataclass
class Result:
    case: Case
    times: dict[str, list[float]]
    max_abs_err: float
    cosine: float

    def p50(self, side: str) -> float:
        return statistics.median(self.times[side])


def openblas_call(name: str) -> Any:
    """OpenBLAS's `openblas_<name>` (a ctypes function) from the library numpy loaded, or
    None."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*"))
    for path in libs:
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(path)  # the copy numpy has loaded already
            for prefix in ("scipy_openblas", "openblas"):
                for suffix in ("64_", ""):
                    fn = getattr(lib, f"{prefix}_{name}{suffix}", None)
                    if fn is not None:
                        return fn
    return None


def blas_threads(requested: int | None) -> str:
    """numpy's BLAS threads in this process (set to `requested` when given) and the CPU
    core its kernels are built for (OPENBLAS_CORETYPE forces one)."""
    get, set_ = openblas_call("get_num_threads"), openblas_call("set_num_threads")
    if requested is not None:
        if set_ is None:
            raise SystemExit("--blas-threads: numpy's OpenBLAS is not found in this process")
        set_(ctypes.c_int(requested))
    if get is None:
        return "numpy's BLAS default (thread count unknown)"
    how = "OpenBLAS default"
    if requested is not None:
        how = "--blas-threads"
    elif os.environ.get("OPENBLAS_NUM_THREADS"):
        how = "OPENBLAS_NUM_THREADS"
    text = f"{int(get())} ({how})"
    corename = openblas_call("get_corename")
    if corename is not None:
        corename.restype = ctypes.c_char_p
        core = corename().decode()
        forced = os.environ.get("OPENBLAS_CORETYPE")
        text += f", kernels for {core}" + (
            f" (OPENBLAS_CORETYPE={forced})" if forced else " (detected)"
        )
    return text


def instance_for(nc_count: int) -> str:
    """The daemon's default instance type, or the smallest one with `nc_count` NCs."""
    presets = driver_sim.presets
    for preset in sorted(presets.PRESETS.values(), key=lambda p: p.device_count):
        enough = preset.device_count * presets.NC_PER_DEVICE >= nc_count
        default = presets.PRESETS[presets.DEFAULT_INSTANCE_TYPE]
        if enough and preset.device_count >= default.device_count:
            return preset.name
    raise SystemExit(f"a NEFF needs {nc_count} NeuronCores, more than any simulated instance")


def compare(ours: Outputs, reference: list[np.ndarray], names: list[str]) -> tuple[float, float]:
    """Worst max abs error and worst cosine over the outputs (float64)."""
    worst_err, worst_cos = 0.0, 1.0
    for name, ref in zip(names, reference, strict=True):
        got = np.asarray(ours[name], np.float64).reshape(-1)
        want = np.asarray(ref, np.float64).reshape(-1)
        if got.shape != want.shape:
            raise SystemExit(f"output {name!r}: {got.size} values, onnxruntime gives {want.size}")
        worst_err = max(worst_err, float(np.max(np.abs(got - want))) if got.size else 0.0)
        norm = float(np.linalg.norm(got) * np.linalg.norm(want))
        cosine = float(got @ want) / norm if norm else float(np.array_equal(got, want))
        worst_cos = min(worst_cos, cosine)
    return worst_err, worst_cos


def settle() -> None:
    """Pause before a side's calls: the thread pools the side before left spinning
    (onnxruntime's, OpenBLAS's, here or in the daemon) go to sleep, not into its time."""
    time.sleep(SETTLE_S)


def timed(fn: Callable[[], Any]) -> float:
    return timed_call(fn)[0]


def timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def run_case(
    prepared: tuple[Case, onnx.ModelProto, bytes],
    rt: LocalRuntime,
    client: Client,
    args: argparse.Namespace,
) -> Result:
    case, model, neff = prepared
    feeds = models.random_inputs(model, 0, **case.dims)
    session = onnxrt.session(model, threads=args.threads)
    names = [o.name for o in session.get_outputs()]
    local_model = rt.load(neff, timeout_s=INFER_TIMEOUT_S)
    daemon_model = client.load(neff, timeout_s=INFER_TIMEOUT_S)
    calls: dict[str, Callable[[], Any]] = {
        "onnxruntime": lambda: session.run(names, feeds),
        "in-process": lambda: rt.infer(local_model, feeds),
        "daemon": lambda: daemon_model.infer(feeds),
    }
    try:
        # first calls: warm-up, and the check that all three agree
        first, out = {}, {}
        for side in SIDES:
            first[side], out[side] = timed_call(calls[side])
        err, cos = compare(out["daemon"], out["onnxruntime"], names)
        local_err, local_cos = compare(out["in-process"], out["onnxruntime"], names)
        del out
        print(
            f"  check vs onnxruntime: daemon max|err| {err:.3g} cosine {cos:.7f}; "
            f"in-process max|err| {local_err:.3g} cosine {local_cos:.7f}",
            flush=True,
        )
        # more warm-up calls (at least two: a first call pays one-time work, such as the
        # fast NC engine's session build); their median sets the calls per round
        cost = {}
        for side in SIDES:
            settle()
            warm = [first[side]]
            while len(warm) < 3 or (sum(warm[1:]) < args.budget / 2 and len(warm) < 20):
                warm.append(timed(calls[side]))
            cost[side] = statistics.median(warm[1:])
        per_round = {
            s: max(args.min_calls, min(args.max_calls, round(args.budget / cost[s]))) for s in SIDES
        }
        print(
            "  calls per round: "
            + ", ".join(f"{s} {per_round[s]} (~{cost[s] * 1e3:.1f} ms)" for s in SIDES),
            flush=True,
        )
        times: dict[str, list[float]] = {s: [] for s in SIDES}
        for r in range(args.rounds):
            for k in range(len(SIDES)):
                side = SIDES[(r + k) % len(SIDES)]
                settle()
                for _ in range(per_round[side]):
                    times[side].append(timed(calls[side]))
        return Result(case, times, err, cos)
    finally:
        daemon_model.unload()
        rt.unload(local_model)


def print_row(cells: Sequence[str], columns: Sequence[tuple[str, int]]) -> None:
    """One line of a table: each cell in its column's width, the first left-aligned, the
    rest right-aligned (`columns`: each column's title and width)."""
    print(
        "".join(
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
            for i, (c, (_, w)) in enumerate(zip(cells, columns, strict=True))
        )
    )


def print_table(results: list[Result]) -> None:
    """One row per case; max|err| and cosine are the daemon's outputs against onnxruntime's."""
    columns = (
        ("case", 10),
        ("ort p50 ms", 12),
        ("in-proc p50 ms", 16),
        ("daemon p50 ms", 15),
        ("daemon/ort", 12),
        ("in-proc/ort", 13),
        ("aim", 12),
        ("calls ort/in/dmn", 18),
        ("max|err|", 10),
        ("cosine", 11),
    )
    print_row([title for title, _ in columns], columns)
    for res in results:
        ort_p50, local_p50, daemon_p50 = (res.p50(s) for s in SIDES)
        ratio = daemon_p50 / ort_p50
        aim = f"<={res.case.aim:g}x {'ok' if ratio <= res.case.aim else 'OVER'}"
        counts = "/".join(str(len(res.times[s])) for s in SIDES)
        cells = (
            res.case.name,
            f"{ort_p50 * 1e3:.2f}",
            f"{local_p50 * 1e3:.2f}",
            f"{daemon_p50 * 1e3:.2f}",
            f"{ratio:.2f}x",
            f"{local_p50 / ort_p50:.2f}x",
            aim,
            counts,
            f"{res.max_abs_err:.2g}",
            f"{res.cosine:.7f}",
        )
        print_row(cells, columns)
    print(
        "transport (daemon p50 - in-process p50): "
        + ", ".join(
            f"{r.case.name} {(r.p50('daemon') - r.p50('in-process')) * 1e3:.2f} ms" for r in results
        )
    )
    print("fastest call per side (less sensitive to machine noise than p50):")
    for res in results:
        best = {side: min(res.times[side]) for side in SIDES}
        print(
            f"  {res.case.name:<10} ort {best['onnxruntime'] * 1e3:.2f} ms, in-process "
            f"{best['in-process'] * 1e3:.2f} ms, daemon {best['daemon'] * 1e3:.2f} ms; "
            f"daemon/ort {best['daemon'] / best['onnxruntime']:.2f}x, in-process/ort "
            f"{best['in-process'] / best['onnxruntime']:.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated cases (default all: {','.join(CASES)})",
    )
    parser.add_argument("--rounds", type=int, help="rounds per case (default 5, --quick 3)")
    parser.add_argument(
        "--budget", type=float, help="seconds per side per round (default 1.0, --quick 0.3)"
    )
    parser.add_argument("--max-calls", type=int, default=200, help="most calls per side per round")
    parser.add_argument(
        "--min-calls", type=int, help="fewest calls per side per round (default 2, --quick 1)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="onnxruntime intra-op threads, here and for the "
        "runtime's CPU nodes (NEURON_RTD_HOST_THREADS) (default 2)",
    )
    parser.add_argument(
        "--blas-threads",
        type=int,
        help="numpy's BLAS threads in the runtime, in-process and daemon (default: leave "
        "OpenBLAS's default)",
    )
    parser.add_argument(
        "--engine",
        choices=NC_ENGINES,
        default="fast",
        help="how the runtime's NCs compute, in-process and daemon (default fast)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter rounds")
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.budget is None:
        args.budget = 0.3 if args.quick else 1.0
    if args.min_calls is None:
        args.min_calls = 1 if args.quick else 2
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        parser.error(f"unknown cases {unknown}; known: {','.join(CASES)}")
    blas = 1 if args.blas_threads is None else args.blas_threads
    counts = (args.rounds, args.budget, args.threads, args.min_calls, blas)
    if min(counts) <= 0 or args.max_calls < args.min_calls:
        parser.error(
            "--rounds, --budget, --threads, --min-calls, --blas-threads must be positive, "
            "--max-calls at least --min-calls"
        )
    os.environ["NEURON_RTD_HOST_THREADS"] = str(args.threads)  # the in-process CPU nodes
    started = time.perf_counter()

    print(
        f"onnxruntime {ort.__version__}: CPUExecutionProvider, intra_op_num_threads "
        f"{args.threads}, inter_op_num_threads 1"
    )
    print(
        f"runtime (in-process and daemon): CPU nodes on onnxruntime with "
        f"NEURON_RTD_HOST_THREADS={args.threads}; NC engine {args.engine} (reference: numpy, "
        f"BLAS threads {blas_threads(args.blas_threads)}); {os.cpu_count()} CPUs"
    )
    print(f"{args.rounds} rounds per case, ~{args.budget:g} s per side per round", flush=True)

    prepared: list[tuple[Case, onnx.ModelProto, bytes]] = []
    for name in names:
        case = CASES[name]
        t0 = time.perf_counter()
        model = case.build()
        compiled = compile_model(model, input_shapes=case.input_shapes, name=name)
        summary = str(compiled.summary).splitlines()
        print(
            f"{name}: compiled in {time.perf_counter() - t0:.1f} s; {summary[0]}; {summary[-1]}",
            flush=True,
        )
        prepared.append((case, model, compiled.neff))
    nc_needed = max(read_neff(neff).nc_count for _, _, neff in prepared)
    instance = instance_for(nc_needed)
    print(f"simulated machine: {instance} (the largest NEFF needs {nc_needed} NeuronCores)")

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="nrt-bench-ort-") as tmp:
        work = Path(tmp)
        config = work / "neuron-rtd.json"  # the instance type, for the daemon's tree
        config.write_text(json.dumps({"sim": {"instance_type": instance}}))
        daemon_args = ["-c", str(config), "-l", "warning"]
        env = {"NEURON_RTD_HOST_THREADS": str(args.threads), "NEURON_RTD_NC_ENGINE": args.engine}
        if args.blas_threads is not None:  # read by OpenBLAS as the daemon starts
            env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(args.blas_threads)
        with (
            DaemonProcess(sim_root=work / "sim", args=daemon_args, env=env) as daemon,
            LocalRuntime(instance, root=work / "local", engine=args.engine) as rt,
            Client(daemon.address) as client,
        ):
            while prepared:
                entry = prepared.pop(0)
                print(f"{entry[0].name}:", flush=True)
                results.append(run_case(entry, rt, client, args))
                del entry
                gc.collect()
    print()
    print_table(results)
    print(f"bench took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
