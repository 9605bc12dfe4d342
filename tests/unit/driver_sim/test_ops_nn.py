"""The NN kernels (driver_sim.ops: conv, pool, norm, resize, and the Pad, DepthToSpace and
SpaceToDepth of shape): every ONNX backend node case of their ops, with the refused ones
pinned, plus direct checks against nested-loop references."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from kernel_cases import node_cases, run_case
from kernel_cases import run_kernel as run

from driver_sim import KERNELS
from driver_sim.execute import execute_program
from driver_sim.ops import conv as conv_ops
from driver_sim.program import Instr, NcProgram, load_program

# op -> how many ONNX node cases it has (a case that goes missing is noticed)
CASE_COUNTS = {
    "Conv": 6,
    "ConvTranspose": 11,
    "BatchNormalization": 4,
    "MaxPool": 19,
    "AveragePool": 20,
    "GlobalAveragePool": 2,
    "GlobalMaxPool": 2,
    "LRN": 2,
    "InstanceNormalization": 2,
    "LayerNormalization": 19,
    "Resize": 39,
    "Pad": 6,
    "DepthToSpace": 2,
    "SpaceToDepth": 4,
}

# case name -> a phrase of the reason the kernel refuses it at compile time
REFUSED = {
    "test_batchnorm_example_training_mode": "training_mode 1 is not implemented",
    "test_batchnorm_epsilon_training_mode": "training_mode 1 is not implemented",
}


@pytest.mark.parametrize("op", sorted(CASE_COUNTS))
def test_onnx_node_cases(op: str) -> None:
    """Every case of `op` passes (right numbers, dtype and shape) or is a pinned refusal."""
    cases = node_cases(op)
    assert len(cases) == CASE_COUNTS[op]
    refused = {}
    for case in cases:
        reason = run_case(case)
        if reason is not None:
            refused[case.name] = reason
    expected = {name: why for name, why in REFUSED.items() if name in {c.name for c in cases}}
    assert set(refused) == set(expected), refused
    for name, reason in refused.items():
        assert expected[name] in reason, (name, reason)


def test_pinned_refusals_are_cases() -> None:
    names = {case.name for op in CASE_COUNTS for case in node_cases(op)}
    assert set(REFUSED) <= names


# ---- helpers ------------------------------------------------------------------------------


def refusal(op: str, dtypes: list[str], **attrs: Any) -> str:
    """Why the kernel of `op` refuses these attributes and input dtypes."""
    kern = KERNELS[op]
    with pytest.raises(ValueError) as info:
        kern.check_support([np.dtype(d) for d in dtypes], kern.parse_attrs(attrs))
    return str(info.value)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def loop_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    group: int,
    strides: list[int],
    dilations: list[int],
    begin: list[int],
    out: list[int],
) -> np.ndarray:
    """Conv by its definition, one output element at a time."""
    n = x.shape[0]
    m, cg = w.shape[:2]
    mg = m // group
    y = np.zeros((n, m, *out))
    for image, oc in itertools.product(range(n), range(m)):
        g = oc // mg
        for pos in itertools.product(*(range(o) for o in out)):
            total = float(b[oc])
            for ic in range(cg):
                for tap in itertools.product(*(range(k) for k in w.shape[2:])):
                    where = [
                        p * s - bg + t * d
                        for p, s, bg, t, d in zip(pos, strides, begin, tap, dilations, strict=True)
                    ]
                    if all(0 <= q < size for q, size in zip(where, x.shape[2:], strict=True)):
                        total += x[(image, g * cg + ic, *where)] * w[(oc, ic, *tap)]
            y[(image, oc, *pos)] = total
    return y


def loop_conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    group: int,
    strides: list[int],
    dilations: list[int],
    begin: list[int],
    out: list[int],
) -> np.ndarray:
    """ConvTranspose by its definition: every input element scatters into the output."""
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    y = np.zeros((n, mg * group, *out))
    for image, ic in itertools.product(range(n), range(c)):
        g = ic // cg
        for pos in itertools.product(*(range(s) for s in x.shape[2:])):
            for oc, tap in itertools.product(
                range(mg), itertools.product(*(range(k) for k in w.shape[2:]))
            ):
                where = [
                    p * s + t * d - bg
                    for p, s, t, d, bg in zip(pos, strides, tap, dilations, begin, strict=True)
                ]
                if all(0 <= q < o for q, o in zip(where, out, strict=True)):
                    y[(image, g * mg + oc, *where)] += x[(image, ic, *pos)] * w[(ic, oc, *tap)]
    return y


# ---- Conv and ConvTranspose ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "group", "cg", "mg", "kernel", "strides", "dilations", "pads"),
    [
        # 2-D, 2 groups, dilation + stride + asymmetric pads
        ((2, 4, 7, 6), 2, 2, 3, (3, 2), [2, 1], [2, 1], [1, 0, 2, 1]),
        # strides 3 and 2 with dilations 2 and 3: taps from several stride phases
        ((1, 2, 11, 10), 1, 2, 2, (3, 3), [3, 2], [2, 3], [2, 1, 0, 3]),
        # 1-D, 3 groups
        ((1, 3, 9), 3, 1, 2, (3,), [2], [2], [2, 1]),
        # 3-D
        ((1, 2, 5, 4, 4), 1, 2, 2, (2, 3, 2), [1, 2, 1], [1, 1, 2], [0, 1, 1, 1, 0, 0]),
        # depthwise with multiplier 2
        ((2, 3, 6, 5), 3, 1, 2, (3, 3), [1, 2], [1, 1], [1, 1, 1, 1]),
        # 1x1, stride 1, no padding: a plain matmul
        ((2, 4, 3, 3), 2, 2, 2, (1, 1), [1, 1], [1, 1], [0, 0, 0, 0]),
        # 1024 output pixels per image: matmuls over images 0-1, then image 2 alone
        ((3, 2, 34, 33), 1, 2, 2, (3, 2), [1, 1], [1, 1], [0, 0, 0, 0]),
    ],
)
def test_conv_matches_loops(
    shape: tuple[int, ...],
    group: int,
    cg: int,
    mg: int,
    kernel: tuple[int, ...],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
) -> None:
    rng = np.random.default_rng(1)
    x = rand(rng, *shape)
    w = rand(rng, mg * group, cg, *kernel)
    b = rand(rng, mg * group)
    y = run("Conv", x, w, b, group=group, strides=strides, dilations=dilations, pads=pads)
    rank = len(kernel)
    begin = pads[:rank]
    out = [
        (size + pads[i] + pads[rank + i] - (k - 1) * d - 1) // s + 1
        for i, (size, k, d, s) in enumerate(zip(shape[2:], kernel, dilations, strides, strict=True))
    ]
    want = loop_conv(x, w, b, group, strides, dilations, begin, out)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_depthwise_conv_in_channel_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv_ops, "_DEPTHWISE_BLOCK", 2 * 16)  # one channel (x 2) per block
    rng = np.random.default_rng(6)
    x, w, b = rand(rng, 2, 3, 7, 5), rand(rng, 6, 1, 2, 3), rand(rng, 6)
    y = run("Conv", x, w, b, group=3, strides=[2, 1], pads=[0, 1, 1, 0])
    want = loop_conv(x, w, b, 3, [2, 1], [1, 1], [0, 1], [4, 4])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conv_auto_pad_same_and_float16() -> None:
    rng = np.random.default_rng(2)
    x, w = rand(rng, 1, 2, 6, 5), rand(rng, 3, 2, 3, 2)
    zero = np.zeros(3, np.float32)
    upper = run("Conv", x, w, auto_pad="SAME_UPPER", strides=[2, 2])
    lower = run("Conv", x, w, auto_pad="SAME_LOWER", strides=[2, 2])
    # 3 outputs per axis need 1 padding element: at the end (UPPER) or the start (LOWER)
    np.testing.assert_allclose(
        upper, loop_conv(x, w, zero, 1, [2, 2], [1, 1], [0, 0], [3, 3]), atol=1e-5
    )
    np.testing.assert_allclose(
        lower, loop_conv(x, w, zero, 1, [2, 2], [1, 1], [1, 1], [3, 3]), atol=1e-5
    )
    half = run(
        "Conv", x.astype(np.float16), w.astype(np.float16), auto_pad="SAME_UPPER", strides=[2, 2]
    )
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, upper, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("shape", "group", "mg", "kernel", "attrs", "begin", "out"),
    [
        (
            (1, 4, 3, 4),
            2,
            2,
            (3, 2),
            {
                "strides": [2, 3],
                "dilations": [1, 2],
                "pads": [1, 0, 0, 2],
                "output_padding": [1, 1],
            },
            [1, 0],
            [7, 11],
        ),
        # output_shape 8 of the full 9: the odd padding element goes at the start
        ((2, 2, 4), 1, 3, (3,), {"strides": [2], "output_shape": [8]}, [1], [8]),
        ((1, 1, 3, 3), 1, 1, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, [0, 0], [6, 6]),
        ((1, 1, 3, 3), 1, 1, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, [1, 1], [6, 6]),
    ],
)
def test_conv_transpose_matches_loops(
    shape: tuple[int, ...],
    group: int,
    mg: int,
    kernel: tuple[int, ...],
    attrs: dict[str, Any],
    begin: list[int],
    out: list[int],
) -> None:
    rng = np.random.default_rng(3)
    x = rand(rng, *shape)
    w = rand(rng, shape[1], mg, *kernel)
    b = rand(rng, mg * group)
    y = run("ConvTranspose", x, w, b, group=group, **attrs)
    rank = len(kernel)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    want = loop_conv_transpose(x, w, group, strides, dilations, begin, out)
    want += b.reshape(-1, *[1] * rank)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conv_refusals() -> None:
    assert "share one dtype" in refusal("Conv", ["float32", "float16"])
    assert "int32" in refusal("Conv", ["int32", "int32"])
    assert "non-zero pads" in refusal("Conv", ["float32"] * 2, auto_pad="SAME_UPPER", pads=[1, 1])
    stride = refusal("Conv", ["float32"] * 2, auto_pad="SAME_LOWER", kernel_shape=[1], strides=[3])
    assert "stride over the kernel extent" in stride
    transposed = refusal(
        "ConvTranspose", ["float32"] * 2, auto_pad="SAME_UPPER", kernel_shape=[1], strides=[2]
    )
    assert "stride over kernel extent" in transposed
    x, w = np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1), np.float32)
    with pytest.raises(ValueError, match="negative total padding"):  # known only at run time
        run("ConvTranspose", x, w, auto_pad="SAME_UPPER", strides=[3, 3])
    with pytest.raises(ValueError, match="attribute pads"):
        KERNELS["Conv"].parse_attrs({"pads": [-1, 0]})


def test_conv_macs() -> None:
    conv, transpose = KERNELS["Conv"], KERNELS["ConvTranspose"]
    assert conv.macs([(2, 8, 9, 9), (16, 4, 3, 3)], [(2, 16, 7, 7)], {}) == 2 * 16 * 49 * 4 * 9
    assert transpose.macs([(2, 8, 5, 5), (8, 3, 3, 3)], [(2, 6, 11, 11)], {}) == 2 * 8 * 25 * 3 * 9


# ---- pooling ------------------------------------------------------------------------------


def test_max_pool_indices_and_storage_order() -> None:
    x = np.array([[[[1, 5, 2], [7, 7, 0], [3, 9, 9]]]], np.float32)  # ties: row-major first
    y, rows = run("MaxPool", x, kernel_shape=[2, 2], strides=[1, 1])
    _, columns = run("MaxPool", x, kernel_shape=[2, 2], strides=[1, 1], storage_order=1)
    np.testing.assert_array_equal(y, [[[[7, 7], [9, 9]]]])
    np.testing.assert_array_equal(rows, [[[[3, 4], [7, 7]]]])  # (1, 0), (1, 1); (2, 1), (2, 1)
    np.testing.assert_array_equal(columns, [[[[1, 4], [5, 5]]]])  # h + w * H
    batch = np.stack([x[0], -x[0]])  # indices count the image and channel
    _, indices = run("MaxPool", batch, kernel_shape=[3, 3])
    np.testing.assert_array_equal(indices.ravel(), [7, 9 + 5])  # the 0 of -x at (1, 2)


def test_max_pool_runs_in_programs_with_one_or_two_outputs() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    for outputs in (("y",), ("y", "i")):
        program = NcProgram([Instr("MaxPool", ("x",), outputs, attrs)], {}, ["x"], list(outputs))
        got: dict[str, np.ndarray] = {
            "y": np.empty((1, 1, 2, 2), np.float32),
            "i": np.empty((1, 1, 2, 2), np.int64),
        }
        execute_program(load_program(None, program), {"x": x}, got)
        np.testing.assert_array_equal(got["y"].ravel(), [5, 7, 13, 15])
        if "i" in outputs:
            np.testing.assert_array_equal(got["i"].ravel(), [5, 7, 13, 15])


def test_max_pool_integers_and_padding_never_wins() -> None:
    x = np.array([[[-128, -100, 5]]], np.int8)
    y = run("MaxPool", x, kernel_shape=[2], pads=[1, 1])[0]
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [[[-128, -100, 5, 5]]])


def test_average_pool_counts() -> None:
    x = np.ones((1, 1, 4), np.float32)
    # windows start at -1, 1, 3 (the last one reaches past the end padding: ceil_mode)
    attrs = {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}
    excluded = run("AveragePool", x * np.array([1, 2, 3, 4], np.float32), **attrs)
    np.testing.assert_allclose(excluded.ravel(), [1.5, 3, 4])
    included = run("AveragePool", x, count_include_pad=1, **attrs)
    np.testing.assert_allclose(included.ravel(), [2 / 3, 1, 1 / 2])  # padding counts, beyond not


def test_pool_refusals() -> None:
    valid = refusal("MaxPool", ["float32"], kernel_shape=[2], auto_pad="VALID", ceil_mode=1)
    assert "ceil_mode" in valid
    same = refusal(
        "AveragePool", ["float32"], kernel_shape=[2], auto_pad="SAME_UPPER", dilations=[2]
    )
    assert "dilations" in same
    assert "int32" in refusal("MaxPool", ["int32"], kernel_shape=[2])


# ---- normalizations -----------------------------------------------------------------------


def test_layer_normalization_outputs() -> None:
    rng = np.random.default_rng(4)
    x, scale = rand(rng, 2, 3, 4).astype(np.float64), rand(rng, 3, 4).astype(np.float64)
    y, mean, inv_std = run("LayerNormalization", x, scale, axis=1)
    assert (y.dtype, mean.dtype, inv_std.dtype) == (np.float64, np.float32, np.float32)
    assert mean.shape == inv_std.shape == (2, 1, 1)
    flat = x.reshape(2, -1)
    np.testing.assert_allclose(mean.ravel(), flat.mean(1), rtol=1e-6)
    np.testing.assert_allclose(inv_std.ravel(), 1 / np.sqrt(flat.var(1) + 1e-5), rtol=1e-5)
    want = (x - flat.mean(1)[:, None, None]) * inv_std * scale
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_batch_normalization_refuses_training() -> None:
    with pytest.raises(ValueError, match="training_mode"):
        KERNELS["BatchNormalization"].parse_attrs({"training_mode": 1})
    assert KERNELS["BatchNormalization"].max_outputs == 1


def test_lrn_even_size() -> None:
    x = np.arange(1, 6, dtype=np.float32).reshape(1, 5, 1, 1)
    y = run("LRN", x, size=2, alpha=2.0, beta=1.0, bias=1.0)
    # size 2: channels c .. c + 1
    squares = x.ravel() ** 2
    sums = squares + np.append(squares[1:], 0)
    np.testing.assert_allclose(y.ravel(), x.ravel() / (1 + sums))


# ---- Resize, Pad, DepthToSpace ------------------------------------------------------------


def test_resize_linear_half_pixel_by_hand() -> None:
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    y = run("Resize", x, None, np.array([1, 1, 2, 2], np.float32), mode="linear")
    # output 0..3 maps to (o + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (clamped to the edges)
    row = [1, 1.25, 1.75, 2]
    want = np.array([row, [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3, 3.25, 3.75, 4]])
    np.testing.assert_allclose(y[0, 0], want)


def test_resize_nearest_keeps_integers_and_refusals() -> None:
    x = np.arange(6, dtype=np.int64).reshape(1, 1, 2, 3)
    y = run("Resize", x, None, None, np.array([4, 6], np.int64), axes=[2, 3], mode="nearest")
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y[0, 0, ::2, ::2], x[0, 0])
    assert "antialias" in refusal("Resize", ["float32"], mode="nearest", antialias=1)
    assert "int64" in refusal("Resize", ["int64"], mode="linear")
    with pytest.raises(ValueError, match="tf_crop_and_resize with scales"):
        run(
            "Resize",
            x.astype(np.float32),
            np.array([0, 1], np.float32),
            np.array([2.0], np.float32),
            axes=[3],
            coordinate_transformation_mode="tf_crop_and_resize",
        )


def test_pad_negative_and_wrap() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    cropped = run("Pad", x, np.array([0, -1, 1, 1], np.int64), np.array(9, np.int32))
    np.testing.assert_array_equal(cropped, [[1, 2, 9], [4, 5, 9], [9, 9, 9]])
    wrapped = run("Pad", x, np.array([2, 1], np.int64), None, np.array([-1], np.int64), mode="wrap")
    np.testing.assert_array_equal(wrapped, [[1, 2, 0, 1, 2, 0], [4, 5, 3, 4, 5, 3]])
    version2 = run("Pad", x.astype(np.float32), pads=[1, 0, 0, 0], value=-1.0)
    np.testing.assert_array_equal(version2, [[-1, -1, -1], [0, 1, 2], [3, 4, 5]])


def test_depth_to_space_inverts_space_to_depth() -> None:
    x = np.arange(2 * 3 * 4 * 6).reshape(2, 3, 4, 6).astype(np.float32)
    for mode in ("DCR", "CRD"):
        depth = run("SpaceToDepth", x, blocksize=2, mode=mode)
        assert depth.shape == (2, 12, 2, 3)
        np.testing.assert_array_equal(run("DepthToSpace", depth, blocksize=2, mode=mode), x)


# ---- kernels never write their inputs -----------------------------------------------------


def frozen(*arrays: np.ndarray) -> list[np.ndarray]:
    for array in arrays:
        array.flags.writeable = False
    return list(arrays)


@pytest.mark.parametrize(
    ("op", "make", "attrs"),
    [
        (
            "Conv",
            lambda r: [rand(r, 2, 4, 6, 6), rand(r, 4, 2, 3, 3), rand(r, 4)],
            {"group": 2, "pads": [1, 1, 1, 1]},
        ),
        ("Conv", lambda r: [rand(r, 1, 4, 5, 5), rand(r, 4, 1, 3, 3), rand(r, 4)], {"group": 4}),
        ("Conv", lambda r: [rand(r, 1, 4, 5, 5), rand(r, 6, 4, 1, 1), rand(r, 6)], {}),
        (
            "ConvTranspose",
            lambda r: [rand(r, 1, 2, 3, 3), rand(r, 2, 3, 2, 2), rand(r, 3)],
            {"strides": [2, 2]},
        ),
        ("MaxPool", lambda r: [rand(r, 1, 2, 5, 5)], {"kernel_shape": [2, 2]}),
        ("AveragePool", lambda r: [rand(r, 1, 2, 5, 5)], {"kernel_shape": [1, 1]}),
        ("GlobalAveragePool", lambda r: [rand(r, 1, 2, 3, 3)], {}),
        (
            "BatchNormalization",
            lambda r: [
                rand(r, 2, 3, 4),
                rand(r, 3),
                rand(r, 3),
                rand(r, 3),
                np.ones(3, np.float32),
            ],
            {},
        ),
        ("InstanceNormalization", lambda r: [rand(r, 2, 3, 4), rand(r, 3), rand(r, 3)], {}),
        ("LayerNormalization", lambda r: [rand(r, 2, 3, 4), rand(r, 4), rand(r, 4)], {}),
        ("LRN", lambda r: [rand(r, 1, 4, 2, 2)], {"size": 3}),
        (
            "Resize",
            lambda r: [rand(r, 1, 1, 3, 3), None, np.array([1, 1, 1, 1], np.float32)],
            {"mode": "linear"},
        ),
        (
            "Resize",
            lambda r: [rand(r, 1, 1, 3, 3), None, np.array([1, 1, 2, 0.5], np.float32)],
            {"mode": "cubic"},
        ),
        ("Pad", lambda r: [rand(r, 2, 3), np.array([0, 0, 0, 0], np.int64)], {}),
        ("DepthToSpace", lambda r: [rand(r, 1, 4, 2, 2)], {"blocksize": 2}),
    ],
)
def test_inputs_stay_unmodified(op: str, make: Any, attrs: dict[str, Any]) -> None:
    inputs = make(np.random.default_rng(5))
    copies = [None if a is None else a.copy() for a in inputs]
    frozen(*[a for a in inputs if a is not None])
    result = run(op, *inputs, **attrs)
    outputs = list(result) if KERNELS[op].multi_output else [result]
    for before, after in zip(copies, inputs, strict=True):
        if before is not None:
            np.testing.assert_array_equal(after, before)
    for output in outputs:
        # an output may be an input itself (identity), but never a writable view of one
        assert not any(
            output is not a and np.shares_memory(output, a) and output.flags.writeable
            for a in inputs
            if a is not None
        )
    assert math.isfinite(float(np.asarray(outputs[0], np.float64).sum()))
