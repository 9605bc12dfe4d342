"""Auto-cast: a NEFF compiled with `--auto-cast matmult --auto-cast-type bf16` computes its
matrix multiplies on bf16-rounded inputs with fp32 accumulation, on both NC engines, and
`neuron-cli validate` reports what that costs against fp32 onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from test_validate import neuron_cli, table

import driver_sim
from neuron_rtd import models
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import compile_model
from neuron_rtd.compiler.cli import main as neuron_cc
from neuron_rtd.neff import read_neff
from neuron_rtd.runtime import LocalRuntime


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_the_reference_kernels_round_matmul_inputs_to_bf16() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 32), np.float32), rng.standard_normal((32, 4), np.float32)
    instrs = [
        driver_sim.Instr("MatMul", ("a", "b"), ("y",)),
        driver_sim.Instr("Relu", ("y",), ("z",)),
    ]
    for mode, want in (("none", a @ b), ("matmult", bf16(a) @ bf16(b))):
        program = driver_sim.NcProgram(instrs, {"b": b}, ["a"], ["y"], auto_cast=mode)
        got = {"y": np.empty((8, 4), np.float32)}
        driver_sim.execute_program(driver_sim.load_program("test", program), {"a": a}, got)
        np.testing.assert_allclose(got["y"], want, rtol=1e-6, atol=1e-6)
    with pytest.raises(driver_sim.KernelError, match="auto-cast 'some'"):
        driver_sim.load_program(
            "test", driver_sim.NcProgram(instrs, {"b": b}, ["a"], ["y"], auto_cast="some")
        )


def test_neuron_cc_records_the_auto_cast_in_the_neff(tmp_path: Path) -> None:
    model = models.bert.build(**models.bert.SMALL, seed=3)
    onnx.save(model, tmp_path / "bert.onnx")
    out = tmp_path / "bert.neff"
    argv = ["compile", str(tmp_path / "bert.onnx"), "-o", str(out), "-q"]
    argv += ["--input-shape", "input_ids=1,16", "--input-shape", "attention_mask=1,16"]
    assert neuron_cc([*argv, "--auto-cast", "matmult", "--auto-cast-type", "fp16"]) == 0
    stages = [s for n in read_neff(out.read_bytes()).nodes for s in n.stages if n.kind == "neuron"]
    assert stages and {(s.auto_cast, s.auto_cast_type) for s in stages} == {("matmult", "fp16")}
    assert neuron_cc([*argv]) == 0  # fp32 is the default
    stages = [s for n in read_neff(out.read_bytes()).nodes for s in n.stages if n.kind == "neuron"]
    assert {s.auto_cast for s in stages} == {"none"}


def run(neff: bytes, feeds: dict[str, np.ndarray], engine: str) -> dict[str, np.ndarray]:
    with LocalRuntime("inf1.xlarge", engine=engine) as rt:
        return rt.infer(rt.load(neff), feeds)


@pytest.mark.parametrize("family", ["resnet", "bert"])
def test_bf16_matmults_on_both_engines(family: str) -> None:
    """The full ResNet-18 and the encoder keep a cosine of at least 0.999 against fp32,
    without being bit-equal to it, on both engines. The engines agree with each other as
    bf16 rounding allows: rounding is a step function, so the fp32-level differences of
    two engines move some values across a bf16 rounding boundary, and those differences
    grow layer by layer to the size of bf16's own error."""
    if family == "resnet":
        model = models.resnet.build()
        feeds = models.random_inputs(model, seed=8, N=1)
        shapes: dict[str, Any] = {"input": [1, 3, 224, 224]}
    else:
        model = models.bert.build(**models.bert.SMALL, seed=7)
        feeds = models.random_inputs(model, seed=8, B=1, S=16)
        shapes = {"input_ids": [1, 16], "attention_mask": [1, 16]}
    fp32 = compile_model(model, input_shapes=shapes).neff
    cast = compile_model(model, input_shapes=shapes, auto_cast="matmult").neff
    exact = run(fp32, feeds, "fast")
    fast, reference = run(cast, feeds, "fast"), run(cast, feeds, "reference")
    for name, want in exact.items():
        for got in (fast[name], reference[name]):
            assert cosine(got, want) >= 0.999
            assert not np.array_equal(got, want)
        assert cosine(fast[name], reference[name]) >= 0.999


@pytest.mark.daemon
def test_validate_reports_the_cost_of_bf16(tmp_path: Path, daemon: DaemonProcess) -> None:
    model = models.bert.build(**models.bert.SMALL, seed=5)
    onnx.save(model, tmp_path / "bert.onnx")
    shapes = {"input_ids": [1, 16], "attention_mask": [1, 16]}
    (tmp_path / "bert.neff").write_bytes(
        compile_model(model, input_shapes=shapes, auto_cast="matmult").neff
    )
    done = neuron_cli(
        "validate",
        tmp_path / "bert.onnx",
        tmp_path / "bert.neff",
        "-a",
        daemon.address,
        "--range",
        "0:1000",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "auto-cast: the NEFF computes matmults with bf16 inputs" in done.stdout
    rows = table(done.stdout)
    assert set(rows) == {"last_hidden_state", "pooler_output"}
    for cells in rows.values():
        after_shape = next(i for i, cell in enumerate(cells) if cell.endswith(")")) + 1
        cosine_cell, sqnr_cell = cells[after_shape], cells[after_shape + 1]
        assert float(cosine_cell) >= 0.999  # close to fp32 ...
        assert sqnr_cell != "inf" and float(sqnr_cell) < 100  # ... and not exact
    assert "cosine >= 0.999" in done.stdout
