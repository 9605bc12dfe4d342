"""The run: one case on our stack and on onnxruntime, its result whatever happens
(`run_case`), and every case of a selection one after another (`run_cases`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from driver_sim import KERNELS
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.tools.conformance.cases import case_group, case_op, case_ops, claimed_ops
from neuron_rtd.tools.conformance.compare import _error_text
from neuron_rtd.tools.conformance.ort import run_onnxruntime
from neuron_rtd.tools.conformance.ours import _Ours, _run_ours
from neuron_rtd.tools.conformance.results import FAIL, CaseResult


def run_case(case: Any, runtime: LocalRuntime, *, with_ort: bool = True) -> CaseResult:
    """One case on our stack (and on onnxruntime): never raises for the case's sake."""
    start = time.perf_counter()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            ours = _run_ours(case, runtime)
        except Exception as exc:  # a bug of the runner itself still gives an outcome
            ours = _Ours(FAIL, f"runner error: {type(exc).__name__}: {_error_text(exc)}")
        ort, ort_reason = run_onnxruntime(case) if with_ort else ("", "")
    claimed = claimed_ops(case)
    op = case_op(case)
    return CaseResult(
        name=case.name,
        group=case_group(case),
        ops=case_ops(case),
        claimed=bool(claimed) if op is None else op in KERNELS,
        uses_nc_kernels=bool(claimed),
        outcome=ours.outcome,
        reason=ours.reason,
        cpu_ops=ours.cpu_ops,
        note=ours.note,
        ort=ort,
        ort_reason=ort_reason,
        seconds=time.perf_counter() - start,
    )


def run_cases(
    cases: Iterable[Any],
    runtime: LocalRuntime,
    *,
    with_ort: bool = True,
    progress: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Every case through compile -> load -> infer -> compare on `runtime`."""
    results: list[CaseResult] = []
    for case in cases:
        result = run_case(case, runtime, with_ort=with_ort)
        results.append(result)
        if progress is not None:
            progress(result)
    return results
