"""What neuron-monitor costs the daemon: the daemon's CPU time per report (every runtime
metric group: one describe, one snapshot, one read_inference_counters), and per call,
against the same daemon left idle for as long.

    .venv/bin/python bench/monitor_cost.py [--reports N] [--models K]

The daemon holds K loaded models (each in the snapshot) while the reports are taken back
to back; its CPU time comes from the kernel (psutil), so it includes the gRPC server's
threads. The idle rate, measured first over the same wall time, is taken off.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.client.observe import Watch
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.tools.monitor.config import everything
from neuron_rtd.tools.monitor.monitor import Monitor


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def daemon_cpu_per_call(
    proc: psutil.Process, call: Callable[[], object], n: int, idle_per_s: float
) -> tuple[float, float]:
    """(daemon CPU ms per call, idle excluded; wall ms per call)."""
    call()  # warm
    cpu0, wall0 = cpu_s(proc), time.perf_counter()
    for _ in range(n):
        call()
    wall = time.perf_counter() - wall0
    spent = cpu_s(proc) - cpu0 - idle_per_s * wall
    return spent / n * 1e3, wall / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reports", type=int, default=300, help="reports taken (default 300)")
    parser.add_argument("--models", type=int, default=4, help="models loaded (default 4)")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="nrt-") as tmp,
        DaemonProcess(sim_root=Path(tmp) / "sim") as daemon,
        Client(daemon.address) as client,
    ):
        for k in range(args.models):
            sample = build_mlp((64, 32, 10), name=f"m{k}", seed=k)
            model = client.load(sample.neff)
            model.infer(sample.random_inputs(k))
        proc = psutil.Process(daemon.pid)
        time.sleep(1.0)  # the loads' aftermath
        cpu0, wall0 = cpu_s(proc), time.perf_counter()
        time.sleep(5.0)
        idle_per_s = (cpu_s(proc) - cpu0) / (time.perf_counter() - wall0)

        monitor = Monitor(everything([daemon.address], period_s=1e-3))  # each call: all due
        with Watch(daemon.address) as watch:
            rows = {
                "report (describe + snapshot + counters)": daemon_cpu_per_call(
                    proc, monitor.collect, args.reports, idle_per_s
                ),
                "describe": daemon_cpu_per_call(proc, watch.describe, args.reports, idle_per_s),
                "snapshot": daemon_cpu_per_call(proc, watch.snapshot, args.reports, idle_per_s),
                "read_inference_counters": daemon_cpu_per_call(
                    proc, watch.counters, args.reports, idle_per_s
                ),
            }
        monitor.close()
    print(
        f"daemon idle: {idle_per_s * 1e3:.2f} ms CPU per s; {args.models} models loaded; "
        f"{args.reports} calls each"
    )
    print(f"{'':42s} {'daemon CPU ms/call':>18s} {'wall ms/call':>13s}")
    for name, (cpu_ms, wall_ms) in rows.items():
        print(f"{name:42s} {cpu_ms:18.3f} {wall_ms:13.3f}")
    per_report = rows["report (describe + snapshot + counters)"][0]
    print(f"at neuron-monitor's default period (5 s): {per_report / 5000 * 100:.4f}% of one vCPU")


if __name__ == "__main__":
    main()
