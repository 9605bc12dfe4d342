"""bench/real_models.py's reports: the header, each model's figures, the overview table
of a run, its summary, and with `--repeat` the ratios across runs (worst, median, best)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnxruntime as ort
from real_models_host import machine
from vs_onnxruntime import blas_threads, print_row

if TYPE_CHECKING:
    from real_models import Figures

SIDES = ("onnxruntime", "in-process", "daemon", "floor")
OPSET = 17


def print_header(args: argparse.Namespace) -> None:
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"onnxruntime {ort.__version__}: default session, CPUExecutionProvider, "
        f"intra_op_num_threads {args.threads}, inter_op_num_threads 1; "
        f"torch {importlib.metadata.version('torch')} export, opset {OPSET}"
    )
    print(
        f"runtime (in-process and daemon): NC engine {args.engine}, CPU nodes with "
        f"NEURON_RTD_HOST_THREADS={args.threads}, numpy BLAS threads {blas_threads(None)}"
    )
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"machine: {machine()}; load average {load}")
    print(
        f"{args.rounds} round(s) per model, ~{args.budget:g} s per side per round "
        f"(at least {args.min_calls} calls); {args.repeat} full run(s)"
        f"{'; --busy: a busy loop on one core throughout' if args.busy else ''}",
        flush=True,
    )


# --- reports ----------------------------------------------------------------------------
def print_figures(fig: Figures) -> None:
    in_b, out_b = fig.io_bytes
    print(f"  {'side':<34}{'p50 ms':>10}{'p99 ms':>10}{'calls':>8}")
    for side in SIDES:
        label = side
        if side == "floor":
            label = f"floor (echo + copy {in_b + out_b:,} B)"
        print(
            f"  {label:<34}{fig.p50(side) * 1e3:>10.3f}{fig.p99(side) * 1e3:>10.3f}"
            f"{fig.calls(side):>8}"
        )
    c = fig.check
    print(
        f"  daemon / (onnxruntime + floor) {fig.daemon_ratio():.2f}x, "
        f"in-process / onnxruntime {fig.local_ratio():.2f}x"
    )
    print(
        f"  check vs onnxruntime: daemon cosine {c['daemon_cosine']:.7f} max|err| "
        f"{c['daemon_max_abs_err']:.3g}; in-process cosine {c['in_process_cosine']:.7f} "
        f"max|err| {c['in_process_max_abs_err']:.3g}"
    )
    print(
        f"  other processes on the machine: {fig.others_pct:.0f}% of a core; "
        f"stolen by the host: {fig.stolen_pct:.0f}%",
        flush=True,
    )


def print_overview(results: list[Figures]) -> None:
    columns = (
        ("model", 16),
        ("NC/CPU ops", 12),
        ("ort p50", 10),
        ("in-proc p50", 13),
        ("daemon p50", 12),
        ("floor p50", 11),
        ("dmn/(ort+fl)", 14),
        ("in-proc/ort", 13),
        ("cosine", 11),
        ("others", 8),
        ("stolen", 8),
    )
    print_row([title for title, _ in columns], columns)
    for fig in results:
        cells = (
            fig.name,
            f"{fig.compiled.nc_ops}/{fig.compiled.cpu_ops}",
            *(f"{fig.p50(side) * 1e3:.3f}" for side in SIDES),
            f"{fig.daemon_ratio():.2f}x",
            f"{fig.local_ratio():.2f}x",
            f"{fig.check['daemon_cosine']:.7f}",
            f"{fig.others_pct:.0f}%",
            f"{fig.stolen_pct:.0f}%",
        )
        print_row(cells, columns)
    print(
        "(p50 in ms: the best round's median; others: the CPU the machine's other processes "
        "took during the model's rounds, stolen: the CPU time the host took from this virtual "
        "machine meanwhile, both in % of one core)"
    )


def print_summary(results: list[Figures], run: dict[str, Any]) -> dict[str, Any]:
    """The overview table, the idle cost and the worst ratios; the summary as data."""
    idle = run["idle"]
    print()
    if results:
        print_overview(results)
    print(
        f"idle, every model loaded, over {idle['seconds']:.1f} s: daemon "
        f"{idle['daemon_pct']:.1f}% of a core ({idle['daemon_threads']:.0f} threads), "
        f"this process with its LocalRuntime {idle['in_process_pct']:.1f}% "
        f"({idle['in_process_threads']:.0f} threads)"
    )
    print(
        f"other processes on the machine during the rounds: "
        f"{run['other_processes_cpu_pct']:.0f}% of a core; stolen by the host: "
        f"{run['stolen_cpu_pct']:.0f}%"
    )
    if not results:
        return {}
    worst_daemon = max(results, key=lambda f: f.daemon_ratio())
    worst_local = max(results, key=lambda f: f.local_ratio())
    summary = {
        "worst_daemon_ratio": worst_daemon.daemon_ratio(),
        "worst_daemon_model": worst_daemon.name,
        "worst_in_process_ratio": worst_local.local_ratio(),
        "worst_in_process_model": worst_local.name,
        "worst_cosine": min(f.check["daemon_cosine"] for f in results),
    }
    print(
        f"worst daemon / (onnxruntime + floor): {summary['worst_daemon_ratio']:.2f}x "
        f"({worst_daemon.name}); worst in-process / onnxruntime: "
        f"{summary['worst_in_process_ratio']:.2f}x ({worst_local.name}); "
        f"worst cosine {summary['worst_cosine']:.7f}"
    )
    return summary


def across_runs(runs: list[list[Figures]]) -> dict[str, dict[str, Any]]:
    """Per model, its daemon / (onnxruntime + floor) of every run it ran in, and their
    worst, median and best; its sides' p50s (ms) by run."""
    ratios: dict[str, list[float]] = {}
    p50s: dict[str, dict[str, list[float]]] = {}
    for results in runs:
        for fig in results:
            ratios.setdefault(fig.name, []).append(fig.daemon_ratio())
            sides = p50s.setdefault(fig.name, {side: [] for side in SIDES})
            for side in SIDES:
                sides[side].append(fig.p50(side) * 1e3)
    return {
        name: {
            "daemon_ratios": found,
            "worst": max(found),
            "median": statistics.median(found),
            "best": min(found),
            "p50s_ms": p50s[name],
        }
        for name, found in ratios.items()
    }


def print_across_runs(across: dict[str, dict[str, Any]], runs: int, busy: str) -> None:
    """The table of `--repeat`: each model's ratio in every run, its worst and median."""
    print(f"\nacross {runs} runs{' with ' + busy if busy else ''}:")
    columns = (
        ("model", 16),
        ("ort p50 (med)", 15),
        ("daemon p50 (med)", 18),
        ("worst", 8),
        ("median", 8),
        ("best", 8),
        ("by run", 30),
    )
    print_row([title for title, _ in columns], columns)
    for name, row in across.items():
        cells = (
            name,
            f"{statistics.median(row['p50s_ms']['onnxruntime']):.3f}",
            f"{statistics.median(row['p50s_ms']['daemon']):.3f}",
            f"{row['worst']:.2f}x",
            f"{row['median']:.2f}x",
            f"{row['best']:.2f}x",
            " ".join(f"{r:.2f}" for r in row["daemon_ratios"]),
        )
        print_row(cells, columns)
    if across:
        worst = max(across, key=lambda name: across[name]["worst"])
        median = max(across, key=lambda name: across[name]["median"])
        print(
            f"worst daemon / (onnxruntime + floor) in any run: {across[worst]['worst']:.2f}x "
            f"({worst}); worst median: {across[median]['median']:.2f}x ({median})"
        )


def json_report(
    args: argparse.Namespace,
    runs: list[tuple[list[Figures], dict[str, Any]]],
    across: dict[str, dict[str, Any]],
    failed: dict[str, str],
    busy: str,
) -> dict[str, Any]:
    """The whole bench as data (`--json`): the first run's figures where one run's were
    before `--repeat`, every run's under "runs", the ratios across them."""
    results, run = runs[0] if runs else ([], {})
    return {
        "command": [sys.executable, *sys.argv],
        "threads": args.threads,
        "engine": args.engine,
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "onnxruntime": ort.__version__,
        "torch": importlib.metadata.version("torch"),
        "rounds": args.rounds,
        "budget_s": args.budget,
        "min_calls": args.min_calls,
        "repeat": args.repeat,
        "busy": busy,
        "models": {f.name: f.as_json() for f in results},
        "failed": failed,
        **run,  # its summary too
        "runs": [{"models": {f.name: f.as_json() for f in r}, **own} for r, own in runs],
        "across_runs": across,
    }
