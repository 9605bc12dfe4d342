"""Rounding, trigonometry and the variadic Max/Min/Sum/Mean (`driver_sim.ops.elementwise`),
Or, Xor, the inclusive comparisons, IsNaN and IsInf (`driver_sim.ops.logic`), and Elu,
Selu, Softsign and HardSwish (`driver_sim.ops.activation`) against every ONNX backend case
of theirs, plus what the cases leave out."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import node_cases, run_case

from driver_sim import KERNELS

OPS = (
    "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Max", "Min", "Sum", "Mean",
    "Or", "Xor", "GreaterOrEqual", "LessOrEqual", "IsNaN", "IsInf", "Elu", "Selu",
    "Softsign", "HardSwish",
)  # fmt: skip


@pytest.mark.parametrize("op", OPS)
def test_every_onnx_case_passes(op: str) -> None:
    cases = node_cases(op)
    assert cases, f"no ONNX cases for {op}"
    refused = {case.name: reason for case in cases if (reason := run_case(case))}
    assert refused == {}


def call(op: str, *arrays: np.ndarray, **attrs: object) -> np.ndarray:
    kern = KERNELS[op]
    return np.asarray(kern.bind(kern.parse_attrs(attrs))(*arrays))


def read_only(array: np.ndarray) -> np.ndarray:
    array = np.array(array)
    array.flags.writeable = False
    return array


def test_variadic_ops_broadcast_and_leave_their_inputs_alone() -> None:
    a = read_only(np.array([[1.0, 5.0]], np.float32))
    b = read_only(np.array([[3.0], [0.0]], np.float32))  # widens the result to (2, 2)
    c = read_only(np.array([2.0, 2.0], np.float32))
    np.testing.assert_array_equal(call("Max", a, c, b), [[3, 5], [2, 5]])
    np.testing.assert_array_equal(call("Min", a, b, c), [[1, 2], [0, 0]])
    np.testing.assert_allclose(call("Mean", a, b, c), [[2, 10 / 3], [1, 7 / 3]], rtol=1e-6)
    single = call("Sum", a)
    assert single is not a and np.array_equal(single, a)
    assert a.tolist() == [[1.0, 5.0]] and b.tolist() == [[3.0], [0.0]]


def test_is_inf_detects_the_signs_asked_for() -> None:
    x = np.array([-np.inf, 0.0, np.inf, np.nan], np.float32)
    assert call("IsInf", x).tolist() == [True, False, True, False]
    assert call("IsInf", x, detect_positive=0).tolist() == [True, False, False, False]
    assert call("IsInf", x, detect_negative=0).tolist() == [False, False, True, False]
    assert call("IsInf", x, detect_negative=0, detect_positive=0).tolist() == [False] * 4


def test_activations_keep_float16() -> None:
    x = np.linspace(-3, 3, 7).astype(np.float16)
    for op in ("Elu", "Selu", "Softsign", "HardSwish"):
        assert call(op, x).dtype == np.float16
