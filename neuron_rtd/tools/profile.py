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
from neuron_rtd.tools.profile_report import build_report, dims, render, shape_text
from neuron_rtd.tools.validate.command import read_neff_or_fail
from neuron_rtd.tools.validate.errors import UsageError
from neuron_rtd.tools.validate.inputs import (
    given_shapes,
    input_shapes,
    int_ranges,
    npz_inputs,
    random_inputs,
)

PROG = "neuron-cli profile"


class ProfileFailed(Exception):
    """The daemon or the model failed: exit 1 with this message."""


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
    given = given_shapes(args.inputs, args.input_shape)
    if args.inputs is not None:
        return npz_inputs(args.inputs, neff.inputs, args.cast)
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
                            "inputs": shape_text(dims(instr.input_shapes)),
                            "outputs": shape_text(dims(instr.output_shapes)),
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
