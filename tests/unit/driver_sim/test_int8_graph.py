"""The fast engine's int8 graph (driver_sim/int8_graph.py) gives the NC's exact integers on
inputs that make saturating int16 pair sums differ: uint8 activations near 255 (int8 near
127 with zero point -128) times int8 weights at +-127 and -128, whose pairs reach
2 * 255 * 128 = 65280; and the NC's float functions of int8 tensors (a table, a softmax, a
layer norm) and quantized Add and Mul give its bits. Checked here on this CPU, and on a CPU
without VNNI or AMX (`qemu-x86_64 -cpu Haswell`, where onnxruntime's uint8 x int8 kernels
use vpmaddubsw and the same products written plainly come out wrong): the arithmetic is the
rewrite's, not the CPU's.

Run as a script (`python test_int8_graph.py`), it prints each case's count of outputs that
differ from the reference kernels, and the plain product's, as JSON: what the qemu test
reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import driver_sim
from driver_sim.int8_graph import PRODUCTS
from driver_sim.onnx_graph import _tensor_types, to_onnx
from neuron_rtd import onnxrt

Instr = driver_sim.Instr
_RNG = np.random.default_rng(11)


def _weights(*shape: int) -> np.ndarray:
    return _RNG.choice(np.array([-128, -127, 127, 126], np.int8), size=shape)


def _near_top(*shape: int, dtype: Any = np.int8) -> np.ndarray:
    top = 127 if dtype == np.int8 else 255
    return _RNG.integers(top - 6, top + 1, size=shape).astype(dtype)


def _scalars(**values: tuple[float | int, Any]) -> dict[str, np.ndarray]:
    return {name: np.array(value, dtype) for name, (value, dtype) in values.items()}


_CONV_Q = _scalars(
    xs=(0.02, np.float32), xz=(-128, np.int8), ws=(0.01, np.float32), wz=(0, np.int8),
    ys=(3.0, np.float32), yz=(-10, np.int8),
)  # fmt: skip


def _conv(group: int) -> tuple[driver_sim.NcProgram, dict[str, np.ndarray]]:
    """int8 X in, QLinearConv (3x3, pad 1), MaxPool, int8 out: the graph's edges convert."""
    channels = 16
    weights = {**_CONV_Q, "w": _weights(channels, channels // group, 3, 3)}
    program = driver_sim.NcProgram(
        [
            Instr(
                "QLinearConv",
                ("x", "xs", "xz", "w", "ws", "wz", "ys", "yz"),
                ("c",),
                {"pads": [1, 1, 1, 1], "group": group},
            ),
            Instr("MaxPool", ("c",), ("y",), {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ],
        weights,
        ["x"],
        ["y", "c"],
    )
    return program, {"x": _near_top(1, channels, 6, 6)}


def _quantized_chain() -> tuple[driver_sim.NcProgram, dict[str, np.ndarray]]:
    """float in: QuantizeLinear, QLinearConv, QLinearAdd with its input, Flatten, QGemm
    (B transposed, per output column), DequantizeLinear: float out."""
    q = {**_CONV_Q, "gs": np.array(0.5, np.float32), "gz": np.array(3, np.int8)}
    weights = {
        **q,
        "w": _weights(8, 8, 3, 3),
        "b": _weights(5, 8 * 4 * 4),
        "bs": np.full(5, 0.01, np.float32),
        "bz": np.zeros(5, np.int8),
    }
    program = driver_sim.NcProgram(
        [
            Instr("QuantizeLinear", ("x", "xs", "xz"), ("q",)),
            Instr(
                "QLinearConv",
                ("q", "xs", "xz", "w", "ws", "wz", "ys", "yz"),
                ("c",),
                {"pads": [1, 1, 1, 1]},
            ),
            Instr("QLinearAdd", ("c", "ys", "yz", "q", "xs", "xz", "ys", "yz"), ("s",)),
            Instr("Flatten", ("s",), ("f",)),
            Instr(
                "QGemm", ("f", "ys", "yz", "b", "bs", "bz", "", "gs", "gz"), ("g",), {"transB": 1}
            ),
            Instr("DequantizeLinear", ("g", "gs", "gz"), ("y",)),
        ],
        weights,
        ["x"],
        ["y"],
    )
    x = _near_top(2, 8, 4, 4).astype(np.float32) * np.float32(0.02) + np.float32(2.5)
    return program, {"x": x}


def _matmuls() -> tuple[driver_sim.NcProgram, dict[str, np.ndarray]]:
    """uint8 A by constant int8 B (QLinearMatMul, per column, and MatMulInteger), and int8
    A by int8 B computed (B from a second input)."""
    q = _scalars(
        s=(0.02, np.float32), z=(0, np.uint8), ys=(40.0, np.float32), yz=(128, np.uint8),
        iz=(-128, np.int8), iys=(20000.0, np.float32), iyz=(0, np.int8),
    )  # fmt: skip
    weights = {**q, "w": _weights(36, 8), "ws": np.full(8, 0.02, np.float32)}
    weights["wz"] = np.zeros(8, np.int8)
    program = driver_sim.NcProgram(
        [
            Instr("QLinearMatMul", ("a", "s", "z", "w", "ws", "wz", "ys", "yz"), ("y",)),
            Instr("MatMulInteger", ("a", "w", "z"), ("sums",)),
            Instr("QLinearMatMul", ("i", "s", "iz", "j", "s", "iz", "iys", "iyz"), ("p",)),
        ],
        weights,
        ["a", "i", "j"],
        ["y", "sums", "p"],
    )
    feeds = {
        "a": _near_top(4, 36, dtype=np.uint8),
        "i": _near_top(4, 36),
        "j": _RNG.choice(np.array([-128, 127], np.int8), size=(36, 8)),
    }
    return program, feeds


def _functions() -> tuple[driver_sim.NcProgram, dict[str, np.ndarray]]:
    """The NC's float functions of int8 tensors and onnxruntime's quantized Add and Mul
    (broadcast), on int8 and uint8: a lookup, a softmax along a middle axis, a layer norm
    quantized and one in float."""
    q = _scalars(
        s=(0.05, np.float32), z=(-3, np.int8), ys=(1 / 256, np.float32), yz=(-128, np.int8),
        us=(0.03, np.float32), uz=(100, np.uint8), ns=(0.02, np.float32), nz=(5, np.int8),
    )  # fmt: skip
    weights = {
        **q,
        "table": _RNG.integers(-128, 128, 256).astype(np.int8),
        "utable": _RNG.integers(0, 256, 256).astype(np.uint8),
        "gamma": _RNG.standard_normal(24).astype(np.float32),
        "beta": _RNG.standard_normal(24).astype(np.float32),
        "row": _RNG.integers(-128, 128, (1, 24)).astype(np.int8),
    }
    ln = {"axis": -1, "epsilon": 1e-3}
    program = driver_sim.NcProgram(
        [
            Instr("QuantizedLookup", ("x", "table"), ("looked",)),
            Instr("QuantizedLookup", ("u", "utable"), ("ulooked",)),
            Instr("QuantizedSoftmax", ("x", "s", "ys", "yz"), ("soft",), {"axis": -2}),
            Instr("QuantizedLayerNorm", ("x", "s", "z", "gamma", "beta", "ns", "nz"), ("n",), ln),
            Instr("QuantizedLayerNorm", ("x", "s", "z", "gamma"), ("f",), ln),
            Instr("QLinearAdd", ("x", "s", "z", "row", "ns", "nz", "s", "z"), ("sum",)),
            Instr("QLinearMul", ("x", "s", "z", "row", "ns", "nz", "ys", "yz"), ("product",)),
            Instr("QLinearAdd", ("u", "us", "uz", "u", "us", "uz", "us", "uz"), ("usum",)),
            Instr("QLinearSigmoid", ("x", "s", "z", "ys", "yz"), ("sig",)),
            Instr("QLinearLeakyRelu", ("u", "us", "uz", "us", "uz"), ("leaky",), {"alpha": 0.3}),
        ],
        weights,
        ["x", "u"],
        ["looked", "ulooked", "soft", "n", "f", "sum", "product", "usum", "sig", "leaky"],
    )
    feeds = {
        "x": _RNG.integers(-128, 128, (3, 40, 24)).astype(np.int8),
        "u": _RNG.integers(0, 256, (3, 40, 24)).astype(np.uint8),
    }
    return program, feeds


def _concat_and_pool() -> tuple[driver_sim.NcProgram, dict[str, np.ndarray]]:
    """onnxruntime's ops whose outputs type inference cannot see (QLinearConcat's first
    input is a float scale; a pool's zero point has no rank) feeding products: ShuffleNet's
    concatenation into a conv, a pooled, flattened tensor into a QGemm."""
    q = {**_CONV_Q, "gs": np.array(0.5, np.float32), "gz": np.array(3, np.int8)}
    weights = {
        **q,
        "w": _weights(8, 16, 1, 1),
        "b": _weights(5, 8),
        "bs": np.full(5, 0.01, np.float32),
        "bz": np.zeros(5, np.int8),
    }
    conv = ("c", "xs", "xz", "w", "ws", "wz", "ys", "yz")
    program = driver_sim.NcProgram(
        [
            Instr(
                "QLinearConcat", ("xs", "xz", "x", "xs", "xz", "x", "xs", "xz"), ("c",), {"axis": 1}
            ),
            Instr("QLinearConv", conv, ("y",)),
            Instr("QLinearGlobalAveragePool", ("y", "ys", "yz", "ys", "yz"), ("p",)),
            Instr("Flatten", ("p",), ("f",)),
            Instr(
                "QGemm", ("f", "ys", "yz", "b", "bs", "bz", "", "gs", "gz"), ("g",), {"transB": 1}
            ),
        ],
        weights,
        ["x"],
        ["g"],
    )
    return program, {"x": _near_top(2, 8, 4, 4)}


CASES: dict[str, Callable[[], tuple[driver_sim.NcProgram, dict[str, np.ndarray]]]] = {
    "conv": lambda: _conv(1),
    "grouped conv": lambda: _conv(4),
    "depthwise conv": lambda: _conv(16),
    "quantized chain": _quantized_chain,
    "matmuls": _matmuls,
    "functions": _functions,
    "concat and pool": _concat_and_pool,
}


def _fast_model(program: driver_sim.NcProgram, feeds: dict[str, np.ndarray]) -> Any:
    loaded = driver_sim.load_program("test", program)
    types = tuple((str(feeds[name].dtype), feeds[name].ndim) for name in program.inputs)
    return loaded, to_onnx(loaded, types, 17)


def differences(name: str) -> int:
    """How many outputs of case `name` the fast engine's graph, run on onnxruntime, gives
    otherwise than the reference kernels."""
    program, feeds = CASES[name]()
    loaded, model = _fast_model(program, feeds)
    session = onnxrt.session(model, fuse_qdq=False)  # as the fast engine makes it
    fast = dict(zip(program.outputs, session.run(list(program.outputs), feeds), strict=True))
    want = {name: np.empty_like(value) for name, value in fast.items()}
    driver_sim.execute_program(loaded, feeds, want)
    for out, value in fast.items():
        assert value.dtype == want[out].dtype, (name, out, value.dtype, want[out].dtype)
    return sum(int(np.sum(fast[out] != want[out])) for out in fast)


def plain_differences() -> int:
    """How many outputs of the conv case's QLinearConv, written as it is (uint8 X near 255,
    full-range int8 W) and run on onnxruntime, differ from the exact integers: the
    saturating kernels' mark, 0 where the CPU sums uint8 x int8 exactly (VNNI, AMX)."""
    program, feeds = _conv(1)
    w = program.weights
    x = (feeds["x"].astype(np.int16) + 128).astype(np.uint8)
    inits = {**w, "xz": np.array(0, np.uint8), "yz": np.array(118, np.uint8)}
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    graph = helper.make_graph(
        [helper.make_node("QLinearConv", names, ["y"], pads=[1, 1, 1, 1])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(inits[n], n) for n in names[1:]],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, {"x": x})[0]
    want = np.empty((1, 16, 6, 6), np.int8)
    conv_only = driver_sim.NcProgram([program.instructions[0]], w, ["x"], ["c"])
    driver_sim.execute_program(driver_sim.load_program("test", conv_only), feeds, {"c": want})
    return int(np.sum(got != (want.astype(np.int16) + 128).astype(np.uint8)))


@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_graph_gives_the_exact_integers(name: str) -> None:
    assert differences(name) == 0


@pytest.mark.parametrize("name", list(CASES))
def test_every_product_is_uint8_by_int8_within_64_or_by_uint8(name: str) -> None:
    """The construction, read off the graph: no product is left whose pairs can saturate."""
    program, feeds = CASES[name]()
    _, model = _fast_model(program, feeds)
    types = _tensor_types(model)  # as the fast engine reads them (initializers too)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in [n for n in model.graph.node if n.op_type in PRODUCTS]:
        b = PRODUCTS[node.op_type]
        assert types[node.input[0]] == TensorProto.UINT8, (node.op_type, node.input[0])
        if types[node.input[b]] == TensorProto.INT8:
            assert np.abs(inits[node.input[b]].astype(np.int16)).max() <= 64
            assert not np.any(inits[node.input[b + 2]]), "split weights have zero point 0"
        else:
            assert types[node.input[b]] == TensorProto.UINT8, (node.op_type, node.input[b])


def test_on_a_cpu_without_vnni_the_fast_graph_is_exact_where_plain_products_saturate() -> None:
    """Under qemu as a Haswell (AVX2, no VNNI or AMX), the plain uint8 x int8 product of
    these values comes out wrong (its pairs saturate) and every case of the fast graph
    exact."""
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-user is installed by scripts/bootstrap.sh"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, __file__],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts.pop("plain product") > 0, "the values must make saturating pairs differ"
    assert counts == dict.fromkeys(CASES, 0)


if __name__ == "__main__":
    found = {name: differences(name) for name in CASES}
    print(json.dumps({**found, "plain product": plain_differences()}))
