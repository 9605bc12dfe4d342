"""`neuron-cli validate model.onnx model.neff`: does a compiled NEFF compute what its ONNX
model does?

The NEFF runs on the daemon (loaded, inferred once, unloaded even on errors), the ONNX
model on onnxruntime's CPU provider, both on the same inputs: an npz given with
--inputs (keys are the input names) or random ones drawn from --seed (float inputs
uniform in --range, default 0:1; integer inputs in the range the model implies: the
embedding table's size for token ids, 0 and 1 for a mask, else in --range's [LOW, HIGH),
which must then be given; bool inputs fair coins), at the NEFF's declared shapes or the
--input-shape given for an input with a varying axis.

The reference may be the float model an int8 NEFF was quantized from (`neuron-cc
quantize`): the report then says it is int8 against float, and the default least cosine
is that of a quantized model (neuron_rtd/tools/validate/precision.py).

Per output it reports the cosine similarity (the exact-match fraction for integer and
bool outputs), the SQNR in dB, the largest absolute error and, for a classifier's scores
(a float matrix from a Softmax, LogSoftmax, Gemm or MatMul), the top-1 agreement.

Exit codes: 0 every output meets the thresholds, 1 some output does not (the report says
which and why) or no daemon answers at the address, 2 usage errors (a bad file or npz,
arguments that do not fit the model).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neuron_rtd import onnxrt
from neuron_rtd.arguments import parse_shape, unreadable
from neuron_rtd.client import Client, NrtClientError, NrtConnectionError, default_address
from neuron_rtd.command_line import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_address,
    add_cast,
    add_json_output,
)
from neuron_rtd.errors import NrtError
from neuron_rtd.neff import Neff, TensorSpec, read_neff_file
from neuron_rtd.tools.validate.errors import UsageError
from neuron_rtd.tools.validate.inputs import (
    DEFAULT_FLOAT_RANGE,
    given_shapes,
    input_shapes,
    int_ranges,
    npz_inputs,
    random_inputs,
)
from neuron_rtd.tools.validate.metrics import (
    AUTO_CAST_MIN_COSINE,
    DEFAULT_MIN_COSINE,
    QUANTIZED_MIN_COSINE,
    Thresholds,
    compare,
)
from neuron_rtd.tools.validate.model_facts import (
    classifier_outputs,
    implied_int_ranges,
    load_graph,
)
from neuron_rtd.tools.validate.precision import (
    auto_casts,
    default_min_cosine,
    is_float_graph,
    quantized_ops,
)
from neuron_rtd.tools.validate.report import iter_input_lines, render_text

PROG = "neuron-cli validate"
ORT_THREADS = 2


# --- arguments -----------------------------------------------------------------------


def parse_range(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    try:
        bounds = (float(low), float(high))
    except ValueError:
        bounds = (math.nan, math.nan)
    if not sep or not all(math.isfinite(b) for b in bounds) or bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(
            f"expected LOW:HIGH with LOW <= HIGH (e.g. 0:1, or --range=-1:1), got {text!r}"
        )
    return bounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "onnx",
        help="the ONNX model (the reference, run by onnxruntime): the one the NEFF was "
        "compiled from, or the float model an int8 one was quantized from",
    )
    parser.add_argument("neff", help="the NEFF compiled from it (run by the daemon)")
    parser.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="the inputs, one array per input name (default: random ones)",
    )
    add_cast(parser)
    add_address(parser)
    parser.add_argument(
        "--range",
        type=parse_range,
        metavar="LOW:HIGH",
        help="random inputs: floats uniform in [LOW, HIGH] (default 0:1), and integers the "
        "model implies no range for in [LOW, HIGH) (write a negative LOW as --range=-1:1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random inputs' seed (default 0)")
    parser.add_argument(
        "--input-shape",
        type=functools.partial(parse_shape, example="input_ids=1,128"),
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="the shape of a random input with a varying axis (default: its largest; repeatable)",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        metavar="C",
        help="least cosine similarity (exact-match fraction for integer/bool outputs) "
        f"(default {DEFAULT_MIN_COSINE}; {AUTO_CAST_MIN_COSINE} for a NEFF compiled with "
        f"--auto-cast; {QUANTIZED_MIN_COSINE} for an int8 NEFF against a float ONNX model)",
    )
    parser.add_argument(
        "--min-sqnr", type=float, metavar="DB", help="least SQNR in dB of float outputs"
    )
    parser.add_argument(
        "--max-abs-error", type=float, metavar="X", help="largest absolute error allowed"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=60,
        metavar="SECONDS",
        help="how long one call to the daemon, and the inference itself, may take (default 60)",
    )
    add_json_output(parser, "print the report as JSON")


# --- running -------------------------------------------------------------------------


def read_neff_or_fail(path: str, hint: str = "") -> Neff:
    """The NEFF at `path`, or a UsageError saying why not (`hint`: what else to give)."""
    why = unreadable(path, "NEFF file")
    if why:
        raise UsageError(f"{path}: {why}{hint}")
    try:
        return read_neff_file(path)
    except (NrtError, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a valid NEFF: {exc}") from None


def _random_source(
    args: argparse.Namespace,
    specs: Sequence[TensorSpec],
    integer_ranges: Mapping[str, tuple[int, int]],
    implied: Mapping[str, tuple[int, int]],
) -> str:
    low, high = args.range or DEFAULT_FLOAT_RANGE
    parts = [f"random, seed {args.seed}"]
    if any(spec.dtype.kind == "f" for spec in specs):
        parts.append(f"floats in {low:g}:{high:g}")
    for name, (lo, hi) in integer_ranges.items():
        why = "implied by the model" if name in implied else "--range"
        parts.append(f"{name} in [{lo}, {hi}) ({why})")
    return "; ".join(parts)


def onnx_session(path: str) -> Any:
    why = unreadable(path, "ONNX file")
    if why:
        raise UsageError(f"{path}: {why}")
    try:
        return onnxrt.session(path, threads=ORT_THREADS, log_severity=onnxrt.LOG_ERRORS)
    except Exception as exc:  # onnxruntime's own exception types
        raise UsageError(f"{path}: onnxruntime cannot load it: {exc}") from None


def run_onnx(session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run onnxruntime on `inputs` (cast to the dtypes the model declares)."""
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        dtype = onnxrt.ORT_DTYPES.get(arg.type)
        if dtype is None:
            raise UsageError(f"ONNX input {arg.name!r} has type {arg.type}, not supported here")
        feeds[arg.name] = np.ascontiguousarray(inputs[arg.name], dtype=dtype)
    names = [arg.name for arg in session.get_outputs()]
    try:
        values = session.run(names, feeds)
    except Exception as exc:  # onnxruntime's own exception types
        raise UsageError(f"onnxruntime cannot run the model on these inputs: {exc}") from None
    return {name: np.asarray(value) for name, value in zip(names, values, strict=True)}


def _output_array(spec: TensorSpec, data: bytes, reference: np.ndarray | None) -> np.ndarray:
    """The daemon's bytes as the output's array; an output with more than one varying
    axis takes the reference's shape when the element count and fixed axes agree."""
    try:
        return spec.array_from(data)
    except ValueError:
        flat = np.frombuffer(data, dtype=spec.dtype)
        varying = set(spec.varying_axes)
        if (
            reference is not None
            and reference.ndim == len(spec.shape)
            and flat.size == reference.size
            and all(
                reference.shape[axis] == size
                for axis, size in enumerate(spec.shape)
                if axis not in varying
            )
        ):
            return flat.reshape(reference.shape)
        return flat


@dataclasses.dataclass
class NeffRun:
    outputs: dict[str, np.ndarray]
    error: str | None = None  # the daemon could not run the NEFF on these inputs


def run_neff(
    address: str,
    neff_path: str,
    neff: Neff,
    inputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    timeout_s: int = 60,
) -> NeffRun:
    """Load the NEFF on the daemon, infer once, unload it (whatever happened). Each call
    and the inference itself may take `timeout_s` seconds."""
    with Client(address, timeout_s=timeout_s) as client:
        try:
            model = client.load(neff_path, timeout_s=timeout_s)
        except NrtConnectionError:
            raise
        except NrtClientError as exc:
            raise UsageError(f"the daemon at {address} cannot load {neff_path}: {exc}") from None
        try:
            raw = {
                spec.name: np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype).tobytes()
                for spec in neff.inputs
            }
            try:
                data = client.infer_raw(model.id, raw)
            except NrtConnectionError:
                raise
            except NrtClientError as exc:
                return NeffRun({}, error=f"the daemon failed to run the NEFF: {exc}")
            return NeffRun(
                {
                    spec.name: _output_array(spec, data[spec.name], reference.get(spec.name))
                    for spec in neff.outputs
                    if spec.name in data
                }
            )
        finally:
            try:
                model.unload()
            except NrtClientError as exc:
                print(f"{PROG}: warning: could not unload model {model.id}: {exc}", file=sys.stderr)


# --- the command ---------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NrtConnectionError as exc:  # no daemon answers: a failure, as in every tool
        print(f"{PROG}: error: {exc.details}", file=sys.stderr)
        return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    address = args.address or default_address()
    neff = read_neff_or_fail(args.neff)
    session = onnx_session(args.onnx)
    graph = load_graph(args.onnx)
    casts = auto_casts(neff)
    int8_ops = quantized_ops(neff) if is_float_graph(graph) else {}
    default_cosine = default_min_cosine(casts, int8_ops)
    thresholds = Thresholds(
        min_cosine=default_cosine if args.min_cosine is None else args.min_cosine,
        min_sqnr_db=args.min_sqnr,
        max_abs_error=args.max_abs_error,
    )

    onnx_inputs = [arg.name for arg in session.get_inputs()]
    neff_inputs = [spec.name for spec in neff.inputs]
    if sorted(onnx_inputs) != sorted(neff_inputs):
        raise UsageError(
            f"the models do not have the same inputs: the ONNX model's are "
            f"{', '.join(onnx_inputs) or 'none'}, the NEFF's {', '.join(neff_inputs) or 'none'}"
        )

    implied = implied_int_ranges(graph)
    integer_ranges: dict[str, tuple[int, int]] = {}
    given = given_shapes(args.inputs, args.input_shape)
    if args.inputs is not None:
        inputs = npz_inputs(args.inputs, neff.inputs, args.cast)
        source = f"from {args.inputs}"
    else:
        shapes = input_shapes(neff.inputs, given)
        integer_ranges = int_ranges(neff.inputs, implied, args.range)
        inputs = random_inputs(neff.inputs, shapes, args.range, args.seed, integer_ranges)
        source = _random_source(args, neff.inputs, integer_ranges, implied)

    reference = run_onnx(session, inputs)
    if args.timeout < 1:
        raise UsageError(f"--timeout must be at least 1 second, got {args.timeout}")
    result = run_neff(address, args.neff, neff, inputs, reference, args.timeout)
    classifiers = classifier_outputs(graph)
    reports = [] if result.error else compare(reference, result.outputs, thresholds, classifiers)
    passed = result.error is None and all(r.passed for r in reports)

    if args.json:
        doc = {
            "onnx": args.onnx,
            "neff": args.neff,
            "address": address,
            "inputs": {
                "source": "npz" if args.inputs is not None else "random",
                "file": args.inputs,
                "seed": None if args.inputs is not None else args.seed,
                "range": None
                if args.inputs is not None
                else list(args.range or DEFAULT_FLOAT_RANGE),
                "int_ranges": None
                if args.inputs is not None
                else {name: list(r) for name, r in integer_ranges.items()},
                "tensors": {
                    name: {"dtype": a.dtype.name, "shape": list(a.shape)}
                    for name, a in inputs.items()
                },
            },
            "thresholds": dataclasses.asdict(thresholds),
            "auto_cast": [{"mode": mode, "type": kind} for mode, kind in casts],
            "int8_against_float": {"ops": int8_ops} if int8_ops else None,
            "error": result.error,
            "outputs": [r.to_json() for r in reports],
            "passed": passed,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(f"validate {args.onnx} (onnxruntime) against {args.neff} (daemon at {address})")
        for mode, kind in casts:
            print(
                f"auto-cast: the NEFF computes {'every op' if mode == 'all' else 'matmults'} "
                f"with {kind} inputs (fp32 accumulation): below, its accuracy against fp32"
            )
        if int8_ops:
            print(
                f"int8 against float: the NEFF computes {sum(int8_ops.values())} quantized "
                f"op(s) ({', '.join(f'{op} x{n}' for op, n in sorted(int8_ops.items()))}), "
                f"{args.onnx} is float: below, its accuracy against float"
            )
        lines = list(iter_input_lines(inputs, source))
        print(render_text(reports, thresholds, lines, result.error))
    return EXIT_OK if passed else EXIT_FAILED
