"""The comparison of `neuron-cli validate`: per output, cosine similarity (the exact-match
fraction for integer and bool outputs), SQNR, largest absolute error and, for
classifier-like outputs, top-1 agreement, checked against thresholds. Pure: it needs no
daemon and no onnxruntime."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

DEFAULT_MIN_COSINE = 0.9999
# For a NEFF compiled with auto-cast: 16-bit matmul inputs cost about that much against
# fp32 (full ResNet-18 with bf16 matmults: 0.9996).
AUTO_CAST_MIN_COSINE = 0.999
# For an int8 NEFF against the float model it was quantized from (neuron-cc quantize on
# a small ResNet, against float: about 0.995), as MACE holds quantized models to.
QUANTIZED_MIN_COSINE = 0.99


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
    name: str,
    reference: np.ndarray,
    got: np.ndarray,
    thresholds: Thresholds = Thresholds(),
    classifier: bool | None = None,
) -> OutputReport:
    """Compare one output of the NEFF (`got`) with onnxruntime's (`reference`); top-1 when
    it is a `classifier`'s scores (None: when it looks like them)."""
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
        if is_classifier_like(ref) and classifier is not False:
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
    classifiers: Collection[str] | None = None,
) -> list[OutputReport]:
    """Compare every output: `reference` (onnxruntime's, in its order) against `got` (the
    NEFF's). An output only one side has is a failure of its own. Top-1 is reported for
    the `classifiers` (None: for every output that looks like a classifier's)."""
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
        classifier = None if classifiers is None else name in classifiers
        reports.append(compare_one(name, ref, got[name], thresholds, classifier))
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
