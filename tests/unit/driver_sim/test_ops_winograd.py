"""WinogradConv (driver_sim.ops.winograd): the same numbers as the Conv kernel, its weight
transform, support check, MAC count and cost rule, and a program that runs it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from driver_sim import KERNELS
from driver_sim.execute import execute_program
from driver_sim.ops import winograd as winograd_ops
from driver_sim.ops.winograd import winograd_pays, winograd_weights
from driver_sim.program import Instr, NcProgram, load_program

WINOGRAD = KERNELS["WinogradConv"]
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def frozen(*shape: int, seed: int) -> np.ndarray:
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    array.setflags(write=False)
    return array


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads: list[int]) -> np.ndarray:
    kern = KERNELS["Conv"]
    result: np.ndarray = kern.bind(kern.parse_attrs({"pads": pads}))(x, w, b)
    return result


def winograd(x: np.ndarray, u: np.ndarray, b: np.ndarray | None, pads: Any) -> np.ndarray:
    result: np.ndarray = WINOGRAD.bind(WINOGRAD.parse_attrs({"pads": pads}))(x, u, b)
    return result


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


# (N, Cin, Cout, H, W, pads [top, left, bottom, right], bias)
CASES = [
    (1, 3, 5, 8, 8, [1, 1, 1, 1], True),  # even, "same" padding
    (3, 5, 7, 9, 11, [1, 1, 1, 1], False),  # odd sizes, no bias, N = 3
    (1, 7, 3, 10, 7, [0, 0, 0, 0], True),  # no padding
    (3, 6, 5, 7, 6, [0, 2, 1, 0], True),  # asymmetric pads
    (1, 4, 9, 5, 13, [2, 0, 0, 3], False),  # asymmetric, odd
    (3, 2, 3, 1, 1, [1, 1, 1, 1], True),  # a single pixel
    (1, 3, 2, 3, 3, [0, 0, 0, 0], True),  # a single output pixel
    (1, 1, 1, 2, 3, [4, 3, 5, 2], True),  # pads wider than the kernel
    (1, 13, 11, 23, 19, [1, 1, 1, 1], True),  # bigger, odd channels
]


@pytest.mark.parametrize(("n", "cin", "cout", "h", "w", "pads", "bias"), CASES)
def test_matches_conv(
    n: int, cin: int, cout: int, h: int, w: int, pads: list[int], bias: bool
) -> None:
    seed = n * 1000 + cin * 100 + h
    x = frozen(n, cin, h, w, seed=seed)
    weights = frozen(cout, cin, 3, 3, seed=seed + 1)
    b = frozen(cout, seed=seed + 2) if bias else None
    u = winograd_weights(weights)
    u.setflags(write=False)
    kept = [x.copy(), u.copy(), None if b is None else b.copy()]
    got = winograd(x, u, b, pads)
    assert_close(got, conv(x, weights, b, pads))
    assert got.flags.c_contiguous
    for before, after in zip(kept, (x, u, b), strict=True):
        np.testing.assert_array_equal(before, after)


def test_chunks_of_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scratch too small for one image: each image is its own chunk, same numbers."""
    x, weights, b = frozen(5, 4, 9, 10, seed=1), frozen(6, 4, 3, 3, seed=2), frozen(6, seed=3)
    want = winograd(x, winograd_weights(weights), b, [1, 0, 1, 2])
    monkeypatch.setattr(winograd_ops, "_SCRATCH_ELEMENTS", 1)
    got = winograd(x, winograd_weights(weights), b, [1, 0, 1, 2])
    np.testing.assert_array_equal(got, want)
    assert_close(got, conv(x, weights, b, [1, 0, 1, 2]))


def test_accuracy_against_float64() -> None:
    """Realistic data (He-scaled weights, ReLU-like input): within 1e-5 of a float64 Conv
    relative to the output's scale, like the float32 Conv kernel."""
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal((2, 48, 20, 20)), 0).astype(np.float32)
    w = (rng.standard_normal((40, 48, 3, 3)) * math.sqrt(2 / (9 * 48))).astype(np.float32)
    b = (0.1 * rng.standard_normal(40)).astype(np.float32)
    want = conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), [1] * 4)
    scale = np.max(np.abs(want))
    assert np.max(np.abs(winograd(x, winograd_weights(w), b, [1] * 4) - want)) < 1e-5 * scale
    assert np.max(np.abs(conv(x, w, b, [1] * 4) - want)) < 1e-5 * scale


def test_weight_transform() -> None:
    w = frozen(4, 3, 3, 3, seed=5)
    u = winograd_weights(w)
    assert u.shape == (16, 4, 3) and u.dtype == np.float32 and u.flags.c_contiguous
    for out_channel, in_channel in [(0, 0), (3, 2), (1, 2)]:
        g = w[out_channel, in_channel].astype(np.float64)
        want = (G @ g @ G.T).reshape(16)
        np.testing.assert_allclose(u[:, out_channel, in_channel], want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"\(Cout, Cin, 3, 3\)"):
        winograd_weights(np.zeros((4, 3, 5, 5), dtype=np.float32))


def test_refuses_other_dtypes_and_bad_pads() -> None:
    f32, f16, f64 = np.dtype("float32"), np.dtype("float16"), np.dtype("float64")
    pads = WINOGRAD.parse_attrs({"pads": [1, 1, 1, 1]})
    WINOGRAD.check_support([f32, f32, f32], pads)
    WINOGRAD.check_support([f32, f32], WINOGRAD.parse_attrs({}))
    refused: list[list[np.dtype]] = [[f16, f16], [f64, f64, f64], [f32, f32, f64], [f16, f32]]
    for dtypes in refused:
        with pytest.raises(ValueError, match="does not implement"):
            WINOGRAD.check_support(dtypes, pads)
    for bad in ([1, 1, 1], [0, -1, 0, 0]):
        with pytest.raises(ValueError, match="pads"):
            WINOGRAD.check_support([f32, f32], WINOGRAD.parse_attrs({"pads": bad}))


def test_refuses_shapes_that_do_not_fit() -> None:
    x, u = frozen(1, 3, 4, 4, seed=1), winograd_weights(frozen(2, 3, 3, 3, seed=2))
    with pytest.raises(ValueError, match="U"):
        winograd(x, winograd_weights(frozen(2, 4, 3, 3, seed=3)), None, [0] * 4)
    with pytest.raises(ValueError, match="B has shape"):
        winograd(x, u, frozen(3, seed=4), [0] * 4)
    with pytest.raises(ValueError, match="exceeds"):
        winograd(frozen(1, 3, 2, 4, seed=5), u, None, [0] * 4)


def test_macs_are_the_gemms() -> None:
    """16 * Cout * Cin per tile the GEMMs compute: (th + 1) x (tw + 1) per image for th x tw
    output tiles (one junk tile row and column); ResNet's 64@56 does 2.1x fewer than
    Conv's 9 * Cout * Cin per output pixel."""
    pads = WINOGRAD.parse_attrs({"pads": [1, 1, 1, 1]})
    assert WINOGRAD.macs([(3, 5, 7, 8), (16, 6, 5)], [(3, 6, 7, 8)], pads) == 16 * 6 * 5 * 3 * 5 * 5
    ours = WINOGRAD.macs([(1, 64, 56, 56), (16, 64, 64)], [(1, 64, 56, 56)], pads)
    conv_attrs = KERNELS["Conv"].parse_attrs({"pads": [1, 1, 1, 1]})
    direct = KERNELS["Conv"].macs([(1, 64, 56, 56), (64, 64, 3, 3)], [(1, 64, 56, 56)], conv_attrs)
    assert ours == 16 * 64 * 64 * 29 * 29 and 2.0 < direct / ours < 2.2


def test_program_runs_it() -> None:
    x, w, b = frozen(2, 3, 6, 5, seed=11), frozen(4, 3, 3, 3, seed=12), frozen(4, seed=13)
    program = NcProgram(
        [Instr("WinogradConv", ("x", "u", "b"), ("y",), {"pads": [1, 1, 1, 1]})],
        {"u": winograd_weights(w), "b": b},
        ["x"],
        ["y"],
    )
    loaded = load_program("t", program)
    y = np.empty((2, 4, 6, 5), dtype=np.float32)
    execute_program(loaded, {"x": x}, {"y": y})
    assert_close(y, conv(x, w, b, [1, 1, 1, 1]))


def test_pays_on_resnet_shapes() -> None:
    """The measured rule: the rewrite pays on ResNet-18's 3x3 convs at 14x14 and larger,
    not at 7x7 (where the tile grid is mostly junk), nor on few channels, nor on GEMMs of
    few tiles."""
    for batch in (1, 8):
        assert winograd_pays(batch, 64, 64, 56, 56)
        assert winograd_pays(batch, 128, 128, 28, 28)
        assert winograd_pays(batch, 256, 256, 14, 14)
        assert not winograd_pays(batch, 512, 512, 7, 7)
        assert winograd_pays(batch, 16, 24, 28, 28)
        assert not winograd_pays(batch, 8, 64, 56, 56)
    assert not winograd_pays(1, 128, 128, 8, 8)  # 25 tiles per GEMM
    assert winograd_pays(2, 128, 128, 8, 8)
