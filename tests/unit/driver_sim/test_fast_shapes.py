"""The fast engine builds a program's session for the input sizes the runtime declares
(onnxruntime fuses more when it knows them: DeepLabV3's graph ran 7.8 ms a call with its
input sizes left open, 7.4 with them given, as the original model does), and a run of
other sizes still runs, on a session of any sizes."""

from __future__ import annotations

import numpy as np

import driver_sim
from driver_sim.fast import FastProgram
from driver_sim.onnx_graph import run_types


def test_a_run_takes_the_declared_dims_its_arrays_have() -> None:
    declared = (("<f4", (1, None, 4)), ("<i8", 2))
    fits: list[np.ndarray] = [np.zeros((1, 7, 4), np.float32), np.zeros((3, 3), np.int64)]
    assert run_types(declared, fits) == (("<f4", (1, None, 4)), ("<i8", 2))
    other: list[np.ndarray] = [np.zeros((2, 7, 4), np.float32), np.zeros((3, 3), np.int64)]
    assert run_types(declared, other) == (("<f4", 3), ("<i8", 2))
    assert run_types(None, fits) == (("<f4", 3), ("<i8", 2))


def test_a_program_declared_with_sizes_gets_a_session_of_those_sizes_and_runs_others() -> None:
    rng = np.random.default_rng(2)
    program = driver_sim.NcProgram(
        [driver_sim.Instr("MatMul", ("x", "w"), ("h",)), driver_sim.Instr("Relu", ("h",), ("y",))],
        {"w": rng.standard_normal((8, 5)).astype(np.float32)},
        ["x"],
        ["y"],
        input_types=[(np.float32, (1, 3, 8))],
    )
    loaded = driver_sim.load_program("test", program)
    fast = FastProgram.of(loaded, threads=1, opset=None)
    assert fast is not None
    (session,) = [s for s in fast._sessions.values() if s is not None]  # made at load
    assert session.get_inputs()[0].shape == [1, 3, 8]
    for shape in ((1, 3, 8), (2, 3, 8)):  # the declared sizes, then others
        x = rng.standard_normal(shape).astype(np.float32)
        got = {"y": np.empty((*shape[:2], 5), np.float32)}
        assert fast.run({"x": x}, got) is not None
        want = {"y": np.empty_like(got["y"])}
        driver_sim.execute_program(loaded, {"x": x}, want)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
