"""The KServe v2 (Triton) front door, side by side with the daemon's own API, in one run.

    python bench/kserve.py [--calls 1500] [--rounds 3] [--pa-seconds 5] [--no-perf-analyzer]

One daemon serves a model repository on its unix socket and on HTTP (loopback):
- `tiny` (a 1x16 Relu) and `mid` (an MLP 32x1024 -> 2048 -> 512, 128 KB in, 64 KB out):
  v2 `ModelInfer` against nmgr `infer` on the same model and socket, both as raw gRPC
  stubs on one channel, calls alternating in rounds; then Triton's own client library,
  `tritonclient.grpc` against `tritonclient.http` with binary tensors, on the same model.
- `batched` and `plain`: one NEFF with batch buckets 1..8 (an MLP 1024 -> 4096 -> 1024),
  served with and without `dynamic_batching`; `perf_analyzer` (Triton's load generator,
  unmodified) at concurrency 8 on each: throughput and p50/p99 latency.

perf_analyzer: the build `make perf-analyzer` installs (scripts/perf_analyzer.py: the
binary of the `tritonclient==2.51.0` wheel, the last that runs on Debian 12, as
.venv/bin/perf_analyzer), installed first when it is not there.
"""

from __future__ import annotations

import argparse
import re
import runpy
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from timing import alternate, report  # bench/timing.py (a script's folder is on its path)

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.proto import CHANNEL_OPTIONS, kserve_pb, kserve_pb_grpc, pb, pb_grpc

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batched_mlp_neff() -> bytes:
    """An MLP 1024 -> 4096 -> 1024 whose batch axis is bucketed over 1..8: 32 MB of
    weights, so a run of 8 rows costs little more than a run of one (as on a real NC,
    the weights' traffic dominates), which is what dynamic batching is for."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(
        (rng.standard_normal((1024, 4096)) * 0.02).astype(np.float32), "w1"
    )
    w2 = numpy_helper.from_array(
        (rng.standard_normal((4096, 1024)) * 0.02).astype(np.float32), "w2"
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "batched_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return compile_model(model, dynamic_batch=bucket_ranges(1, 8)).neff


def write_repository(root: Path) -> None:
    def put(name: str, neff: bytes, config: str = "") -> None:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.neff").write_bytes(neff)
        if config:
            (root / name / "config.pbtxt").write_text(config)

    put("tiny", build_relu((1, 16), name="tiny"))
    put("mid", build_mlp((1024, 2048, 512), batch=32, name="mid").neff)
    batched = batched_mlp_neff()
    put("plain", batched)
    put(
        "batched",
        batched,
        "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000 }\n",
    )


def model_ids(address: str) -> dict[str, int]:
    """The runtime's model id of each repository model (they are ordinary models)."""
    with Client(address) as client:
        return {m.name: m.id for m in client.connection.snapshot().models}


def latency(address: str, http: str, calls: int, rounds: int) -> None:
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    ids = model_ids(address)
    clients = Clients(
        nmgr=pb_grpc.nmgr_v1Stub(channel),
        v2=kserve_pb_grpc.GRPCInferenceServiceStub(channel),
        triton_grpc=grpcclient.InferenceServerClient(address),
        triton_http=httpclient.InferenceServerClient(http),
    )
    for name, shape in (("tiny", (1, 16)), ("mid", (32, 1024))):
        times = alternate(sides(clients, name, ids[name], shape), calls, rounds, warm_up=100)
        print(f"\n{name} {shape}: one client, sync calls")
        report(times, NMGR)
        p50 = {k: statistics.median(v) for k, v in times.items()}
        paired = round_ratios(times[V2], times[NMGR], rounds)
        print(
            f"  v2/nmgr round by round (p50 of each round's calls): median "
            f"{statistics.median(paired):.3f}x, {min(paired):.3f}-{max(paired):.3f}x"
        )
        print(
            f"  goals: v2/nmgr {p50[V2] / p50[NMGR]:.3f}x (<= 1.05); "
            f"http/grpc {p50[TRITON_HTTP] / p50[TRITON_GRPC]:.2f}x (<= 1.3)"
        )


def round_ratios(side: list[float], base: list[float], rounds: int) -> list[float]:
    """Per round, the p50 of `side`'s calls over the p50 of `base`'s: the two were called
    one round after the other, so a burst of the machine's noise that spans a round hits
    both alike, where it can tilt the p50s of all calls."""
    size = max(1, len(base) // rounds)
    return [
        statistics.median(side[at : at + size]) / statistics.median(base[at : at + size])
        for at in range(0, len(base) - size + 1, size)
    ]


NMGR = "nmgr infer (raw stub)"
V2 = "v2 ModelInfer (raw stub)"
TRITON_GRPC = "tritonclient.grpc"
TRITON_HTTP = "tritonclient.http binary"


@dataclass(frozen=True)
class Clients:
    nmgr: pb_grpc.nmgr_v1Stub
    v2: kserve_pb_grpc.GRPCInferenceServiceStub
    triton_grpc: grpcclient.InferenceServerClient
    triton_http: httpclient.InferenceServerClient


def sides(
    clients: Clients, name: str, model_id: int, shape: tuple[int, ...]
) -> dict[str, Callable[[], object]]:
    """One call of each kind on model `name`, with the same random input."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    infer = pb.infer_request(
        h_nn=pb.h_nn(id=model_id), ifmap=[pb.infer_io(name="x", buf=x.tobytes())]
    )
    tensor = kserve_pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=shape)
    model_infer = kserve_pb.ModelInferRequest(
        model_name=name, inputs=[tensor], raw_input_contents=[x.tobytes()]
    )
    g_in = grpcclient.InferInput("x", list(shape), "FP32")
    g_in.set_data_from_numpy(x)
    h_in = httpclient.InferInput("x", list(shape), "FP32")
    h_in.set_data_from_numpy(x, binary_data=True)
    outputs = [o.name for o in clients.triton_grpc.get_model_metadata(name).outputs]
    h_out = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
    return {
        NMGR: lambda: clients.nmgr.infer(infer),
        V2: lambda: clients.v2.ModelInfer(model_infer),
        TRITON_GRPC: lambda: clients.triton_grpc.infer(name, [g_in]),
        TRITON_HTTP: lambda: clients.triton_http.infer(name, [h_in], outputs=h_out),
    }


def fetch_perf_analyzer() -> Path:
    """perf_analyzer as `make perf-analyzer` installs it in this Python's prefix (the
    venv's bin/, a wrapper that finds its libraries itself): installed first when it is
    not there, by scripts/perf_analyzer.py, the one implementation."""
    install = runpy.run_path(str(ROOT / "scripts" / "perf_analyzer.py"))["install"]
    return Path(install(Path(sys.prefix)))


def perf_analyzer(socket_path: str, seconds: float) -> None:
    binary = fetch_perf_analyzer()
    print("\nperf_analyzer (tritonclient 2.51.0's), gRPC on the daemon's socket, concurrency 8")
    results: dict[str, tuple[float, float, float]] = {}
    for name in ("plain", "batched"):
        command = [
            str(binary), "-m", name, "-i", "grpc", "-u", f"unix://{socket_path}",
            "--concurrency-range", "8", "-b", "1", "--measurement-mode", "time_windows",
            "-p", str(int(seconds * 1000)), "--percentile", "99",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            raise SystemExit(f"perf_analyzer failed on {name} (exit {done.returncode})")
        out = done.stdout
        throughput = float(re.findall(r"Throughput: ([\d.]+) infer/sec", out)[-1])
        p50 = float(re.findall(r"p50 latency: (\d+) usec", out)[-1])
        p99 = float(re.findall(r"p99 latency: (\d+) usec", out)[-1])
        results[name] = (throughput, p50, p99)
        ms = f"p50 {p50 / 1e3:7.2f} ms  p99 {p99 / 1e3:7.2f} ms"
        print(f"  {name:<8} {throughput:8.1f} infer/s  {ms}")
    ratio = results["batched"][0] / results["plain"][0]
    print(f"  goal: dynamic batching / none {ratio:.2f}x throughput (>= 2)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1500, help="calls per side in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pa-seconds", type=float, default=5.0, help="perf_analyzer's window")
    parser.add_argument("--no-perf-analyzer", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nrt-kserve-bench-"))
    try:
        write_repository(work / "repo")
        http = f"127.0.0.1:{free_port()}"
        flags = ["-l", "warning", "--model-repository", str(work / "repo"), "--http-address", http]
        with DaemonProcess(sim_root=work / "sim", args=flags) as daemon:
            latency(daemon.address, http, args.calls, args.rounds)
            if not args.no_perf_analyzer:
                perf_analyzer(daemon.socket_path, args.pa_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
