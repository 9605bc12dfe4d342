"""Models as PyTorch users export them (ResNet-18, MobileNetV2, EfficientNet-B0, DeepLabV3
on MobileNetV3-Large, a Transformer encoder, LSTM/GRU/bidirectional LSTM/RNN, ConvNeXt,
ShuffleNetV2, DenseNet, a GPT-style decoder, a speech net, a UNet, and small models under a
millisecond) through the daemon, in process and on onnxruntime, side by side in one run.

    python bench/real_models.py [--cases resnet18,lstm,...] [--rounds 3] [--budget 0.5]
                                [--quick] [--threads N] [--engine fast|reference]
                                [--cache DIR] [--json FILE] [--repeat N] [--busy]

Each net (bench/torch_nets.py: the published layers, widths and strides, random weights,
seed 0) is exported once with `torch.onnx.export(..., dynamo=False, opset_version=17)`
into the cache folder (a temp folder unless `--cache`; a file there is reused), and
compiled to a NEFF (the summary's last line says how many ops run on the NC and how many
on the CPU). Its inputs are seeded normal noise of the shapes in the ONNX graph. Four
sides are timed:

- onnxruntime: onnxruntime's default session on the ONNX model in this process (CPU
  provider, `--threads` intra-op threads, one inter-op thread, spinning as it comes);
- in-process: the NEFF on `LocalRuntime` (the runtime in this process, no gRPC);
- daemon: the NEFF on a real `neuron-rtd` child process on a unix socket, through the
  Python client (`Client.load`, `model.infer`), as an application calls it;
- floor: what any daemon must pay beyond the compute, a bare gRPC echo of a small
  message (bench/echo.py's server, a child process) plus one `np.copyto` of the model's
  input bytes and one of its output bytes.

Per model the sides run in alternating rounds (the order rotating each round, a short
pause before each side so the pools the side before left spinning go to sleep), each
side calling for about `--budget` seconds (at least `--min-calls`) per round. A side's
p50 is the best of its rounds' medians; its p99 is over every timed call. The table per
model gives both, the ratios daemon / (onnxruntime + floor) and in-process / onnxruntime,
and the check: cosine and max abs error of the daemon's (and the in-process) outputs
against onnxruntime's, from each side's first call. It also says how much CPU the
machine's other processes took meanwhile (/proc/stat less this process and its two
servers) and, on a virtual machine, how much the host stole from its CPUs (/proc/stat's
steal): a busy machine slows the sides unequally, a spinning pool most of all.

Models stay loaded until the end; then, all of them idle, the daemon's CPU time over
3 s (/proc/PID/stat) and this process's (the onnxruntime sessions dropped, the
`LocalRuntime` models still loaded) tell what the runtime's thread policy costs at rest,
as percent of one core. A last line per acceptance names the worst ratios. The runtime's
CPU nodes run with NEURON_RTD_HOST_THREADS = `--threads` (here and in the daemon).

`--repeat N` makes N full runs (a new daemon each, the models compiled once) and ends with
each model's ratio daemon / (onnxruntime + floor) in every run, its worst and its median:
a user gets any run, not the best. `--busy` runs a busy loop pinned to one core throughout
(bench/real_models_host.py), every side under the same load.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
from echo import ECHO_METHOD, serve_echo  # bench/echo.py (a script's folder is on its path)
from real_models_host import OthersMeter, busy_core, idle_cost  # bench/real_models_host.py
from real_models_report import (  # bench/real_models_report.py
    OPSET,
    SIDES,
    across_runs,
    json_report,
    print_across_runs,
    print_figures,
    print_header,
    print_summary,
)
from timing import percentile  # bench/timing.py (a script's folder is on its path)
from vs_onnxruntime import (
    INFER_TIMEOUT_S,
    compare,
    instance_for,
    settle,
)

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import compile_model
from neuron_rtd.neff import read_neff
from neuron_rtd.onnxrt import session as ort_session
from neuron_rtd.proto import CHANNEL_OPTIONS
from neuron_rtd.runtime import NC_ENGINES, LocalRuntime

ECHO_PAYLOAD = bytes(64)  # the floor's small message
SEED = 0
TOKENS = 100  # integer inputs are ids below this: valid for any vocabulary at least as large

# name -> what it is (bench/torch_nets.py:NETS builds them; listed here so a cached model
# needs no torch)
CASES = {
    "resnet18": "ResNet-18, 1x3x224x224",
    "mobilenet_v2": "MobileNetV2 1.0, 1x3x224x224",
    "efficientnet_b0": "EfficientNet-B0, 1x3x224x224",
    "deeplabv3_mnv3": "DeepLabV3 on MobileNetV3-Large (OS 16, ASPP), 1x3x224x224",
    "transformer": "TransformerEncoder 2 layers, d_model 256, 4 heads, 1x64x256",
    "bert": "BERT-mini's encoder: 4 layers, hidden 256, 4 heads, GELU, 1x128x256",
    "lstm": "LSTM(64, 128, num_layers=2), 1x20x64",
    "gru": "GRU(64, 128, num_layers=2), 1x20x64",
    "bilstm": "bidirectional LSTM(64, 128, num_layers=2), 1x20x64",
    "mlp": "Linear 1024-2048, ReLU, Linear 2048-512, 32x1024",
    "tiny_mlp": "Linear 16-16, ReLU, Linear 16-16, 1x16",
    "small_cnn": "CIFAR-size CNN (5 convs), 1x3x32x32",
    "convnext": "ConvNeXt layout (depthwise 7x7, LayerNorm, GELU, layer scale), 1x3x128x128",
    "shufflenet_v2": "ShuffleNetV2 1.0x (channel split, concat, shuffle), 1x3x224x224",
    "densenet": "DenseNet-121's first two dense blocks (a concat per layer), 1x3x128x128",
    "decoder": "GPT-style decoder 2 blocks (embedding, causal mask, pre-norm), 1x32 token ids",
    "speech": "Conv1d front end + bidirectional GRU + log_softmax, 1x40x100",
    "unet": "three-level UNet (ConvTranspose, bilinear upsample, skip concat), 1x3x64x64",
    "lenet5": "LeNet-5 (tanh, average pooling), 1x1x28x28",
    "rnn": "RNN(32, 64, num_layers=2, relu), 1x50x32",
}


@dataclasses.dataclass
class Compiled:
    name: str
    path: Path  # the ONNX model
    neff: bytes
    summary: str  # the compile summary's last line, and the reasons for CPU ops
    nc_ops: int
    cpu_ops: int
    seconds: float  # export (when exported now) and compile


@dataclasses.dataclass
class Figures:
    """One model's timings (seconds per call, by side and round) and check."""

    name: str
    compiled: Compiled
    rounds: dict[str, list[list[float]]]
    check: dict[str, float]
    io_bytes: tuple[int, int]
    others_pct: float  # other processes' CPU during the rounds, percent of one core
    stolen_pct: float  # the CPU time the host stole meanwhile, percent of one core

    def p50(self, side: str) -> float:
        """The best of the rounds' medians."""
        return min(statistics.median(r) for r in self.rounds[side])

    def p99(self, side: str) -> float:
        return percentile([t for r in self.rounds[side] for t in r], 0.99)

    def calls(self, side: str) -> int:
        return sum(len(r) for r in self.rounds[side])

    def daemon_ratio(self) -> float:
        """daemon / (onnxruntime + floor), at p50."""
        return self.p50("daemon") / (self.p50("onnxruntime") + self.p50("floor"))

    def local_ratio(self) -> float:
        """in-process / onnxruntime, at p50."""
        return self.p50("in-process") / self.p50("onnxruntime")

    def as_json(self) -> dict[str, Any]:
        return {
            "description": CASES[self.name],
            "compile": {
                "seconds": round(self.compiled.seconds, 3),
                "nc_ops": self.compiled.nc_ops,
                "cpu_ops": self.compiled.cpu_ops,
                "summary": self.compiled.summary,
            },
            "input_bytes": self.io_bytes[0],
            "output_bytes": self.io_bytes[1],
            "sides": {
                side: {
                    "p50_ms": self.p50(side) * 1e3,
                    "p99_ms": self.p99(side) * 1e3,
                    "calls": self.calls(side),
                    "round_p50s_ms": [statistics.median(r) * 1e3 for r in self.rounds[side]],
                }
                for side in SIDES
            },
            "daemon_over_ort_plus_floor": self.daemon_ratio(),
            "in_process_over_ort": self.local_ratio(),
            "check": self.check,
            "other_processes_cpu_pct": self.others_pct,
            "stolen_cpu_pct": self.stolen_pct,
        }


# --- models -----------------------------------------------------------------------------
def exported(name: str, cache: Path) -> tuple[Path, bool]:
    """The ONNX file of case `name` in `cache`, exported now unless it is there; whether it
    was exported now. Only an export imports torch."""
    torch_version = importlib.metadata.version("torch")
    path = cache / f"{name}-opset{OPSET}-torch{torch_version}.onnx"
    if path.exists():
        return path, False
    import torch_nets  # bench/torch_nets.py: imports torch

    partial = path.with_suffix(".partial")
    torch_nets.export(name, str(partial), seed=SEED)
    partial.replace(path)
    return path, True


def compile_case(name: str, cache: Path) -> Compiled:
    t0 = time.perf_counter()
    path, fresh = exported(name, cache)
    result = compile_model(path, name=name)
    lines = str(result.summary).splitlines()
    reasons = sorted({line.strip() for line in lines if " on CPU: " in line})
    return Compiled(
        name=name,
        path=path,
        neff=result.neff,
        summary="; ".join([lines[-1], *reasons]) + ("" if fresh else " (cached ONNX)"),
        nc_ops=result.summary.nc_ops,
        cpu_ops=result.summary.cpu_ops,
        seconds=time.perf_counter() - t0,
    )


def seeded_inputs(model: onnx.ModelProto, seed: int = SEED) -> dict[str, np.ndarray]:
    """Normal noise for each float graph input, of its (fixed) shape and type; for an
    integer one (token ids, indices) integers in [0, TOKENS)."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, TOKENS, shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


# --- timing -----------------------------------------------------------------------------
def calls_for(budget_s: float, min_calls: int, call: Callable[[], Any]) -> list[float]:
    """Time `call` again and again for `budget_s` seconds, and at least `min_calls` times."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def floor_call(echo: Callable[[bytes], bytes], in_bytes: int, out_bytes: int) -> Callable[[], Any]:
    """The transport floor: the echo of a small message, then one copy of the input bytes
    and one of the output bytes."""
    src_in, src_out = np.ones(in_bytes, np.uint8), np.ones(out_bytes, np.uint8)
    dst_in, dst_out = np.empty_like(src_in), np.empty_like(src_out)

    def call() -> None:
        echo(ECHO_PAYLOAD)
        np.copyto(dst_in, src_in)
        np.copyto(dst_out, src_out)

    return call


@dataclasses.dataclass
class Bench:
    """What every case shares: the runtime here, the daemon's client, the echo."""

    args: argparse.Namespace
    rt: LocalRuntime
    client: Client
    echo: Callable[[bytes], bytes]
    server_pids: list[int]  # the daemon and the echo server

    def run(self, compiled: Compiled) -> Figures:
        """Load the model on all sides (and leave it loaded on the runtime's two, while
        its onnxruntime session goes), check, warm up, time."""
        args = self.args
        model = onnx.load(compiled.path)
        feeds = seeded_inputs(model)
        session = ort_session(compiled.path, threads=args.threads)
        names = [o.name for o in session.get_outputs()]
        local = self.rt.load(compiled.neff, timeout_s=INFER_TIMEOUT_S)
        try:
            remote = self.client.load(compiled.neff, timeout_s=INFER_TIMEOUT_S)
        except BaseException:
            self.rt.unload(local)
            raise
        reference = session.run(names, feeds)  # first calls: warm-up, and the check
        local_out = self.rt.infer(local, feeds)
        remote_out = remote.infer(feeds)
        err, cos = compare(remote_out, reference, names)
        local_err, local_cos = compare(local_out, reference, names)
        io_bytes = (
            sum(a.nbytes for a in feeds.values()),
            sum(np.asarray(a).nbytes for a in reference),
        )
        calls: dict[str, Callable[[], Any]] = {
            "onnxruntime": lambda: session.run(names, feeds),
            "in-process": lambda: self.rt.infer(local, feeds),
            "daemon": lambda: remote.infer(feeds),
            "floor": floor_call(self.echo, *io_bytes),
        }
        for side in SIDES:  # more warm-up: one-time work (sessions built, buffers mapped)
            settle()
            calls_for(min(0.2, args.budget / 2), 2, calls[side])
        rounds: dict[str, list[list[float]]] = {side: [] for side in SIDES}
        others = OthersMeter(self.server_pids)
        for r in range(args.rounds):
            for k in range(len(SIDES)):
                side = SIDES[(r + k) % len(SIDES)]
                settle()
                rounds[side].append(calls_for(args.budget, args.min_calls, calls[side]))
        check = {
            "daemon_cosine": cos,
            "daemon_max_abs_err": err,
            "in_process_cosine": local_cos,
            "in_process_max_abs_err": local_err,
        }
        return Figures(compiled.name, compiled, rounds, check, io_bytes, *others.shares())


# --- the run ----------------------------------------------------------------------------
@contextmanager
def echo_server(work: Path) -> Iterator[tuple[Callable[[bytes], bytes], int]]:
    """bench/echo.py's server in a child process (this script with --serve-echo); yields
    its echo call and its pid."""
    address = f"unix:{work}/echo.sock"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-echo", address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("the echo server did not start")
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(
                ECHO_METHOD, request_serializer=None, response_deserializer=None
            )
            yield call, proc.pid
    finally:
        proc.terminate()
        proc.wait()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated (default all: {','.join(CASES)})"
    )
    parser.add_argument("--rounds", type=int, help="rounds per model (default 3, --quick 1)")
    parser.add_argument(
        "--budget", type=float, help="seconds per side per round (default 0.5, --quick 0.1)"
    )
    parser.add_argument(
        "--min-calls", type=int, help="fewest calls per side per round (default 3, --quick 1)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="onnxruntime intra-op threads, and the runtime's CPU nodes' "
        "(NEURON_RTD_HOST_THREADS) (default: the usable cores)",
    )
    parser.add_argument(
        "--engine", choices=NC_ENGINES, default="fast", help="how the NCs compute (default fast)"
    )
    parser.add_argument("--cache", type=Path, help="keep the exported ONNX models in DIR")
    parser.add_argument("--json", type=Path, help="write every figure to FILE as JSON")
    parser.add_argument("--quick", action="store_true", help="one short round per model")
    parser.add_argument(
        "--repeat", type=int, default=1, help="full runs of the comparison (default 1)"
    )
    parser.add_argument(
        "--busy", action="store_true", help="a busy loop on one core for the whole comparison"
    )
    parser.add_argument("--serve-echo", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        return args
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.budget = args.budget or (0.1 if quick else 0.5)
    args.min_calls = args.min_calls or (1 if quick else 3)
    args.names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in args.names if n not in CASES]
    if unknown or not args.names:
        parser.error(f"unknown cases {unknown}; known: {','.join(CASES)}")
    if min(args.rounds, args.budget, args.min_calls, args.threads, args.repeat) <= 0:
        parser.error("--rounds, --budget, --min-calls, --threads and --repeat must be positive")
    return args


def compile_all(names: list[str], cache: Path, failed: dict[str, str]) -> list[Compiled]:
    """Export (unless cached) and compile each case; a refused one goes to `failed`."""
    compiled = []
    for name in names:
        try:
            entry = compile_case(name, cache)
        except Exception as exc:  # a model the exporter or compiler refuses: reported
            failed[name] = f"export/compile: {type(exc).__name__}: {exc}"
            print(f"{name}: FAILED {failed[name]}", flush=True)
            continue
        print(f"{name}: {CASES[name]}; ready in {entry.seconds:.1f} s; {entry.summary}")
        compiled.append(entry)
    return compiled


def run_all(
    args: argparse.Namespace, compiled: list[Compiled], work: Path, failed: dict[str, str]
) -> tuple[list[Figures], dict[str, Any]]:
    """Every model on the four sides, then the idle cost with all of them loaded; the
    figures and the run's own (instance, other processes' CPU, idle)."""
    # every model stays loaded to the end, each on NCs of its own (a Neuron node each)
    nc_needed = sum(read_neff(c.neff).nc_count for c in compiled)
    instance = instance_for(nc_needed)
    print(f"simulated machine: {instance} (the models take {nc_needed} NCs)", flush=True)
    config = work / "neuron-rtd.json"
    config.write_text(json.dumps({"sim": {"instance_type": instance}}))
    env = {"NEURON_RTD_HOST_THREADS": str(args.threads), "NEURON_RTD_NC_ENGINE": args.engine}
    results: list[Figures] = []
    with ExitStack() as stack:
        echo, echo_pid = stack.enter_context(echo_server(work))
        daemon = stack.enter_context(
            DaemonProcess(sim_root=work / "sim", args=["-c", str(config), "-l", "warning"], env=env)
        )
        rt = stack.enter_context(LocalRuntime(instance, root=work / "local", engine=args.engine))
        client = stack.enter_context(Client(daemon.address))
        bench = Bench(args, rt, client, echo, [daemon.pid, echo_pid])
        whole_run = OthersMeter(bench.server_pids)
        for entry in compiled:
            print(f"\n{entry.name}:", flush=True)
            try:
                fig = bench.run(entry)
            except Exception as exc:
                failed[entry.name] = f"run: {type(exc).__name__}: {exc}"
                print(f"  FAILED {failed[entry.name]}", flush=True)
                continue
            print_figures(fig)
            results.append(fig)
            gc.collect()  # the case's onnxruntime session, and its pool, go
        others_pct, stolen_pct = whole_run.shares()
        idle = idle_cost(daemon.pid)
    run = {
        "instance": instance,
        "other_processes_cpu_pct": others_pct,
        "stolen_cpu_pct": stolen_pct,
        "idle": idle,
    }
    return results, run


def main() -> int:
    args = parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return 0
    started = time.perf_counter()
    os.environ["NEURON_RTD_HOST_THREADS"] = str(args.threads)  # the in-process CPU nodes
    print_header(args)
    failed: dict[str, str] = {}
    runs: list[tuple[list[Figures], dict[str, Any]]] = []  # each run's figures and its own
    with tempfile.TemporaryDirectory(prefix="nrt-real-") as tmp:
        work = Path(tmp)
        cache = args.cache or work / "onnx"
        cache.mkdir(parents=True, exist_ok=True)
        compiled = compile_all(args.names, cache, failed)
        with busy_core(args.busy) as busy:
            if busy:
                print(f"--busy: {busy}", flush=True)
            for n in range(args.repeat if compiled else 0):
                if args.repeat > 1:
                    print(f"\n=== run {n + 1} of {args.repeat} ===", flush=True)
                results, run = run_all(args, compiled, work, failed)
                run["summary"] = print_summary(results, run)
                runs.append((results, run))
    across = across_runs([results for results, _ in runs])
    if args.repeat > 1:
        print_across_runs(across, len(runs), busy)
    for name, why in failed.items():
        print(f"FAILED {name}: {why}")
    elapsed = time.perf_counter() - started
    print(f"bench took {elapsed:.0f} s")
    if args.json:
        report = json_report(args, runs, across, failed, busy)
        args.json.write_text(json.dumps(report | {"seconds": elapsed}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
