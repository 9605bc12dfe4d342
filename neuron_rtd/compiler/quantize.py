"""`neuron-cc quantize`: a float ONNX model into an int8 one in QDQ form, its activation
ranges calibrated on sample inputs, for `neuron-cc compile` to take.

onnxruntime's quantizer does the work (`onnxruntime.quantization`): `quant_pre_process`
(shape inference and graph optimization, as its documentation asks before quantizing);
its calibrator (`create_calibrator`: MinMax, Entropy or Percentile) run over the samples,
its ranges saved as its calibration cache; then `quantize_static` in QDQ format
(QuantizeLinear/DequantizeLinear pairs around each quantized op) on those ranges, weights
per channel (per tensor when asked). The calibrator is called directly, not through
`quantize_static`, for two reasons: progress per sample, and the entropy method's
histogram size, which `quantize_static` does not pass on (see `_calibrator_options`).
Activations and weights are int8, onnxruntime's defaults for QDQ (symmetric weights, so
their zero points are 0).

This module reads the samples and checks them against the model's inputs, runs the
quantizer quietly (its calibration prints to stdout), tells progress, and says what it
did (`QuantizeSummary`).

The calibration samples come in an npz (`read_npz_samples`; TFRecord shards of Examples
are read by `neuron_rtd.compiler.calibration`): one array per model input,
keyed by the input's name, all with the same number of samples S along axis 0:
- of the input's rank plus one: [S, *input shape], each `array[i]` one sample;
- or of the input's own rank, when the input's first axis is its batch (symbolic or 1):
  [S, ...], each `array[i:i+1]` one sample of batch 1 (a stack of images as they are).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from neuron_rtd.arguments import unreadable
from neuron_rtd.compiler.compile import Progress
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import as_input
from neuron_rtd.records.npz import NpzUnreadable, npz_arrays

# our names of onnxruntime's calibration methods (its CalibrationMethod members)
METHODS: Mapping[str, str] = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
DEFAULT_PERCENTILE = 99.999  # onnxruntime's
ENTROPY_BINS = 2048  # the entropy method's histogram (see _calibrator_options)
ACTIVATIONS = WEIGHTS = "int8"  # onnxruntime's defaults for QDQ

# Ops of a quantized model (also the QLinear* ones)
_QUANTIZED_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
)


class CalibrationError(ValueError):
    """Calibration samples that cannot be read or do not fit the model (a usage error)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeOptions:
    method: str = "minmax"  # a key of METHODS
    percentile: float = DEFAULT_PERCENTILE  # the percentile method's
    per_channel: bool = True  # weights' scales per output channel (else per tensor)


@dataclasses.dataclass(frozen=True)
class ModelInput:
    """A model input as the graph declares it: `shape` None when it says nothing, a
    symbolic axis its name ("?" when it has none)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str, ...] | None

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.name} {self.dtype.name}"
        return f"{self.name} {self.dtype.name} [{','.join(map(str, self.shape))}]"

    def fits(self, shape: Sequence[int]) -> bool:
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            isinstance(want, str) or want == got
            for want, got in zip(self.shape, shape, strict=True)
        )

    @property
    def has_batch_axis(self) -> bool:
        """Whether its first axis may hold one sample (symbolic, or of size 1)."""
        first = self.shape[0] if self.shape else None
        return isinstance(first, str) or first == 1


Sample = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class QuantizeSummary:
    name: str
    method: str
    percentile: float | None  # the percentile method's, else None
    per_channel: bool
    samples: int
    int8_ops: Mapping[str, int]  # ops computed between DequantizeLinear and QuantizeLinear
    float_ops: Mapping[str, int]  # the ops left in float
    qdq_nodes: int  # QuantizeLinear and DequantizeLinear nodes added
    float_bytes: int
    int8_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "int8_ops": dict(self.int8_ops),
            "float_ops": dict(self.float_ops),
            "format": "QDQ",
            "activations": ACTIVATIONS,
            "weights": WEIGHTS,
        }

    def __str__(self) -> str:
        method = self.method
        if self.percentile is not None:
            method += f" ({self.percentile:g}th percentile)"
        weights = "per channel" if self.per_channel else "per tensor"
        int8 = sum(self.int8_ops.values())
        lines = [
            f"model {self.name!r}: QDQ, activations {ACTIVATIONS}, weights {WEIGHTS} {weights}",
            f"calibration: {method} on {self.samples} sample(s)",
            f"int8: {int8} op(s) ({_counts(self.int8_ops)}), "
            f"{self.qdq_nodes} QuantizeLinear/DequantizeLinear node(s)",
        ]
        if self.float_ops:
            lines.append(f"float: {_counts(self.float_ops)}")
        mib = [f"{size / 2**20:.2f} MiB" for size in (self.float_bytes, self.int8_bytes)]
        lines.append(f"size: {mib[0]} float, {mib[1]} int8")
        return "\n".join(lines)


def _counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclasses.dataclass(frozen=True)
class QuantizeResult:
    model: bytes  # the serialized QDQ ModelProto
    summary: QuantizeSummary


# --- the model -----------------------------------------------------------------------


def load_float_model(path: str | Path) -> onnx.ModelProto:
    """The float ONNX model at `path`; CompileError when it is not one to quantize."""
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise CompileError(f"{path} is not an ONNX model: {exc}") from None
    if not model.graph.node:
        raise CompileError(f"{path} is not an ONNX model: it has no graph (no nodes)")
    done = sorted({n.op_type for n in model.graph.node if is_quantized_op(n.op_type)})
    if done:
        raise CompileError(
            f"{path} is quantized already (it has {', '.join(done)}): give the float model"
        )
    return model


def is_quantized_op(op: str) -> bool:
    """Whether `op` is one of a quantized model's (a model quantized already is not
    quantized again; `neuron-cli validate` finds a quantized NEFF by them)."""
    return op in _QUANTIZED_OPS or op.startswith("QLinear")


def model_inputs(model: onnx.ModelProto) -> list[ModelInput]:
    """The model's inputs (its initializers are not)."""
    constants = {init.name for init in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tensor.shape.dim
            )
        found.append(ModelInput(value.name, dtype, shape))
    return found


# --- the samples ---------------------------------------------------------------------


def read_npz_samples(
    path: str | Path, inputs: Sequence[ModelInput], *, cast: bool = False
) -> list[Sample]:
    """The calibration samples in the npz at `path` (see the module docstring), each
    input's converted to its dtype under the one dtype policy (`cast`: numpy's unsafe
    cast). CalibrationError saying what does not fit and what to give."""
    where = f"--calibration {path}"
    why = unreadable(path, "calibration file")
    if why:
        raise CalibrationError(f"{where}: {why}")
    arrays = _load_npz(path, where)
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no array for input(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"array(s) {', '.join(map(repr, extra))} name no input")
        raise CalibrationError(
            f"{where}: {'; '.join(parts)}: give one array per input, named as the input "
            f"(the model's inputs: {'; '.join(i.describe() for i in inputs)})"
        )
    per_input = {i.name: _split_samples(i, arrays[i.name], where, cast) for i in inputs}
    counts = {name: len(samples) for name, samples in per_input.items()}
    if len(set(counts.values())) > 1:
        told = ", ".join(f"{name}: {n}" for name, n in counts.items())
        raise CalibrationError(
            f"{where}: the inputs have different numbers of samples ({told}): axis 0 counts "
            "the samples and must be the same for every input"
        )
    count = next(iter(counts.values()), 0)
    if count == 0:
        raise CalibrationError(f"{where}: it holds no samples (axis 0 has size 0)")
    return [{name: samples[k] for name, samples in per_input.items()} for k in range(count)]


def _load_npz(path: str | Path, where: str) -> dict[str, np.ndarray]:
    try:
        return npz_arrays(path)
    except NpzUnreadable as exc:
        if exc.cause is None:
            raise CalibrationError(
                f"{where}: not an npz archive (numpy.savez writes one)"
            ) from None
        raise CalibrationError(f"{where}: cannot read it as an npz archive: {exc.cause}") from None


def _split_samples(spec: ModelInput, array: np.ndarray, where: str, cast: bool) -> list[np.ndarray]:
    """`array`'s samples for input `spec`: along a sample axis in front, or a batch of
    one each along the input's own batch axis."""
    try:
        array = as_input(array, spec.dtype, spec.name, cast=cast, option="--cast")
    except BadInput as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    shape = tuple(array.shape)
    if shape and (
        spec.shape is None or (len(shape) == len(spec.shape) + 1 and spec.fits(shape[1:]))
    ):
        return [np.ascontiguousarray(array[k]) for k in range(shape[0])]
    if shape and spec.has_batch_axis and spec.fits((1, *shape[1:])):
        return [np.ascontiguousarray(array[k : k + 1]) for k in range(shape[0])]
    rank = len(spec.shape or ())
    or_batch = ", or along the input's own batch axis" if spec.has_batch_axis else ""
    raise CalibrationError(
        f"{where}: array {spec.name!r} of shape {shape} holds no samples of input "
        f"{spec.describe()}: give its samples along axis 0, in front of the input's {rank} "
        f"axes{or_batch}"
    )


class _Reader:
    """The samples, one at a time, as onnxruntime's calibration asks for them (a
    CalibrationDataReader: it has `get_next`)."""

    def __init__(self, samples: Sequence[Sample], progress: Progress | None) -> None:
        self._samples = samples
        self._next = 0
        self._progress = progress

    def get_next(self) -> Sample | None:
        if self._next >= len(self._samples):
            return None
        sample = self._samples[self._next]
        self._next += 1
        if self._progress:
            self._progress("calibrating", self._next, len(self._samples))
        return sample

    def __len__(self) -> int:
        return len(self._samples)


# --- quantizing ----------------------------------------------------------------------


def quantize_model(
    model: onnx.ModelProto,
    samples: Sequence[Sample],
    options: QuantizeOptions = QuantizeOptions(),
    progress: Progress | None = None,
) -> QuantizeResult:
    """`model` quantized to QDQ int8, calibrated on `samples` (see the module docstring).
    CompileError when onnxruntime's quantizer cannot do it, with its reason."""
    from onnxruntime import quantization as ort_quant  # 0.1 s: only when quantizing

    if options.method not in METHODS:
        raise ValueError(f"unknown calibration method {options.method!r}: one of {list(METHODS)}")
    if not samples:
        raise ValueError("no calibration samples")
    step = _steps(progress)
    method = getattr(ort_quant.CalibrationMethod, METHODS[options.method])
    with tempfile.TemporaryDirectory(prefix="neuron-cc-quantize-") as tmp:
        work = Path(tmp)
        source, prepared, quantized = (work / n for n in ("in.onnx", "pre.onnx", "q.onnx"))
        onnx.save(model, str(source))
        step("pre-processing")
        with _quiet():
            _pre_process(source, prepared)
        step("calibrating")
        ranges = work / "ranges.json"
        try:
            with _quiet():
                calibrator = ort_quant.create_calibrator(
                    prepared,
                    augmented_model_path=str(work / "augmented.onnx"),
                    calibrate_method=method,
                    extra_options=_calibrator_options(options),
                )
                calibrator.collect_data(_Reader(samples, progress))
                ort_quant.calibrate.save_tensors_data(calibrator.compute_data(), ranges)
            step("quantizing")
            with _quiet():
                ort_quant.quantize_static(
                    str(prepared),
                    str(quantized),
                    quant_format=ort_quant.QuantFormat.QDQ,
                    per_channel=options.per_channel,
                    calibrate_method=method,
                    calibration_cache_path=ranges,
                )
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:  # onnxruntime's and onnx's own exception types
            raise CompileError(f"onnxruntime's quantizer failed: {_first_line(exc)}") from None
        result = onnx.load(str(quantized))
    summary = _summary(model, result, options, len(samples))
    return QuantizeResult(result.SerializeToString(), summary)


def _calibrator_options(options: QuantizeOptions) -> dict[str, Any]:
    """onnxruntime's calibrator's options: its own defaults, but for entropy's histogram
    (2048 bins, as TensorRT's: with its default of 128, as many as the quantized bins,
    the KL search has one candidate, the full range, and entropy equals minmax)."""
    if options.method == "entropy":
        return {"num_bins": ENTROPY_BINS, "num_quantized_bins": 128}
    if options.method == "percentile":
        return {"percentile": options.percentile}
    return {}


def _steps(progress: Progress | None) -> Callable[[str], None]:
    phases = ("pre-processing", "calibrating", "quantizing")

    def step(what: str) -> None:
        if progress:
            progress(what, phases.index(what), len(phases))

    return step


def _pre_process(source: Path, prepared: Path) -> None:
    """onnxruntime's pre-processing; without its symbolic shape inference when that
    fails (it does on some ops), as its documentation advises."""
    from onnxruntime import quantization as ort_quant

    try:
        ort_quant.quant_pre_process(str(source), str(prepared))
        return
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception:  # onnxruntime's and onnx's own exception types
        pass
    try:
        ort_quant.quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:
        raise CompileError(
            f"onnxruntime's quantizer cannot pre-process the model: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantizer prints its calibration's steps to stdout and logs
    warnings: neither reaches the user (stdout may be JSON)."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _summary(
    source: onnx.ModelProto, result: onnx.ModelProto, options: QuantizeOptions, samples: int
) -> QuantizeSummary:
    dequantized = {
        out
        for node in result.graph.node
        if node.op_type == "DequantizeLinear"
        for out in node.output
    }
    int8_ops: Counter[str] = Counter()
    float_ops: Counter[str] = Counter()
    qdq = 0
    for node in result.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            qdq += 1
        elif any(name in dequantized for name in node.input):
            int8_ops[node.op_type] += 1
        else:
            float_ops[node.op_type] += 1
    return QuantizeSummary(
        name=source.graph.name,
        method=options.method,
        percentile=options.percentile if options.method == "percentile" else None,
        per_channel=options.per_channel,
        samples=samples,
        int8_ops=dict(int8_ops),
        float_ops=dict(float_ops),
        qdq_nodes=qdq,
        float_bytes=source.ByteSize(),
        int8_bytes=result.ByteSize(),
    )
