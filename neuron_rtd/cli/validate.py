"""`neuron-cli validate model.onnx model.neff`: does a compiled NEFF compute what its ONNX
model does?

The NEFF runs on the daemon (loaded, inferred once, unloaded even on errors), the ONNX
model on onnxruntime's CPU provider, both on the same inputs: an npz given with
`--inputs` (keys are the input names) or random ones drawn from `--seed` (float inputs
uniform in `--range`, integer inputs uniform in [LOW, HIGH), bool inputs fair coins), at
the NEFF's declared shapes or the `--input-shape` given for an input with a varying axis.

Per output it reports the cosine similarity (the exact-match fraction for integer and
bool outputs), the SQNR in dB, the largest absolute error and, for classifier-like
outputs (float, rank 2, last axis > 1), the top-1 agreement.

Exit codes: 0 every output meets the thresholds, 1 some output does not (the report says
which and why), 2 usage errors (a bad file or npz, arguments that do not fit the model,
no daemon at the address).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from neuron_rtd.client.client import Client, NrtClientError, default_address
from neuron_rtd.errors import NrtError
from neuron_rtd.neff import Neff, TensorSpec, read_neff_file

PROG = "neuron-cli validate"
DEFAULT_MIN_COSINE = 0.9999
ORT_THREADS = 2

# onnxruntime's type strings, as `NodeArg.type` gives them.
ORT_DTYPES: dict[str, np.dtype] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in (
        ("float", "float32"),
        ("float16", "float16"),
        ("double", "float64"),
        ("int8", "int8"),
        ("uint8", "uint8"),
        ("int16", "int16"),
        ("uint16", "uint16"),
        ("int32", "int32"),
        ("uint32", "uint32"),
        ("int64", "int64"),
        ("uint64", "uint64"),
        ("bool", "bool"),
    )
}


class UsageError(Exception):
    """The command cannot run as asked: exit 2 with this message."""


# --- metrics (pure: `compare` needs no daemon and no onnxruntime) --------------------


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What every output must meet. `min_cosine` also bounds the exact-match fraction of
    integer and bool outputs; `min_sqnr_db` applies to float outputs; `max_abs_error` to
    all. None: not checked."""

    min_cosine: float = DEFAULT_MIN_COSINE
    min_sqnr_db: float | None = None
    max_abs_error: float | None = None


@dataclasses.dataclass
class OutputReport:
    """One output compared. `kind` is "float" (cosine and SQNR) or "exact" (integer and
    bool outputs: the exact-match fraction). Metrics are None where they do not apply or
    could not be computed (shapes that differ, a missing output)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...] | None
    got_dtype: str | None = None
    got_shape: tuple[int, ...] | None = None
    cosine: float | None = None
    match_fraction: float | None = None
    sqnr_db: float | None = None
    max_abs_error: float | None = None
    top1: float | None = None
    top1_rows: int | None = None
    nonfinite_mismatches: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: non-finite floats become the strings "inf", "-inf", "nan"."""
        doc: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float):
                value = _json_float(value)
            doc[field.name] = value
        doc["passed"] = self.passed
        return doc


def _json_float(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def cosine_similarity(reference: np.ndarray, got: np.ndarray) -> float:
    """cos(ref, got) over all elements, in float64: 1.0 when both are all zeros (or
    empty), 0.0 when only one is."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    out = np.asarray(got, dtype=np.float64).ravel()
    ref_norm = float(np.linalg.norm(ref))
    out_norm = float(np.linalg.norm(out))
    if ref_norm == 0.0 or out_norm == 0.0:
        return 1.0 if ref_norm == out_norm else 0.0
    value = float(np.dot(ref, out)) / (ref_norm * out_norm)
    return max(-1.0, min(1.0, value))


def sqnr_db(reference: np.ndarray, got: np.ndarray) -> float:
    """10*log10(sum(ref^2) / sum((ref-got)^2)): inf when identical, -inf when the
    reference is all zeros and the other is not."""
    ref = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum(np.square(ref - np.asarray(got, dtype=np.float64))))
    if noise == 0.0:
        return math.inf
    signal = float(np.sum(np.square(ref)))
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def top1_agreement(reference: np.ndarray, got: np.ndarray) -> float:
    """The fraction of rows whose argmax over the last axis agrees."""
    ref = np.asarray(reference)
    if ref.shape[0] == 0:
        return 1.0
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(np.asarray(got), axis=-1)))


def is_classifier_like(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" and array.ndim == 2 and array.shape[-1] > 1


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def compare_one(
    name: str, reference: np.ndarray, got: np.ndarray, thresholds: Thresholds = Thresholds()
) -> OutputReport:
    """Compare one output of the NEFF (`got`) with onnxruntime's (`reference`)."""
    ref = np.asarray(reference)
    out = np.asarray(got)
    exact = ref.dtype.kind in "biu" and out.dtype.kind in "biu"
    report = OutputReport(
        name=name,
        kind="exact" if exact else "float",
        dtype=ref.dtype.name,
        shape=tuple(ref.shape),
        got_dtype=out.dtype.name,
        got_shape=tuple(out.shape),
    )
    if ref.dtype != out.dtype:
        report.notes.append(f"dtype {out.dtype.name} from the NEFF, {ref.dtype.name} expected")
    if ref.shape != out.shape:
        report.failures.append(
            f"shape {tuple(out.shape)} from the NEFF, {tuple(ref.shape)} from onnxruntime"
        )
        return report

    if exact:
        equal = ref == out
        report.match_fraction = float(np.mean(equal)) if equal.size else 1.0
        diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        report.max_abs_error = float(diff.max()) if diff.size else 0.0
        if report.match_fraction < thresholds.min_cosine:
            mismatched = int(equal.size - np.count_nonzero(equal))
            report.failures.append(
                f"exact match {report.match_fraction:.6f} < {thresholds.min_cosine} "
                f"({mismatched} of {equal.size} elements differ)"
            )
    else:
        ref64 = ref.astype(np.float64)
        out64 = out.astype(np.float64)
        # Non-finite values must agree exactly; the metrics use the rest.
        ref_finite = np.isfinite(ref64)
        out_finite = np.isfinite(out64)
        both_nan = np.isnan(ref64) & np.isnan(out64)
        same_inf = ~ref_finite & ~out_finite & (ref64 == out64)
        agree = (ref_finite & out_finite) | both_nan | same_inf
        report.nonfinite_mismatches = int(agree.size - np.count_nonzero(agree))
        finite = ref_finite & out_finite
        r, o = ref64[finite], out64[finite]
        report.cosine = cosine_similarity(r, o)
        report.sqnr_db = sqnr_db(r, o)
        report.max_abs_error = float(np.max(np.abs(r - o))) if r.size else 0.0
        if report.nonfinite_mismatches:
            report.max_abs_error = math.inf
            report.failures.append(
                f"{report.nonfinite_mismatches} element(s) are NaN or infinite in one output "
                "but not the other"
            )
        if report.cosine < thresholds.min_cosine:
            report.failures.append(f"cosine {report.cosine:.6f} < {thresholds.min_cosine}")
        if thresholds.min_sqnr_db is not None and report.sqnr_db < thresholds.min_sqnr_db:
            report.failures.append(f"SQNR {report.sqnr_db:.2f} dB < {thresholds.min_sqnr_db} dB")
        if is_classifier_like(ref):
            report.top1 = top1_agreement(ref, out)
            report.top1_rows = int(ref.shape[0])
    limit = thresholds.max_abs_error
    if limit is not None and report.max_abs_error is not None and report.max_abs_error > limit:
        report.failures.append(f"max abs error {_fmt(report.max_abs_error)} > {limit}")
    return report


def compare(
    reference: Mapping[str, np.ndarray],
    got: Mapping[str, np.ndarray],
    thresholds: Thresholds = Thresholds(),
) -> list[OutputReport]:
    """Compare every output: `reference` (onnxruntime's, in its order) against `got` (the
    NEFF's). An output only one side has is a failure of its own."""
    reports: list[OutputReport] = []
    for name, ref in reference.items():
        ref = np.asarray(ref)
        if name not in got:
            reports.append(
                OutputReport(
                    name=name,
                    kind="exact" if ref.dtype.kind in "biu" else "float",
                    dtype=ref.dtype.name,
                    shape=tuple(ref.shape),
                    failures=["the NEFF has no output of this name"],
                )
            )
            continue
        reports.append(compare_one(name, ref, got[name], thresholds))
    for name, out in got.items():
        if name not in reference:
            out = np.asarray(out)
            reports.append(
                OutputReport(
                    name=name,
                    kind="exact" if out.dtype.kind in "biu" else "float",
                    dtype=out.dtype.name,
                    shape=None,
                    got_dtype=out.dtype.name,
                    got_shape=tuple(out.shape),
                    failures=["the ONNX model has no output of this name"],
                )
            )
    return reports


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


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        sizes = tuple(int(d) for d in dims.split(","))
    except ValueError:
        sizes = ()
    if not sep or not name or not sizes or any(d < 0 for d in sizes):
        raise argparse.ArgumentTypeError(
            f"expected NAME=D0,D1,... (e.g. input_ids=1,128), got {text!r}"
        )
    return name, sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("onnx", help="the ONNX model (the reference, run by onnxruntime)")
    parser.add_argument("neff", help="the NEFF compiled from it (run by the daemon)")
    parser.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="the inputs, one array per input name (default: random ones)",
    )
    parser.add_argument(
        "-a",
        "--address",
        help="the daemon's address (default: $NEURON_RTD_ADDRESS, else unix:/run/neuron.sock)",
    )
    parser.add_argument(
        "--range",
        type=parse_range,
        default=(0.0, 1.0),
        metavar="LOW:HIGH",
        help="random inputs: floats uniform in [LOW, HIGH], integers in [LOW, HIGH) "
        "(default 0:1; write a negative LOW as --range=-1:1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random inputs' seed (default 0)")
    parser.add_argument(
        "--input-shape",
        type=parse_shape,
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="the shape of a random input with a varying axis (default: its largest; repeatable)",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=DEFAULT_MIN_COSINE,
        metavar="C",
        help="least cosine similarity (exact-match fraction for integer/bool outputs) "
        f"(default {DEFAULT_MIN_COSINE})",
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
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


# --- inputs --------------------------------------------------------------------------


def _check_shape(spec: TensorSpec, shape: Sequence[int], where: str) -> None:
    """`shape` fits `spec`: same rank, fixed axes equal, varying axes within their bound."""
    if len(shape) != len(spec.shape):
        raise UsageError(
            f"{where}: input {spec.name!r} has shape {tuple(shape)}; the NEFF declares "
            f"{spec.describe()} ({len(spec.shape)} axes)"
        )
    varying = set(spec.varying_axes)
    for axis, (size, declared) in enumerate(zip(shape, spec.shape, strict=True)):
        if axis in varying:
            if size < 1 or (declared and size > declared):
                raise UsageError(
                    f"{where}: input {spec.name!r} axis {axis} is {size}; the NEFF declares "
                    f"{spec.describe()} (1 to {declared or 'any'} there)"
                )
        elif size != declared:
            raise UsageError(
                f"{where}: input {spec.name!r} has shape {tuple(shape)}; the NEFF declares "
                f"{spec.describe()}"
            )


def input_shapes(
    specs: Sequence[TensorSpec], given: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """Each input's shape for random inputs: `given` (checked against the spec), else
    the declared size, where a varying axis follows a size given for its symbol on
    another input."""
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise UsageError(
            f"--input-shape names {', '.join(unknown)}; the NEFF's inputs are {', '.join(by_name)}"
        )
    symbol_sizes: dict[str, tuple[int, str]] = {}
    for name, shape in given.items():
        spec = by_name[name]
        _check_shape(spec, shape, "--input-shape")
        for axis, symbol in enumerate(spec.symbols):
            if symbol is None:
                continue
            seen = symbol_sizes.setdefault(symbol, (shape[axis], name))
            if seen[0] != shape[axis]:
                raise UsageError(
                    f"--input-shape gives dimension {symbol!r} size {seen[0]} for {seen[1]!r} "
                    f"but {shape[axis]} for {name!r}"
                )
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.name in given:
            shapes[spec.name] = tuple(given[spec.name])
            continue
        shape = list(spec.shape)
        for axis, symbol in enumerate(spec.symbols):
            if symbol is not None and symbol in symbol_sizes:
                shape[axis] = symbol_sizes[symbol][0]
        if spec.unbounded:
            raise UsageError(
                f"input {spec.name!r} ({spec.describe()}) has an axis without a bound: "
                "give its shape with --input-shape"
            )
        shapes[spec.name] = tuple(shape)
    return shapes


def random_inputs(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]],
    value_range: tuple[float, float],
    seed: int,
) -> dict[str, np.ndarray]:
    """Random inputs in the NEFF's dtypes: floats uniform in [low, high], integers
    uniform over the integers in [low, high), bools fair coins."""
    rng = np.random.default_rng(seed)
    low, high = value_range
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(shapes[spec.name])
        dtype = spec.dtype
        if dtype.kind == "b":
            arrays[spec.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            lo, hi = math.ceil(low), math.ceil(high)
            info = np.iinfo(dtype)
            if lo >= hi:
                raise UsageError(
                    f"--range {low:g}:{high:g} holds no integer for input {spec.name!r} "
                    f"({dtype.name}): integers are drawn from [LOW, HIGH)"
                )
            if lo < info.min or hi - 1 > info.max:
                raise UsageError(
                    f"--range {low:g}:{high:g} does not fit input {spec.name!r} "
                    f"({dtype.name}: {info.min} to {info.max})"
                )
            values = rng.integers(lo, hi, size=shape, dtype=np.int64, endpoint=False)
            arrays[spec.name] = values.astype(dtype)
        elif dtype.kind == "f":
            arrays[spec.name] = rng.uniform(low, high, size=shape).astype(dtype)
        else:
            raise UsageError(f"input {spec.name!r} has dtype {dtype.name}: no random values")
    return arrays


def npz_inputs(path: str, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """The inputs in an npz file, each checked against its spec and cast to its dtype."""
    if not Path(path).is_file():
        raise UsageError(f"--inputs {path}: no such file")
    try:
        if not zipfile.is_zipfile(path):
            raise UsageError(f"--inputs {path}: not an npz archive (np.savez writes one)")
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(f"--inputs {path}: cannot read it as an npz archive: {exc}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise UsageError(f"--inputs {path}: not an npz archive (np.savez writes one)")
    try:
        with loaded:
            arrays = {key: loaded[key] for key in loaded.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(f"--inputs {path}: cannot read it as an npz archive: {exc}") from None
    names = [spec.name for spec in specs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing key(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unknown key(s) {', '.join(map(repr, extra))}")
        raise UsageError(
            f"--inputs {path}: {'; '.join(parts)} (the NEFF's inputs are {', '.join(names)})"
        )
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        array = arrays[spec.name]
        _check_shape(spec, array.shape, f"--inputs {path}")
        if array.dtype.kind not in "biuf":
            raise UsageError(
                f"--inputs {path}: key {spec.name!r} has dtype {array.dtype}, not a number"
            )
        out[spec.name] = np.ascontiguousarray(array, dtype=spec.dtype)
    return out


# --- running -------------------------------------------------------------------------


def read_neff_or_fail(path: str) -> Neff:
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such NEFF file")
    try:
        return read_neff_file(path)
    except (NrtError, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a valid NEFF: {exc}") from None


def onnx_session(path: str) -> Any:
    import onnxruntime as ort

    if not Path(path).is_file():
        raise UsageError(f"{path}: no such ONNX file")
    options = ort.SessionOptions()
    options.intra_op_num_threads = ORT_THREADS
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types
        raise UsageError(f"{path}: onnxruntime cannot load it: {exc}") from None


def run_onnx(session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run onnxruntime on `inputs` (cast to the dtypes the model declares)."""
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        dtype = ORT_DTYPES.get(arg.type)
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
        except grpc.RpcError as exc:
            raise UsageError(_rpc_message(exc, address)) from None
        except NrtClientError as exc:
            raise UsageError(f"the daemon at {address} cannot load {neff_path}: {exc}") from None
        try:
            raw = {
                spec.name: np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype).tobytes()
                for spec in neff.inputs
            }
            try:
                data = client.infer_raw(model.id, raw)
            except NrtClientError as exc:
                return NeffRun({}, error=f"the daemon failed to run the NEFF: {exc}")
            except grpc.RpcError as exc:
                raise UsageError(_rpc_message(exc, address)) from None
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
            except (grpc.RpcError, NrtClientError) as exc:
                print(f"{PROG}: warning: could not unload model {model.id}: {exc}", file=sys.stderr)


def _rpc_message(exc: grpc.RpcError, address: str) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the daemon at {address}: {details}"
    name = code.name if code is not None else "error"
    return f"the daemon at {address} failed the call ({name}): {details}"


# --- report --------------------------------------------------------------------------


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


def _metric_cells(r: OutputReport) -> list[str]:
    if r.kind == "exact":
        similarity = "-" if r.match_fraction is None else f"match {r.match_fraction:.6f}"
    else:
        similarity = "-" if r.cosine is None else f"{r.cosine:.6f}"
    if r.sqnr_db is None:
        sqnr = "-"
    elif math.isinf(r.sqnr_db):
        sqnr = "inf" if r.sqnr_db > 0 else "-inf"
    else:
        sqnr = f"{r.sqnr_db:.2f}"
    error = "-" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
    if r.top1 is None:
        top1 = "-"
    else:
        agreeing = round(r.top1 * (r.top1_rows or 0))
        top1 = f"{r.top1 * 100:.1f}% ({agreeing}/{r.top1_rows})"
    return [similarity, sqnr, error, top1]


def render_text(
    reports: Sequence[OutputReport],
    thresholds: Thresholds,
    input_lines: Sequence[str],
    error: str | None = None,
) -> str:
    lines = ["inputs:", *(f"  {line}" for line in input_lines)]
    if error is not None:
        lines += ["", f"FAIL: {error}"]
        return "\n".join(lines)
    header = ["OUTPUT", "DTYPE", "SHAPE", "COSINE", "SQNR (dB)", "MAX ABS ERR", "TOP-1", "RESULT"]
    rows = [
        [r.name, r.dtype, _shape_text(r.shape), *_metric_cells(r), "ok" if r.passed else "FAIL"]
        for r in reports
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    table = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines += ["", *table]
    for r in reports:
        for note in r.notes:
            lines.append(f"note: output {r.name!r}: {note}")
    limits = [f"cosine >= {thresholds.min_cosine}"]
    if thresholds.min_sqnr_db is not None:
        limits.append(f"SQNR >= {thresholds.min_sqnr_db} dB")
    if thresholds.max_abs_error is not None:
        limits.append(f"max abs error <= {thresholds.max_abs_error}")
    failed = [r for r in reports if not r.passed]
    lines.append("")
    if not failed:
        lines.append(f"PASS: all {len(reports)} output(s) meet {', '.join(limits)}")
    else:
        for r in failed:
            lines.append(f"FAIL: output {r.name!r}: {'; '.join(r.failures)}")
        lines.append(f"FAIL: {len(failed)} of {len(reports)} output(s) do not meet the thresholds")
    return "\n".join(lines)


def _iter_input_lines(inputs: Mapping[str, np.ndarray], source: str) -> Iterator[str]:
    yield source
    for name, array in inputs.items():
        yield f"{name}  {array.dtype.name} {_shape_text(tuple(array.shape))}"


# --- the command ---------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    thresholds = Thresholds(
        min_cosine=args.min_cosine, min_sqnr_db=args.min_sqnr, max_abs_error=args.max_abs_error
    )
    address = args.address or default_address()
    neff = read_neff_or_fail(args.neff)
    session = onnx_session(args.onnx)

    onnx_inputs = [arg.name for arg in session.get_inputs()]
    neff_inputs = [spec.name for spec in neff.inputs]
    if sorted(onnx_inputs) != sorted(neff_inputs):
        raise UsageError(
            f"the models do not have the same inputs: the ONNX model's are "
            f"{', '.join(onnx_inputs) or 'none'}, the NEFF's {', '.join(neff_inputs) or 'none'}"
        )

    if args.inputs is not None:
        if args.input_shape:
            raise UsageError("--input-shape does not apply with --inputs (the npz gives shapes)")
        inputs = npz_inputs(args.inputs, neff.inputs)
        source = f"from {args.inputs}"
    else:
        given = dict(args.input_shape)
        if len(given) != len(args.input_shape):
            raise UsageError("--input-shape names an input more than once")
        shapes = input_shapes(neff.inputs, given)
        inputs = random_inputs(neff.inputs, shapes, args.range, args.seed)
        low, high = args.range
        source = f"random, seed {args.seed}, range {low:g}:{high:g}"

    reference = run_onnx(session, inputs)
    if args.timeout < 1:
        raise UsageError(f"--timeout must be at least 1 second, got {args.timeout}")
    result = run_neff(address, args.neff, neff, inputs, reference, args.timeout)
    reports = [] if result.error else compare(reference, result.outputs, thresholds)
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
                "range": None if args.inputs is not None else list(args.range),
                "tensors": {
                    name: {"dtype": a.dtype.name, "shape": list(a.shape)}
                    for name, a in inputs.items()
                },
            },
            "thresholds": dataclasses.asdict(thresholds),
            "error": result.error,
            "outputs": [r.to_json() for r in reports],
            "passed": passed,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(f"validate {args.onnx} (onnxruntime) against {args.neff} (daemon at {address})")
        lines = list(_iter_input_lines(inputs, source))
        print(render_text(reports, thresholds, lines, result.error))
    return 0 if passed else 1
