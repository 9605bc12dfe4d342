"""The command, `python -m neuron_rtd.tools.conformance`: its arguments, the run, the
report printed (and written as JSON), and the exit code (1 when a case of a claimed op
fails)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from neuron_rtd.runtime import NC_ENGINES, LocalRuntime
from neuron_rtd.tools.conformance.cases import all_cases, select_cases
from neuron_rtd.tools.conformance.report import claimed_failures, format_report, to_json
from neuron_rtd.tools.conformance.results import CaseResult
from neuron_rtd.tools.conformance.run import run_cases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_rtd.tools.conformance",
        description="Run onnx's backend node test cases through compile, load and infer "
        "on a simulated machine, next to onnxruntime.",
    )
    parser.add_argument("--ops", help="comma-separated op types: only their cases")
    parser.add_argument("--match", help="only cases whose name holds this substring")
    parser.add_argument("--json", type=Path, help="write every result to this JSON file")
    parser.add_argument(
        "--failures",
        action="store_true",
        help="also list failing cases of unclaimed ops and unsupported cases of claimed ops",
    )
    parser.add_argument("--no-ort", action="store_true", help="do not run onnxruntime")
    parser.add_argument(
        "--engine",
        choices=NC_ENGINES,
        help="how the NCs compute (default: fast)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    args = parser.parse_args(argv)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()] if args.ops else None
    cases = select_cases(all_cases(), ops, args.match)
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    progress = _print_progress if args.verbose else None
    start = time.perf_counter()
    with LocalRuntime(engine=args.engine) as runtime:
        results = run_cases(cases, runtime, with_ort=not args.no_ort, progress=progress)
    seconds = time.perf_counter() - start
    print(format_report(results, failures=args.failures, seconds=seconds))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(results, seconds), indent=1) + "\n")
    return 1 if claimed_failures(results) else 0


def _print_progress(result: CaseResult) -> None:
    tail = f": {result.reason}" if result.reason else ""
    print(
        f"{result.outcome:<12} {result.name} [{result.ort or '-'}] {result.seconds:.2f}s{tail}",
        file=sys.stderr,
        flush=True,
    )
