"""Models side by side on one daemon: clients hammering a big model on one NCG while one
client calls a small model on another NCG, through gRPC. What a busy model costs the
calls of another: the small model's latency and calls/s, and the big model's calls/s.

    python bench/mixed_models.py [--seconds 4] [--rounds 2] [--big-clients 3]

The big model is an MLP 1024-2048-2048-10 at batch 16 (a few ms a run, ninfer 8), the
small one an MLP 64-64-10 at batch 1; each client is a process of its own, calling
synchronous `infer` with its tensors inline, as any gRPC client does. Calls on one NC take
their turns there; the runtime's compute gate lets one call per core compute at once and
counts a turn's wait as a wait (neuron_rtd/runtime/compute.py): a call waiting its turn
must not hold up the small model's calls.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import grpc

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS, pb, pb_grpc


def client(address: str, model: int, x: bytes, ready: Barrier, seconds: float, out: Queue) -> None:
    """Call `model` for `seconds` once every client is connected and warm (`ready`); put
    (model, latencies)."""
    stub = pb_grpc.nmgr_v1Stub(grpc.insecure_channel(address, options=CHANNEL_OPTIONS))
    request = pb.infer_request(h_nn=pb.h_nn(id=model), ifmap=[pb.infer_io(name="x", buf=x)])
    stub.infer(request)  # connected, warm
    ready.wait()  # the round begins for all at once, however long their processes took
    start = time.monotonic()
    latencies = []
    while time.monotonic() < start + seconds:
        t0 = time.perf_counter()
        answer = stub.infer(request)
        latencies.append(time.perf_counter() - t0)
        if answer.status.code != 0:
            raise RuntimeError(f"model {model}: {answer.status.details.decode()}")
    out.put((model, latencies))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--big-clients", type=int, default=3)
    args = parser.parse_args()
    big = build_mlp((1024, 2048, 2048, 10), batch=16, seed=1)
    small = build_mlp((64, 64, 10), batch=1, seed=2)
    work = Path(tempfile.mkdtemp(prefix="nrt-bench-"))
    context = multiprocessing.get_context("forkserver")
    with (
        DaemonProcess(sim_root=work / "sim", args=["-l", "warning"]) as daemon,
        Client(daemon.address, shm=False) as owner,
    ):
        (big_ncg, _), (small_ncg, _) = owner.create_ncg(1), owner.create_ncg(1)
        big_model = owner.load(big.neff, ncg=big_ncg, ninfer=8)
        small_model = owner.load(small.neff, ncg=small_ncg)
        big_model.start()
        small_model.start()
        inputs = {
            big_model.id: big.random_inputs(seed=1)["x"].tobytes(),
            small_model.id: small.random_inputs(seed=1)["x"].tobytes(),
        }
        models = [big_model.id] * args.big_clients + [small_model.id]
        print(
            f"{args.big_clients} clients of MLP 1024-2048-2048-10 b16 on NCG {big_ncg}, "
            f"1 client of MLP 64-64-10 b1 on NCG {small_ncg}; {args.seconds:g} s a round"
        )
        for round_ in range(args.rounds):
            out: Queue = context.Queue()
            ready = context.Barrier(len(models))
            procs = [
                context.Process(
                    target=client,
                    args=(daemon.address, m, inputs[m], ready, args.seconds, out),
                )
                for m in models
            ]
            for proc in procs:
                proc.start()
            got = [out.get(timeout=60 + args.seconds) for _ in procs]
            for proc in procs:
                proc.join()
            small_s = sorted(t for m, times in got if m == small_model.id for t in times)
            big_s = [t for m, times in got if m == big_model.id for t in times]
            p99 = small_s[min(len(small_s) - 1, int(0.99 * len(small_s)))]
            print(
                f"round {round_ + 1}: big model {len(big_s) / args.seconds:.0f} calls/s "
                f"(p50 {statistics.median(big_s) * 1e3:.2f} ms); small model "
                f"{len(small_s) / args.seconds:.0f} calls/s, p50 "
                f"{statistics.median(small_s) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
