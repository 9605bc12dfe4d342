"""The report of `neuron-cli validate` as text: the inputs, a table of outputs and
metrics, notes, and the verdict."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from neuron_rtd.tools.validate.metrics import OutputReport, Thresholds


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


def iter_input_lines(inputs: Mapping[str, np.ndarray], source: str) -> Iterator[str]:
    yield source
    for name, array in inputs.items():
        yield f"{name}  {array.dtype.name} {_shape_text(tuple(array.shape))}"
