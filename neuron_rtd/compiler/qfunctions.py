"""What a quantized model leaves in float between a DequantizeLinear and a QuantizeLinear,
fused into the NC's exact functions of int8 tensors (`driver_sim/ops/qfunctions.py`), so
the whole of an int8 model computes in integers and exact steps, the same bits on both
engines:

- an element-wise op whose only computed input is quantized per tensor, its output
  quantized (GELU, Tanh, HardSwish, a Mul or Add of a constant scalar...: `_ELEMENTWISE`)
  becomes a QuantizedLookup, its table the op's result for each of the 256 inputs,
  computed here by the NC's own kernel of the op;
- Softmax of a quantized input, its output quantized: QuantizedSoftmax;
- LayerNormalization of a quantized input over a known number of values (at most
  32768): QuantizedLayerNorm, its output quantized or float.

This pass runs after `fuse` (whose GELU it sees), with its helpers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from driver_sim.ops.qfunctions import LAYER_NORM_MAX, every_byte
from driver_sim.ops.quant import dequantize, quantize
from driver_sim.ops.registry import KERNELS
from neuron_rtd.compiler.fuse import INTERNAL_DOMAIN, Fuser, _Quantized
from neuron_rtd.compiler.onnx_attrs import UnsupportedAttr, node_attrs
from neuron_rtd.compiler.onnx_graph import Graph

# Element-wise ops: the output's element is a function of the input's element alone
# (their other inputs, where they have any, constants of one element).
_ELEMENTWISE = frozenset(
    {
        *("Gelu", "Tanh", "Erf", "Relu", "Clip", "HardSigmoid", "HardSwish", "Softplus"),
        *("Softsign", "Elu", "Selu", "Celu", "Mish", "ThresholdedRelu", "Shrink", "Exp"),
        *("Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Sin", "Cos", "Floor", "Ceil", "Round"),
        *("Sign", "Add", "Sub", "Mul", "Div", "Pow"),
    }
)
_STANDARD = ("", "ai.onnx")


def fuse_quantized_functions(graph: Graph, nc_can_run: Callable[[onnx.NodeProto], bool]) -> None:
    """Fuse every quantized float island of `graph` in place, then each run of quantized
    element-wise ops of one tensor into one table."""
    _Functions(graph, nc_can_run).run()
    _Regions(graph, nc_can_run).run()


class _Functions(Fuser):
    def run(self) -> None:
        for node in list(self.graph.nodes):
            if id(node) in self.replaced or len([o for o in node.output if o]) != 1:
                continue
            standard = node.domain in _STANDARD
            if node.op_type == "Softmax" and standard:
                self._softmax(node)
            elif node.op_type == "LayerNormalization" and standard:
                self._layer_norm(node)
            elif node.op_type in _ELEMENTWISE and (standard or node.domain == INTERNAL_DOMAIN):
                self._lookup(node)
        self.finish()

    def _negative_axis(self, node: onnx.NodeProto, name: str, default: int) -> int | None:
        """`node`'s axis attribute counted from the end of `name`'s shape."""
        kind = self.graph.types.get(name)
        if kind is None or kind.shape is None:
            return None
        rank = len(kind.shape)
        axis = next((a.i for a in node.attribute if a.name == "axis"), default)
        if not -rank <= axis < rank:
            return None
        return axis - rank if axis >= 0 else axis

    def _softmax(self, node: onnx.NodeProto) -> None:
        x = self.dequantized(node.input[0])
        tail = self._quantize_after(node)
        axis = self._negative_axis(node, node.input[0], -1 if self.graph.opset >= 13 else 1)
        if x is None or tail is None or axis is None:
            return
        if self.graph.opset < 13 and axis != -1:  # Softmax-1/11: the input coerced to 2-D
            return
        chain, out = tail
        fused = helper.make_node(
            "QuantizedSoftmax",
            [x.tensor, x.scale, out.scale, out.zero_point],
            [out.tensor],
            name=f"{node.name}.int8",
            domain=INTERNAL_DOMAIN,
            axis=axis,
        )
        self.commit([node, *chain], fused)

    def _layer_norm(self, node: onnx.NodeProto) -> None:
        x = self.dequantized(node.input[0])
        axis = self._negative_axis(node, node.input[0], -1)
        params = [self._float_constant(name) for name in node.input[1:3]]
        if x is None or axis is None or None in params:
            return
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shape = self.graph.types[node.input[0]].shape or ()
        normalized = shape[len(shape) + axis :]
        if not all(isinstance(n, int) for n in normalized):
            return
        if attrs.get("stash_type", 1) != 1 or math.prod(normalized) > LAYER_NORM_MAX:  # type: ignore[arg-type]
            return
        ins = [*x, params[0] or "", params[1] if len(params) > 1 and params[1] else ""]
        chain: list[onnx.NodeProto] = []
        out_name = node.output[0]
        tail = self._quantize_after(node)
        if tail is not None:
            chain, out = tail
            ins += [out.scale, out.zero_point]
            out_name = out.tensor
        fused = helper.make_node(
            "QuantizedLayerNorm",
            ins,
            [out_name],
            name=f"{node.name}.int8",
            domain=INTERNAL_DOMAIN,
            axis=axis,
            epsilon=float(attrs.get("epsilon", 1e-5)),
        )
        self.commit([node, *chain], fused)

    def _float_constant(self, name: str) -> str | None:
        """A constant float32 tensor holding `name`'s value: itself, or the value of the
        DequantizeLinear of constants that computes it (the quantizer's LayerNorm weights);
        "" for "", None if it is computed otherwise."""
        if not name or name in self.graph.consts:
            return name if not name or self.graph.consts[name].dtype == np.float32 else None
        dq = self.producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        if not all(n in self.graph.consts for n in dq.input if n):
            return None
        try:
            attrs = KERNELS["DequantizeLinear"].parse_attrs(node_attrs(dq))
            ins = [self.graph.consts[n] if n else None for n in dq.input]
            value = np.asarray(KERNELS["DequantizeLinear"].compute(*ins, **attrs))
        except (UnsupportedAttr, ValueError, TypeError):
            return None
        return self.constant(f"{name}.value", value) if value.dtype == np.float32 else None

    def _lookup(self, node: onnx.NodeProto) -> None:
        """`node` and the element-wise ops after it up to a QuantizeLinear (the quantizer
        cuts GELU into Div, Erf and quantized Add and Muls) as one table."""
        computed = self._computed_input(node)
        x = self.dequantized(computed or "")
        if x is None or computed is None:
            return
        chain = [node]
        tail = self._quantize_after(node)
        while tail is None:
            reader = self.only_reader(chain[-1].output[0])
            if (
                reader is None
                or reader.op_type not in _ELEMENTWISE
                or reader.domain not in _STANDARD
            ):
                return
            if self._computed_input(reader) != chain[-1].output[0] or len(chain) == 8:
                return
            chain.append(reader)
            tail = self._quantize_after(reader)
        after, out = tail
        table = self._table(chain, x, out)
        if table is None:
            return
        name = self.constant(f"{node.name}.table", table)
        fused = helper.make_node(
            "QuantizedLookup",
            [x.tensor, name],
            [out.tensor],
            name=f"{node.name}.int8",
            domain=INTERNAL_DOMAIN,
        )
        self.commit([*chain, *after], fused)

    def _computed_input(self, node: onnx.NodeProto) -> str | None:
        """The one input of `node` that is not a constant, its others constants of one
        element; None otherwise."""
        computed = [n for n in node.input if n and n not in self.graph.consts]
        constants = [n for n in node.input if n and n in self.graph.consts]
        if len(computed) != 1 or any(self.graph.consts[n].size != 1 for n in constants):
            return None
        return computed[0]

    def _table(
        self, chain: list[onnx.NodeProto], x: _Quantized, out: _Quantized
    ) -> np.ndarray | None:
        """The ops' quantized result for each byte of x (the layout QuantizedLookup reads),
        by the NC's kernels of the ops; None where one has none."""
        x_type = self.graph.types[x.tensor].dtype
        if x_type not in (np.dtype(np.int8), np.dtype(np.uint8)):
            return None
        consts = self.graph.consts
        real = dequantize(every_byte(x_type), consts[x.scale], consts[x.zero_point])
        result = _evaluate(chain, self._computed_input(chain[0]) or "", real, consts)
        if result is None:
            return None
        y_zero = consts[out.zero_point]
        with np.errstate(all="ignore"):
            return quantize(result, consts[out.scale], y_zero, y_zero.dtype)


def _evaluate(
    nodes: list[onnx.NodeProto], start: str, value: np.ndarray, consts: dict[str, np.ndarray]
) -> np.ndarray | None:
    """The last of `nodes`' output, computed by the NC's kernels of the ops in order from
    `value` for tensor `start` (the other inputs constants, or outputs before); None where
    an op has no kernel or refuses, or gives other than one value per input element."""
    values = {start: value}
    for node in nodes:
        kern = KERNELS.get(node.op_type)
        if kern is None:
            return None
        ins = [values[n] if n in values else consts[n] if n else None for n in node.input]
        try:
            with np.errstate(all="ignore"):
                result = kern.compute(*ins, **kern.parse_attrs(node_attrs(node)))
        except (KeyError, UnsupportedAttr, ValueError, TypeError, ArithmeticError):
            return None
        if isinstance(result, tuple) or np.shape(result) != np.shape(value):
            return None
        values[node.output[0]] = result
    return np.asarray(values[nodes[-1].output[0]])


# Quantized element-wise ops: each output element a function of its inputs' elements at
# the same place (QuantizedLookup's table aside, their other inputs are scales and zero
# points, or constants of one element).
_QUANTIZED_ELEMENTWISE = frozenset(
    {"QuantizedLookup", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu"}
)


class _Regions(Fuser):
    """The ops computed from one quantized tensor alone, element by element, up to the one
    tensor the rest of the graph reads, as one QuantizedLookup: the quantizer writes GELU
    as a lookup of erf, a quantized Add and two quantized Muls (each a pass over the
    tensor), Swish as a quantized Sigmoid and Mul; the whole is a function of the byte."""

    def run(self) -> None:
        for name in list(self.readers):
            kind = self.graph.types.get(name)
            if name in self.graph.consts or kind is None:
                continue
            if kind.dtype in (np.dtype(np.int8), np.dtype(np.uint8)):
                self._collapse(name)
        self.finish()

    def _computed(self, node: onnx.NodeProto) -> list[str] | None:
        """The computed inputs of a quantized element-wise op; None for any other op, or
        one with a constant of more than one element (a table's aside)."""
        if node.op_type not in _QUANTIZED_ELEMENTWISE or node.domain in _STANDARD:
            return None
        if node.op_type == "QuantizedLookup":
            return [node.input[0]]
        consts = self.graph.consts
        computed = [n for n in node.input if n and n not in consts]
        if any(consts[n].size != 1 for n in node.input if n and n in consts):
            return None
        return computed

    def _collapse(self, x: str) -> None:
        inside, members, frontier = {x}, set[int](), [x]
        while frontier:  # the readers of what is inside, whose computed inputs all are
            for node in self.readers.get(frontier.pop(), []):
                computed = self._computed(node)
                if id(node) in members or id(node) in self.replaced or not computed:
                    continue
                if all(name in inside for name in computed):
                    members.add(id(node))
                    inside.update(node.output)
                    frontier.extend(node.output)
        region = [node for node in self.graph.nodes if id(node) in members]  # in order
        outputs = [out for node in region for out in node.output]
        exits = [
            out
            for out in outputs
            if out in self.graph.outputs
            or any(id(reader) not in members for reader in self.readers.get(out, []))
        ]
        unread = [o for o in outputs if not self.readers.get(o) and o not in self.graph.outputs]
        if len(region) < 2 or len(exits) != 1 or unread or region[-1].output[0] != exits[0]:
            return
        table = self._table(x, region)
        if table is None:
            return
        fused = helper.make_node(
            "QuantizedLookup",
            [x, self.constant(f"{region[-1].name}.table", table)],
            [exits[0]],
            name=f"{region[-1].name}.region",
            domain=INTERNAL_DOMAIN,
        )
        self.commit(region, fused)

    def _table(self, x: str, region: list[onnx.NodeProto]) -> np.ndarray | None:
        """The region's result for each byte of x, by the NC's kernels of its ops."""
        table = _evaluate(region, x, every_byte(self.graph.types[x].dtype), self.graph.consts)
        return table if table is not None and table.dtype.itemsize == 1 else None
