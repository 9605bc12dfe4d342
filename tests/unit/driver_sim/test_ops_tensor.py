"""The tensor, elementwise, activation and reduction kernels of the NC library.

Every ONNX backend node case of each op runs through its kernel (`kernel_cases.run_case`,
with read-only inputs); the cases a kernel refuses at compile time are pinned in
`REFUSED`. Direct tests cover what those cases leave out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from kernel_cases import node_cases, run_case
from onnx import TensorProto, numpy_helper
from scipy import special

from driver_sim import KERNELS

OPS = (
    # ACT
    "Pow", "Sqrt", "Exp", "Log", "Reciprocal", "Erf", "LeakyRelu", "PRelu", "Clip",
    "HardSigmoid", "Softplus", "Gelu", "LogSoftmax", "Relu", "Sigmoid", "Tanh", "Softmax",
    # PE
    "MatMul", "Gemm",
    # POOL: elementwise
    "Neg", "Abs", "Add", "Sub", "Mul", "Div", "Where", "Equal", "Greater", "Less", "Not",
    "And", "Cast", "Identity",
    # POOL: reductions
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
    "ArgMax", "ArgMin", "TopK",
    # POOL: data movement
    "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
    "Gather", "Expand", "Tile", "Shape", "Constant", "ConstantOfShape", "Range",
)  # fmt: skip

# The cases the kernels refuse at compile time (a CPU node runs them), with a part of
# the reason they give.
REFUSED = {
    # strings are not NC dtypes; bfloat16 the NC holds, Range does not compute in it
    "test_equal_string": "dtype object",
    "test_equal_string_broadcast": "dtype object",
    "test_range_bfloat16_type_positive_delta": "dtype bfloat16",
}


def _numpy(value: Any) -> Any:
    """A case value as the runtime hands it to a kernel: TensorProto data (the Cast cases
    keep theirs so) becomes an array; arrays become read-only, so that a kernel writing
    into its inputs fails."""
    if isinstance(value, TensorProto):
        value = numpy_helper.to_array(value)
    if isinstance(value, np.ndarray):
        value = value.copy()
        value.flags.writeable = False
    return value


def _runtime_case(case: Any) -> Any:
    data = [([_numpy(v) for v in ins], [_numpy(v) for v in outs]) for ins, outs in case.data_sets]
    return dataclasses.replace(case, data_sets=data)


@pytest.mark.parametrize("op", OPS)
def test_onnx_node_cases(op: str) -> None:
    cases = node_cases(op)
    refused = {}
    for case in cases:
        reason = run_case(_runtime_case(case))  # AssertionError on any wrong output
        if reason is not None:
            refused[case.name] = reason
    names = {case.name for case in cases}
    expected = {name: why for name, why in REFUSED.items() if name in names}
    assert set(refused) == set(expected)
    for name, reason in refused.items():
        assert expected[name] in reason, (name, reason)
    assert len(refused) < len(cases), f"{op}: no case runs"


def test_every_pinned_refusal_is_a_case() -> None:
    names = {case.name for op in OPS for case in node_cases(op)}
    assert set(REFUSED) <= names


# ---- helpers ---------------------------------------------------------------------------


def _read_only(value: Any) -> Any:
    if not isinstance(value, np.ndarray):
        return value
    array = value.copy()
    array.flags.writeable = False
    return array


def run(op: str, *inputs: Any, **attrs: Any) -> Any:
    """The kernel's result on read-only copies of `inputs` (None: an absent input),
    after its attribute parsing and support check accept them."""
    kern = KERNELS[op]
    values = kern.parse_attrs(attrs)
    kern.check_support([np.asarray(i).dtype for i in inputs if i is not None], values)
    args = [_read_only(i) for i in inputs]
    with np.errstate(all="ignore"):
        result = kern.bind(values)(*args)
    for before, after in zip(inputs, args, strict=True):
        if isinstance(before, np.ndarray):
            np.testing.assert_array_equal(after, before)
    return result


def call(op: str, *inputs: Any, **attrs: Any) -> Any:
    """The kernel's result on `inputs` themselves."""
    kern = KERNELS[op]
    return kern.bind(kern.parse_attrs(attrs))(*inputs)


def refusal(op: str, *inputs: Any, **attrs: Any) -> str:
    """Why the kernel refuses these attributes or input dtypes (fails if it does not)."""
    kern = KERNELS[op]
    try:
        values = kern.parse_attrs(attrs)
        kern.check_support([np.asarray(i).dtype for i in inputs if i is not None], values)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"{op} accepts {attrs} with inputs {inputs}")


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- versions, dtypes and views ------------------------------------------------------------


def since(op: str) -> set[int]:
    versions = KERNELS[op].since
    assert versions, f"{op} declares no versions"
    return set(versions)


def test_versions_are_declared() -> None:
    for op in OPS:
        assert KERNELS[op].since, op
    # opset 13 dropped the 2-D coercion of (Log)Softmax and changed the default axis
    assert KERNELS["Softmax"].since == KERNELS["LogSoftmax"].since == (13,)
    assert {11, 13} <= since("Squeeze") & since("Unsqueeze")
    assert {13, 18} <= since("Split") and 1 not in since("Split")
    assert {13, 18} <= since("ReduceMean")
    assert {6, 11, 13} <= since("Clip")
    assert KERNELS["Softmax"].parse_attrs({}) == {"axis": -1}


def test_unsupported_dtypes_are_refused() -> None:
    import ml_dtypes

    x = np.zeros(3, np.float32)
    assert "bfloat16" in refusal("Relu", x.astype(ml_dtypes.bfloat16))
    assert "float8" in refusal("Reshape", x.astype(ml_dtypes.float8_e4m3fn), ints(3))
    assert "complex64" in refusal("Add", x.astype(np.complex64), x.astype(np.complex64))
    assert "object" in refusal("Concat", np.array(["a"], object), axis=0)
    assert "share one dtype" in refusal("Add", x, x.astype(np.float64))
    assert "share one dtype" in refusal("Concat", x, x, x.astype(np.int32), axis=0)
    assert "share one dtype" in refusal("Where", x > 0, x, x.astype(np.float16))
    assert "int64" in refusal("Sqrt", x.astype(np.int64))  # transcendentals take floats
    assert "bool" in refusal("Add", x > 0, x > 0)
    assert "element type 8" in refusal("Cast", x, to=8)  # string
    assert "element type 14" in refusal("Cast", x, to=14)  # complex64 (bfloat16 is held)
    assert "not implemented" in refusal("Constant", value_string="a")
    assert "float8" in refusal(
        "Constant", value={"dtype": "float8_e4m3fn", "shape": [1], "data": [1.0]}
    )


def test_output_dtypes() -> None:
    x = rand(2, 3)
    assert run("Shape", x).dtype == np.int64
    assert run("ArgMax", x).dtype == run("ArgMin", x.astype(np.int8)).dtype == np.int64
    assert run("TopK", x.astype(np.uint8), ints(2))[1].dtype == np.int64
    for op in ("Equal", "Greater", "Less"):
        assert run(op, x, x.T[:1].T).dtype == bool
    assert run("Not", x > 0).dtype == run("And", x > 0, x < 1).dtype == bool
    assert run("ReduceSum", x.astype(np.int32)).dtype == np.int32  # not widened
    assert run("Relu", x.astype(np.int8)).dtype == np.int8
    for dtype in (np.float16, np.float64):
        y = x.astype(dtype)
        for op in ("Sigmoid", "Softmax", "LogSoftmax", "Gelu", "Erf", "HardSigmoid"):
            assert run(op, y).dtype == dtype, op
        assert run("Pow", y, np.array(3, np.int64)).dtype == dtype


def test_data_movement_returns_views() -> None:
    x = _read_only(rand(2, 1, 6))
    views = [
        call("Reshape", x, ints(3, -1)),
        call("Flatten", x, axis=2),
        call("Transpose", x, perm=[2, 0, 1]),
        call("Squeeze", x, ints(1)),
        call("Unsqueeze", x, ints(0, -1)),
        call("Slice", x, ints(5), ints(0), ints(-1), ints(-2)),
        call("Expand", x, ints(3, 2, 1, 1)),
        call("Identity", x),
        call("Cast", x, to=1),
        call("Concat", x, axis=1),
        *call("Split", x, ints(4, 2), axis=2),
    ]
    for view in views:
        assert np.shares_memory(view, x)


def test_in_place_kernels_leave_read_only_inputs_alone() -> None:
    # `run` gives read-only inputs and checks them afterwards
    x, w, c = rand(3, 4), rand(4, 5, seed=1), rand(5, seed=2)
    np.testing.assert_allclose(
        run("Gemm", x, w, c, alpha=2.0, beta=0.5), 2 * x @ w + 0.5 * c, rtol=1e-5
    )
    for op in ("Softmax", "LogSoftmax", "Gelu", "HardSigmoid", "LeakyRelu", "Sigmoid", "Erf"):
        run(op, x)
    run("PRelu", x, f32(0.5))
    run("Clip", x, np.float32(-0.1), None)
    run("Pow", x, np.array(0.5, np.float32))


# ---- elementwise and activations -------------------------------------------------------------


def test_activations_match_their_formulas() -> None:
    import math

    x = np.linspace(-6, 6, 97).astype(np.float32)
    x64 = x.astype(np.float64)
    erf = np.array([math.erf(v) for v in x64])
    np.testing.assert_allclose(run("Erf", x), erf, rtol=1e-6, atol=1e-7)
    phi = np.array([math.erfc(-v / math.sqrt(2)) / 2 for v in x64])
    np.testing.assert_allclose(run("Gelu", x), x64 * phi, rtol=1e-5)
    tanh = np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3))
    np.testing.assert_allclose(run("Gelu", x, approximate="tanh"), x64 * (1 + tanh) / 2, rtol=1e-5)
    np.testing.assert_allclose(run("Softplus", x), np.log1p(np.exp(x64)), rtol=1e-6)
    np.testing.assert_allclose(
        run("HardSigmoid", x, alpha=0.3, beta=0.4), np.clip(0.3 * x64 + 0.4, 0, 1), rtol=1e-6
    )
    np.testing.assert_allclose(
        run("LeakyRelu", x, alpha=0.3), np.where(x64 < 0, 0.3 * x64, x64), rtol=1e-6
    )
    far = np.array([-80, -20, 0, 20, 100], np.float64)
    np.testing.assert_allclose(
        run("Sigmoid", far.astype(np.float32)), 1 / (1 + np.exp(-far)), rtol=1e-6
    )
    assert "none, tanh" in refusal("Gelu", x, approximate="fast")


def test_float32_erf_and_gelu_are_accurate() -> None:
    # every 997th float32 in [1e-30, 12], both signs, against float64 scipy
    bits = np.arange(np.float32(1e-30).view(np.int32), np.float32(12).view(np.int32), 997)
    positive = bits.astype(np.int32).view(np.float32)
    x = np.concatenate([positive, -positive])
    x64 = x.astype(np.float64)
    want = special.erf(x64)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert (np.abs(run("Erf", x) - want) / ulp).max() <= 4
    want = x64 * special.erfc(-x64 / np.sqrt(2)) / 2
    np.testing.assert_allclose(run("Gelu", x), want, rtol=1e-5, atol=1e-37)
    np.testing.assert_allclose(
        run("Gelu", x, approximate="tanh")[:100], _gelu_tanh(x64[:100]), rtol=1e-6
    )
    specials = f32(0.0, -0.0, np.inf, -np.inf, np.nan)
    np.testing.assert_array_equal(run("Erf", specials), [0.0, -0.0, 1.0, -1.0, np.nan])
    assert np.signbit(run("Erf", specials)[1])
    # x * (1 + erf(x / sqrt 2)) / 2 at -inf is -inf * 0
    np.testing.assert_array_equal(run("Gelu", specials), [0.0, -0.0, np.inf, np.nan, np.nan])
    half = x[::50].astype(np.float16)
    np.testing.assert_allclose(run("Erf", half), special.erf(half.astype(np.float64)), atol=1e-3)
    np.testing.assert_array_equal(run("Erf", x64), special.erf(x64))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))) / 2


def test_log_softmax_of_large_and_infinite_values() -> None:
    x = f32(10000.0, 10001.0, 10002.0, -np.inf)
    np.testing.assert_allclose(
        run("LogSoftmax", x), [-2.4076059, -1.4076059, -0.4076059, -np.inf], rtol=1e-6
    )


def test_pow_follows_c_pow() -> None:
    half = np.array(0.5, np.float32)
    got = run("Pow", f32(-np.inf, -0.0, 4.0, -1.0), half)
    np.testing.assert_array_equal(got, [np.inf, 0.0, 2.0, np.nan])
    assert not np.signbit(got[1])  # pow(-0, 0.5) is +0, unlike sqrt(-0)
    x = rand(4, 5)
    np.testing.assert_array_equal(run("Pow", x, f32(2.0)), x * x)
    # integer base: computed in the promoted type, truncated to the base's dtype
    got = run("Pow", np.array([2, 3, -3], np.int32), f32(0.5, 2.5, 2.0))
    np.testing.assert_array_equal(got, [1, 15, 9])
    assert got.dtype == np.int32
    got = run("Pow", f32(2.0, 3.0), np.array([10, -1], np.int64))
    np.testing.assert_allclose(got, [1024.0, 1 / 3], rtol=1e-7)


def test_clip_bounds() -> None:
    x = f32(-np.inf, -2.0, 0.5, 2.0, np.inf, np.nan)
    big = np.finfo(np.float32).max
    # absent bounds default to the dtype's lowest/highest values
    np.testing.assert_array_equal(run("Clip", x), [-big, -2.0, 0.5, 2.0, big, np.nan])
    np.testing.assert_array_equal(
        run("Clip", x, None, np.float32(1)), [-big, -2, 0.5, 1, 1, np.nan]
    )
    np.testing.assert_array_equal(
        run("Clip", x, f32(3), f32(1)), [1, 1, 1, 1, 1, np.nan]
    )  # min > max
    # Clip-6 takes the bounds as attributes
    np.testing.assert_array_equal(run("Clip", x, min=-1.0), [-1, -1, 0.5, 2, big, np.nan])
    # ... which default to -+FLT_MAX: +inf in float16, a bound in float64
    half = np.array([np.inf, -1.0], np.float16)
    np.testing.assert_array_equal(run("Clip", half, min=0.0), [np.inf, 0.0])
    np.testing.assert_array_equal(run("Clip", np.array([1e300]), min=0.0), [big])
    ints8 = np.array([-128, 5, 127], np.int8)
    np.testing.assert_array_equal(run("Clip", ints8, np.int8(0)), [0, 5, 127])
    unbounded = run("Clip", ints8)  # the limits of an integer dtype clip nothing
    assert unbounded.dtype == np.int8
    np.testing.assert_array_equal(unbounded, ints8)
    assert "Clip-6 and 11" in refusal("Clip", x.astype(np.float64))
    assert "both" in refusal("Clip", x, f32(0), min=1.0)
    with pytest.raises(ValueError, match="one element"):
        run("Clip", x, f32(0, 1))


def test_integer_division_truncates_toward_zero() -> None:
    a = np.array([7, -7, 7, -7, 6, -128], np.int8)
    b = np.array([2, 2, -2, -2, -3, 3], np.int8)
    np.testing.assert_array_equal(run("Div", a, b), [3, -3, -3, 3, -2, -42])
    u = np.array([7, 255], np.uint8)
    np.testing.assert_array_equal(run("Div", u, np.uint8(2)), [3, 127])
    assert run("Div", a, b).dtype == np.int8


def test_prelu_broadcasts_slope_only() -> None:
    x = rand(2, 3)
    np.testing.assert_allclose(
        run("PRelu", x, f32(0.1, 0.2, 0.3)), np.where(x < 0, x * f32(0.1, 0.2, 0.3), x)
    )
    with pytest.raises(ValueError, match="broadcast"):
        run("PRelu", x[:, :1], rand(2, 3))


def test_cast() -> None:
    x = f32(1.7, -1.7, 0.0, -0.0, np.nan, 300.0)
    np.testing.assert_array_equal(run("Cast", x[:4], to=6), [1, -1, 0, 0])  # truncation
    np.testing.assert_array_equal(run("Cast", x, to=9), [True, True, False, False, True, True])
    np.testing.assert_array_equal(run("Cast", np.array([200, -1], np.int16), to=3), [-56, -1])
    np.testing.assert_array_equal(run("Cast", np.array([True, False]), to=1), [1.0, 0.0])
    assert run("Cast", np.int64(70000), to=10) == np.float16(np.inf)
    assert run("Cast", x, to=11, saturate=0).dtype == np.float64  # saturate: float8 only


# ---- reductions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        ("ReduceSum", np.sum),
        ("ReduceMean", np.mean),
        ("ReduceMax", np.max),
        ("ReduceMin", np.min),
        ("ReduceProd", np.prod),
        (
            "ReduceL2",
            lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
        ),
    ],
)
def test_reduction_axes_forms(op: str, ref: Any) -> None:
    x = rand(2, 3, 4).astype(np.float64)
    for axes, keepdims in [((0, -1), True), ((1,), False), (None, True), (None, False)]:
        want = ref(x, axis=axes, keepdims=keepdims)
        # axes as an input (Reduce*-18, ReduceSum-13) and as an attribute (older versions)
        given = ints() if axes is None else ints(*axes)
        np.testing.assert_allclose(run(op, x, given, keepdims=int(keepdims)), want, rtol=1e-12)
        attrs: dict[str, Any] = {"keepdims": int(keepdims)}
        if axes is not None:
            attrs["axes"] = list(axes)
        np.testing.assert_allclose(run(op, x, **attrs), want, rtol=1e-12)
    # no axes with noop_with_empty_axes: every element "reduced" on its own
    noop = run(op, x, ints(), noop_with_empty_axes=1)
    np.testing.assert_allclose(noop, ref(x, axis=(), keepdims=True), rtol=1e-12)
    assert "both" in refusal(op, x, ints(0), axes=[0])
    with pytest.raises(ValueError, match="repeated"):
        run(op, x, ints(1, -2))


def test_reductions_over_an_empty_set() -> None:
    empty = np.zeros((2, 0), np.int32)
    axis = ints(1)
    np.testing.assert_array_equal(run("ReduceMax", empty, axis, keepdims=0), [-(2**31)] * 2)
    np.testing.assert_array_equal(run("ReduceMin", empty, axis, keepdims=0), [2**31 - 1] * 2)
    np.testing.assert_array_equal(run("ReduceSum", empty, axis, keepdims=0), [0, 0])
    np.testing.assert_array_equal(run("ReduceProd", empty, axis, keepdims=0), [1, 1])
    np.testing.assert_array_equal(run("ReduceL2", empty.astype(np.float32), axis), [[0], [0]])
    np.testing.assert_array_equal(run("ReduceMax", empty.astype(np.float32), axis), [[-np.inf]] * 2)
    np.testing.assert_array_equal(run("ReduceMin", np.zeros((0, 2), bool), ints(0)), [[True, True]])


def test_reduce_sum_accumulates_float16_in_float32() -> None:
    x = np.full(4096, 0.1, np.float16)
    assert abs(float(run("ReduceSum", x)[0]) - 409.6) < 0.5  # float16 accumulation: 256


def test_arg_reductions_select_first_or_last_index() -> None:
    x = f32(1, 3, 3, 0, 0)
    assert run("ArgMax", x).tolist() == [1]
    assert run("ArgMax", x, select_last_index=1).tolist() == [2]
    assert run("ArgMin", x, keepdims=0).tolist() == 3
    assert run("ArgMin", x, keepdims=0, select_last_index=1).tolist() == 4
    m = np.array([[1, 5, 5], [7, 7, 2]], np.int16)
    assert run("ArgMax", m, axis=-1, select_last_index=1).tolist() == [[2], [1]]
    assert run("ArgMax", m, axis=0, keepdims=0).tolist() == [1, 1, 0]


def test_topk_breaks_ties_by_lower_index() -> None:
    x = np.array([[3, 1, 3, 2, 3, 1]], np.int64)
    values, indices = run("TopK", x, ints(4))
    assert values.tolist() == [[3, 3, 3, 2]] and indices.tolist() == [[0, 2, 4, 3]]
    values, indices = run("TopK", x, ints(3), largest=0)
    assert values.tolist() == [[1, 1, 2]] and indices.tolist() == [[1, 5, 3]]
    values, indices = run("TopK", x.T.astype(np.float32), ints(2), axis=0)
    assert values.ravel().tolist() == [3, 3] and indices.ravel().tolist() == [0, 2]
    values, indices = run("TopK", x, ints(0))
    assert values.shape == indices.shape == (1, 0)
    with pytest.raises(ValueError, match="out of range"):
        run("TopK", x, ints(7))


# ---- data movement ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "step", "want"),
    [
        (-1, -100, -1, list(range(9, -1, -1))),
        (100, -100, -1, list(range(9, -1, -1))),
        (2**63 - 1, -(2**63), -1, list(range(9, -1, -1))),
        (-100, 100, 1, list(range(10))),
        (-(2**63), 2**63 - 1, 4, [0, 4, 8]),
        (8, 2, -3, [8, 5]),
        (-12, -20, -1, [0]),  # start clamps to 0 with a negative step, end to -1
        (0, 0, -1, []),
        (5, 5, 1, []),
        (7, 3, 1, []),
        (3, 100, 2, [3, 5, 7, 9]),
    ],
)
def test_slice_clamps_and_steps(start: int, end: int, step: int, want: list[int]) -> None:
    x = np.arange(10, dtype=np.int32)
    assert run("Slice", x, ints(start), ints(end), ints(0), ints(step)).tolist() == want
    x2 = np.stack([x, -x])
    got = run("Slice", x2, ints(start, -1), ints(end, -2), ints(-1, 0), ints(step, -1))
    assert got.tolist() == [[-v for v in want]]


def test_slice_refuses_bad_arguments() -> None:
    x = np.arange(10)
    with pytest.raises(ValueError, match="step 0"):
        run("Slice", x, ints(0), ints(5), ints(0), ints(0))
    with pytest.raises(ValueError, match="repeated"):
        run("Slice", x.reshape(2, 5), ints(0, 1), ints(1, 2), ints(1, -1))
    with pytest.raises(ValueError, match="length"):
        run("Slice", x, ints(0, 1), ints(5))
    assert run("Slice", x, np.array([2], np.int32), np.array([4], np.int32)).tolist() == [2, 3]


def test_split_forms() -> None:
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    parts = run("Split", x, axis=1, num_outputs=3)  # Split-18: the last part smaller
    assert [p.shape[1] for p in parts] == [3, 3, 1]
    assert [p.shape[1] for p in run("Split", x, ints(2, 0, 5), axis=-1)] == [2, 0, 5]
    assert [p.shape[1] for p in run("Split", x, axis=1, split=[6, 1])] == [6, 1]  # Split-11
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), x)
    assert "output count" in refusal("Split", x, axis=1)
    assert "more than one" in refusal("Split", x, ints(3, 4), num_outputs=2)
    with pytest.raises(ValueError, match="add up"):
        run("Split", x, ints(3, 3), axis=1)
    with pytest.raises(ValueError, match="chunks"):
        run("Split", x[:, :6], axis=1, num_outputs=4)  # 2, 2, 2, 0


def test_reshape_and_axes_ops() -> None:
    x = rand(2, 3, 4)
    assert run("Reshape", x, ints(0, -1)).shape == (2, 12)
    assert run("Reshape", x, ints(4, 0, 2)).shape == (4, 3, 2)
    empty = np.zeros((0, 3), np.float32)
    assert run("Reshape", empty, ints(3, 0), allowzero=1).shape == (3, 0)
    with pytest.raises(ValueError):
        run("Reshape", empty, ints(3, 0))  # 0 copies the 3: 9 elements wanted, 0 given
    with pytest.raises(ValueError):
        run("Reshape", x, ints(0, 0, 0, 0))
    y = rand(1, 3, 1)
    assert run("Squeeze", y).shape == (3,)
    assert run("Squeeze", y, axes=[-1]).shape == (1, 3)  # Squeeze-11 attribute
    assert run("Unsqueeze", y, axes=[0, -1]).shape == (1, 1, 3, 1, 1)  # Unsqueeze-11
    assert run("Unsqueeze", y, ints(4, 1)).shape == (1, 1, 3, 1, 1)
    assert "missing" in refusal("Unsqueeze", y)
    with pytest.raises(ValueError):
        run("Squeeze", y, ints(1))  # not a size-1 axis
    with pytest.raises(ValueError, match="empty axes"):
        run("Squeeze", y, ints())
    assert run("Flatten", x, axis=-3).shape == (1, 24)
    assert run("Flatten", x, axis=3).shape == (24, 1)
    with pytest.raises(ValueError):
        run("Flatten", x, axis=-4)
    assert "permutation" in refusal("Transpose", x, perm=[0, 0, 1])


def test_gather_expand_tile_concat() -> None:
    x = rand(4, 3)
    got = run("Gather", x, np.array([[-1, 0]], np.int32), axis=0)
    np.testing.assert_array_equal(got, x[[[3, 0]]])
    np.testing.assert_array_equal(run("Gather", x, np.int64(-2), axis=-1), x[:, 1])
    with pytest.raises(IndexError):
        run("Gather", x, ints(4))
    assert run("Expand", rand(3, 1), ints(2, 1, 5)).shape == (2, 3, 5)
    assert run("Expand", rand(3, 1), ints(1)).shape == (3, 1)
    np.testing.assert_array_equal(run("Tile", x, ints(2, 1)), np.tile(x, (2, 1)))
    with pytest.raises(ValueError):
        run("Tile", x, ints(2))
    assert run("Concat", x, x[:0], x, axis=-2).shape == (8, 3)
    np.testing.assert_array_equal(run("Concat", x, axis=0), x)


def test_shape_constant_and_range() -> None:
    x = np.zeros((2, 3, 4), np.int8)
    assert run("Shape", x).tolist() == [2, 3, 4]
    assert run("Shape", x, start=-2).tolist() == [3, 4]
    assert run("Shape", x, start=1, end=-1).tolist() == [3]
    assert run("Shape", x, start=-10, end=10).tolist() == [2, 3, 4]
    assert run("Shape", x, start=2, end=1).tolist() == []
    assert run("Constant", value_floats=[1.5, 2.0]).dtype == np.float32
    assert run("Constant", value_int=3).tolist() == 3
    assert run("Constant", value_ints=[1, 2]).dtype == np.int64
    table = {"dtype": "uint16", "shape": [2, 1], "data": [7, 8]}
    constant = run("Constant", value=table)
    assert constant.dtype == np.uint16 and constant.tolist() == [[7], [8]]
    assert not constant.flags.writeable
    assert "exactly one" in refusal("Constant", value_int=1, value_float=2.0)
    assert "exactly one" in refusal("Constant")
    filled = run("ConstantOfShape", ints(2, 3))
    assert filled.dtype == np.float32 and filled.shape == (2, 3) and not filled.any()
    value = {"dtype": "int8", "shape": [1], "data": [-3]}
    assert run("ConstantOfShape", ints(), value=value).tolist() == -3
    assert "one element" in refusal(
        "ConstantOfShape", ints(2), value={"dtype": "int8", "shape": [2], "data": [1, 2]}
    )
    got = run("Range", np.int16(-30000), np.int16(30000), np.int16(1))
    assert got.dtype == np.int16 and got.size == 60000 and got[-1] == 29999
    assert run("Range", np.int32(10), np.int32(4), np.int32(-2)).tolist() == [10, 8, 6]
    assert run("Range", np.int32(4), np.int32(10), np.int32(-2)).tolist() == []
    got = run("Range", np.float16(0.5), np.float16(3), np.float16(0.5))
    assert got.dtype == np.float16 and got.tolist() == [0.5, 1, 1.5, 2, 2.5]
    np.testing.assert_allclose(
        run("Range", f32(0)[0], f32(1)[0], f32(0.1)[0]), np.arange(10) * f32(0.1)[0]
    )
    with pytest.raises(ValueError, match="delta 0"):
        run("Range", np.int64(0), np.int64(1), np.int64(0))


def test_float16_matmul_accumulates_in_float32() -> None:
    a = np.full((1, 2048), 0.1, np.float16)
    b = np.ones((2048, 1), np.float16)
    for got in (run("MatMul", a, b), run("Gemm", a, b)):
        assert got.dtype == np.float16 and abs(float(got[0, 0]) - 204.8) < 0.2
    ints32 = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(run("MatMul", ints32, ints32.T), ints32 @ ints32.T)
    assert "int32" in refusal("Gemm", ints32, ints32.T)
