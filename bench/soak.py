"""Soak: 8 client processes against one daemon for a given time, each mixing sync, async,
inline and shared-memory inferences with loads and unloads (and, now and then, a whole
client closed and opened again); the daemon's RSS, open fds and threads sampled all along.

    python bench/soak.py [--minutes 30] [--warmup 3] [--clients 8] [--every 10]
                         [--json FILE]

The figures: growth per hour of RSS, fds and threads after the warm-up (a least-squares
slope over the samples after it), the calls made and refused. Goal: RSS growth <= 20 MB/h,
fds and threads flat.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp


def client_loop(conn: Connection, address: str, seed: int, end: float) -> None:
    """One client: until `end`, a random mix of what applications do."""
    rng = random.Random(seed)
    samples = [build_mlp((32, 64, 8), batch=2, seed=s) for s in range(3)]
    calls = refused = 0
    while time.monotonic() < end:
        shm = rng.random() < 0.5
        with Client(address, shm=shm, timeout_s=60) as client:
            try:  # each model takes an NC of its own: 2 per client share the 16
                models = [client.load(samples[0].neff, ninfer=4)]
            except Exception:
                refused += 1
                time.sleep(0.1)
                continue
            for _ in range(rng.randrange(50, 200)):
                if time.monotonic() >= end:
                    break
                sample = rng.choice(samples)
                action = rng.random()
                try:
                    if action < 0.05 and len(models) < 2:
                        models.append(client.load(sample.neff, ninfer=rng.choice([1, 4])))
                    elif action < 0.08 and len(models) > 1:
                        models.pop(rng.randrange(len(models))).unload()
                    else:
                        model = rng.choice(models)
                        x = {"x": np.random.default_rng(calls).standard_normal((2, 32))}
                        x["x"] = x["x"].astype(np.float32)
                        if action < 0.6:
                            model.infer(x)
                        else:
                            futures = [model.infer_async(x) for _ in range(3)]
                            for future in futures:
                                future.result()
                    calls += 1
                except Exception:  # a refusal (queue full, resources): counted
                    refused += 1
    conn.send((calls, refused))


def slope_per_hour(times: list[float], values: list[float]) -> float:
    if len(times) < 2:
        return float("nan")
    return float(np.polyfit(np.array(times) / 3600.0, np.array(values), 1)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="minutes not in the slope")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    context = multiprocessing.get_context("forkserver")
    with (
        tempfile.TemporaryDirectory(prefix="nrt-soak-") as work,
        DaemonProcess(sim_root=Path(work) / "sim", args=["-l", "warning"]) as daemon,
    ):
        proc = psutil.Process(daemon.pid)
        start = time.monotonic()
        end = start + args.minutes * 60
        workers = []
        for i in range(args.clients):
            parent, child = context.Pipe()
            p = context.Process(target=client_loop, args=(child, daemon.address, i, end))
            p.start()
            workers.append((p, parent))
        samples: list[dict[str, float]] = []
        while time.monotonic() < end:
            samples.append(
                {
                    "t_s": time.monotonic() - start,
                    "rss_mb": proc.memory_info().rss / 2**20,
                    "fds": proc.num_fds(),
                    "threads": proc.num_threads(),
                }
            )
            row = samples[-1]
            print(
                f"{row['t_s']:7.0f} s  rss {row['rss_mb']:7.1f} MB  fds {row['fds']:4.0f}  "
                f"threads {row['threads']:3.0f}",
                flush=True,
            )
            time.sleep(max(0.0, min(args.every, end - time.monotonic())))
        totals = [conn.recv() for _, conn in workers]
        for p, _ in workers:
            p.join(60)
        tracebacks = daemon.log().count("Traceback")
    after = [s for s in samples if s["t_s"] >= args.warmup * 60]
    t = [s["t_s"] for s in after]
    result: dict[str, Any] = {
        "minutes": args.minutes,
        "clients": args.clients,
        "calls": sum(c for c, _ in totals),
        "refused": sum(r for _, r in totals),
        "tracebacks": tracebacks,
        "samples": samples,
        "rss_mb_per_hour": slope_per_hour(t, [s["rss_mb"] for s in after]),
        "fds_per_hour": slope_per_hour(t, [s["fds"] for s in after]),
        "threads_per_hour": slope_per_hour(t, [s["threads"] for s in after]),
    }
    first, last = (after[0], after[-1]) if after else (samples[0], samples[-1])
    print(
        f"\n{args.clients} clients, {args.minutes:g} min: {result['calls']} calls, "
        f"{result['refused']} refused, {tracebacks} tracebacks in the daemon log"
    )
    print(
        f"after the {args.warmup:g} min warm-up: RSS {first['rss_mb']:.1f} -> "
        f"{last['rss_mb']:.1f} MB ({result['rss_mb_per_hour']:+.1f} MB/h), fds "
        f"{first['fds']:.0f} -> {last['fds']:.0f} ({result['fds_per_hour']:+.1f}/h), threads "
        f"{first['threads']:.0f} -> {last['threads']:.0f} ({result['threads_per_hour']:+.1f}/h)"
    )
    print("goal: RSS <= 20 MB/h, fds and threads flat")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    ok = result["rss_mb_per_hour"] <= 20 and not tracebacks
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
