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
  maps, optionals, strings, bfloat16, float8, 4-bit, complex);
- `fail`: wrong numbers, wrong shape or dtype, a missing output, any error at load or
  inference time, or a compiler crash (an exception other than CompileError).

A note records what did not decide the outcome but may be a bug: a CompileError that is
an "internal error", or a compiler crash on a model whose inputs a NEFF cannot carry.

Outputs are compared the way onnx's backend test runner does: the same number of
outputs, exact shape and dtype, then np.testing.assert_allclose with the case's
rtol/atol (NaN matches NaN; strings compared exactly).

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
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from driver_sim import KERNELS
from neuron_rtd import onnxrt
from neuron_rtd.compiler.compile import compile_model
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.neff import ALLOWED_DTYPES, read_neff
from neuron_rtd.runtime import NC_ENGINES, LocalRuntime

PASS_NC = "pass-nc"
PASS_CPU = "pass-cpu"
FAIL = "fail"
UNSUPPORTED = "unsupported"
OUTCOMES = (PASS_NC, PASS_CPU, FAIL, UNSUPPORTED)

ORT_PASS = "pass"
ORT_FAIL = "fail"
ORT_UNSUPPORTED = "unsupported"
ORT_OUTCOMES = (ORT_PASS, ORT_FAIL, ORT_UNSUPPORTED)

DEFAULT_DOMAINS = ("", "ai.onnx")
REASON_LIMIT = 400  # characters of a reason kept
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")
# onnxruntime's source location and C++ signature before its message: dropped
_ORT_WHERE = re.compile(
    r"/onnxruntime_src/\S+:\d+ [^()]*\([^()]*\)(?: const)?(?:::<lambda\(\)>)? ?"
)


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


# ---- the corpus ------------------------------------------------------------------------


@functools.cache
def all_cases() -> tuple[Any, ...]:
    """Every backend node test case onnx defines (generated once, quietly)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def _op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


@functools.cache
def _single_node_ops() -> dict[str, str]:
    """Case name -> op of every single-node case of the corpus."""
    return {
        case.name: _op_name(case.model.graph.node[0])
        for case in all_cases()
        if len(case.model.graph.node) == 1
    }


def case_op(case: Any) -> str | None:
    """The op a case tests: its single node's, or for a function expansion the op of the
    case it expands; None for a multi-node case with no single-node counterpart."""
    if _is_expansion(case):
        return _single_node_ops()[_EXPANDED.sub("", case.name)]
    nodes = case.model.graph.node
    return _op_name(nodes[0]) if len(nodes) == 1 else None


def _is_expansion(case: Any) -> bool:
    """A function expansion of a single-node case of the corpus (it may be one node:
    CastLike expands to one Cast)."""
    base = _EXPANDED.sub("", case.name)
    return base != case.name and base in _single_node_ops()


def case_group(case: Any) -> str:
    """The per-op table row of a case (see the module docstring)."""
    op = case_op(case)
    if op is not None:
        return f"{op} (expanded)" if _is_expansion(case) else op
    stem = _EXPANDED.sub("", case.name).removeprefix("test_")
    return f"(multi-node) {stem}"


def case_ops(case: Any) -> tuple[str, ...]:
    return tuple(sorted({_op_name(node) for node in case.model.graph.node}))


def claimed_ops(case: Any) -> tuple[str, ...]:
    """The case's ops that the NC library has a kernel for."""
    return tuple(
        sorted(
            {
                node.op_type
                for node in case.model.graph.node
                if node.domain in DEFAULT_DOMAINS and node.op_type in KERNELS
            }
        )
    )


def select_cases(
    cases: Iterable[Any], ops: Sequence[str] | None = None, match: str | None = None
) -> list[Any]:
    """The cases of these ops (single-node cases and their expansions) whose name holds
    `match`."""
    wanted = set(ops) if ops else None
    return [
        case
        for case in cases
        if (wanted is None or case_op(case) in wanted) and (not match or match in case.name)
    ]


# ---- values and comparison -------------------------------------------------------------


def _value(item: Any) -> Any:
    """A data-set value as numpy (TensorProto and numpy scalars converted; lists of
    values converted element by element; None stays None)."""
    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    if isinstance(item, list | tuple):
        return [_value(x) for x in item]
    if item is None or isinstance(item, dict):
        return item
    return np.asarray(item)


def _first_line(text: str, fallback: str = "") -> str:
    for line in str(text).splitlines():
        if line.strip():
            return _clip(_ORT_WHERE.sub("", line.strip()))
    return fallback


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3] + "..."


def _error_text(exc: BaseException) -> str:
    return _first_line(str(exc), type(exc).__name__)


def _allclose_text(exc: AssertionError) -> str:
    """assert_allclose's message without the arrays, on one line."""
    lines: list[str] = []
    where = False  # the first mismatching element kept, the others dropped
    for raw in str(exc).splitlines():
        line = raw.strip()
        if line.startswith(("ACTUAL:", "DESIRED:", "x:", "y:")):
            break
        if not line or line.startswith(("First ", "Mismatch at ind")):
            continue
        if line.startswith("["):
            if where:
                continue
            where, line = True, f"first at {line}"
        lines.append(line)
    return _clip("; ".join(lines)) or "values differ"


def compare_outputs(got: Sequence[Any], expected: Sequence[Any], rtol: float, atol: float) -> None:
    """AssertionError (one line: which output, what differs) unless `got` matches
    `expected` as onnx's backend runner requires."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for index, (out, ref) in enumerate(zip(got, expected, strict=True)):
        _compare_one(f"output {index}", out, ref, rtol, atol)


def _compare_one(where: str, out: Any, ref: Any, rtol: float, atol: float) -> None:
    if ref is None or out is None:
        if ref is not out:
            raise AssertionError(f"{where}: got {_kind(out)}, expected {_kind(ref)}")
        return
    if isinstance(ref, list | tuple) or isinstance(out, list | tuple):
        if not isinstance(ref, list | tuple) or not isinstance(out, list | tuple):
            raise AssertionError(f"{where}: got {_kind(out)}, expected {_kind(ref)}")
        if len(out) != len(ref):
            raise AssertionError(f"{where}: a sequence of {len(out)}, expected {len(ref)}")
        for k, (o, r) in enumerate(zip(out, ref, strict=True)):
            _compare_one(f"{where}[{k}]", o, r, rtol, atol)
        return
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        raise AssertionError(f"{where}: shape {out.shape}, expected {ref.shape}")
    if ref.dtype == object or out.dtype == object:
        if not np.array_equal(out, ref):
            raise AssertionError(f"{where}: values differ")
        return
    if out.dtype != ref.dtype:
        raise AssertionError(f"{where}: dtype {out.dtype}, expected {ref.dtype}")
    tolerance = rtol
    if out.dtype.name == "bfloat16":  # as onnx's runner: two bfloat16 ulps, via float32
        tolerance = max(rtol, 2**-6)
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    try:
        np.testing.assert_allclose(out, ref, rtol=tolerance, atol=atol)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {_allclose_text(exc)}") from None
    except TypeError as exc:  # dtypes numpy cannot compare with a float
        if not np.array_equal(out, ref):
            raise AssertionError(f"{where}: values differ ({exc})") from None


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list | tuple):
        return f"a sequence of {len(value)}"
    array = np.asarray(value)
    return f"{array.dtype} {array.shape}"


# ---- what a NEFF can carry -------------------------------------------------------------


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    constant = {init.name for init in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in constant]


def _carry_problem(model: onnx.ModelProto) -> str | None:
    """Why a NEFF cannot carry one of the model's inputs or outputs (None if it can)."""
    for role, infos in (("input", _real_inputs(model)), ("output", list(model.graph.output))):
        for vi in infos:
            which = vi.type.WhichOneof("value")
            if which != "tensor_type":
                kind = (which or "untyped value").removesuffix("_type").replace("_", " ")
                return f"{role} {vi.name!r} is a {kind}, which a NEFF cannot carry"
            elem = vi.type.tensor_type.elem_type
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
            except Exception:  # UNDEFINED and types numpy has no dtype for
                dtype = ""
            if dtype not in ALLOWED_DTYPES:
                try:
                    label = onnx.TensorProto.DataType.Name(elem).lower()
                except ValueError:
                    label = f"element type {elem}"
                return f"{role} {vi.name!r} is {label}, which a NEFF cannot carry"
    return None


def _declared_dims(vi: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim
    )


def _input_shapes(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> dict[str, list[int]]:
    """Sizes for inputs whose declared shape is not the data's own static shape (symbolic
    or missing dims): the data's shape, so the NEFF is planned for what it is fed."""
    shapes: dict[str, list[int]] = {}
    for vi in _real_inputs(model):
        value = feeds.get(vi.name)
        if not isinstance(value, np.ndarray) or 0 in value.shape:
            continue
        if _declared_dims(vi) != tuple(value.shape):
            shapes[vi.name] = list(value.shape)
    return shapes


# ---- one case through our stack ---------------------------------------------------------


@dataclasses.dataclass
class _Ours:
    outcome: str
    reason: str = ""
    cpu_ops: dict[str, str] = dataclasses.field(default_factory=dict)
    note: str = ""


def _cpu_reasons(summary: Any) -> dict[str, str]:
    reasons: dict[str, str] = {}
    for _, emitted in summary.sections:
        for node in emitted.nodes:
            if node.kind == "cpu":
                reasons.update({op: _clip(why) for op, why in node.reasons.items()})
    return reasons


def _emitted_ops(summary: Any) -> set[str]:
    """The op types the NEFF's nodes hold (what was not folded away)."""
    return {op for _, emitted in summary.sections for node in emitted.nodes for op in node.ops}


def _run_ours(case: Any, runtime: LocalRuntime) -> _Ours:
    model = case.model
    names = [vi.name for vi in _real_inputs(model)]
    problem = _carry_problem(model)
    cpu_ops: dict[str, str] = {}
    used_cpu = False
    folded = ""
    for inputs, expected in case.data_sets:
        values = [_value(x) for x in inputs]
        wants = [_value(x) for x in expected]
        if problem is None and len(values) != len(names):
            return _Ours(FAIL, f"the case feeds {len(values)} inputs, the model has {len(names)}")
        feeds = dict(zip(names, values, strict=False))
        try:
            compiled = compile_model(
                model, input_shapes=_input_shapes(model, feeds) or None, name=case.name
            )
        except CompileError as exc:
            # an internal error is a compiler bug even where it stops the model
            note = f"compiler: {_error_text(exc)}" if str(exc).startswith("internal") else ""
            # what the NEFF cannot carry is the clearer reason where there is one
            return _Ours(UNSUPPORTED, problem or _error_text(exc), note=note)
        except Exception as exc:
            crash = f"compiler crashed: {type(exc).__name__}: {_error_text(exc)}"
            if problem is not None:
                return _Ours(UNSUPPORTED, problem, note=crash)
            return _Ours(FAIL, crash)
        if problem is not None:
            return _Ours(UNSUPPORTED, problem, note="the compiler made a NEFF for it anyway")
        cpu_ops.update(_cpu_reasons(compiled.summary))
        if not set(_emitted_ops(compiled.summary)) & {n.op_type for n in model.graph.node}:
            folded = "every op folded to a constant at compile time"
        try:
            neff = read_neff(compiled.neff)
        except Exception as exc:
            return _Ours(FAIL, f"the NEFF does not read back: {_error_text(exc)}")
        used_cpu = used_cpu or bool(neff.cpu_nodes)
        for spec in neff.inputs:
            value = feeds.get(spec.name)
            if not isinstance(value, np.ndarray):
                return _Ours(FAIL, f"the NEFF declares input {spec.name!r}, the case has none")
            if value.dtype != spec.dtype or value.shape != spec.shape:
                return _Ours(
                    FAIL,
                    f"NEFF input {spec.name!r} is {spec.dtype} {spec.shape}, the case feeds "
                    f"{value.dtype} {value.shape}",
                )
        try:
            loaded = runtime.load(compiled.neff)
        except Exception as exc:
            return _Ours(FAIL, f"load: {_nrt_text(exc)}", cpu_ops)
        note = ""
        try:
            try:
                results = runtime.infer(loaded, feeds)
            except Exception as exc:
                return _Ours(FAIL, f"inference: {_nrt_text(exc)}", cpu_ops)
            outputs = [out.name for out in model.graph.output]
            missing = [name for name in outputs if name not in results]
            if missing:
                return _Ours(FAIL, f"no output {missing[0]!r} came back", cpu_ops)
            try:
                compare_outputs([results[n] for n in outputs], wants, case.rtol, case.atol)
            except AssertionError as exc:
                return _Ours(FAIL, _clip(str(exc)), cpu_ops)
        finally:
            try:
                runtime.unload(loaded)
            except Exception as exc:
                note = f"unload: {_nrt_text(exc)}"
        if note:
            return _Ours(FAIL, note, cpu_ops)
    return _Ours(PASS_CPU if used_cpu else PASS_NC, "", cpu_ops, note=folded)


def _nrt_text(exc: BaseException) -> str:
    code = getattr(getattr(exc, "code", None), "name", None)
    label = type(exc).__name__ + (f" (nerr {code})" if code else "")
    return f"{label}: {_error_text(exc)}"


# ---- one case through onnxruntime --------------------------------------------------------


def _ort_session(model: onnx.ModelProto) -> Any:
    try:
        return onnxrt.session(model, log_severity=onnxrt.LOG_SILENT)
    except Exception as exc:
        if "IR version" not in str(exc):
            raise
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    lowered.ir_version = helper.find_min_ir_version_for(
        list(model.opset_import), ignore_unknown=True
    )
    return onnxrt.session(lowered, log_severity=onnxrt.LOG_SILENT)


def run_onnxruntime(case: Any) -> tuple[str, str]:
    """onnxruntime's outcome on a case and the reason (empty for a pass)."""
    try:
        session = _ort_session(case.model)
    except Exception as exc:
        return ORT_UNSUPPORTED, _error_text(exc)
    try:
        names = [i.name for i in session.get_inputs()]
        for inputs, expected in case.data_sets:
            feeds = dict(zip(names, [_value(x) for x in inputs], strict=False))
            got = session.run(None, feeds)
            compare_outputs(got, [_value(x) for x in expected], case.rtol, case.atol)
    except AssertionError as exc:
        return ORT_FAIL, _clip(str(exc))
    except Exception as exc:
        return ORT_FAIL, f"{type(exc).__name__}: {_error_text(exc)}"
    return ORT_PASS, ""


# ---- the run --------------------------------------------------------------------------


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


# ---- reporting ----------------------------------------------------------------------------


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


# ---- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_rtd.tools.conformance",
        description="Run onnx's backend node test cases through compile, load and infer "
        "on a simulated machine, next to onnxruntime.",
    )
    parser.add_argument("--ops", help="comma-separated op types: only their cases")
    parser.add_argument("--match", help="only cases whose name holds this substring")
    parser.add_argument("--json", type=Path, help="write every result to this JSON file")
    parser.add_argument(
        "--failures",
        action="store_true",
        help="also list failing cases of unclaimed ops and unsupported cases of claimed ops",
    )
    parser.add_argument("--no-ort", action="store_true", help="do not run onnxruntime")
    parser.add_argument(
        "--engine",
        choices=NC_ENGINES,
        help="how the NCs compute (default: $NEURON_RTD_NC_ENGINE, else fast)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    args = parser.parse_args(argv)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()] if args.ops else None
    cases = select_cases(all_cases(), ops, args.match)
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    progress = _print_progress if args.verbose else None
    start = time.perf_counter()
    with LocalRuntime(engine=args.engine) as runtime:
        results = run_cases(cases, runtime, with_ort=not args.no_ort, progress=progress)
    seconds = time.perf_counter() - start
    print(format_report(results, failures=args.failures, seconds=seconds))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(results, seconds), indent=1) + "\n")
    return 1 if claimed_failures(results) else 0


def _print_progress(result: CaseResult) -> None:
    tail = f": {result.reason}" if result.reason else ""
    print(
        f"{result.outcome:<12} {result.name} [{result.ort or '-'}] {result.seconds:.2f}s{tail}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
