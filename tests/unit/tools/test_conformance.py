"""The conformance runner: claimed ops pass, what no one runs is unsupported with a reason,
a kernel giving wrong numbers is a failure, and the runner itself never raises."""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_device import OffByOneDevice

from driver_sim import KERNELS
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.tools import conformance
from neuron_rtd.tools.conformance import (
    FAIL,
    ORT_PASS,
    ORT_UNSUPPORTED,
    PASS_CPU,
    PASS_NC,
    UNSUPPORTED,
    all_cases,
    case_group,
    compare_outputs,
    format_report,
    ours,
    run_cases,
    select_cases,
    totals,
)

CLAIMED = ["Relu", "Gemm", "MatMul", "Softmax", "Add", "Div"]


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    with LocalRuntime() as rt:
        yield rt


def named(*names: str) -> list[Any]:
    by_name = {case.name: case for case in all_cases()}
    return [by_name[name] for name in names]


@pytest.fixture(scope="module", params=["reference", "fast"])
def engine_runtime(request: pytest.FixtureRequest) -> Iterator[LocalRuntime]:
    with LocalRuntime(engine=request.param) as rt:
        yield rt


def test_claimed_ops_pass(engine_runtime: LocalRuntime) -> None:
    """On either NC engine."""
    runtime = engine_runtime
    cases = select_cases(all_cases(), CLAIMED)
    assert len(cases) > 30
    results = run_cases(cases, runtime)
    assert len(results) == len(cases)
    failed = [f"{r.name}: {r.outcome}: {r.reason}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)
    assert all(r.claimed for r in results)
    # each op has cases that run wholly on the NC; onnxruntime passes them all too
    on_nc = {r.group for r in results if r.outcome == PASS_NC}
    assert on_nc >= set(CLAIMED)
    assert all(r.ort == ORT_PASS for r in results)
    counts = totals(results)
    assert sum(counts["ours"].values()) == len(cases)
    assert counts["ours"][FAIL] == counts["ours"][UNSUPPORTED] == 0


def test_a_string_case_runs_on_a_cpu_node(runtime: LocalRuntime) -> None:
    """A NEFF carries string tensors; only its CPU nodes (onnxruntime) touch them."""
    (result,) = run_cases(named("test_regex_full_match_basic"), runtime)
    assert result.passed, result.reason
    assert result.outcome != PASS_NC


def test_op_no_one_runs_is_unsupported_with_a_reason(runtime: LocalRuntime) -> None:
    (result,) = run_cases(named("test_flexattention"), runtime)
    assert result.outcome == UNSUPPORTED
    assert "FlexAttention" in result.reason
    assert result.ort == ORT_UNSUPPORTED and result.ort_reason
    assert result.group == "ai.onnx.preview.FlexAttention"


def test_wrong_numbers_from_the_nc_fail() -> None:
    with LocalRuntime(wrap_device=OffByOneDevice) as broken:
        (result,) = run_cases(named("test_relu"), broken)
    assert result.outcome == FAIL
    assert result.reason.startswith("output 0:") and "Mismatched elements" in result.reason
    assert result.claimed and result.ort == ORT_PASS
    report = format_report([result])
    assert "failing cases of claimed ops: 1" in report and "test_relu" in report


def test_kernel_refusing_a_variant_passes_through_a_cpu_node(
    runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    relu = KERNELS["Relu"]
    monkeypatch.setitem(KERNELS, "Relu", dataclasses.replace(relu, since=(1,)))
    (result,) = run_cases(named("test_relu"), runtime, with_ort=False)
    assert result.outcome == PASS_CPU
    assert "op version" in result.cpu_ops["Relu"]
    assert result.ort == ""


def test_the_runner_never_raises(runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    broken = types.SimpleNamespace(
        name="test_not_a_model", model=onnx.ModelProto(), data_sets=[([], [])], rtol=1e-3, atol=0
    )
    (result,) = run_cases([broken], runtime)
    assert result.outcome == UNSUPPORTED and result.reason
    assert result.group == "(multi-node) not_a_model"

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(ours, "compile_model", crash)
    (result,) = run_cases(named("test_relu"), runtime, with_ort=False)
    assert result.outcome == FAIL
    assert result.reason == "compiler crashed: RuntimeError: boom"


def test_groups_and_selection() -> None:
    relu, softmax, castlike = named(
        "test_relu",
        "test_softmax_axis_0_expanded_ver18",
        "test_castlike_FLOAT_to_FLOAT16_expanded",
    )
    assert case_group(relu) == "Relu"
    assert case_group(softmax) == "Softmax (expanded)"
    assert case_group(castlike) == "CastLike (expanded)"  # one Cast node, still an expansion
    chosen = select_cases(all_cases(), ["Softmax"], match="axis_0")
    assert {c.name for c in chosen} == {
        "test_softmax_axis_0",
        "test_softmax_axis_0_expanded",
        "test_softmax_axis_0_expanded_ver18",
    }


def test_compare_outputs() -> None:
    x = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    compare_outputs([x], [x.copy()], rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError, match="dtype float64, expected float32"):
        compare_outputs([x.astype(np.float64)], [x], rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError, match=r"shape \(1, 3\), expected \(3,\)"):
        compare_outputs([x.reshape(1, 3)], [x], rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError, match="2 outputs, expected 1"):
        compare_outputs([x, x], [x], rtol=1e-3, atol=1e-7)
    with pytest.raises(AssertionError, match="output 0: Not equal"):
        compare_outputs([x + 1], [x], rtol=1e-3, atol=1e-7)
    compare_outputs([[x]], [[x]], rtol=1e-3, atol=1e-7)  # sequences element by element


def test_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    out = tmp_path / "relu.json"
    assert conformance.main(["--ops", "Relu", "--match", "test_relu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ours (2 cases): 2 pass" in printed and "onnxruntime: 2 pass" in printed
    data = json.loads(out.read_text())
    assert {c["name"] for c in data["cases"]} == {"test_relu", "test_relu_expanded_ver18"}
    assert data["claimed_failures"] == []
    relu = KERNELS["Relu"]
    broken = dataclasses.replace(relu, compute=lambda x: -x)
    monkeypatch.setitem(KERNELS, "Relu", broken)
    # the broken kernel is the reference engine's arithmetic
    argv = ["--match", "test_relu", "--no-ort", "--failures", "--engine", "reference"]
    assert conformance.main(argv) == 1
    assert "failing cases of claimed ops: 1" in capsys.readouterr().out
    assert conformance.main(["--match", "no_such_case"]) == 2


def test_a_case_belongs_to_the_op_it_tests_not_to_its_primitives() -> None:
    """An expansion of an op the NC does not claim is no case of a claimed op, though its
    primitives run on NC kernels; a claimed op's expansion is one."""
    (mapped,) = named("test_sequence_map_identity_1_sequence_expanded")
    assert conformance.case_op(mapped) == "SequenceMap" and "SequenceMap" not in KERNELS
    assert conformance.claimed_ops(mapped)  # its loop body's ops are NC kernels
    (softmax,) = named("test_softmax_example_expanded")
    assert conformance.case_op(softmax) == "Softmax" and "Softmax" in KERNELS
