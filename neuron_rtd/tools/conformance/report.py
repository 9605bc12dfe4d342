"""The report: the per-op table, the totals on our stack and on onnxruntime, the failing
cases of claimed ops (`format_report`), and all of it as JSON (`to_json`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from neuron_rtd.tools.conformance.results import (
    FAIL,
    ORT_FAIL,
    ORT_OUTCOMES,
    ORT_PASS,
    ORT_UNSUPPORTED,
    OUTCOMES,
    PASS_CPU,
    PASS_NC,
    UNSUPPORTED,
    CaseResult,
)


def totals(results: Iterable[CaseResult]) -> dict[str, dict[str, int]]:
    """{"ours": outcome -> count, "onnxruntime": outcome -> count}."""
    ours = dict.fromkeys(OUTCOMES, 0)
    ort = dict.fromkeys(ORT_OUTCOMES, 0)
    for result in results:
        ours[result.outcome] += 1
        if result.ort:
            ort[result.ort] += 1
    return {"ours": ours, "onnxruntime": ort}


@dataclasses.dataclass
class GroupRow:
    group: str
    cases: int = 0
    claimed: bool = False
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    ort_pass: int = 0


def group_rows(results: Iterable[CaseResult]) -> list[GroupRow]:
    rows: dict[str, GroupRow] = {}
    for result in results:
        row = rows.setdefault(result.group, GroupRow(result.group))
        row.cases += 1
        row.claimed = row.claimed or result.claimed
        row.counts[result.outcome] += 1
        row.ort_pass += result.ort == ORT_PASS
    return sorted(rows.values(), key=lambda r: r.group.lower())


def claimed_failures(results: Iterable[CaseResult]) -> list[CaseResult]:
    return [r for r in results if r.claimed and r.outcome == FAIL]


def format_report(
    results: Sequence[CaseResult], *, failures: bool = False, seconds: float | None = None
) -> str:
    """The per-op table, the totals, the failing cases of claimed ops (and with
    `failures`, every other failing case and the unsupported cases of claimed ops)."""
    rows = group_rows(results)
    width = max([len("op"), *(len(r.group) for r in rows)]) + 2
    head = f"{'op':<{width}}{'cases':>6}{'pass-nc':>9}{'pass-cpu':>9}{'fail':>6}{'unsup':>7}"
    lines = [head + f"{'ort-pass':>10}", "-" * (len(head) + 10)]
    for row in rows:
        label = row.group + (" *" if row.claimed else "")
        counts = row.counts
        lines.append(
            f"{label:<{width}}{row.cases:>6}{counts[PASS_NC]:>9}{counts[PASS_CPU]:>9}"
            f"{counts[FAIL]:>6}{counts[UNSUPPORTED]:>7}{row.ort_pass:>10}"
        )
    lines.append("(* : a case of the row has an op the NC library claims)")
    total = totals(results)
    ours, ort = total["ours"], total["onnxruntime"]
    lines.append("")
    lines.append(
        f"ours ({len(results)} cases): {ours[PASS_NC] + ours[PASS_CPU]} pass "
        f"({ours[PASS_NC]} pass-nc, {ours[PASS_CPU]} pass-cpu), {ours[FAIL]} fail, "
        f"{ours[UNSUPPORTED]} unsupported"
    )
    if any(r.ort for r in results):
        lines.append(
            f"onnxruntime: {ort[ORT_PASS]} pass, {ort[ORT_FAIL]} fail, "
            f"{ort[ORT_UNSUPPORTED]} unsupported"
        )
    if seconds is not None:
        lines.append(f"time: {seconds:.1f} s")
    bad = claimed_failures(results)
    lines.append("")
    lines.append(f"failing cases of claimed ops: {len(bad)}")
    lines.extend(_case_line(r) for r in bad)
    partly = [r for r in results if r.outcome == FAIL and not r.claimed and r.uses_nc_kernels]
    lines.append(f"failing cases of other ops whose expansion uses NC kernels: {len(partly)}")
    lines.extend(_case_line(r) for r in partly)
    if failures:
        others = [r for r in results if r.outcome == FAIL and not r.claimed]
        lines.append("")
        lines.append(f"failing cases of unclaimed ops: {len(others)}")
        lines.extend(_case_line(r) for r in others)
        unsup = [r for r in results if r.claimed and r.outcome == UNSUPPORTED]
        lines.append("")
        lines.append(f"unsupported cases of claimed ops: {len(unsup)}")
        lines.extend(_case_line(r) for r in unsup)
        noted = [r for r in results if r.note]
        if noted:
            lines.append("")
            lines.append(f"cases with notes: {len(noted)}")
            lines.extend(f"  {r.name}: {r.note}" for r in noted)
    return "\n".join(lines)


def _case_line(result: CaseResult) -> str:
    ort = f" [onnxruntime: {result.ort}]" if result.ort else ""
    return f"  {result.name} ({result.group}): {result.reason}{ort}"


def to_json(results: Sequence[CaseResult], seconds: float | None = None) -> dict[str, Any]:
    return {
        "totals": totals(results),
        "seconds": seconds,
        "groups": {
            row.group: {
                "cases": row.cases,
                "claimed": row.claimed,
                **row.counts,
                "ort-pass": row.ort_pass,
            }
            for row in group_rows(results)
        },
        "claimed_failures": [r.name for r in claimed_failures(results)],
        "cases": [dataclasses.asdict(r) for r in results],
    }
