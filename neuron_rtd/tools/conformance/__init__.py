"""The ONNX conformance run: every backend node test case that onnx defines, through
compile -> load -> infer -> compare, next to onnxruntime on the same cases.

    python -m neuron_rtd.tools.conformance [--ops Conv,Relu] [--match SUBSTRING]
        [--json out.json] [--failures] [--no-ort] [--verbose]

Each case gets exactly one outcome:

- `pass-nc`: every output matched and the NEFF has no CPU node (all ops on NeuronCores;
  ops the compiler folded to constants count as run, and the case gets a note saying so);
- `pass-cpu`: every output matched and at least one op ran in a CPU node (onnxruntime);
- `unsupported`: the compiler raised CompileError (the first line of its message is the
  reason), or the case's inputs or outputs are of a kind a NEFF cannot carry (sequences,
  maps, optionals, complex, and the element types it has none for);
- `fail`: wrong numbers, wrong shape or dtype, a missing output, any error at load or
  inference time, or a compiler crash (an exception other than CompileError).

A note records what did not decide the outcome but may be a bug: a CompileError that is
an "internal error", or a compiler crash on a model whose inputs a NEFF cannot carry.

Outputs are compared the way onnx's backend test runner does: the same number of
outputs, exact shape and dtype, then np.testing.assert_allclose with the case's
rtol/atol (NaN matches NaN; strings compared exactly, as text: a NEFF's string outputs are
UTF-8 bytes). A model that draws random
numbers (Bernoulli, RandomUniform..., a Dropout given its training mode) gives other
draws than the case's, so its outputs are compared by distribution
(`compare_by_distribution`: shape, dtype, support, means).

The onnxruntime column runs the case's model in an InferenceSession: `pass`, `fail`
(wrong results or an error while running), or `unsupported` (the session cannot be
created). A model whose IR version is newer than onnxruntime reads is retried with
`ir_version` lowered to the least its opsets need (`find_min_ir_version_for`); our
compiler gets the model as it is (its CPU sub-models are written at an IR version
onnxruntime reads).

Grouping (the per-op table): a single-node case counts under its node's op type (prefixed
with the domain outside ai.onnx, e.g. `ai.onnx.ml.Binarizer`). Every multi-node case of the
corpus is a function expansion `<case>_expanded` (or `_expanded_verN`) of a single-node
case; it counts under `<Op> (expanded)`, Op being that case's op. A multi-node case with
no such counterpart counts under `(multi-node) <stem>`, the stem its name without
`test_` and the expansion suffix.

Claimed ops: an op is claimed when the NC kernel library (`driver_sim.kernels.KERNELS`)
has a kernel for it. A case is a case of a claimed op when the op it tests (`case_op`:
its node's, or for an expansion the op it expands) is claimed; a multi-node case with
no such op counts as claimed when any of its nodes is. Every case of a claimed op must
pass (on the NC, or through a CPU node where the kernel refuses the variant) or be
`unsupported` with a clear reason: the command exits 1 when any of them fails, 0
otherwise (2 for bad arguments). Failing cases of other ops whose expansion ran partly
on NC kernels are listed on their own, as they show NC numbers too.

The modules: `cases` (the corpus: every case, its op and group, the claimed ops,
selection), `results` (the outcomes and a case's result), `compare` (values and how
outputs are compared, the one-line reasons), `ours` (one case through our stack, and what
a NEFF can carry), `ort` (one case through onnxruntime), `run` (one case on both, and a run
of many), `report` (the per-op table, the totals, the JSON) and `cli` (the command, which
`python -m` runs through `__main__`).
"""

from neuron_rtd.tools.conformance.cases import (
    all_cases,
    case_group,
    case_op,
    case_ops,
    claimed_ops,
    select_cases,
)
from neuron_rtd.tools.conformance.cli import main
from neuron_rtd.tools.conformance.compare import compare_outputs
from neuron_rtd.tools.conformance.ort import run_onnxruntime
from neuron_rtd.tools.conformance.report import (
    GroupRow,
    claimed_failures,
    format_report,
    group_rows,
    to_json,
    totals,
)
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
from neuron_rtd.tools.conformance.run import run_case, run_cases

__all__ = [
    "FAIL",
    "ORT_FAIL",
    "ORT_OUTCOMES",
    "ORT_PASS",
    "ORT_UNSUPPORTED",
    "OUTCOMES",
    "PASS_CPU",
    "PASS_NC",
    "UNSUPPORTED",
    "CaseResult",
    "GroupRow",
    "all_cases",
    "case_group",
    "case_op",
    "case_ops",
    "claimed_failures",
    "claimed_ops",
    "compare_outputs",
    "format_report",
    "group_rows",
    "main",
    "run_case",
    "run_cases",
    "run_onnxruntime",
    "select_cases",
    "to_json",
    "totals",
]
