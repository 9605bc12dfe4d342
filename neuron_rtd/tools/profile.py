"""Per-op profile of a model on the daemon, as tables, JSON or a Chrome trace.

    neuron-cli profile ID                          a model loaded with enable_node_profiling
    neuron-cli profile MODEL.neff [--inputs in.npz | --input-shape NAME=D0,D1,...]
                                                   load it with profiling, run it, unload it

A NEFF's inputs: the npz given with --inputs, else random ones at the NEFF's declared
shapes (an input with a varying axis at its largest bucket, or at the shape --input-shape
gives), as neuron-cli validate makes them.

The tables: run order (each NC instruction and CPU node of one inference, with its op
type, time, MACs, GMAC/s and output shape), the top 10 by time, a summary by op type and
the totals of each NC and CPU node. Times are averages over the profiled inferences
shown. Two clocks: "host ms" is wall time on the daemon's host (a profiled model runs its
NC programs on the reference kernels, one instruction at a time, to time them); "NC us"
is simulated NeuronCore time, the cost model's cycles on the op's engine at the NC clock
(the engines run side by side, so a stage takes its busiest engine's time; CPU nodes have
none). GMAC/s is MACs per host second.

`--trace FILE` writes Chrome trace-event JSON (Perfetto, chrome://tracing): one track
per NC and per CPU node, each instruction a complete event, in host wall time.

Exit codes: 0 success, 1 the daemon or the model failed (one line says why), 2 usage
and bad input (a file, an npz or a shape that does not fit).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from neuron_rtd.arguments import parse_shape
from neuron_rtd.client import NrtConnectionError
from neuron_rtd.client.client import Client, NrtClientError
from neuron_rtd.client.observe import Watch
from neuron_rtd.command_line import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_address,
    add_cast,
    add_json_output,
)
from neuron_rtd.neff import Neff
from neuron_rtd.tools.control.command import explain
from neuron_rtd.tools.validate.command import read_neff_or_fail
from neuron_rtd.tools.validate.errors import UsageError
from neuron_rtd.tools.validate.inputs import input_shapes, int_ranges, npz_inputs, random_inputs

PROG = "neuron-cli profile"
TOP = 10


class ProfileFailed(Exception):
    """The daemon or the model failed: exit 1 with this message."""


@dataclass
class Row:
    """One NC instruction or CPU node, averaged over the inferences shown."""

    order: int
    where: str  # "NC 0" or "CPU"
    node: str
    index: int  # in its stage's program; -1 for a CPU node
    op: str  # the op type; a CPU node's is "cpu-node"
    engine: str
    host_ms: float
    nc_us: float
    macs: int
    gmacps: float
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="ID|MODEL.neff", help="a loaded model's id, or a NEFF file to profile"
    )
    parser.add_argument("--inputs", metavar="NPZ", help="inputs for a NEFF (default: random)")
    add_cast(parser)
    parser.add_argument(
        "--input-shape",
        type=functools.partial(parse_shape, example="input=4,3,224,224"),
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="the shape of a NEFF's random input with a varying axis (default: its largest "
        "bucket; repeatable)",
    )
    parser.add_argument(
        "--runs", type=int, default=10, help="inferences to run on a NEFF (default 10)"
    )
    parser.add_argument(
        "--last", type=int, default=0, help="profile only the last N inferences kept (default all)"
    )
    add_json_output(parser, "print the profile as JSON")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON file")
    add_address(parser)
    parser.add_argument("--timeout", type=int, default=60, help="seconds per call (default 60)")


def run(args: argparse.Namespace) -> int:
    try:
        response = _collect(args)
        report = build_report(response)
        if args.trace:
            _write_trace(Path(args.trace), response)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(render(report), end="")
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ProfileFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# --- getting the profile ------------------------------------------------------------------
def _collect(args: argparse.Namespace) -> Any:
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    if args.last < 0:
        raise UsageError("--last must be 0 or more")
    if args.target.isdigit():
        if args.inputs is not None or args.input_shape:
            flag = "--inputs" if args.inputs is not None else "--input-shape"
            raise UsageError(f"{flag} applies to a NEFF file, not to a loaded model's id")
        return _fetch(args.address, int(args.target), args.last, args.timeout)
    return _profile_neff(args)


def _fetch(address: str, model_id: int, last: int, timeout_s: float) -> Any:
    with Watch(address, timeout_s=timeout_s) as watch:
        try:
            return watch.profile(model_id, last)
        except NrtClientError as exc:
            raise ProfileFailed(_said(exc)) from None


def _said(exc: NrtClientError) -> str:
    """No daemon, as every tool says it; the daemon's refusal as neuron-cli's commands say
    it: `model 7 is not loaded (NERR_INVALID_HANDLE): see neuron-cli list-model`."""
    return exc.details if isinstance(exc, NrtConnectionError) else explain(exc)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _inputs(neff: Neff, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The npz's arrays, or random ones at the declared shapes (a varying axis at its
    largest bucket, or as --input-shape says), as validate makes them."""
    if args.inputs is not None:
        if args.input_shape:
            raise UsageError("--input-shape does not apply with --inputs (the npz gives shapes)")
        return npz_inputs(args.inputs, neff.inputs, args.cast)
    given = dict(args.input_shape)
    if len(given) != len(args.input_shape):
        raise UsageError("--input-shape names an input more than once")
    shapes = input_shapes(neff.inputs, given)
    values = (-1.0, 1.0)
    return random_inputs(neff.inputs, shapes, values, 0, int_ranges(neff.inputs, {}, values))


def _profile_neff(args: argparse.Namespace) -> Any:
    neff = read_neff_or_fail(args.target, " (or give a loaded model's id)")
    inputs = _inputs(neff, args)
    raw = {
        spec.name: np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype).tobytes()
        for spec in neff.inputs
    }
    data = Path(args.target).read_bytes()
    try:
        with Client(args.address, timeout_s=args.timeout) as client:
            model = client.load(data, timeout_s=args.timeout, profile=True)
            try:
                for _ in range(args.runs):
                    client.infer_raw(model.id, raw)
                return client.connection.profile(model.id, args.last or args.runs)
            finally:
                try:
                    model.unload()
                except (grpc.RpcError, NrtClientError) as exc:
                    print(
                        f"{PROG}: warning: could not unload model {model.id}: {exc}",
                        file=sys.stderr,
                    )
    except NrtClientError as exc:
        raise ProfileFailed(f"{args.target}: {_said(exc)}") from None
    except grpc.RpcError as exc:
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise ProfileFailed(
            f"cannot reach the daemon at {args.address}: {_one_line(Exception(details))}"
        ) from None


# --- the report ---------------------------------------------------------------------------
def _where(step: Any) -> str:
    return f"NC {step.vnc}" if step.vnc >= 0 else "CPU"


def _dims(shapes: Iterable[Any]) -> list[list[int]]:
    return [list(s.dims) for s in shapes]


def rows(response: Any) -> list[Row]:
    """One row per NC instruction and CPU node, averaged over the inferences (those of
    the last inference's variant, the one the rows follow)."""
    inferences = list(response.inferences)
    if not inferences:
        return []
    shape_of = [(s.node, s.stage, s.vnc, len(s.instrs)) for s in inferences[-1].steps]
    same = [
        i
        for i in inferences
        if [(s.node, s.stage, s.vnc, len(s.instrs)) for s in i.steps] == shape_of
    ]
    count = len(same)
    clock = response.nc_clock_hz or 1
    out: list[Row] = []
    last = same[-1]
    for k, step in enumerate(last.steps):
        if step.vnc < 0:
            host = sum(i.steps[k].host_ns for i in same) / count
            out.append(
                Row(
                    len(out),
                    "CPU",
                    step.node,
                    -1,
                    "cpu-node",
                    "host",
                    host / 1e6,
                    0.0,
                    0,
                    0.0,
                    _dims(step.input_shapes),
                    _dims(step.output_shapes),
                )
            )
            continue
        for j, instr in enumerate(step.instrs):
            host = sum(i.steps[k].instrs[j].host_ns for i in same) / count
            cycles = sum(i.steps[k].instrs[j].cycles for i in same) / count
            macs = int(instr.macs)
            out.append(
                Row(
                    len(out),
                    _where(step),
                    step.node,
                    instr.index,
                    instr.op,
                    instr.engine,
                    host / 1e6,
                    cycles / clock * 1e6,
                    macs,
                    macs / host if host else 0.0,  # MACs per ns = GMAC/s
                    _dims(instr.input_shapes),
                    _dims(instr.output_shapes),
                )
            )
    return out


def build_report(response: Any) -> dict[str, Any]:
    table = rows(response)
    total_ms = sum(r.host_ms for r in table) or 1.0
    total_nc = sum(r.nc_us for r in table) or 1.0
    by_type: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "host_ms": 0.0, "nc_us": 0.0, "macs": 0}
    )
    by_track: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "host_ms": 0.0, "nc_us": 0.0, "macs": 0}
    )
    for row in table:
        for key, group in (
            (row.op, by_type),
            (row.where if row.where != "CPU" else f"CPU {row.node}", by_track),
        ):
            entry = group[key]
            entry["count"] += 1
            entry["host_ms"] += row.host_ms
            entry["nc_us"] += row.nc_us
            entry["macs"] += row.macs

    def finish(group: Mapping[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
        out = []
        for key, entry in sorted(group.items(), key=lambda kv: -kv[1]["host_ms"]):
            host_ns = entry["host_ms"] * 1e6
            out.append(
                {
                    name: key,
                    **entry,
                    "percent": 100 * entry["host_ms"] / total_ms,
                    "nc_percent": 100 * entry["nc_us"] / total_nc,
                    "gmacps": entry["macs"] / host_ns if host_ns else 0.0,
                }
            )
        return out

    inferences = list(response.inferences)
    return {
        "model_id": response.model_id,
        "model_name": response.model_name,
        "nc_clock_hz": response.nc_clock_hz,
        "recorded": response.recorded,
        "inferences": len(inferences),
        "time_note": (
            "host_ms: host wall time of each op on the reference kernels (averaged); "
            "nc_us: simulated NC time, cost-model cycles / nc_clock_hz"
        ),
        "inference_host_ms": (
            sum(i.host_ns for i in inferences) / len(inferences) / 1e6 if inferences else 0.0
        ),
        "inference_nc_us": (
            sum(i.cycles for i in inferences) / len(inferences) / response.nc_clock_hz * 1e6
            if inferences and response.nc_clock_hz
            else 0.0
        ),
        "total_macs": sum(r.macs for r in table),
        "run_order": [asdict(r) for r in table],
        "top": [asdict(r) for r in sorted(table, key=lambda r: -r.host_ms)[:TOP]],
        "by_type": finish(by_type, "op"),
        "by_track": finish(by_track, "track"),
    }


def _shape_text(shapes: Sequence[Sequence[int]]) -> str:
    return ",".join("[" + "x".join(map(str, s)) + "]" for s in shapes)


def _table(headers: Sequence[str], lines: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max([len(h), *(len(line[k]) for line in lines)]) for k, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if k in right else c.ljust(w)
                for k, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    return "\n".join([rule, fmt(headers), rule, *(fmt(line) for line in lines), rule]) + "\n"


def _op_lines(table: Sequence[Mapping[str, Any]], total_ms: float) -> list[list[str]]:
    return [
        [
            str(r["order"]),
            r["where"],
            r["node"] if r["index"] < 0 else f"{r['node']}#{r['index']}",
            r["op"],
            f"{r['host_ms']:.4f}",
            f"{100 * r['host_ms'] / total_ms:.1f}",
            f"{r['nc_us']:.3f}",
            str(r["macs"]),
            f"{r['gmacps']:.3f}",
            _shape_text(r["output_shapes"]),
        ]
        for r in table
    ]


def render(report: Mapping[str, Any]) -> str:
    total_ms = sum(r["host_ms"] for r in report["run_order"]) or 1.0
    op_headers = [
        "#",
        "where",
        "op",
        "type",
        "host ms",
        "%",
        "NC us",
        "MACs",
        "GMAC/s",
        "output shape",
    ]
    right = {0, 4, 5, 6, 7, 8}
    parts = [
        f"Model {report['model_id']} ({report['model_name']}): {report['inferences']} profiled "
        f"inference(s) shown, {report['recorded']} since load\n"
        f"Inference: {report['inference_host_ms']:.3f} ms host wall, "
        f"{report['inference_nc_us']:.3f} us simulated NC; {report['total_macs']} MACs\n"
        "host ms: wall time on the host (reference kernels, op by op, averaged); "
        f"NC us: the op's engine cycles at {report['nc_clock_hz'] / 1e9:g} GHz (engines run "
        "side by side: a stage takes its busiest engine's time)\n\n",
        "Run order\n",
        _table(op_headers, _op_lines(report["run_order"], total_ms), right),
        f"\nTop {TOP} by host time\n",
        _table(op_headers, _op_lines(report["top"], total_ms), right),
        "\nBy op type\n",
    ]
    group_headers = ["count", "host ms", "%", "NC us", "NC %", "MACs", "GMAC/s"]

    def group_lines(entries: Sequence[Mapping[str, Any]], key: str) -> list[list[str]]:
        return [
            [
                e[key],
                str(e["count"]),
                f"{e['host_ms']:.4f}",
                f"{e['percent']:.1f}",
                f"{e['nc_us']:.3f}",
                f"{e['nc_percent']:.1f}",
                str(e["macs"]),
                f"{e['gmacps']:.3f}",
            ]
            for e in entries
        ]

    parts.append(
        _table(["type", *group_headers], group_lines(report["by_type"], "op"), set(range(1, 8)))
    )
    parts.append("\nBy NC and CPU node\n")
    parts.append(
        _table(
            ["track", *group_headers], group_lines(report["by_track"], "track"), set(range(1, 8))
        )
    )
    return "".join(parts)


# --- the trace ----------------------------------------------------------------------------
def trace_events(response: Any) -> list[dict[str, Any]]:
    """Chrome trace events: process 1 the model, a thread per NC and per CPU node, the
    inferences laid out at their wall-clock starts (us since the first)."""
    inferences = list(response.inferences)
    if not inferences:
        return []
    pid = 1
    tracks: dict[str, int] = {}
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"model {response.model_id} ({response.model_name})"},
        },
    ]

    def tid_of(step: Any) -> int:
        name = f"NC {step.vnc}" if step.vnc >= 0 else f"CPU node {step.node}"
        if name not in tracks:
            tracks[name] = tid = len(tracks) + 1
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        return tracks[name]

    origin = inferences[0].time_ns
    for inference in inferences:
        base = (inference.time_ns - origin) / 1e3
        for step in inference.steps:
            tid = tid_of(step)
            label = step.node if step.vnc < 0 else f"{step.node} stage {step.stage}"
            events.append(
                {
                    "ph": "X",
                    "name": label,
                    "cat": "cpu" if step.vnc < 0 else "stage",
                    "pid": pid,
                    "tid": tid,
                    "ts": base + step.start_ns / 1e3,
                    "dur": step.host_ns / 1e3,
                    "args": {"inference": inference.seq, "nc_cycles": step.cycles},
                }
            )
            for instr in step.instrs:
                events.append(
                    {
                        "ph": "X",
                        "name": instr.op,
                        "cat": instr.engine,
                        "pid": pid,
                        "tid": tid,
                        "ts": base + instr.start_ns / 1e3,
                        "dur": instr.host_ns / 1e3,
                        "args": {
                            "inference": inference.seq,
                            "index": instr.index,
                            "macs": instr.macs,
                            "nc_cycles": instr.cycles,
                            "inputs": _shape_text(_dims(instr.input_shapes)),
                            "outputs": _shape_text(_dims(instr.output_shapes)),
                        },
                    }
                )
    return events


def _write_trace(path: Path, response: Any) -> None:
    document = {"traceEvents": trace_events(response), "displayTimeUnit": "ms"}
    try:
        path.write_text(json.dumps(document))
    except OSError as exc:
        raise UsageError(f"--trace {path}: cannot write it: {exc.strerror}") from None
