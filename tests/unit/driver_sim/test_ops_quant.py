"""The quantized kernels (driver_sim.ops.quant): every ONNX backend node case of their ops,
and random shapes against onnxruntime running the same node (bit-exact where the spec
is: integer sums and one rounding; within one step where onnxruntime computes through
float in its own way, its com.microsoft ops)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from kernel_cases import node_cases, run_case
from kernel_cases import run_kernel as run
from onnx import helper

from driver_sim import KERNELS
from neuron_rtd import onnxrt

CASE_COUNTS = {
    "QuantizeLinear": 13,
    "DequantizeLinear": 14,
    "QLinearConv": 1,
    "QLinearMatMul": 8,
    "MatMulInteger": 1,
    "ConvInteger": 2,
    "DynamicQuantizeLinear": 3,
}
# Cases of types a NEFF does not hold (float8, 4-bit, 2-bit): refused at compile time.
NARROW = ("e4m3fn", "e5m2", "uint4", "int4", "uint2", "int2", "float4e2m1")


@pytest.mark.parametrize("op", sorted(CASE_COUNTS))
def test_onnx_node_cases(op: str) -> None:
    cases = node_cases(op)
    assert len(cases) == CASE_COUNTS[op]
    for case in cases:
        if case.name == "test_quantizelinear_blocked_symmetric":
            continue  # its expected output is stored as a TensorProto (see below)
        reason = run_case(case)
        if any(kind in case.name for kind in NARROW):
            assert reason is not None and "dtype" in reason, (case.name, reason)
        else:
            assert reason is None, (case.name, reason)


def test_blocked_symmetric_quantization() -> None:
    (case,) = [c for c in node_cases("QuantizeLinear") if c.name.endswith("blocked_symmetric")]
    (inputs, expected), *_ = case.data_sets
    y = run("QuantizeLinear", *inputs, axis=1, block_size=2, output_dtype=5)
    assert y.dtype == np.int16
    np.testing.assert_array_equal(y, onnx.numpy_helper.to_array(expected[0]))


# ---- against onnxruntime ----------------------------------------------------------------


def ort_run(op: str, inputs: Sequence[np.ndarray | None], outputs: int = 1, **attrs: Any) -> Any:
    """onnxruntime's result for one node of `op` (com.microsoft for its own ops)."""
    domain = (
        "com.microsoft"
        if op.startswith(("QLinearAdd", "QLinearMul", "QGemm"))
        or op
        in (
            "QLinearGlobalAveragePool",
            "QLinearAveragePool",
            "QLinearConcat",
            "QLinearSigmoid",
            "QLinearLeakyRelu",
        )
        else ""
    )
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    infos = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs, strict=True)
        if a is not None
    ]
    outs = [f"o{k}" for k in range(outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", infos, [helper.make_empty_tensor_value_info(o) for o in outs]
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    session = onnxrt.session(model, threads=1)
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if a is not None}
    results = session.run(None, feeds)
    return results if outputs > 1 else results[0]


RNG = np.random.default_rng(29)


def q8(shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def f32(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


def zp(value: int, dtype: Any = np.uint8) -> np.ndarray:
    return np.array(value, dtype=dtype)


def assert_close_steps(got: np.ndarray, want: np.ndarray, steps: int) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max(initial=0) <= steps, diff.max()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_dequantize_random(dtype: Any) -> None:
    x = (RNG.standard_normal((3, 5, 7)) * 4).astype(np.float32)
    scale, zero = f32(0.037), zp(3, dtype)
    want = ort_run("QuantizeLinear", [x, scale, zero])
    got = run("QuantizeLinear", x, scale, zero)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        run("DequantizeLinear", got, scale, zero), ort_run("DequantizeLinear", [got, scale, zero])
    )
    # per axis, and ties rounded half to even
    scales = np.array([0.5, 0.25, 1.0, 0.1, 2.0], dtype=np.float32)
    zeros = np.array([0, 1, 2, 3, 4], dtype=dtype)
    halves = np.full((3, 5, 7), 1.25, dtype=np.float32)
    for value in (x, halves):
        want = ort_run("QuantizeLinear", [value, scales, zeros], axis=1)
        np.testing.assert_array_equal(run("QuantizeLinear", value, scales, zeros, axis=1), want)
    ints = q8((3, 5, 7), dtype)
    np.testing.assert_array_equal(
        run("DequantizeLinear", ints, scales, zeros, axis=1),
        ort_run("DequantizeLinear", [ints, scales, zeros], axis=1),
    )


def test_dequantize_int32_and_dynamic_quantize() -> None:
    acc = RNG.integers(-(1 << 20), 1 << 20, size=(4, 6)).astype(np.int32)
    np.testing.assert_array_equal(
        run("DequantizeLinear", acc, f32(0.001)), ort_run("DequantizeLinear", [acc, f32(0.001)])
    )
    for x in (RNG.standard_normal((5, 9)).astype(np.float32), np.zeros((2, 3), np.float32)):
        got = run("DynamicQuantizeLinear", x)
        want = ort_run("DynamicQuantizeLinear", [x], outputs=3)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_integer_products_random(dtype: Any) -> None:
    a, b = q8((2, 5, 33), dtype), q8((33, 7), np.int8 if dtype == np.int8 else np.uint8)
    za, zb = zp(7, a.dtype), zp(3, b.dtype)
    np.testing.assert_array_equal(
        run("MatMulInteger", a, b, za, zb), ort_run("MatMulInteger", [a, b, za, zb])
    )
    x, w = q8((1, 4, 9, 9)), q8((6, 4, 3, 3), np.uint8)
    attrs: dict[str, Any] = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    np.testing.assert_array_equal(
        run("ConvInteger", x, w, zp(5), zp(9), **attrs),
        ort_run("ConvInteger", [x, w, zp(5), zp(9)], **attrs),
    )


def as_uint8_b(inputs: Sequence[np.ndarray | None], b: int = 3) -> list[np.ndarray | None]:
    """`inputs` with the int8 B (at `b`) and its zero point (at `b` + 2) as uint8, 128 more
    (the same differences): onnxruntime's uint8 x int8 kernels saturate pairs of products
    to int16 on x86 without VNNI (its result there up to 124 steps off), its uint8 x uint8
    ones sum exactly on every CPU, as the spec does."""
    shifted = list(inputs)
    for k in (b, b + 2):
        value = shifted[k]
        assert value is not None and value.dtype == np.int8
        shifted[k] = np.asarray(value.astype(np.int16) + 128).astype(np.uint8)
    return shifted


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("group", [1, 8])
def test_qlinear_conv_random(per_channel: bool, group: int) -> None:
    x = q8((2, 8, 11, 11))
    w = q8((8, 8 // group, 3, 3), np.int8)
    channels = 8 if per_channel else 1
    w_scale: np.ndarray = (RNG.random(channels) * 0.01 + 0.001).astype(np.float32)
    w_zero: np.ndarray = np.zeros(channels, dtype=np.int8)
    if not per_channel:
        w_scale, w_zero = w_scale.reshape(()), w_zero.reshape(())
    bias = RNG.integers(-5000, 5000, size=8).astype(np.int32)
    inputs = [x, f32(0.02), zp(128), w, w_scale, w_zero, f32(0.05), zp(120), bias]
    attrs: dict[str, Any] = {"pads": [1, 1, 1, 1], "group": group, "strides": [1, 2]}
    np.testing.assert_array_equal(
        run("QLinearConv", *inputs, **attrs), ort_run("QLinearConv", as_uint8_b(inputs), **attrs)
    )


def test_qlinear_matmul_and_qgemm_random() -> None:
    a, b = q8((3, 4, 40)), q8((40, 6), np.int8)
    inputs = [a, f32(0.03), zp(100), b, f32(0.02), zp(0, np.int8), f32(0.2), zp(128)]
    exact = ort_run("QLinearMatMul", as_uint8_b(inputs))
    np.testing.assert_array_equal(run("QLinearMatMul", *inputs), exact)
    a2 = a[0]
    c = RNG.integers(-300, 300, size=6).astype(np.int32)
    b_t = np.ascontiguousarray(b.T)
    gemm = [a2, f32(0.03), zp(100), b_t, f32(0.02), zp(0, np.int8), c, f32(0.2), zp(128)]
    exact = ort_run("QGemm", as_uint8_b(gemm), transB=1)
    np.testing.assert_array_equal(run("QGemm", *gemm, transB=1), exact)
    floats = run("QGemm", *gemm[:7], transB=1)
    np.testing.assert_allclose(floats, ort_run("QGemm", as_uint8_b(gemm[:7]), transB=1), rtol=1e-6)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_random(op: str) -> None:
    a, b = q8((2, 3, 8, 8)), q8((3, 1, 1))
    inputs = [a, f32(0.04), zp(120), b, f32(0.03), zp(130), f32(0.05), zp(125)]
    assert_close_steps(run(op, *inputs), ort_run(op, inputs), 1)


def test_qlinear_pools_and_tables_random() -> None:
    x = q8((2, 16, 7, 7))
    five = [x, f32(0.05), zp(128), f32(0.01), zp(3)]
    np.testing.assert_array_equal(
        run("QLinearGlobalAveragePool", *five), ort_run("QLinearGlobalAveragePool", five)
    )
    pool: dict[str, Any] = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    assert_close_steps(
        run("QLinearAveragePool", *five, **pool), ort_run("QLinearAveragePool", five, **pool), 1
    )
    table = [x, f32(0.05), zp(128), f32(1 / 256), zp(0)]
    assert_close_steps(run("QLinearSigmoid", *table), ort_run("QLinearSigmoid", table), 1)
    leaky = [x, f32(0.05), zp(128), f32(0.04), zp(100)]
    assert_close_steps(
        run("QLinearLeakyRelu", *leaky, alpha=0.1), ort_run("QLinearLeakyRelu", leaky, alpha=0.1), 1
    )
    other = q8((2, 5, 7, 7))
    concat = [f32(0.05), zp(128), x, f32(0.05), zp(128), other, f32(0.07), zp(110)]
    assert_close_steps(
        run("QLinearConcat", *concat, axis=1), ort_run("QLinearConcat", concat, axis=1), 1
    )


def test_macs_count_int8_products() -> None:
    kern = KERNELS["QLinearConv"]
    shapes = [(1, 8, 9, 9), (), (), (16, 8, 3, 3), (), (), (), (), (16,)]
    attrs = kern.parse_attrs({})
    assert kern.macs(shapes, [(1, 16, 7, 7)], attrs) == 16 * 49 * 8 * 9
    assert KERNELS["QLinearMatMul"].macs([(4, 40), (), (), (40, 6)], [(4, 6)], {}) == 4 * 6 * 40


def test_bad_quantization_parameters_are_clear_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="y_scale has shape"):
        run("QuantizeLinear", x, np.ones(4, np.float32), np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="dtype float32"):
        KERNELS["QLinearMatMul"].check_support([np.dtype("float32")] * 8, {})
    with pytest.raises(ValueError, match="zero point"):
        run("DequantizeLinear", np.zeros(3, np.int32), f32(1.0), np.ones((), np.int32))
