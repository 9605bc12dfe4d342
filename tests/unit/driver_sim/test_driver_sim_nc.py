"""driver_sim NeuronCores: kernels against numpy references, runs, counters, KernelError."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from driver_sim import (
    KERNELS,
    Device,
    DriverError,
    Engine,
    Instr,
    KernelError,
    Machine,
    NcProgram,
    NeuronCore,
    supported_ops,
)
from driver_sim.cost import ISSUE_CYCLES, elapsed_cycles

RNG = np.random.default_rng(1234)


@pytest.fixture
def device(machine: Machine) -> Iterator[Device]:
    (dev,) = machine.acquire([0], address="unix:/t.sock", version="1")
    dev.reset()
    yield dev
    dev.release()


@pytest.fixture
def core(device: Device) -> NeuronCore:
    return device.nc(1)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run_op(
    core: NeuronCore,
    op: str,
    inputs: list[np.ndarray],
    out_shape: tuple[int, ...],
    attrs: Mapping[str, Any] | None = None,
    out_dtype: Any = np.float32,
) -> np.ndarray:
    names = tuple(f"in{i}" for i in range(len(inputs)))
    program = NcProgram(
        instructions=[Instr(op, names, ("y",), attrs or {})],
        weights={},
        inputs=names,
        outputs=["y"],
    )
    out = np.empty(out_shape, dtype=out_dtype)
    core.run(core.load(program), dict(zip(names, inputs, strict=True)), {"y": out})
    return out


def softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- kernels ---------------------------------------------------------------------------


def test_supported_ops_and_engines() -> None:
    assert {
        "MatMul",
        "Gemm",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Softmax",
        "Identity",
    } <= supported_ops()
    assert KERNELS["Gemm"].engine is Engine.PE
    assert KERNELS["Softmax"].engine is Engine.ACT
    assert KERNELS["Add"].engine is Engine.POOL


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 6)),
        ((4,), (4, 3)),
        ((4,), (4,)),
    ],
)
def test_matmul_broadcast(
    core: NeuronCore, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    a, b = rand(*a_shape), rand(*b_shape)
    expected = np.matmul(a, b)
    got = run_op(core, "MatMul", [a, b], expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm_all_attributes(
    core: NeuronCore, trans_a: int, trans_b: int, c_shape: tuple[int, ...] | None
) -> None:
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4) if trans_b else rand(4, 5)
    alpha, beta = 0.5, -2.0
    a_ref = a.T if trans_a else a
    b_ref = b.T if trans_b else b
    expected = alpha * (a_ref.astype(np.float64) @ b_ref)
    inputs = [a, b]
    if c_shape is not None:
        c = rand(*c_shape)
        expected = expected + beta * c
        inputs.append(c)
    attrs = {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}
    got = run_op(core, "Gemm", inputs, (3, 5), attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_gemm_defaults(core: NeuronCore) -> None:
    a, b, c = rand(2, 3), rand(3, 4), rand(4)
    np.testing.assert_allclose(run_op(core, "Gemm", [a, b, c], (2, 4)), a @ b + c, rtol=1e-5)


@pytest.mark.parametrize(
    ("op", "ref"),
    [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)],
)
def test_binary_broadcasting(core: NeuronCore, op: str, ref: Any) -> None:
    a, b = rand(2, 3, 4), rand(3, 1) + 3.0
    got = run_op(core, op, [a, b], (2, 3, 4))
    np.testing.assert_allclose(got, ref(a, b), rtol=1e-6)
    scalar = np.array(2.5, dtype=np.float32)
    np.testing.assert_allclose(run_op(core, op, [scalar, b], (3, 1)), ref(scalar, b), rtol=1e-6)


def test_integer_div_truncates_toward_zero(core: NeuronCore) -> None:
    a = np.array([7, -7, 7, -7, 6], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int32)
    got = run_op(core, "Div", [a, b], (5,), out_dtype=np.int32)
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 2])


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        ("Relu", lambda x: np.maximum(x, 0)),
        ("Sigmoid", lambda x: 1 / (1 + np.exp(-x.astype(np.float64)))),
        ("Tanh", np.tanh),
        ("Identity", lambda x: x),
    ],
)
def test_unary(core: NeuronCore, op: str, ref: Any) -> None:
    x = rand(4, 5) * 4
    np.testing.assert_allclose(run_op(core, op, [x], x.shape), ref(x), rtol=1e-5, atol=1e-7)


def test_sigmoid_is_stable_at_the_extremes(core: NeuronCore) -> None:
    x = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = run_op(core, "Sigmoid", [x], x.shape)
    np.testing.assert_allclose(got, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -2])
def test_softmax_axis(core: NeuronCore, axis: int | None) -> None:
    x = rand(2, 3, 4) * 50  # large values: the shift keeps exp finite
    attrs = {} if axis is None else {"axis": axis}
    got = run_op(core, "Softmax", [x], x.shape, attrs)
    expected = softmax_ref(x, -1 if axis is None else axis)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_float32_is_not_upcast() -> None:
    x32, w32 = rand(2, 3), rand(3, 3)
    cases: list[tuple[str, tuple[np.ndarray, ...], dict[str, Any]]] = [
        ("Gemm", (x32, w32, rand(3)), {"alpha": 0.5, "beta": 2.0, "transA": 0, "transB": 1}),
        ("Softmax", (x32,), {"axis": 0}),
        ("Sigmoid", (x32,), {}),
        ("Relu", (x32,), {}),
        ("Div", (x32, x32 + 3), {}),
    ]
    for op, args, attrs in cases:
        kern = KERNELS[op]
        result = kern.bind(kern.parse_attrs(attrs))(*args)
        assert result.dtype == np.float32, op


# ---- programs and runs --------------------------------------------------------------------


def mlp_program() -> tuple[NcProgram, dict[str, np.ndarray]]:
    weights = {"w1": rand(16, 32), "b1": rand(32), "w2": rand(32, 4)}
    program = NcProgram(
        instructions=[
            Instr("MatMul", ("x", "w1"), ("h",), {}),
            Instr("Add", ("h", "b1"), ("hb",), {}),
            Instr("Relu", ("hb",), ("a",), {}),
            Instr("Gemm", ("a", "w2"), ("logits",), {"alpha": 2.0}),
            Instr("Softmax", ("logits",), ("y",), {"axis": 1}),
        ],
        weights=weights,
        inputs=["x"],
        outputs=["y", "logits"],
    )
    return program, weights


def test_mlp_run_writes_outputs(core: NeuronCore) -> None:
    program, w = mlp_program()
    loaded = core.load(program)
    x = rand(2, 16)
    y = np.empty((2, 4), np.float32)
    logits = np.empty((2, 4), np.float32)
    core.run(loaded, {"x": x}, {"y": y, "logits": logits})
    ref_logits = 2.0 * (np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"])
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y, softmax_ref(ref_logits, 1), rtol=1e-4, atol=1e-6)


def test_counters_follow_the_cost_model(core: NeuronCore, device: Device, machine: Machine) -> None:
    program, _ = mlp_program()
    reset_from = time.time_ns()
    device.reset()  # the idle clock restarts between reset_from and reset_to
    reset_to = time.time_ns()
    loaded = core.load(program)
    outs = {"y": np.empty((2, 4), np.float32), "logits": np.empty((2, 4), np.float32)}
    core.run(loaded, {"x": rand(2, 16)}, outs)
    core.run(loaded, {"x": rand(2, 16)}, outs)
    outs8 = {"y": np.empty((8, 4), np.float32), "logits": np.empty((8, 4), np.float32)}
    core.run(loaded, {"x": rand(8, 16)}, outs8)
    # MACs: MatMul Y.size*K = (2*32)*16, Gemm (2*4)*32, per run; batch 8 is 4x that.
    per_row = 32 * 16 + 4 * 32
    read_from = time.time_ns()
    counters = core.counters()
    read_to = time.time_ns()
    assert counters.macs_count == 2 * (2 * per_row) + 8 * per_row
    assert counters.runs == 3
    assert counters.pe_num_executed_instr == counters.pe_matmul_num_executed_instr == 6
    assert counters.act_num_executed_instr == 6
    assert counters.pool_num_executed_instr == 3
    assert counters.sb_rmw_count == 3
    assert counters.busy_ns > 0
    assert counters.pe_num_wait_event_cycles == 0
    # idle = cycles since the reset - busy cycles, and each of the 6 PE instructions is
    # busy for its issue plus one pass of the array (each has under 128 x 128 MACs)
    pe_busy = 6 * (ISSUE_CYCLES + 1)
    least = elapsed_cycles(read_from - reset_to) - pe_busy
    most = elapsed_cycles(read_to - reset_from) - pe_busy
    assert least <= counters.pe_num_idle_cycles <= most
    seen = Machine.open(machine.root).device_info(0).nc_counters
    assert seen[1].macs_count == counters.macs_count
    assert seen[1].runs == 3
    assert seen[1].busy_ns == counters.busy_ns
    assert seen[0].runs == 0


def test_idle_cycles_grow_with_time(core: NeuronCore) -> None:
    first = core.counters().pool_num_idle_cycles
    time.sleep(0.01)
    later = core.counters().pool_num_idle_cycles
    assert later - first >= 0.01 * 1.4e9 * 0.9


_READ_COUNTERS = """
import sys
from driver_sim import Machine
info = Machine.open(sys.argv[1]).device_info(0)
print(info.nc_counters[1].macs_count, info.nc_counters[1].runs, info.owner.pid)
"""


def test_counters_are_visible_to_another_process(core: NeuronCore, machine: Machine) -> None:
    a, b = rand(3, 7), rand(7, 5)
    run_op(core, "MatMul", [a, b], (3, 5))
    out = subprocess.run(
        [sys.executable, "-c", _READ_COUNTERS, str(machine.root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert out == [str(3 * 5 * 7), "1", str(os.getpid())]


def test_reset_zeroes_nc_counters(device: Device, core: NeuronCore) -> None:
    run_op(core, "Relu", [rand(4)], (4,))
    assert core.counters().runs == 1
    device.reset()
    assert core.counters().runs == 0
    assert core.counters().act_num_executed_instr == 0


def test_concurrent_runs_on_one_core_are_serialised(core: NeuronCore) -> None:
    program = NcProgram([Instr("MatMul", ("x", "w"), ("y",), {})], {"w": rand(8, 8)}, ["x"], ["y"])
    loaded = core.load(program)

    def worker() -> None:
        out = np.empty((4, 8), np.float32)
        for _ in range(50):
            core.run(loaded, {"x": rand(4, 8)}, {"y": out})

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counters = core.counters()
    assert counters.runs == 200
    assert counters.macs_count == 200 * 4 * 8 * 8


def test_program_loaded_elsewhere_is_refused(device: Device) -> None:
    program = NcProgram([Instr("Relu", ("x",), ("y",), {})], {}, ["x"], ["y"])
    loaded = device.nc(0).load(program)
    with pytest.raises(DriverError, match="loaded on"):
        device.nc(2).run(loaded, {"x": rand(2)}, {"y": np.empty(2, np.float32)})


# ---- KernelError -------------------------------------------------------------------------


def load_one(core: NeuronCore, *instrs: Instr, inputs: tuple[str, ...] = ("x",)) -> None:
    core.load(NcProgram(list(instrs), {"w": rand(2, 2)}, inputs, [instrs[-1].outputs[0]]))


def test_unknown_op(core: NeuronCore) -> None:
    with pytest.raises(KernelError, match=r"instruction 1 \(Frobnicate\): unknown op") as caught:
        load_one(core, Instr("Relu", ("x",), ("a",), {}), Instr("Frobnicate", ("a",), ("y",), {}))
    assert (caught.value.op, caught.value.index) == ("Frobnicate", 1)


def test_bad_arity(core: NeuronCore) -> None:
    with pytest.raises(KernelError, match=r"instruction 0 \(MatMul\): takes 2 inputs, got 1"):
        load_one(core, Instr("MatMul", ("x",), ("y",), {}))
    with pytest.raises(KernelError, match=r"instruction 0 \(Gemm\): takes 2\.\.3 inputs, got 4"):
        load_one(core, Instr("Gemm", ("x", "w", "w", "w"), ("y",), {}))
    with pytest.raises(KernelError, match=r"instruction 0 \(Relu\): produces 1 output"):
        load_one(core, Instr("Relu", ("x",), ("y", "z"), {}))


def test_bad_attributes(core: NeuronCore) -> None:
    with pytest.raises(KernelError, match=r"instruction 0 \(Gemm\): attribute transA"):
        load_one(core, Instr("Gemm", ("x", "w"), ("y",), {"transA": 2}))
    with pytest.raises(KernelError, match=r"\(Softmax\): attribute axis: must be an integer"):
        load_one(core, Instr("Softmax", ("x",), ("y",), {"axis": "last"}))
    with pytest.raises(KernelError, match=r"\(Relu\): unknown attribute\(s\) alpha"):
        load_one(core, Instr("Relu", ("x",), ("y",), {"alpha": 1.0}))


def test_bad_dataflow(core: NeuronCore) -> None:
    with pytest.raises(KernelError, match=r"instruction 0 \(Relu\): input 'nope' is not defined"):
        load_one(core, Instr("Relu", ("nope",), ("y",), {}))
    with pytest.raises(KernelError, match=r"instruction 1 \(Relu\): output 'a' is already"):
        load_one(core, Instr("Relu", ("x",), ("a",), {}), Instr("Relu", ("x",), ("a",), {}))
    with pytest.raises(KernelError, match="program output 'y' is not produced"):
        core.load(NcProgram([Instr("Relu", ("x",), ("a",), {})], {}, ["x"], ["y"]))


def test_run_errors(core: NeuronCore) -> None:
    program = NcProgram(
        [Instr("MatMul", ("x", "w"), ("h",), {}), Instr("Tanh", ("h",), ("y",), {})],
        {"w": rand(4, 3)},
        ["x"],
        ["y"],
    )
    loaded = core.load(program)
    with pytest.raises(KernelError, match="missing input 'x'"):
        core.run(loaded, {}, {"y": np.empty((2, 3), np.float32)})
    with pytest.raises(KernelError, match=r"instruction 0 \(MatMul\): ValueError"):
        core.run(loaded, {"x": rand(2, 5)}, {"y": np.empty((2, 3), np.float32)})
    with pytest.raises(KernelError, match=r"instruction 1 \(Tanh\): output 'y' has shape \(2, 3\)"):
        core.run(loaded, {"x": rand(2, 4)}, {"y": np.empty((2, 4), np.float32)})
    with pytest.raises(KernelError, match="no array given for output 'y'"):
        core.run(loaded, {"x": rand(2, 4)}, {})
    assert core.counters().runs == 0


def test_host_execution_counts_nothing() -> None:
    from driver_sim import execute_program, load_program

    program, w = mlp_program()
    loaded = load_program("host", program)
    x = rand(3, 16)
    outs = {"y": np.empty((3, 4), np.float32), "logits": np.empty((3, 4), np.float32)}
    execute_program(loaded, {"x": x}, outs)
    ref_logits = 2.0 * (np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"])
    np.testing.assert_allclose(outs["logits"], ref_logits, rtol=1e-4, atol=1e-5)


def test_run_cost_follows_shapes_set_by_input_values() -> None:
    """Tile's output size depends on the values of its `repeats` input: two runs with the
    same input shapes but other repeats cost differently (the cost cache keys on it)."""
    from driver_sim.execute import bind_inputs, run_steps
    from driver_sim.program import Instr, NcProgram, load_program

    program = load_program(
        "test",
        NcProgram([Instr("Tile", ("x", "reps"), ("y",))], {}, ["x", "reps"], ["y"]),
    )
    costs = []
    for reps in ([1, 1], [4, 4]):
        env = program.template.copy()
        key = bind_inputs(
            program, {"x": np.ones((8, 128), np.float32), "reps": np.array(reps)}, env
        )
        freed = run_steps(program, env)
        costs.append(int(program.cost_of(key, env, freed).engine_cycles.sum()))
    assert costs[1] > costs[0]
