"""One case through our stack: compile -> load -> infer on the NCs -> compare, with what
a NEFF can carry (a case whose inputs or outputs it cannot is `unsupported`) and the
sizes its inputs are planned for."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

from driver_sim.ops.random import RANDOM_OPS
from neuron_rtd.compiler.compile import compile_model
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.neff import ALLOWED_DTYPES, read_neff
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.tools.conformance.compare import (
    _clip,
    _error_text,
    _value,
    compare_by_distribution,
    compare_outputs,
)
from neuron_rtd.tools.conformance.results import FAIL, PASS_CPU, PASS_NC, UNSUPPORTED

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
            if elem == onnx.TensorProto.STRING:  # a NEFF's string tensor (CPU nodes only)
                continue
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
                got = [results[n] for n in outputs]
                if _draws(model):
                    compare_by_distribution(got, wants)
                else:
                    compare_outputs(got, wants, case.rtol, case.atol)
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


def _draws(model: onnx.ModelProto) -> bool:
    """Whether the model draws random numbers (its outputs compare by distribution): a
    random op, or a Dropout told its training mode (which drops at random)."""
    return any(
        node.op_type in RANDOM_OPS or (node.op_type == "Dropout" and len(node.input) > 2)
        for node in model.graph.node
    )


def _nrt_text(exc: BaseException) -> str:
    code = getattr(getattr(exc, "code", None), "name", None)
    label = type(exc).__name__ + (f" (nerr {code})" if code else "")
    return f"{label}: {_error_text(exc)}"
