"""The bitwise ops, BitShift, Mod and BitCast (`driver_sim.ops.bits`), and Cast and
CastLike among every element type the NC holds (`driver_sim.ops.cast`), against every
ONNX backend case of theirs, plus what the cases leave out: shifts out of range, signs of
remainders, saturation, rounding to float8_e8m0fnu, casts ml_dtypes has no direct
conversion for, and refusals that say why."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from kernel_cases import node_cases, run_case
from onnx import numpy_helper

from driver_sim import KERNELS

OPS = (
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "Mod", "BitCast",
    "Cast", "CastLike",
)  # fmt: skip
E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0, F4, BF16, I4, U4, I2, U2 = (
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.bfloat16,
        ml_dtypes.int4,
        ml_dtypes.uint4,
        ml_dtypes.int2,
        ml_dtypes.uint2,
    )
)
# every element type the NC holds, by its ONNX code (not strings, 8, or complex, 14 and 15)
CODE = {
    np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)): code
    for code in range(1, 27)
    if code not in (8, 14, 15)
}


def with_arrays(case: Any) -> Any:
    """`case` with its data as arrays (the cases of narrow types hold TensorProtos)."""

    def array(value: Any) -> Any:
        return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value

    data = [([array(v) for v in ins], [array(v) for v in outs]) for ins, outs in case.data_sets]
    return dataclasses.replace(case, data_sets=data)


@pytest.mark.parametrize("op", OPS)
def test_every_onnx_case_passes(op: str) -> None:
    cases = node_cases(op)
    assert cases, f"no ONNX cases for {op}"
    refused = {case.name: reason for case in cases if (reason := run_case(with_arrays(case)))}
    assert refused == {}


def call(op: str, *arrays: Any, **attrs: object) -> np.ndarray:
    kern = KERNELS[op]
    values = kern.parse_attrs(attrs)
    kern.check_support([np.asarray(a).dtype for a in arrays], values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning leaks out of a kernel
        return np.asarray(kern.bind(values)(*arrays))


def cast(x: Any, to: np.dtype, **attrs: object) -> np.ndarray:
    return call("Cast", np.asarray(x), to=CODE[to], **attrs)


# --- bits -----------------------------------------------------------------------------
def test_bitwise_ops_broadcast_and_keep_the_dtype() -> None:
    a = np.array([[0b1100], [0b1010]], np.uint16)
    b = np.array([0b1010, 0b0110], np.uint16)
    assert call("BitwiseAnd", a, b).tolist() == [[0b1000, 0b0100], [0b1010, 0b0010]]
    assert call("BitwiseOr", a, b).tolist() == [[0b1110, 0b1110], [0b1010, 0b1110]]
    assert call("BitwiseXor", a, b).dtype == np.uint16
    assert call("BitwiseNot", np.array([0, -1, 5], np.int8)).tolist() == [-1, 0, -6]
    with pytest.raises(ValueError, match="inputs must share one dtype"):
        call("BitwiseAnd", a, b.astype(np.uint8))
    with pytest.raises(ValueError, match="input 0 has dtype float32"):
        call("BitwiseNot", np.ones(2, np.float32))


def test_shifts_fill_with_the_sign_and_drop_what_leaves_the_type() -> None:
    x = np.array([-128, -5, 5, 64], np.int8)
    assert call("BitShift", x, np.int8(1), direction="RIGHT").tolist() == [-64, -3, 2, 32]
    assert call("BitShift", x, np.int8(1), direction="LEFT").tolist() == [0, -10, 10, -128]
    # by a negative amount or the width or more: what the sign alone gives
    amounts = np.array([8, -1, 100, 8], np.int8)
    assert call("BitShift", x, amounts, direction="RIGHT").tolist() == [-1, -1, 0, 0]
    assert call("BitShift", x, amounts, direction="LEFT").tolist() == [0, 0, 0, 0]
    u = np.array([1, 2**63], np.uint64)
    assert call("BitShift", u, np.array([63, 64], np.uint64), direction="LEFT").tolist() == [
        2**63,
        0,
    ]
    assert call("BitShift", u, np.uint64(63), direction="RIGHT").tolist() == [0, 1]
    with pytest.raises(ValueError, match="direction: must be one of LEFT, RIGHT"):
        KERNELS["BitShift"].parse_attrs({"direction": "UP"})


def test_mod_takes_the_sign_of_the_divisor_or_with_fmod_of_the_dividend() -> None:
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([3, 3, -3, -3], np.int32)
    assert call("Mod", a, b).tolist() == [1, 2, -2, -1]
    assert call("Mod", a, b, fmod=1).tolist() == [1, -1, 1, -1]
    assert call("Mod", a, np.int32(0)).tolist() == [0] * 4  # no warning, no crash
    x = np.array([5.5, -5.5, np.inf, 1.0, 5.0, -5.0, 0.0], np.float32)
    y = np.array([2.0, 2.0, 2.0, 0.0, np.inf, np.inf, -3.0], np.float32)
    np.testing.assert_array_equal(call("Mod", x, y), [1.5, 0.5, np.nan, np.nan, 5, np.inf, -0.0])
    assert np.signbit(call("Mod", x, y)[-1])  # a zero takes the divisor's sign
    np.testing.assert_array_equal(call("Mod", x, y, fmod=1), [1.5, -1.5, np.nan, np.nan, 5, -5, 0])
    half = call("Mod", x.astype(np.float16), y.astype(np.float16), fmod=1)
    assert half.dtype == np.float16


def test_bitcast_reads_the_bits_as_another_type_of_the_same_width() -> None:
    x = np.array([1.0, -2.0], np.float32)
    assert call("BitCast", x, to=onnx.TensorProto.INT32).tolist() == [0x3F800000, -0x40000000]
    assert call("BitCast", np.float16(1.0), to=onnx.TensorProto.UINT16).shape == ()
    four = np.array([-1, 7, -8], I4)
    assert call("BitCast", four, to=onnx.TensorProto.UINT4).tolist() == [15, 7, 8]
    np.testing.assert_array_equal(
        call("BitCast", four, to=onnx.TensorProto.FLOAT4E2M1).astype(np.float32), [-6, 6, -0.0]
    )
    bf16 = call("BitCast", np.array([0x3F80], np.uint16), to=onnx.TensorProto.BFLOAT16)
    assert bf16.dtype == BF16 and bf16.astype(np.float32).tolist() == [1.0]
    with pytest.raises(ValueError, match="int4 has 4 bits, int8 8"):
        call("BitCast", four, to=onnx.TensorProto.INT8)
    with pytest.raises(ValueError, match="float32 has 32 bits, float16 16"):
        call("BitCast", x, to=onnx.TensorProto.FLOAT16)
    with pytest.raises(ValueError, match="element type 8 is not implemented"):
        KERNELS["BitCast"].parse_attrs({"to": onnx.TensorProto.STRING})


# --- Cast -------------------------------------------------------------------------------
BIG = [1e6, -1e6, np.inf, -np.inf, np.nan, 0.3]


@pytest.mark.parametrize(
    ("to", "saturated", "not_saturated"),
    [
        (E4M3FN, [448, -448, 448, -448, np.nan], [np.nan] * 5),
        (E4M3FNUZ, [240, -240, 240, -240, np.nan], [np.nan] * 5),
        (E5M2, [57344, -57344, 57344, -57344, np.nan], [np.inf, -np.inf, np.inf, -np.inf, np.nan]),
        (E5M2FNUZ, [57344, -57344, 57344, -57344, np.nan], [np.nan] * 5),
    ],
)
def test_float8_saturates_unless_told_not_to(
    to: np.dtype, saturated: list[float], not_saturated: list[float]
) -> None:
    for source in (np.float32, np.float64, np.float16, BF16):
        with np.errstate(over="ignore"):  # 1e6 is beyond float16: infinity
            x = np.array(BIG).astype(source)
        y = cast(x, to)
        assert y.dtype == to
        np.testing.assert_array_equal(y[:5].astype(np.float32), saturated)
        np.testing.assert_array_equal(cast(x, to, saturate=0)[:5].astype(np.float32), not_saturated)
        assert y[5].astype(np.float32) == np.asarray(0.3, source).astype(to).astype(np.float32)
    ints = cast(np.array([10**5, -(10**5), 3], np.int64), to)  # integers saturate too
    assert ints.astype(np.float32).tolist() == [saturated[0], saturated[1], 3]


def test_integers_keep_their_low_bits_and_floats_truncate() -> None:
    assert cast(np.array([9, -9, 200], np.int32), I4).tolist() == [-7, 7, -8]
    assert cast(np.array([200, -56], np.int16), np.dtype(np.int8)).tolist() == [-56, -56]
    assert cast(np.array([-1, 7, -8], I4), U4).tolist() == [15, 7, 8]  # no direct ml_dtypes cast
    assert cast(np.array([3, -2], I2), U2).tolist() == [3, 2]
    assert cast(np.array([1.7, -1.7, 3.0], np.float32), I4).tolist() == [1, -1, 3]
    assert cast(np.array([0.0, -0.0, 0.5, np.nan], np.float32), np.dtype(bool)).tolist() == [
        False,
        False,
        True,
        True,
    ]
    back = cast(cast(np.array([1.5, -6.0], np.float32), F4), E4M3FN)  # narrow to narrow
    assert back.dtype == E4M3FN and back.astype(np.float32).tolist() == [1.5, -6.0]


@pytest.mark.parametrize(
    ("round_mode", "saturate", "powers"),
    [
        ("up", 1, [0, 1, 1, 127, 127, -126]),
        ("down", 1, [-1, 0, 1, 127, 127, -127]),
        ("nearest", 1, [0, 0, 1, 127, 127, -126]),  # 0.75 is a tie: up
        ("up", 0, [0, 1, 1, None, None, -126]),
        ("nearest", 0, [0, 0, 1, None, None, -126]),
    ],
)
def test_e8m0_keeps_the_exponent_and_rounds_as_asked(
    round_mode: str, saturate: int, powers: list[int | None]
) -> None:
    x = np.array([0.75, 1.25, 2.0, 3e38, np.inf, 1e-38], np.float32)
    y = cast(x, E8M0, round_mode=round_mode, saturate=saturate)
    assert y.dtype == E8M0
    want = [np.nan if p is None else 2.0**p for p in powers]
    np.testing.assert_array_equal(y.astype(np.float64), want)
    assert np.isnan(cast(np.float32(np.nan), E8M0).astype(np.float32))
    with pytest.raises(ValueError, match="round_mode: must be one of up, down, nearest"):
        KERNELS["Cast"].parse_attrs({"to": 24, "round_mode": "odd"})


def test_cast_like_takes_the_type_not_the_values_of_its_second_input() -> None:
    x = np.array([1.0, 500.0, -1e9], np.float32)
    like = np.empty((0,), E4M3FN)
    y = call("CastLike", x, like)
    assert y.dtype == E4M3FN and y.astype(np.float32).tolist() == [1.0, 448.0, -448.0]
    unsaturated = call("CastLike", x, like, saturate=0)
    assert np.isnan(unsaturated.astype(np.float32)[1:]).all()
    same = np.arange(3, dtype=np.int64)
    assert call("CastLike", same, np.zeros(1, np.int64)) is same  # nothing to convert
    with pytest.raises(ValueError, match="input 1 has dtype <U1"):
        call("CastLike", x, np.array(["a"]))
    with pytest.raises(ValueError, match="attribute to: element type 8 is not implemented"):
        KERNELS["Cast"].parse_attrs({"to": onnx.TensorProto.STRING})
