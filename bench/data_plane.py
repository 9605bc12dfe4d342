"""The daemon's data plane, side by side with what bounds it, in one run.

    python bench/data_plane.py [--transport] [--pipeline] [--roundtrip] [--concurrency]
                               [--quick] [--rounds N] [--json FILE]

With no bench named, all four run:

(a) --transport: a 1, 4 and 16 MiB float32 tensor in and out of an Identity model,
    inline protobuf (`buf`) vs shared memory (`buf_shm` in, `shm_ofmap` out) vs a bare
    gRPC echo of the same request bytes vs an in-process numpy copy of the same bytes.
    MiB/s counts bytes in + bytes out per round trip. Every variant starts from the
    client's input array and ends with an output array it can read: inline builds the
    request from the array and parses the answer; shm copies the array into its shm
    object and reads the output in place; memcpy copies in, then out.
(b) --pipeline: a 4-NC MLP (4 Neuron nodes, one layer each, each on its own NC, in one
    explicit NCG) driven by one client that keeps up to `ninfer` inferences posted
    (infer_post, then infer_wait of the oldest: a sliding window), for ninfer 1, 2, 4, 8,
    with shm I/O and inline I/O, and shm I/O against a second daemon whose BLAS runs one
    thread (so that one NC's matmul takes one core, not both: it shows what pipelining
    gains when the sequential path leaves a core free). Per-stage compute comes from the
    NCs' own busy time; "cores busy" is daemon + client CPU time over wall time.
(c) --roundtrip: a tiny model's synchronous infer: in process (LocalRuntime) vs through
    the daemon vs a bare gRPC echo of the same request bytes (plus the daemon's cheapest
    call, get_version), with the CPU time per call of the client and of the server.
(d) --concurrency: 1..32 concurrent clients, each a separate process with its own
    channel, doing synchronous infer in a loop on ONE shared model loaded with
    ninfer 32 (a model server loads a model once and its request workers share it;
    ninfer bounds the in-flight requests, so it is at least the client count), and
    the same clients sending the same request bytes to the bare gRPC echo: how far a
    Python gRPC server scales on this machine at all. The clients run on the same cores
    as the server.

The variants of a bench alternate in rounds (this machine is noisy), and every variant's
outputs are checked against a numpy reference before it is timed. The daemon and the echo
server are separate processes on unix sockets under a /tmp/bench_dp_* folder; each
daemon-side bench gets a fresh daemon serving one device (4 NCs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
from echo import ECHO_METHOD, serve_echo  # bench/echo.py (a script's folder is on its path)
from timing import percentile  # bench/timing.py (a script's folder is on its path)

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.client._shm import ShmBuffer
from neuron_rtd.daemon.memory import keep_freed_memory
from neuron_rtd.neff.builder import NeffBuilder, StageSpec
from neuron_rtd.neff.samples import SampleModel, build_mlp, build_relu
from neuron_rtd.proto import CHANNEL_OPTIONS, pb, pb_grpc

DEVICE = "0000:00:1c.0"  # one device: 4 NCs
MIB = 1 << 20
OK = 0


# --- small helpers -------------------------------------------------------------------
def p50(values: Sequence[float]) -> float:
    return statistics.median(values)


def rotated(items: Sequence[Any], by: int) -> list[Any]:
    """`items` starting at position `by` (so each round starts with another variant)."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


def check(response: Any, what: str) -> Any:
    if response.status.code != OK:
        details = response.status.details.decode(errors="replace")
        raise RuntimeError(f"{what}: nerr {response.status.code}: {details}")
    return response


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Right-aligned columns (the first left-aligned), floats with 3 decimals."""

    def text(cell: object) -> str:
        return f"{cell:.3f}" if isinstance(cell, float) else str(cell)

    cells = [list(headers), *[[text(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) + 2 for i in range(len(headers))]
    widths[0] = max(widths[0], 20)
    return "\n".join(
        "".join(
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    )


# --- the bare gRPC echo server ---------------------------------------------------------
class EchoServer:
    """The echo server as a child process on a unix socket in `work`."""

    def __init__(self, work: Path) -> None:
        self.address = f"unix:{work}/echo.sock"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-echo", self.address],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the echo server did not start")
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)

    def call(self) -> Callable[..., Any]:
        """An echo call that sends an infer_request and parses the echoed bytes as one."""
        return self.channel.unary_unary(
            ECHO_METHOD,
            request_serializer=pb.infer_request.SerializeToString,
            response_deserializer=pb.infer_request.FromString,
        )

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait()


# --- the daemon ------------------------------------------------------------------------
class PresentSession(grpc.UnaryUnaryClientInterceptor):
    """Every unary call presents `client`'s session (gRPC metadata `nrt-session-id`), as
    the client's own calls do: the daemon names the shared memory a session mapped only to
    calls that present it."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = (*(details.metadata or ()), *self.client.connection.metadata)
        return continuation(details._replace(metadata=metadata), request)


class Daemon:
    """A fresh daemon serving one device, and a client of it; `stub` makes the raw calls
    that the benches time (presenting the client's session)."""

    def __init__(self, work: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.proc = DaemonProcess(
            sim_root=work / f"sim-{name}",
            socket_path=work / f"{name}.sock",
            log_path=work / f"{name}.log",
            args=["-t", DEVICE, "-l", "warning"],
            env=env,
        ).start()
        self.address = self.proc.address
        self.client = Client(self.address, shm=False)
        self.channel = grpc.intercept_channel(self.client.channel, PresentSession(self.client))
        self.stub: Any = pb_grpc.nmgr_v1Stub(self.channel)

    def load(self, neff: bytes, *, ninfer: int, timeout_s: int = 60, eg: int | None = None) -> int:
        """Load `neff` (on NCG `eg`, stopped; else on an implicit NCG, started)."""
        return self.client.load(neff, ncg=eg, ninfer=ninfer, timeout_s=timeout_s).id

    def unload(self, model_id: int) -> None:
        self.client.unload(model_id)

    def close(self) -> None:
        self.client.close()
        self.proc.close()


class Shm:
    """A shm object made and mapped by the client (its name unlinked once the daemon holds
    it), with a numpy view of it here."""

    def __init__(self, daemon: Daemon, nbytes: int, dtype: Any = np.float32) -> None:
        self.buffer = ShmBuffer(nbytes)
        self.path = self.buffer.path
        self.daemon = daemon
        client = daemon.client
        if not client.connection.share([self.buffer], client.session_id):
            raise RuntimeError(f"the daemon cannot map shared memory {self.path}")
        self.array = self.buffer.view(np.dtype(dtype), (nbytes // np.dtype(dtype).itemsize,))
        self.io = pb.shared_mem_buf(path=self.path)

    def close(self) -> None:
        del self.array
        self.daemon.client.connection.unshare([self.buffer])


def start_model(daemon: Daemon, model_id: int) -> None:
    daemon.client.start(model_id)


# --- (a) tensor transport --------------------------------------------------------------
def identity_neff(shape: tuple[int, ...]) -> bytes:
    """A one-NC NEFF, y = Identity(x), float32: all of its cost is moving its I/O."""
    b = NeffBuilder("identity")
    b.add_input("x", "float32", shape)
    b.add_output("y", "float32", shape)
    stage = StageSpec(instructions=[("Identity", ["x"], ["y"])])
    b.add_node("nc0", "neuron", ["x"], ["y"], [stage])
    return b.build()


def bench_transport(work: Path, cfg: Config, echo: EchoServer) -> dict[str, Any]:
    daemon = Daemon(work, "transport")
    results: dict[str, Any] = {}
    try:
        for mb, calls in cfg.transport_sizes:
            results[f"{mb}MiB"] = transport_size(daemon, echo, mb, calls, cfg.rounds)
    finally:
        daemon.close()
    variants = ("inline", "shm", "echo", "memcpy")
    rows: list[list[object]] = []
    for mb, _ in cfg.transport_sizes:
        entry = results[f"{mb}MiB"]
        for name in variants:
            e = entry[name]
            rows.append([f"{mb:>2} MiB {name}", e["p50_ms"], e["p99_ms"], f"{e['mib_per_s']:.0f}"])
    print("\n(a) tensor transport: Identity model, float32, in + out bytes per round trip")
    print(table(["", "p50 ms", "p99 ms", "MiB/s"], rows))
    print("ratios of MiB/s (p50):")
    for mb, _ in cfg.transport_sizes:
        entry = results[f"{mb}MiB"]
        print(
            f"  {mb:>2} MiB: shm/inline {entry['shm_over_inline']:.1f}x, shm/memcpy "
            f"{entry['shm_over_memcpy']:.0%}, shm/echo {entry['shm_over_echo']:.1f}x, "
            f"inline/echo {entry['inline_over_echo']:.2f}x"
        )
    last = cfg.transport_sizes[-1][0]
    big = results[f"{last}MiB"]
    print(
        f"aims at {last} MiB: shm >= 20x inline: {big['shm_over_inline']:.1f}x; "
        f"shm >= 30% of memcpy: {big['shm_over_memcpy']:.0%}"
    )
    return results


def transport_size(
    daemon: Daemon, echo: EchoServer, mb: int, calls: int, rounds: int
) -> dict[str, Any]:
    """The four transports of one tensor size, alternating in `rounds`."""
    nbytes = mb * MIB
    shape = (nbytes // 4 // 1024, 1024)
    model = daemon.load(identity_neff(shape), ninfer=1)
    h_nn = pb.h_nn(id=model)
    echo_call = echo.call()
    x = np.random.default_rng(mb).standard_normal(shape).astype(np.float32)
    shm_in, shm_out = Shm(daemon, nbytes), Shm(daemon, nbytes)
    shm_request = pb.infer_request(
        h_nn=h_nn,
        ifmap=[pb.infer_io(name="x", buf_shm=shm_in.io)],
        shm_ofmap=[pb.infer_io(name="y", buf_shm=shm_out.io)],
    )
    shm_in_view = shm_in.array.reshape(shape)
    shm_out_view = shm_out.array.reshape(shape)
    middle, out = np.empty_like(x), np.empty_like(x)

    def inline() -> np.ndarray:
        request = pb.infer_request(h_nn=h_nn, ifmap=[pb.infer_io(name="x", buf=x.tobytes())])
        response = daemon.stub.infer(request)
        if response.status.code != OK:
            raise RuntimeError(f"inline infer: nerr {response.status.code}")
        return np.frombuffer(response.ofmap[0].buf, np.float32).reshape(shape)

    def shm() -> np.ndarray:
        np.copyto(shm_in_view, x)
        response = daemon.stub.infer(shm_request)
        if response.status.code != OK:
            raise RuntimeError(f"shm infer: nerr {response.status.code}")
        return shm_out_view

    def echoed() -> np.ndarray:
        request = pb.infer_request(h_nn=h_nn, ifmap=[pb.infer_io(name="x", buf=x.tobytes())])
        response = echo_call(request)
        return np.frombuffer(response.ifmap[0].buf, np.float32).reshape(shape)

    def memcpy() -> np.ndarray:
        np.copyto(middle, x)
        np.copyto(out, middle)
        return out

    variants: dict[str, Callable[[], np.ndarray]] = {
        "inline": inline,
        "shm": shm,
        "echo": echoed,
        "memcpy": memcpy,
    }

    def verify(seed: int) -> None:
        """New input data, outputs cleared, every variant must give the input back."""
        x[...] = np.random.default_rng(seed).standard_normal(shape)
        shm_out_view[...] = 0
        out[...] = 0
        for name, fn in variants.items():
            if not np.array_equal(fn(), x):
                raise AssertionError(f"transport {mb} MiB {name}: the output is not the input")

    verify(100 + mb)
    for fn in variants.values():  # warm up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in rotated(list(variants), r):
            fn = variants[name]
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    verify(200 + mb)
    shm_in.close()
    shm_out.close()
    daemon.unload(model)

    entry: dict[str, Any] = {"bytes_each_way": nbytes, "calls_per_variant": len(times["shm"])}
    for name, values in times.items():
        t = p50(values)
        entry[name] = {
            "p50_ms": t * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3,
            "mib_per_s": 2 * nbytes / t / MIB,
        }
    rate = {name: entry[name]["mib_per_s"] for name in variants}
    entry["shm_over_inline"] = rate["shm"] / rate["inline"]
    entry["shm_over_memcpy"] = rate["shm"] / rate["memcpy"]
    entry["shm_over_echo"] = rate["shm"] / rate["echo"]
    entry["inline_over_echo"] = rate["inline"] / rate["echo"]
    return entry


# --- (b) pipelined throughput of a 4-NC model ------------------------------------------
class PipelineRig:
    """The 4-NC model in one daemon: an explicit 4-NC NCG holding one copy of the model
    per ninfer (loaded with that ninfer; `start` picks the one that runs), and shm objects
    for the largest window."""

    def __init__(
        self, daemon: Daemon, sample: SampleModel, windows: Sequence[int], inputs: list[np.ndarray]
    ) -> None:
        self.daemon = daemon
        self.stub = daemon.stub
        self.spec_in, self.spec_out = sample.inputs[0], sample.outputs[0]
        self.inputs = inputs
        self.eg, _ = daemon.client.create_ncg(4)
        self.models = {n: daemon.load(sample.neff, ninfer=n, eg=self.eg) for n in windows}
        start = next(e["vnc_start"] for e in daemon.client.list_ncgs() if e["id"] == self.eg)
        self.vncs = range(start, start + 4)
        self.shm_in = [Shm(daemon, self.spec_in.nbytes) for _ in range(max(windows))]
        self.shm_out = [Shm(daemon, self.spec_out.nbytes) for _ in range(max(windows))]
        self.process = psutil.Process(daemon.proc.pid)

    def start(self, n: int) -> None:
        start_model(self.daemon, self.models[n])

    def request(self, n: int, slot: int, shm: bool) -> Any:
        """The client's work to post one inference: its input into shm, or inline."""
        h_nn = pb.h_nn(id=self.models[n])
        if not shm:
            buf = self.inputs[slot].tobytes()
            return pb.infer_request(h_nn=h_nn, ifmap=[pb.infer_io(name="x", buf=buf)])
        np.copyto(self.shm_in[slot].array.reshape(self.spec_in.shape), self.inputs[slot])
        return pb.infer_request(
            h_nn=h_nn,
            ifmap=[pb.infer_io(name="x", buf_shm=self.shm_in[slot].io)],
            shm_ofmap=[pb.infer_io(name="probs", buf_shm=self.shm_out[slot].io)],
        )

    def output(self, answer: Any, slot: int, shm: bool) -> np.ndarray:
        spec = self.spec_out
        if shm:
            return self.shm_out[slot].array.reshape(spec.shape)
        return np.frombuffer(answer.ofmap[0].buf, spec.dtype).reshape(spec.shape)

    def run(
        self,
        n: int,
        shm: bool,
        *,
        seconds: float = 0.0,
        count: int = 0,
        refs: list[np.ndarray] | None = None,
    ) -> tuple[int, float]:
        """Keep up to `n` inferences posted (input slot i of the window uses input i);
        stop posting after `seconds` or `count` inferences and drain. The number done and
        the seconds taken. With `refs`, every output is checked against them."""
        free = deque(range(n))
        pending: deque[tuple[int, int]] = deque()
        posted = done = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            while free and (posted < count if count else time.perf_counter() < deadline):
                slot = free.popleft()
                request = self.request(n, slot, shm)
                cookie = check(self.stub.infer_post(request), f"infer_post ninfer {n}").cookie
                pending.append((cookie, slot))
                posted += 1
            if not pending:
                break
            cookie, slot = pending.popleft()
            wait = pb.infer_wait_request(cookie=cookie)
            out = self.output(check(self.stub.infer_wait(wait), "infer_wait"), slot, shm)
            if refs is not None:
                np.testing.assert_allclose(out, refs[slot], rtol=1e-4, atol=1e-6)
                if shm:
                    out[...] = np.nan  # the next use of this slot must write it again
            done += 1
            free.append(slot)
        return done, time.perf_counter() - t0

    def counters(self) -> tuple[list[int], list[int], float]:
        """Per NC: busy ns and MACs so far; and the daemon's CPU seconds so far."""
        busy = [
            self.stub.read_nc_time_in_use(
                pb.read_nc_time_in_use_request(vnc_id=v)
            ).nc_time_in_use.time_in_use
            for v in self.vncs
        ]
        macs = [
            self.stub.read_nc_counters(pb.read_nc_counters_request(vnc_id=v)).nc_counters.macs_count
            for v in self.vncs
        ]
        cpu = self.process.cpu_times()
        return busy, macs, cpu.user + cpu.system

    def close(self) -> None:
        for obj in (*self.shm_in, *self.shm_out):
            obj.close()
        for model in self.models.values():
            self.daemon.unload(model)
        self.daemon.client.destroy_ncg(self.eg)


@dataclass
class Tally:
    done: int = 0
    seconds: float = 0.0
    daemon_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    busy_ns: tuple[int, ...] = (0, 0, 0, 0)
    macs: tuple[int, ...] = (0, 0, 0, 0)


PIPELINE_VARIANTS = {  # name: (daemon, shm I/O)
    "shm": ("default", True),
    "inline": ("default", False),
    "shm, BLAS 1 thread": ("blas1", True),
}


PIPELINE_CASES = {  # label: ((batch, width), variants)
    # each stage's compute about as long as one inference's copies and calls
    "balanced": ((4096, 128), ("shm", "inline")),
    # compute far above the copies: a single GEMM already takes both cores
    "compute-heavy": ((4096, 256), ("shm", "shm, BLAS 1 thread")),
}


def bench_pipeline(work: Path, cfg: Config) -> dict[str, Any]:
    return {
        label: pipeline_case(work, cfg, label, shape, variants)
        for label, (shape, variants) in PIPELINE_CASES.items()
    }


def pipeline_case(
    work: Path, cfg: Config, label: str, shape: tuple[int, int], variants: Sequence[str]
) -> dict[str, Any]:
    batch, width = shape
    chosen = {v: PIPELINE_VARIANTS[v] for v in variants}
    sample = build_mlp((width,) * 5, batch=batch, neuron_nodes=4, seed=3, name="mlp4")
    spec_in, spec_out = sample.inputs[0], sample.outputs[0]
    windows = (1, 2, 4, 8)
    inputs = [sample.random_inputs(seed=i)["x"] for i in range(max(windows))]
    refs = [sample.reference({"x": x})["probs"] for x in inputs]
    in_process_ms = pipeline_in_process_ms(work, sample, inputs[0], refs[0])

    daemons: dict[str, Daemon] = {}
    rigs: dict[str, PipelineRig] = {}
    tallies = {(n, v): Tally() for n in windows for v in chosen}
    try:
        for daemon_name in {d for d, _ in chosen.values()}:
            if daemon_name == "default":
                daemons[daemon_name] = Daemon(work, f"pipeline-{label}")
            else:
                daemons[daemon_name] = Daemon(
                    work,
                    f"pipeline-{label}-blas1",
                    env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                )
        for name, daemon in daemons.items():
            rigs[name] = PipelineRig(daemon, sample, windows, inputs)
        for n in windows:  # check every variant's outputs once
            for rig in rigs.values():
                rig.start(n)
            for rig_name, shm in chosen.values():
                rigs[rig_name].run(n, shm, count=2 * n, refs=refs)
        for r in range(cfg.rounds):
            for n in rotated(windows, r):
                for rig in rigs.values():
                    rig.start(n)
                for variant in rotated(list(chosen), r):
                    rig_name, shm = chosen[variant]
                    rig = rigs[rig_name]
                    busy0, macs0, cpu0 = rig.counters()
                    client0 = time.process_time()
                    done, took = rig.run(n, shm, seconds=cfg.pipeline_seconds)
                    client1 = time.process_time()
                    busy1, macs1, cpu1 = rig.counters()
                    t = tallies[n, variant]
                    t.done += done
                    t.seconds += took
                    t.daemon_cpu_s += cpu1 - cpu0
                    t.client_cpu_s += client1 - client0
                    t.busy_ns = tuple(
                        a + y - x for a, x, y in zip(t.busy_ns, busy0, busy1, strict=True)
                    )
                    t.macs = tuple(a + y - x for a, x, y in zip(t.macs, macs0, macs1, strict=True))
        for rig in rigs.values():
            rig.close()
    finally:
        for daemon in daemons.values():
            daemon.close()

    rate = {key: t.done / t.seconds for key, t in tallies.items()}
    first = tallies[1, "shm"]
    stage_gmacs = [m / first.done / 1e9 for m in first.macs]
    results: dict[str, Any] = {
        "model": f"MLP {width}x4 layers, batch {batch}, 4 Neuron nodes on 4 NCs",
        "input_bytes": spec_in.nbytes,
        "output_bytes": spec_out.nbytes,
        "stage_gmacs": stage_gmacs,
        "in_process_ms_per_inference": in_process_ms,
    }
    for (n, variant), t in tallies.items():
        results[f"ninfer {n}, {variant}"] = {
            "infer_per_s": rate[n, variant],
            "over_ninfer1": rate[n, variant] / rate[1, variant],
            "inferences": t.done,
            "stage_busy_ms": [b / t.done / 1e6 for b in t.busy_ns],
            "daemon_cpu_s": t.daemon_cpu_s,
            "client_cpu_s": t.client_cpu_s,
            "cores_busy": (t.daemon_cpu_s + t.client_cpu_s) / t.seconds,
        }
    print(
        f"\n(b) pipelined throughput, {label}: {results['model']}, one client, sliding window "
        "of posts"
    )
    print(
        f"input {spec_in.nbytes / MIB:.1f} MiB, output {spec_out.nbytes / MIB:.1f} MiB, the same "
        f"between stages; {stage_gmacs[0]:.2f} GMAC per stage; in process (LocalRuntime, "
        f"sequential) {in_process_ms:.1f} ms/inference"
    )
    for variant in chosen:
        rows = []
        for n in windows:
            entry = results[f"ninfer {n}, {variant}"]
            rows.append(
                [
                    f"ninfer {n}",
                    f"{entry['infer_per_s']:.1f}",
                    f"{entry['over_ninfer1']:.2f}x",
                    f"{entry['cores_busy']:.2f}",
                    " ".join(f"{ms:.1f}" for ms in entry["stage_busy_ms"]),
                ]
            )
        print(f"{variant}:")
        print(table(["", "infer/s", "vs ninfer 1", "cores busy", "NC busy ms/inference"], rows))
    print(
        "cores busy = (daemon + client CPU seconds) / wall seconds (the machine has "
        f"{os.cpu_count()}); NC busy = each stage's NC time per inference (grows with contention)"
    )
    print(
        "aim: ninfer 4 >= 1.5x ninfer 1 (shm): "
        + ", ".join(f"{v} {rate[4, v] / rate[1, v]:.2f}x" for v in chosen)
    )
    return results


def pipeline_in_process_ms(
    work: Path, sample: SampleModel, x: np.ndarray, ref: np.ndarray
) -> float:
    """One inference of `sample` in this process (no daemon), median of a few."""
    from neuron_rtd.runtime import LocalRuntime

    with LocalRuntime("inf1.xlarge", root=work / "local-pipeline") as rt:
        model = rt.load(sample.neff)
        np.testing.assert_allclose(rt.infer(model, {"x": x})["probs"], ref, rtol=1e-4, atol=1e-6)
        for _ in range(2):
            rt.infer(model, {"x": x})
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            rt.infer(model, {"x": x})
            times.append(time.perf_counter() - t0)
        rt.unload(model)
    return p50(times) * 1e3


# --- (c) a tiny model's synchronous round trip -----------------------------------------
def bench_roundtrip(work: Path, cfg: Config, echo: EchoServer) -> dict[str, Any]:
    """(c) for two tiny models: one op (the daemon's least work) and a 2-layer MLP."""
    relu = build_relu((1, 16), name="relu16")
    x16 = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    mlp = build_mlp((16, 16, 4), batch=1, seed=0)
    x_mlp = mlp.random_inputs(seed=1)["x"]
    return {
        "relu": roundtrip_case(
            work, cfg, echo, "Relu, 16 floats (1 op)", relu, x16, np.maximum(x16, 0)
        ),
        "mlp": roundtrip_case(
            work,
            cfg,
            echo,
            "MLP 16-16-4 (2 MatMul, 2 Add, Relu, Softmax), batch 1",
            mlp.neff,
            x_mlp,
            mlp.reference({"x": x_mlp})["probs"],
        ),
    }


def roundtrip_case(
    work: Path,
    cfg: Config,
    echo: EchoServer,
    label: str,
    neff: bytes,
    x: np.ndarray,
    ref: np.ndarray,
) -> dict[str, Any]:
    from neuron_rtd.neff import read_neff
    from neuron_rtd.runtime import LocalRuntime

    parsed = read_neff(neff)
    daemon = Daemon(work, f"roundtrip-{parsed.name}")
    echo_call = echo.call()
    local = LocalRuntime("inf1.xlarge", root=work / f"local-roundtrip-{parsed.name}")
    try:
        local_model = local.load(neff)
        model = daemon.load(neff, ninfer=4)
        request = pb.infer_request(
            h_nn=pb.h_nn(id=model), ifmap=[pb.infer_io(name="x", buf=x.tobytes())]
        )
        version = pb.get_version_request()
        spec = parsed.outputs[0]

        def in_process() -> np.ndarray:
            return local.infer(local_model, {"x": x})[spec.name]

        def through_daemon() -> np.ndarray:
            response = daemon.stub.infer(request)
            if response.status.code != OK:
                raise RuntimeError(f"infer: nerr {response.status.code}")
            return np.frombuffer(response.ofmap[0].buf, spec.dtype).reshape(spec.shape)

        def echoed() -> np.ndarray:
            response = echo_call(request)
            return np.frombuffer(response.ifmap[0].buf, np.float32).reshape(x.shape)

        def get_version() -> None:
            daemon.stub.get_version(version)

        np.testing.assert_allclose(in_process(), ref, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(through_daemon(), ref, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(echoed(), x)
        variants: dict[str, Callable[[], Any]] = {
            "in process": in_process,
            "daemon infer": through_daemon,
            "bare gRPC echo": echoed,
            "daemon get_version": get_version,
        }
        for fn in variants.values():  # warm up
            for _ in range(100):
                fn()
        servers = {
            "in process": None,
            "daemon infer": psutil.Process(daemon.proc.pid),
            "bare gRPC echo": psutil.Process(echo.proc.pid),
            "daemon get_version": psutil.Process(daemon.proc.pid),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpu = {name: [0.0, 0.0] for name in variants}  # client, server CPU seconds
        per_round = max(1, cfg.roundtrip_calls // cfg.rounds)
        for r in range(cfg.rounds):
            for name in rotated(list(variants), r):
                fn = variants[name]
                server = servers[name]
                server0 = sum(server.cpu_times()[:2]) if server else 0.0
                client0 = time.process_time()
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
                cpu[name][0] += time.process_time() - client0
                cpu[name][1] += (sum(server.cpu_times()[:2]) - server0) if server else 0.0
        np.testing.assert_allclose(through_daemon(), ref, rtol=1e-5, atol=1e-7)
        local.unload(local_model)
        daemon.unload(model)
    finally:
        local.close()
        daemon.close()
    results: dict[str, Any] = {
        "model": label,
        "request_bytes": request.ByteSize(),
        "calls_per_variant": len(times["daemon infer"]),
    }
    for name, values in times.items():
        results[name] = {
            "p50_ms": p50(values) * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3,
            "client_cpu_us_per_call": cpu[name][0] / len(values) * 1e6,
            "server_cpu_us_per_call": cpu[name][1] / len(values) * 1e6,
        }
    ratio = results["daemon infer"]["p50_ms"] / results["bare gRPC echo"]["p50_ms"]
    results["daemon_over_echo_p50"] = ratio
    print(
        f"\n(c) tiny model round trip: {results['model']}, request {results['request_bytes']} "
        f"bytes, {results['calls_per_variant']} calls per variant"
    )
    rows = [
        [
            name,
            results[name]["p50_ms"],
            results[name]["p99_ms"],
            f"{results[name]['client_cpu_us_per_call']:.0f}",
            f"{results[name]['server_cpu_us_per_call']:.0f}" if servers[name] else "-",
        ]
        for name in variants
    ]
    print(table(["", "p50 ms", "p99 ms", "client CPU us", "server CPU us"], rows))
    print("CPU us = CPU time per call of this process (client) and of the server process")
    print(f"aim: daemon/echo (p50) <= 1.3x: {ratio:.2f}x")
    return results


# --- (d) concurrent clients --------------------------------------------------------------
def client_worker(
    conn: Connection, address: str, echo_address: str, model_id: int, x: bytes, expected: bytes
) -> None:
    """One client process: its own channels; on each command, sync calls in a loop from
    `start_at` for `seconds` (monotonic clock), answering the latencies of the calls that
    finished in that window and the count of failed calls. The calls are the daemon's
    infer, or the same request's bytes to the bare gRPC echo."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    echo_channel = grpc.insecure_channel(echo_address, options=CHANNEL_OPTIONS)
    stub: Any = pb_grpc.nmgr_v1Stub(channel)
    request = pb.infer_request(h_nn=pb.h_nn(id=model_id), ifmap=[pb.infer_io(name="x", buf=x)])
    payload = request.SerializeToString()
    echo = echo_channel.unary_unary(
        ECHO_METHOD, request_serializer=None, response_deserializer=None
    )

    def infer() -> bool:
        response = stub.infer(request)
        return bool(response.status.code == OK)

    def echoed() -> bool:
        return bool(echo(payload) == payload)

    first = stub.infer(request)
    conn.send(first.status.code == OK and first.ofmap[0].buf == expected and echoed())
    while True:
        command = conn.recv()
        if command is None:
            break
        start_at, seconds, target = command
        call = echoed if target == "echo" else infer
        end = start_at + seconds
        time.sleep(max(0.0, start_at - time.monotonic()))
        latencies: list[float] = []
        failed = 0
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                break
            ok = call()
            t1 = time.monotonic()
            if not ok:
                failed += 1
            elif t1 <= end:
                latencies.append(t1 - t0)
        conn.send((latencies, failed))
    channel.close()
    echo_channel.close()


def bench_concurrency(work: Path, cfg: Config, echo: EchoServer) -> dict[str, Any]:
    levels = (1, 2, 4, 8, 16, 32)
    sample = build_mlp((784, 128, 10), batch=1, seed=4)
    x = sample.random_inputs(seed=1)["x"]
    ref = sample.reference({"x": x})["probs"]
    daemon = Daemon(work, "concurrency")
    ctx = multiprocessing.get_context("forkserver")
    workers: list[tuple[Any, Connection]] = []
    try:
        model = daemon.load(sample.neff, ninfer=max(levels))
        request = pb.infer_request(
            h_nn=pb.h_nn(id=model), ifmap=[pb.infer_io(name="x", buf=x.tobytes())]
        )
        answer = check(daemon.stub.infer(request), "infer")
        expected = answer.ofmap[0].buf
        got = np.frombuffer(expected, np.float32).reshape(ref.shape)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
        t_spawn = time.perf_counter()
        for _ in range(max(levels)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=client_worker,
                args=(child, daemon.address, echo.address, model, x.tobytes(), expected),
            )
            proc.start()
            child.close()
            workers.append((proc, parent))
        if not all(conn.recv() for _, conn in workers):
            raise AssertionError("a client's first answer differs from the checked one")
        spawn_s = time.perf_counter() - t_spawn
        runs = [(target, n) for n in levels for target in ("daemon", "echo")]
        latencies: dict[tuple[str, int], list[float]] = {run: [] for run in runs}
        seconds: dict[tuple[str, int], float] = dict.fromkeys(runs, 0.0)
        failed = dict.fromkeys(runs, 0)
        server_cpu = dict.fromkeys(runs, 0.0)
        procs = {"daemon": psutil.Process(daemon.proc.pid), "echo": psutil.Process(echo.proc.pid)}
        for r in range(cfg.rounds):
            for target, n in rotated(runs, r):
                start_at = time.monotonic() + 0.05
                for _, conn in workers[:n]:
                    conn.send((start_at, cfg.concurrency_seconds, target))
                cpu0 = procs[target].cpu_times()
                for _, conn in workers[:n]:
                    lat, bad = conn.recv()
                    latencies[target, n] += lat
                    failed[target, n] += bad
                cpu1 = procs[target].cpu_times()
                server_cpu[target, n] += cpu1.user + cpu1.system - cpu0.user - cpu0.system
                seconds[target, n] += cfg.concurrency_seconds
        check(daemon.stub.infer(request), "infer after")
        daemon.unload(model)
    finally:
        for _proc, conn in workers:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc, _ in workers:
            proc.join(10)
        daemon.close()
    results: dict[str, Any] = {
        "model": "MLP 784-128-10, batch 1, inline I/O, one shared model with ninfer 32",
        "client_spawn_s": spawn_s,
    }
    rows = []
    for n in levels:
        entry: dict[str, Any] = {}
        for target in ("daemon", "echo"):
            lat = latencies[target, n]
            entry[target] = {
                "calls_per_s": len(lat) / seconds[target, n],
                "p50_ms": p50(lat) * 1e3 if lat else float("nan"),
                "p99_ms": percentile(lat, 0.99) * 1e3 if lat else float("nan"),
                "calls": len(lat),
                "failed": failed[target, n],
                "server_cores": server_cpu[target, n] / seconds[target, n],
                "server_cpu_us_per_call": server_cpu[target, n] / max(1, len(lat)) * 1e6,
            }
        results[str(n)] = entry
    for n in levels:
        d, e = results[str(n)]["daemon"], results[str(n)]["echo"]
        d["over_1_client"] = d["calls_per_s"] / results["1"]["daemon"]["calls_per_s"]
        e["over_1_client"] = e["calls_per_s"] / results["1"]["echo"]["calls_per_s"]
        rows.append(
            [
                f"{n} client{'s' if n > 1 else ''}",
                f"{d['calls_per_s']:.0f}",
                f"{d['over_1_client']:.2f}x",
                d["p50_ms"],
                d["failed"],
                f"{d['server_cores']:.2f}",
                f"{d['server_cpu_us_per_call']:.0f}",
                f"{e['calls_per_s']:.0f}",
                f"{e['over_1_client']:.2f}x",
                f"{e['server_cores']:.2f}",
                f"{e['server_cpu_us_per_call']:.0f}",
            ]
        )
    print(f"\n(d) concurrent clients (separate processes, sync calls): {results['model']}")
    headers = ["", "infer/s", "/1", "p50 ms", "failed", "cores", "us/call"]
    headers += ["echo/s", "/1", "cores", "us/call"]
    print(table(headers, rows))
    print(
        f"the clients share the machine's {os.cpu_count()} cores with the server; cores = the "
        "server's CPU seconds / wall seconds; echo = the same request bytes to the bare gRPC echo"
    )
    return results


# --- main --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    rounds: int
    transport_sizes: tuple[tuple[int, int], ...]  # (MiB, calls per variant per round)
    pipeline_seconds: float
    roundtrip_calls: int
    concurrency_seconds: float


def config(quick: bool, rounds: int | None) -> Config:
    if quick:
        return Config(
            rounds=rounds or 3,
            transport_sizes=((1, 10), (4, 5), (16, 3)),
            pipeline_seconds=0.5,
            roundtrip_calls=600,
            concurrency_seconds=0.5,
        )
    return Config(
        rounds=rounds or 5,
        transport_sizes=((1, 30), (4, 12), (16, 6)),
        pipeline_seconds=1.0,
        roundtrip_calls=2000,
        concurrency_seconds=1.0,
    )


@contextlib.contextmanager
def bench_folder() -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="bench_dp_", dir="/tmp"))
    old = tempfile.tempdir
    tempfile.tempdir = str(work)  # the daemons' and workers' temp files go here too
    try:
        yield work
    finally:
        tempfile.tempdir = old
        for entry in work.iterdir():
            if not entry.name.startswith("pymp-"):  # multiprocessing removes its own at exit
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()
        # after multiprocessing's own temp folder (its finalizer has exitpriority -100)
        multiprocessing.util.Finalize(
            None,
            shutil.rmtree,
            args=(str(work),),
            kwargs={"ignore_errors": True},
            exitpriority=-101,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", action="store_true", help="(a) tensor transport")
    parser.add_argument("--pipeline", action="store_true", help="(b) 4-NC pipelining")
    parser.add_argument("--roundtrip", action="store_true", help="(c) tiny-model round trip")
    parser.add_argument("--concurrency", action="store_true", help="(d) concurrent clients")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument("--rounds", type=int, help="rounds per bench (default 5, quick 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--serve-echo", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return 0
    chosen = [b for b in ("transport", "pipeline", "roundtrip", "concurrency") if getattr(args, b)]
    chosen = chosen or ["transport", "pipeline", "roundtrip", "concurrency"]
    cfg = config(args.quick, args.rounds)
    # The daemon's heap settings here too, so the in-process runs (LocalRuntime) do not
    # fault in fresh pages for every large temporary while the daemon does not.
    keep_freed_memory()
    results: dict[str, Any] = {"config": {**cfg.__dict__, "cpus": os.cpu_count()}}
    started = time.perf_counter()
    with bench_folder() as work:
        echo = EchoServer(work) if {"transport", "roundtrip", "concurrency"} & set(chosen) else None
        try:
            for name in chosen:
                # What the rest of the machine uses just before (no bench process is busy).
                others = results.setdefault("machine_busy_before_pct", {})
                others[name] = psutil.cpu_percent(interval=0.5)
                t0 = time.perf_counter()
                load0 = os.getloadavg()[0]
                if name == "transport":
                    assert echo is not None
                    results[name] = bench_transport(work, cfg, echo)
                elif name == "pipeline":
                    results[name] = bench_pipeline(work, cfg)
                elif name == "roundtrip":
                    assert echo is not None
                    results[name] = bench_roundtrip(work, cfg, echo)
                else:
                    assert echo is not None
                    results[name] = bench_concurrency(work, cfg, echo)
                took = results[name]["bench_seconds"] = time.perf_counter() - t0
                load = results[name]["loadavg_1min"] = (load0, os.getloadavg()[0])
                print(
                    f"[{name}: {took:.1f} s; machine busy just before {others[name]:.0f}% "
                    f"of {os.cpu_count()} cores; load average (1 min) {load[0]:.1f} before, "
                    f"{load[1]:.1f} after]",
                    flush=True,
                )
        finally:
            if echo is not None:
                echo.close()
    results["total_seconds"] = time.perf_counter() - started
    print(f"\ntotal {results['total_seconds']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
