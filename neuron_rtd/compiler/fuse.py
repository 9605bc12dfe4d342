"""Fusing op patterns into single NC instructions, as a real compiler does.

- GELU written out with Erf, x * 0.5 * (1 + erf(x / sqrt(2))) in its usual orders,
  becomes one Gelu instruction (five passes over the tensor become one).
- MatMul followed by the Add of a constant bias along the last axis becomes one MatMulBias
  instruction, which adds the bias in place into the fresh product.

- QDQ: an op whose inputs are DequantizeLinear outputs and whose output only a
  QuantizeLinear reads (a Relu or Clip between folded where the output's range already
  clips as they would) becomes the int8 instruction that computes it on the quantized
  tensors, as onnxruntime's own QDQ fusion does: QLinearConv, QLinearMatMul, and
  onnxruntime's QGemm, QLinearAdd, QLinearMul, QLinearGlobalAveragePool,
  QLinearAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu; an op that only
  moves data (Reshape, Flatten, Transpose, MaxPool...) between a DequantizeLinear and a
  QuantizeLinear of the same scale and zero point runs on the quantized tensor. The
  DequantizeLinear nodes no one reads any more go; the others (a model's first
  QuantizeLinear, its last DequantizeLinear) run as the NC's kernels of those ops.

Fused nodes are in the compiler's own domain (`INTERNAL_DOMAIN`) or in onnxruntime's
(`CONTRIB_DOMAIN`, its quantized ops) or are ONNX ops: a pattern is fused only when the NC
can run every op of it, and every intermediate has no other reader and is no model output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper

from driver_sim.ops.quant import CONTRIB_DOMAIN
from neuron_rtd.compiler.onnx_graph import Graph, TensorType, node_inputs

INTERNAL_DOMAIN = "ai.neuron_rtd"

# float op -> (its quantized op, that op's domain) for ops of one quantized input
_QUANTIZED_UNARY = {
    "GlobalAveragePool": ("QLinearGlobalAveragePool", CONTRIB_DOMAIN),
    "AveragePool": ("QLinearAveragePool", CONTRIB_DOMAIN),
    "Sigmoid": ("QLinearSigmoid", CONTRIB_DOMAIN),
    "LeakyRelu": ("QLinearLeakyRelu", CONTRIB_DOMAIN),
}
_QUANTIZED_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}
# Ops that move or select values: they run on the quantized tensor as they are.
_DATA_MOVEMENT = frozenset(
    {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Identity"}
)
_QDQ_OPS = frozenset(
    {"Conv", "MatMul", "Gemm", "Concat", *_QUANTIZED_UNARY, *_QUANTIZED_BINARY, *_DATA_MOVEMENT}
)


class _Quantized(NamedTuple):
    """A quantized tensor: its integer tensor's name, its scale's and zero point's."""

    tensor: str
    scale: str
    zero_point: str


def fuse(graph: Graph, nc_can_run: Callable[[onnx.NodeProto], bool]) -> None:
    """Apply every fusion to `graph` in place."""
    Fuser(graph, nc_can_run).run()


class Fuser:
    def __init__(self, graph: Graph, nc_can_run: Callable[[onnx.NodeProto], bool]) -> None:
        self.graph = graph
        self.nc_can_run = nc_can_run
        self.producer = {out: node for node in graph.nodes for out in node.output if out}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.nodes:
            for name in node_inputs(node):
                self.readers.setdefault(name, []).append(node)
        self.replaced: dict[int, onnx.NodeProto | None] = {}  # id(node) -> new node or None

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if id(node) in self.replaced:
                continue
            if node.op_type == "Erf":
                self._gelu(node)
            elif node.op_type in _QDQ_OPS and node.domain in ("", "ai.onnx"):
                self._qdq(node)
            if node.op_type == "MatMul" and id(node) not in self.replaced:
                self._matmul_bias(node)
        self.finish()

    def finish(self) -> None:
        """The graph's nodes with the fused ones in place, the DequantizeLinear nodes no
        one reads any more gone."""
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.nodes:
            new = self.replaced.get(id(node), node)
            if new is not None:
                nodes.append(new)
        self.graph.nodes = _without_unread_dequantize(nodes, self.graph.outputs)

    # --- helpers --------------------------------------------------------------------
    def const(self, name: str) -> float | None:
        value = self.graph.consts.get(name)
        if value is None or value.size != 1:
            return None
        return float(np.asarray(value).reshape(()))

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        """The one node reading `name`, if it has exactly one and is no model output."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.graph.outputs:
            return None
        return readers[0]

    def other_input(self, node: onnx.NodeProto, name: str) -> str | None:
        if node.op_type not in ("Add", "Mul", "Sub", "Div") or len(node.input) != 2:
            return None
        a, b = node.input
        if a == name:
            return b
        return a if b == name else None

    def commit(self, chain: list[onnx.NodeProto], fused: onnx.NodeProto) -> bool:
        if not all(self.nc_can_run(node) for node in chain) or not self.nc_can_run(fused):
            return False
        if any(id(node) in self.replaced for node in chain):
            return False
        # The fused node takes the place of the last node of the chain (its output's
        # position in the order), the others go.
        for node in chain[:-1]:
            self.replaced[id(node)] = None
        self.replaced[id(chain[-1])] = fused
        return True

    # --- GELU ---------------------------------------------------------------------------
    def _gelu(self, erf: onnx.NodeProto) -> None:
        scaled = self.producer.get(erf.input[0])
        if scaled is None or self.only_reader(erf.input[0]) is not erf:
            return
        x = self._gelu_input(scaled)
        if x is None:
            return
        plus = self.only_reader(erf.output[0])
        if (
            plus is None
            or plus.op_type != "Add"
            or self.const(self.other_input(plus, erf.output[0]) or "") != 1.0
        ):
            return
        chain = [scaled, erf, plus]
        tail = self._gelu_tail(x, plus, chain)
        if tail is None:
            return
        fused = helper.make_node(
            "Gelu", [x], [tail.output[0]], name=f"{tail.name}.gelu", domain=INTERNAL_DOMAIN
        )
        self.commit([*chain, tail], fused)

    def _gelu_input(self, scaled: onnx.NodeProto) -> str | None:
        """x of x / sqrt(2) or x * (1 / sqrt(2))."""
        if scaled.op_type == "Div" and len(scaled.input) == 2:
            value = self.const(scaled.input[1])
            if value is not None and math.isclose(value, math.sqrt(2.0), rel_tol=1e-6):
                return scaled.input[0]
        if scaled.op_type == "Mul" and len(scaled.input) == 2:
            for x, c in (scaled.input, scaled.input[::-1]):
                value = self.const(c)
                if value is not None and math.isclose(value, 1 / math.sqrt(2.0), rel_tol=1e-6):
                    return x
        return None

    def _gelu_tail(
        self, x: str, plus: onnx.NodeProto, chain: list[onnx.NodeProto]
    ) -> onnx.NodeProto | None:
        """The last Mul of x * (1 + erf) * 0.5 or (x * 0.5) * (1 + erf); `chain` gets the
        Muls before it."""
        mul = self.only_reader(plus.output[0])
        if mul is None or mul.op_type != "Mul":
            return None
        other = self.other_input(mul, plus.output[0])
        if other == x:  # (x * (1 + erf)) * 0.5
            half = self.only_reader(mul.output[0])
            if half is None or half.op_type != "Mul":
                return None
            if self.const(self.other_input(half, mul.output[0]) or "") != 0.5:
                return None
            chain.append(mul)
            return half
        halver = self.producer.get(other or "")
        if halver is None or halver.op_type != "Mul" or self.only_reader(other or "") is not mul:
            return None
        if self.const(self.other_input(halver, x) or "") == 0.5:  # (x * 0.5) * (1 + erf)
            chain.insert(0, halver)
            return mul
        return None

    # --- MatMul + bias ------------------------------------------------------------------
    def _matmul_bias(self, matmul: onnx.NodeProto) -> None:
        product = matmul.output[0]
        add = self.only_reader(product)
        if add is None or add.op_type != "Add":
            return
        bias = self.other_input(add, product)
        value = self.graph.consts.get(bias or "")
        out_type = self.graph.types.get(product)
        if value is None or bias is None or out_type is None or not out_type.static:
            return
        shape = out_type.static_shape or ()
        if value.ndim != 1 or not shape or value.shape[0] != shape[-1]:
            return
        if self.graph.types.get(add.output[0]) != out_type or value.dtype != out_type.dtype:
            return
        fused = helper.make_node(
            "MatMulBias",
            [matmul.input[0], matmul.input[1], bias],
            [add.output[0]],
            name=f"{matmul.name}.bias",
            domain=INTERNAL_DOMAIN,
        )
        self.commit([matmul, add], fused)

    # --- QDQ ------------------------------------------------------------------------------
    def _qdq(self, node: onnx.NodeProto) -> None:
        if len(node.output) != 1 and node.op_type != "MaxPool":
            return
        tail = self._quantize_after(node)
        if tail is None:
            return
        chain, out = tail
        if node.op_type in _DATA_MOVEMENT:
            fused = self._moved(node, out)
        elif node.op_type == "Conv":
            fused = self._qlinear_conv(node, out)
        elif node.op_type == "MatMul":
            fused = self._qlinear_matmul(node, out)
        elif node.op_type == "Gemm":
            fused = self._qgemm(node, out)
        elif node.op_type == "Concat":
            fused = self._qlinear_concat(node, out)
        elif node.op_type in _QUANTIZED_BINARY:
            fused = self._quantized_op(node, out, _QUANTIZED_BINARY[node.op_type], 2)
        else:
            fused = self._quantized_op(node, out, _QUANTIZED_UNARY[node.op_type][0], 1)
        if fused is not None:
            self.commit([node, *chain], fused)

    def _quantize_after(
        self, node: onnx.NodeProto
    ) -> tuple[list[onnx.NodeProto], _Quantized] | None:
        """The nodes after `node` up to the QuantizeLinear (per tensor) that only reads
        its output (through a Relu or Clip that the quantization already clips as they
        would), and that QuantizeLinear's output; None if there is none."""
        chain: list[onnx.NodeProto] = []
        reader = self.only_reader(node.output[0])
        if reader is not None and reader.op_type in ("Relu", "Clip"):
            chain.append(reader)
            reader = self.only_reader(reader.output[0])
        if reader is None or reader.op_type != "QuantizeLinear" or len(reader.input) < 2:
            return None
        scale = self.graph.consts.get(reader.input[1])
        zero = self._zero_point(reader)
        if scale is None or zero is None or scale.size != 1 or zero.size != 1:
            return None
        if chain and not self._clips_anyway(chain[0], float(scale.reshape(())), zero):
            return None
        out = _Quantized(reader.output[0], reader.input[1], self._zero_point_name(reader, zero))
        return [*chain, reader], out

    def _zero_point(self, node: onnx.NodeProto) -> np.ndarray | None:
        """The constant zero point of a QuantizeLinear or DequantizeLinear (uint8 0 when
        absent)."""
        if len(node.input) > 2 and node.input[2]:
            return self.graph.consts.get(node.input[2])
        for attr in node.attribute:
            if attr.name == "output_dtype" and attr.i:
                return np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(attr.i))
        return np.zeros((), dtype=np.uint8)

    def _zero_point_name(self, node: onnx.NodeProto, zero: np.ndarray) -> str:
        if len(node.input) > 2 and node.input[2]:
            return node.input[2]
        return self.constant(f"{node.name}.zero_point", zero)

    def constant(self, name: str, value: np.ndarray) -> str:
        """A new constant tensor of the graph."""
        while name in self.graph.consts or name in self.graph.types:
            name += "_"
        self.graph.consts[name] = value
        self.graph.types[name] = TensorType(value.dtype, tuple(value.shape))
        return name

    def _clips_anyway(self, node: onnx.NodeProto, scale: float, zero: np.ndarray) -> bool:
        """Whether quantizing with `scale` and `zero` already clips as Relu or Clip
        `node` does: its bounds quantize to the ends of the integer range or beyond."""
        info = np.iinfo(zero.dtype)
        low: float | None = 0.0
        high: float | None = math.inf
        if node.op_type == "Clip":
            low = self._bound(node, 1, "min", -math.inf)
            high = self._bound(node, 2, "max", math.inf)
        if low is None or high is None:
            return False
        offset = float(zero.reshape(()))
        return round(low / scale) + offset <= info.min and round(high / scale) + offset >= info.max

    def _bound(self, node: onnx.NodeProto, index: int, attr: str, default: float) -> float | None:
        if len(node.input) > index and node.input[index]:
            return self.const(node.input[index])
        for a in node.attribute:
            if a.name == attr:
                return float(a.f)
        return default

    def dequantized(self, name: str, axis_ok: Sequence[int] = ()) -> _Quantized | None:
        """`name` as the output of a DequantizeLinear with constant scale and zero point,
        per tensor (or per axis, along one of `axis_ok` as a non-negative axis)."""
        dq = self.producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 2:
            return None
        if any(a.name == "block_size" and a.i for a in dq.attribute):
            return None
        scale = self.graph.consts.get(dq.input[1])
        zero = self._zero_point(dq)
        if scale is None or zero is None:
            return None
        if scale.size != 1 or zero.size != 1:
            kind = self.graph.types.get(dq.input[0])
            rank = len(kind.shape) if kind is not None and kind.shape is not None else 0
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            if not rank or (axis + rank if axis < 0 else axis) not in axis_ok:
                return None
        if self.graph.types.get(dq.input[0]) is None:
            return None
        if zero.dtype.name not in ("int8", "uint8"):
            return None
        zero_name = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
        if zero_name is None:
            zero_name = self.constant(
                f"{dq.name}.zero_point", zero.astype(self.graph.types[dq.input[0]].dtype)
            )
        return _Quantized(dq.input[0], dq.input[1], zero_name)

    def _quantized_bias(self, name: str, x: _Quantized, w: _Quantized) -> str | None:
        """An int32 bias from a DequantizeLinear whose scale is x's times w's."""
        dq = self.producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in self.graph.consts:
            return None
        bias = self.graph.consts[dq.input[0]]
        scale = self.graph.consts.get(dq.input[1])
        zero = self._zero_point(dq)
        if bias.dtype != np.int32 or scale is None or zero is None or np.any(zero != 0):
            return None
        wanted = self.graph.consts[x.scale].astype(np.float32) * self.graph.consts[w.scale]
        if not np.allclose(scale.reshape(-1), wanted.reshape(-1), rtol=1e-5, atol=0):
            return None
        return dq.input[0]

    def _moved(self, node: onnx.NodeProto, out: _Quantized) -> onnx.NodeProto | None:
        x = self.dequantized(node.input[0])
        if x is None or not self._same_quantization(x, out):
            return None
        if node.op_type == "MaxPool" and len([o for o in node.output if o]) != 1:
            return None
        return _like(node, [x.tensor, *node.input[1:]], [out.tensor], "")

    def _same_quantization(self, a: _Quantized, b: _Quantized) -> bool:
        consts = self.graph.consts
        za, zb = consts[a.zero_point], consts[b.zero_point]
        return (
            za.dtype == zb.dtype
            and bool(np.all(za == zb))
            and bool(np.all(consts[a.scale] == consts[b.scale]))
        )

    def _qlinear_conv(self, node: onnx.NodeProto, out: _Quantized) -> onnx.NodeProto | None:
        x = self.dequantized(node.input[0])
        w = self.dequantized(node.input[1], axis_ok=(0,))
        if x is None or w is None:
            return None
        inputs = [*x, *w, out.scale, out.zero_point]
        if len(node.input) > 2 and node.input[2]:
            bias = self._quantized_bias(node.input[2], x, w)
            if bias is None:
                return None
            inputs.append(bias)
        return _like(node, inputs, [out.tensor], "", "QLinearConv")

    def _qlinear_matmul(self, node: onnx.NodeProto, out: _Quantized) -> onnx.NodeProto | None:
        kind = self.graph.types.get(node.input[1])
        rank = len(kind.shape) if kind is not None and kind.shape is not None else 0
        a = self.dequantized(node.input[0])
        b = self.dequantized(node.input[1], axis_ok=(rank - 1,) if rank else ())
        if a is None or b is None:
            return None
        return _like(node, [*a, *b, out.scale, out.zero_point], [out.tensor], "", "QLinearMatMul")

    def _qgemm(self, node: onnx.NodeProto, out: _Quantized) -> onnx.NodeProto | None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("beta", 1.0) != 1.0:
            return None
        a = self.dequantized(node.input[0])
        b = self.dequantized(node.input[1], axis_ok=(0 if attrs.get("transB", 0) else 1,))
        if a is None or b is None:
            return None
        bias = ""
        if len(node.input) > 2 and node.input[2]:
            bias = self._quantized_bias(node.input[2], a, b) or ""
            if not bias:
                return None
        inputs = [*a, *b, bias, out.scale, out.zero_point]
        fused = _like(node, inputs, [out.tensor], CONTRIB_DOMAIN, "QGemm")
        del fused.attribute[:]
        for name in ("alpha", "transA", "transB"):
            if name in attrs:
                fused.attribute.append(helper.make_attribute(name, attrs[name]))
        return fused

    def _qlinear_concat(self, node: onnx.NodeProto, out: _Quantized) -> onnx.NodeProto | None:
        parts = [self.dequantized(name) for name in node.input]
        if any(p is None for p in parts):
            return None
        inputs = [out.scale, out.zero_point]
        for part in parts:
            assert part is not None
            inputs.extend(part)
        return _like(node, inputs, [out.tensor], CONTRIB_DOMAIN, "QLinearConcat")

    def _quantized_op(
        self, node: onnx.NodeProto, out: _Quantized, op: str, arity: int
    ) -> onnx.NodeProto | None:
        if len(node.input) != arity:
            return None
        parts = [self.dequantized(name) for name in node.input]
        if any(p is None for p in parts):
            return None
        inputs: list[str] = []
        for part in parts:
            assert part is not None
            inputs.extend(part)
        return _like(node, [*inputs, out.scale, out.zero_point], [out.tensor], CONTRIB_DOMAIN, op)


def _like(
    node: onnx.NodeProto,
    inputs: Sequence[str],
    outputs: Sequence[str],
    domain: str,
    op: str | None = None,
) -> onnx.NodeProto:
    """A node of `op` (`node`'s own op when None) with `node`'s attributes."""
    fused = helper.make_node(
        op or node.op_type, list(inputs), list(outputs), name=f"{node.name}.int8", domain=domain
    )
    fused.attribute.extend(node.attribute)
    return fused


def _without_unread_dequantize(
    nodes: list[onnx.NodeProto], outputs: Sequence[str]
) -> list[onnx.NodeProto]:
    """`nodes` less the DequantizeLinear nodes whose output no node reads (QDQ fusion
    took their readers) and is no model output."""
    read = {name for node in nodes for name in node_inputs(node)} | set(outputs)
    return [
        node
        for node in nodes
        if node.op_type != "DequantizeLinear" or any(out in read for out in node.output)
    ]
