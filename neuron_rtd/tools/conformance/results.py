"""A case's outcome: one of `OUTCOMES` on our stack, one of `ORT_OUTCOMES` on
onnxruntime (see the package docstring for what each means), and `CaseResult`, which
holds both for one case."""

from __future__ import annotations

import dataclasses

PASS_NC = "pass-nc"
PASS_CPU = "pass-cpu"
FAIL = "fail"
UNSUPPORTED = "unsupported"
OUTCOMES = (PASS_NC, PASS_CPU, FAIL, UNSUPPORTED)

ORT_PASS = "pass"
ORT_FAIL = "fail"
ORT_UNSUPPORTED = "unsupported"
ORT_OUTCOMES = (ORT_PASS, ORT_FAIL, ORT_UNSUPPORTED)


@dataclasses.dataclass
class CaseResult:
    """One case's outcome on our stack and on onnxruntime."""

    name: str
    group: str  # the row of the per-op table
    ops: tuple[str, ...]  # the op types of its top-level nodes, sorted, no repeats
    claimed: bool  # the op the case tests is one the NC library has a kernel for
    uses_nc_kernels: bool  # some node of it is an op the NC library has a kernel for
    outcome: str  # one of OUTCOMES
    reason: str = ""  # why not a pass (empty for passes)
    cpu_ops: dict[str, str] = dataclasses.field(default_factory=dict)  # op -> why on CPU
    note: str = ""  # something odd seen on the way that did not decide the outcome
    ort: str = ""  # one of ORT_OUTCOMES ("" when onnxruntime was not run)
    ort_reason: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome in (PASS_NC, PASS_CPU)
