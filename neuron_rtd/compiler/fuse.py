"""Fusing op patterns into single NC instructions, as a real compiler does.

- GELU written out with Erf, x * 0.5 * (1 + erf(x / sqrt(2))) in its usual orders,
  becomes one Gelu instruction (five passes over the tensor become one).
- MatMul followed by the Add of a constant bias along the last axis becomes one MatMulBias
  instruction, which adds the bias in place into the fresh product.

Fused nodes are in the compiler's own domain (`INTERNAL_DOMAIN`): they exist only on the
NC, so a pattern is fused only when the NC can run every op of it, and every intermediate
has no other reader and is no model output.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from neuron_rtd.compiler.onnx_graph import Graph, node_inputs

INTERNAL_DOMAIN = "ai.neuron_rtd"


def fuse(graph: Graph, nc_can_run: Callable[[onnx.NodeProto], bool]) -> None:
    """Apply every fusion to `graph` in place."""
    _Fuser(graph, nc_can_run).run()


class _Fuser:
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
            elif node.op_type == "MatMul":
                self._matmul_bias(node)
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.nodes:
            new = self.replaced.get(id(node), node)
            if new is not None:
                nodes.append(new)
        self.graph.nodes = nodes

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
