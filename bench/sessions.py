"""Many clients at once: open sessions cost no thread, and every client gets served.

    python bench/sessions.py [--sessions 1000] [--clients 8,32,64] [--calls 50]

1. Open sessions: `--sessions` session streams held open by 4 processes (on 4
   connections), then 200 `describe` calls from another: their p50/p99 beside the same
   calls with no session open, and the daemon's threads before and after.
2. Clients: on a simulated inf1.24xlarge (64 NeuronCores), N client processes at once,
   each opening a `Client`, loading an MLP and running `--calls` inferences, started
   together: the time until all have finished (at most 300 s), and the p50/p99 of one
   inference over all clients.
Goals (issue 22): describe p99 under 50 ms with 1000 sessions open; 64 clients all finish.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
from timing import percentile  # bench/timing.py (a script's folder is on its path)

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc, pb, pb_grpc

HOLDERS = 4


def hold_sessions(address: str, count: int, pipe: Connection) -> None:
    """Open `count` session streams on one channel, say so, hold them until told."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = pb_grpc.nmgr_session_managerStub(channel)
    ends: list[queue.Queue[Any]] = []
    streams = []
    for _ in range(count):
        requests: queue.Queue[Any] = queue.Queue()
        requests.put(pb.session_monitor_request(framework_name="bench"))
        stream = stub.session_monitor(iter(requests.get, None))
        next(stream)
        ends.append(requests)
        streams.append(stream)
    pipe.send(count)
    pipe.recv()  # hold until told
    for requests in ends:
        requests.put(None)
    for stream in streams:
        for _ in stream:
            pass
    channel.close()


def describe_latency(address: str, calls: int = 200) -> list[float]:
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = ext_pb_grpc.nmgr_extStub(channel)
        stub.describe(ext_pb.describe_request(), timeout=60)
        took = []
        for _ in range(calls):
            began = time.perf_counter()
            stub.describe(ext_pb.describe_request(), timeout=60)
            took.append(time.perf_counter() - began)
    return took


def open_sessions(address: str, pid: int, sessions: int) -> dict[str, Any]:
    before = describe_latency(address)
    threads_before = psutil.Process(pid).num_threads()
    spawn = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    began = time.monotonic()
    for i in range(HOLDERS):
        mine, theirs = spawn.Pipe()
        share = sessions // HOLDERS + (1 if i < sessions % HOLDERS else 0)
        proc = spawn.Process(target=hold_sessions, args=(address, share, theirs))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    opened = sum(pipe.recv() for pipe in pipes)
    open_s = time.monotonic() - began
    during = describe_latency(address)
    threads_during = psutil.Process(pid).num_threads()
    for pipe in pipes:
        pipe.send("end")
    for proc in procs:
        proc.join(120)
    return {
        "sessions": opened,
        "open_s": round(open_s, 2),
        "describe_ms_before": [round(percentile(before, q) * 1e3, 2) for q in (0.5, 0.99)],
        "describe_ms_open": [round(percentile(during, q) * 1e3, 2) for q in (0.5, 0.99)],
        "threads": [threads_before, threads_during],
    }


def one_client(address: str, neff: bytes, calls: int, pipe: Connection, go: Any) -> None:
    pipe.send("ready")  # imported: all clients start together
    go.wait()
    began = time.monotonic()
    took = []
    with Client(address) as client:
        model = client.load(neff)
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        for _ in range(calls):
            start = time.perf_counter()
            model(x=x)
            took.append(time.perf_counter() - start)
    pipe.send((time.monotonic() - began, took))


def run_clients(address: str, count: int, calls: int, neff: bytes) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    go = spawn.Event()
    pipes, procs = [], []
    for _ in range(count):
        mine, theirs = spawn.Pipe()
        proc = spawn.Process(target=one_client, args=(address, neff, calls, theirs, go))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    for pipe in pipes:
        pipe.recv()
    began = time.monotonic()
    go.set()
    deadline = began + 300
    results = [
        pipe.recv() if pipe.poll(max(0.0, deadline - time.monotonic())) else None for pipe in pipes
    ]
    total = time.monotonic() - began
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    done = [r for r in results if r is not None]
    took = [t for _, ts in done for t in ts]
    return {
        "clients": count,
        "finished": len(done),
        "total_s": round(total, 2),
        "client_s_median": round(statistics.median(s for s, _ in done), 2) if done else None,
        "infer_ms": [round(percentile(took, q) * 1e3, 2) for q in (0.5, 0.99)] if took else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--clients", default="8,32,64")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nrt-sessions-"))
    driver_sim.Machine.open(work / "sim", instance_type="inf1.24xlarge")
    config = work / "neuron-rtd.json"
    config.write_text(json.dumps({"sim": {"instance_type": "inf1.24xlarge"}}))
    neff = build_mlp((64, 256, 16)).neff
    figures: dict[str, Any] = {}
    with DaemonProcess(sim_root=work / "sim", args=["-c", str(config)]) as daemon:
        held = open_sessions(daemon.address, daemon.pid, args.sessions)
        figures["open_sessions"] = held
        print(
            f"{held['sessions']} sessions opened in {held['open_s']} s; describe p50/p99 "
            f"{held['describe_ms_before']} ms with none open, {held['describe_ms_open']} ms "
            f"with them open; daemon threads {held['threads'][0]} -> {held['threads'][1]}"
        )
        figures["clients"] = []
        print(f"{'clients':>8} {'finished':>9} {'all done s':>11} {'p50 ms':>8} {'p99 ms':>8}")
        for count in (int(c) for c in args.clients.split(",")):
            row = run_clients(daemon.address, count, args.calls, neff)
            figures["clients"].append(row)
            p50, p99 = row["infer_ms"] or (None, None)
            print(f"{count:>8} {row['finished']:>9} {row['total_s']:>11} {p50:>8} {p99:>8}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    ok = all(r["finished"] == r["clients"] for r in figures["clients"])
    return 0 if ok and held["describe_ms_open"][1] < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
