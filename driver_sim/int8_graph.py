"""The int8 part of the fast engine's graph (`driver_sim/onnx_graph.py`): the NC's exact
integer products, on onnxruntime's fast uint8 x int8 kernels, the same numbers on every
x86-64 CPU by construction.

onnxruntime picks its int8 kernels by CPU feature. Without VNNI or AMX, a uint8 x int8
product goes through vpmaddubsw, which saturates each pair of products to int16
(2 * 255 * 127 > 32767): a QLinearConv's outputs there come out steps off the exact
sums (measured under `qemu-x86_64 -cpu Haswell`: 3969 of 4096 outputs of a 3x3 conv on
uint8 near 255 and int8 near +-127). Its int8 x int8 kernels are the slow ones (60 ms for
ResNet-18 against 7.6 for uint8 x int8 here), and its uint8 x uint8 kernels widen to 16
bits: exact, and 2-3x slower than uint8 x int8. Two rewrites make every product both exact
and fast, and a third keeps the rest exact:

1. **int8 activations as uint8.** Every int8 tensor the program computes is carried as
   uint8, value + 128, with its zero point + 128: the same differences from the zero point,
   the same saturation bounds shifted, so every op that reads or writes a tensor together
   with its zero point (`_ZERO_POINTS`) and every op that only moves values (`_MOVES`)
   computes the same numbers on it. A tensor that leaves or enters that set of ops (a
   graph input or output, any other op) is converted at that edge (+-128 through int32).
2. **Weights within [-64, 64].** Each uint8 x int8 product with constant weights B takes
   B minus its zero point cut into n parts, each within [-64, 64]
   (n = ceil(max|B - zB| / 64), 2 for int8 weights of a full range), side by side along
   the summed axis, and A repeated n times along it: the same sums, and no pair of products
   that can saturate (2 * 255 * 64 = 32640), whichever instruction the kernel uses. A
   grouped convolution (a depthwise one's summed axis is one channel's window: repeating it
   loses onnxruntime's depthwise kernel), ConvInteger and any product with computed B take
   B as uint8 (B + 128) instead: x86 has no instruction that multiplies uint8 by uint8 with
   saturation, so every such kernel sums exactly.

The requantization after the sums (float32(acc) * multiplier, rounded half to even) is
onnxruntime's and the NC's alike (one multiply and a rounding, on every CPU; checked here
and under qemu as a Haswell).

3. **The rest of a quantized model in the NC's own steps** (`function_nodes`): its
   functions of int8 tensors (`driver_sim/ops/qfunctions.py`), and onnxruntime's
   quantized Add and Mul, Sigmoid and LeakyRelu, whose kernels round in MLAS's own ways
   (picked by CPU feature), as DequantizeLinear, one IEEE operation at a time and
   QuantizeLinear, or a Gather of a table the NC's kernel computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_SHIFT = 128  # int8 + 128 is uint8 with the same difference from its zero point (+ 128)
_PART = 64  # uint8 x int8 pairs cannot saturate int16 when |int8| <= 64: 2 * 255 * 64 < 32767

# Per op: its (tensor, zero point) input pairs and the input holding its output's zero point.
_ZERO_POINTS: Mapping[str, tuple[tuple[tuple[int, int], ...], int | None]] = {
    "QuantizeLinear": ((), 2),
    "DequantizeLinear": (((0, 2),), None),
    "QLinearConv": (((0, 2), (3, 5)), 7),
    "QLinearMatMul": (((0, 2), (3, 5)), 7),
    "QGemm": (((0, 2), (3, 5)), 8),
    "MatMulInteger": (((0, 2), (1, 3)), None),
    "ConvInteger": (((0, 2), (1, 3)), None),
    "QLinearAdd": (((0, 2), (3, 5)), 7),
    "QLinearMul": (((0, 2), (3, 5)), 7),
    "QLinearGlobalAveragePool": (((0, 2),), 4),
    "QLinearAveragePool": (((0, 2),), 4),
    "QLinearSigmoid": (((0, 2),), 4),
    "QLinearLeakyRelu": (((0, 2),), 4),
    "QLinearSoftmax": (((0, 2),), 4),
}
# Ops that only move values (their outputs are some of their data inputs' values): per op,
# the data inputs (None: all of them).
_MOVES: Mapping[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"), (0,)
    ),
    **dict.fromkeys(("Slice", "Split", "Gather", "Expand", "Tile"), (0,)),
    **dict.fromkeys(("DepthToSpace", "SpaceToDepth"), (0,)),
    "Concat": None,
}
# The products and the input index of their B.
PRODUCTS = {"QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3, "MatMulInteger": 1, "ConvInteger": 1}


def output_source(node: Any, constant_types: Mapping[str, int]) -> tuple[int, int | None]:
    """What onnxruntime's quantized op `node`'s output is like, for type inference, which
    does not know those ops: (k, None) when it is input k's shape and type, (k, type) when
    it has input k's shape and that type (TensorProto's): its first data input's shape,
    and the type of its output zero point (`constant_types`: the constants' types) where
    that is a constant, float for a QGemm of no output scale, uint8 for one of no zero
    point."""
    from onnx import TensorProto

    op, ins = node.op_type, list(node.input)
    data = 2 if op == "QLinearConcat" else 0  # QLinearConcat's first inputs are Y's scale, zp
    out_zero = 1 if op == "QLinearConcat" else _ZERO_POINTS.get(op, ((), None))[1]
    if out_zero is not None and out_zero < len(ins) and ins[out_zero] in constant_types:
        return data, constant_types[ins[out_zero]]
    if op == "QGemm":
        return data, TensorProto.UINT8 if len(ins) > 7 and ins[7] else TensorProto.FLOAT
    return data, None


def quantized(nodes: Sequence[Any]) -> bool:
    """Whether `nodes` hold an op of quantized tensors (what `exact_int8` rewrites)."""
    return any(n.op_type in _ZERO_POINTS or n.op_type == "QLinearConcat" for n in nodes)


def exact_int8(
    nodes: list[Any],
    constants: dict[str, np.ndarray],
    types: Mapping[str, int],
    inputs: set[str],
    outputs: set[str],
) -> list[Any]:
    """`nodes` with both rewrites (see the module): int8 activations as uint8, and each
    product's B within [-64, 64] (or uint8). `constants` are the graph's initializers (new
    ones join it), `types` the tensors' element types (TensorProto's), `inputs` and
    `outputs` the graph's input and output names."""
    from onnx import TensorProto

    int8 = {name for name, kind in types.items() if kind == TensorProto.INT8}
    rewrite = _Rewrite(constants, int8 - set(constants), inputs, outputs)
    for node in nodes:
        rewrite.node(node)
    return rewrite.finish()


class _Rewrite:
    """One pass over the nodes, in order (they are topologically sorted)."""

    def __init__(
        self,
        constants: dict[str, np.ndarray],
        activations: set[str],
        inputs: set[str],
        outputs: set[str],
    ) -> None:
        from onnx import helper

        self.make = helper.make_node
        self.constants = constants
        self.activations = activations  # int8 tensors computed or fed: carried as uint8
        self.outputs = outputs
        self.out: list[Any] = []
        self.twins: dict[str, str] = {}  # an int8 activation -> its uint8 twin
        self.int8: set[str] = activations & inputs  # those that exist as int8 too
        self.back: dict[str, str] = {}  # an int8 activation -> its int8 copy made from its twin
        self.repeated: set[str] = set()  # products' A repeated along the summed axis, made
        for name in sorted(self.int8):  # fed as int8: its twin made at the start
            self._twin(name)

    # ---- tensors ----------------------------------------------------------------------

    def _twin(self, name: str) -> str:
        """The uint8 twin of int8 activation `name`, made from it where it is not yet."""
        if name not in self.twins:
            self.twins[name] = f"{name}/u8"
            self._convert(name, self.twins[name], _SHIFT)
        return self.twins[name]

    def _output(self, name: str) -> str:
        """What a node that writes uint8 twins writes for its output `name`."""
        if name not in self.activations:
            return name
        self.twins[name] = f"{name}/u8"
        return self.twins[name]

    def _as_int8(self, name: str) -> str:
        """What a node that takes int8 as it is reads for `name`: the tensor itself, or an
        int8 copy made from its twin where only the twin is computed."""
        if name not in self.activations or name in self.int8:
            return name
        if name not in self.back:
            self.back[name] = f"{name}/i8"
            self._convert(self.twins[name], self.back[name], -_SHIFT)
        return self.back[name]

    def _convert(self, source: str, target: str, shift: int) -> None:
        """Nodes computing `target` = `source` + `shift` through int32 (int8 <-> uint8)."""
        from onnx import TensorProto

        wide, moved, amount = f"{target}/i32", f"{target}/i32+", f"{target}/shift"
        self.constants[amount] = np.array(shift, dtype=np.int32)
        to = TensorProto.UINT8 if shift > 0 else TensorProto.INT8
        self.out.append(self.make("Cast", [source], [wide], to=TensorProto.INT32))
        self.out.append(self.make("Add", [wide, amount], [moved]))
        self.out.append(self.make("Cast", [moved], [target], to=to))

    def _shifted_constant(self, name: str) -> str:
        """A constant int8 tensor (or zero point) + 128 as uint8; "" (absent: 0) as 128."""
        new = f"{name}/u8" if name else "int8-zero/u8"
        if new not in self.constants:
            value = self.constants[name] if name else np.zeros((), np.int8)
            self.constants[new] = (np.asarray(value, dtype=np.int16) + _SHIFT).astype(np.uint8)
        return new

    def _int8_constant(self, name: str) -> bool:
        return name in self.constants and self.constants[name].dtype == np.int8

    # ---- nodes ------------------------------------------------------------------------

    def node(self, node: Any) -> None:
        ins, outs = list(node.input), list(node.output)
        op, standard = node.op_type, node.domain in ("", "ai.onnx")
        if self._takes_zero_points(node):
            self._zero_pointed(node, ins)
            outs = [self._output(outs[0]), *outs[1:]] if self._out_zero(node) is not None else outs
        elif op in _MOVES and standard:
            data = _MOVES[op]
            for k in range(len(ins)) if data is None else data:
                if k < len(ins) and ins[k] in self.activations:
                    ins[k] = self._twin(ins[k])
                elif k < len(ins) and self._int8_constant(ins[k]):  # a table Gather reads
                    ins[k] = self._shifted_constant(ins[k])
            outs = [self._output(name) for name in outs]
        else:  # any other op reads and writes int8 as it is
            if op in PRODUCTS and any(self._int8_constant(n) or n in self.activations for n in ins):
                raise ValueError(f"{op} with computed zero points: no exact fast form")
            ins = [self._as_int8(name) for name in ins]
            _set(node, ins, outs)
            self.out.append(node)
            for name in outs:
                if name in self.activations:
                    self.int8.add(name)
                    self._twin(name)
            return
        _set(node, ins, outs)
        self.out.append(node)

    def _pairs(self, node: Any) -> tuple[tuple[int, int], ...]:
        """`node`'s (tensor, zero point) input pairs."""
        if node.op_type == "QLinearConcat":
            return tuple((k, k + 2) for k in range(2, len(node.input), 3))
        return _ZERO_POINTS[node.op_type][0]

    def _out_zero(self, node: Any) -> int | None:
        """The input holding `node`'s output's zero point (None: its output is not int8)."""
        return 1 if node.op_type == "QLinearConcat" else _ZERO_POINTS[node.op_type][1]

    def _takes_zero_points(self, node: Any) -> bool:
        """Whether `node` reads and writes its quantized tensors with constant zero points
        (a computed zero point, or QuantizeLinear's output_dtype, leave it as it is)."""
        if node.op_type not in _ZERO_POINTS and node.op_type != "QLinearConcat":
            return False
        if any(a.name == "output_dtype" for a in node.attribute):
            return False
        out_zero = self._out_zero(node)
        indexes = [z for _, z in self._pairs(node)] + ([] if out_zero is None else [out_zero])
        given = [node.input[k] for k in indexes if k < len(node.input) and node.input[k]]
        return all(name in self.constants for name in given)

    def _zero_pointed(self, node: Any, ins: list[str]) -> None:
        """`ins` of a node that takes zero points: its int8 tensors as uint8 twins (or
        shifted constants) with their zero points + 128; a product's constant B made exact."""
        product_b = PRODUCTS.get(node.op_type)
        for k, zero in self._pairs(node):
            name = ins[k] if k < len(ins) else ""
            if k == product_b and name in self.constants:
                continue  # a product's weights: _weights below
            if name in self.activations or self._int8_constant(name):
                ins[k] = (
                    self._twin(name) if name in self.activations else self._shifted_constant(name)
                )
                ins += [""] * (zero + 1 - len(ins))
                ins[zero] = self._shifted_constant(ins[zero])
        out_zero = self._out_zero(node)
        if out_zero is not None and node.output[0] in self.activations:
            ins += [""] * (out_zero + 1 - len(ins))
            ins[out_zero] = self._shifted_constant(ins[out_zero])
        if product_b is not None and self._int8_constant(ins[product_b]):
            self._weights(node, ins, product_b)

    def finish(self) -> list[Any]:
        """The nodes, and each graph output that is an int8 activation made from its twin."""
        for name in sorted((self.activations & self.outputs) - self.int8):
            self._convert(self.twins[name], name, -_SHIFT)
        return self.out

    # ---- a product's weights ----------------------------------------------------------

    def _weights(self, node: Any, ins: list[str], b: int) -> None:
        """A product's constant int8 B as parts within [-64, 64] (A repeated), or as uint8
        (a grouped convolution, ConvInteger)."""
        zero = b + 2
        ins += [""] * (zero + 1 - len(ins))
        attrs = {a.name: a.i for a in node.attribute}
        if node.op_type == "ConvInteger" or attrs.get("group", 1) != 1:
            ins[b], ins[zero] = self._shifted_constant(ins[b]), self._shifted_constant(ins[zero])
            return
        weights = np.asarray(self.constants[ins[b]], dtype=np.int16)
        zeros = np.asarray(self.constants[ins[zero]] if ins[zero] else 0, dtype=np.int16)
        if node.op_type == "QLinearConv" or (node.op_type == "QGemm" and attrs.get("transB")):
            per_row = zeros.reshape(-1, *[1] * (weights.ndim - 1))  # per output channel
            zeros = per_row if zeros.size > 1 else zeros
        centred = weights - zeros
        parts = max(1, math.ceil(int(np.abs(centred).max(initial=0)) / _PART))
        b_axis, a_axis = _summed_axes(node.op_type, attrs, weights.ndim)
        split = np.concatenate([(centred + k) // parts for k in range(parts)], axis=b_axis)
        new_b, new_zero = f"{ins[b]}/parts{parts}", f"{ins[b]}/parts-zero"
        self.constants[new_b] = split.astype(np.int8)
        self.constants[new_zero] = np.zeros(np.shape(self.constants.get(ins[zero], 0)), np.int8)
        ins[b], ins[zero] = new_b, new_zero
        if parts > 1:
            repeated = f"{ins[0]}/x{parts}/{a_axis}"
            if repeated not in self.repeated:
                self.repeated.add(repeated)
                self.out.append(self.make("Concat", [ins[0]] * parts, [repeated], axis=a_axis))
            ins[0] = repeated


def _set(node: Any, ins: Sequence[str], outs: Sequence[str]) -> None:
    del node.input[:], node.output[:]
    node.input.extend(ins)
    node.output.extend(outs)


def _summed_axes(op: str, attrs: Mapping[str, int], rank: int) -> tuple[int, int]:
    """The summed axis of a product's B and of its A."""
    if op == "QLinearConv":
        return 1, 1
    if op == "QGemm":
        return (1 if attrs.get("transB") else 0), (0 if attrs.get("transA") else 1)
    return max(rank - 2, 0), -1


# ---- the NC's exact functions of int8 tensors (driver_sim/ops/qfunctions.py) -------------

FUNCTIONS = frozenset({"QuantizedLookup", "QuantizedSoftmax", "QuantizedLayerNorm"})
# onnxruntime's quantized Add and Mul, whose kernels (MLAS's, picked by CPU feature) round
# otherwise than the NC in rare cases (7 of 655360 QLinearAdd outputs here): written as the
# NC's steps instead.
BINARY = frozenset({"QLinearAdd", "QLinearMul"})
# onnxruntime's quantized Sigmoid and LeakyRelu, whose tables it builds with MLAS's float
# functions (picked by CPU feature): a table of the NC's kernel instead.
TABLED = frozenset({"QLinearSigmoid", "QLinearLeakyRelu"})


def function_nodes(
    op: str,
    ins: Sequence[str],
    outs: Sequence[str],
    attrs: Mapping[str, Any],
    weights: Mapping[str, np.ndarray],
    constants: dict[str, np.ndarray],
    opset: int,
) -> list[Any]:
    """The ONNX nodes of one of `FUNCTIONS`, `BINARY` or `TABLED`, the same steps as its
    kernel: integers made float exactly by a DequantizeLinear of scale 1, exact sums,
    tables, one IEEE operation at a time. Scales are read from `weights`, new constants
    join `constants`; ValueError where a scale is not constant or an axis is counted from
    the front (the compiler counts them from the end)."""
    from onnx import TensorProto, helper

    from driver_sim.ops import qfunctions
    from driver_sim.ops.quant import requant_multiplier
    from driver_sim.ops.registry import KERNELS

    nodes: list[Any] = []
    out = outs[0]

    def add(node_op: str, inputs: Sequence[str], **kwargs: Any) -> str:
        name = f"{out}/{len(nodes)}{node_op}"
        nodes.append(helper.make_node(node_op, list(inputs), [name], **kwargs))
        return name

    def constant(tag: str, value: Any) -> str:
        constants[f"{out}/{tag}"] = np.asarray(value)
        return f"{out}/{tag}"

    def reduce(node_op: str, x: str, axes: Sequence[int]) -> str:
        since = {"ReduceSum": 13, "ReduceSumSquare": 18, "ReduceProd": 18}[node_op]
        if opset >= since:
            return add(node_op, [x, constant(f"axes{len(nodes)}", np.array(axes, np.int64))])
        return add(node_op, [x], axes=list(axes))

    def scale(name: str) -> np.ndarray:
        if name not in weights:
            raise ValueError(f"{op}'s scale {name!r} is computed, not constant")
        return weights[name]

    one = constant("one", np.float32(1.0))
    if op in BINARY:
        if len(ins) < 8 or not ins[7]:
            raise ValueError(f"{op} without C's zero point")
        a_scale, b_scale, c_scale = (scale(ins[k]).astype(np.float32) for k in (1, 4, 6))
        if op == "QLinearAdd":  # (A - za) * (sa / sc) + (B - zb) * (sb / sc), rounded
            ratios = [constant(f"ratio{k}", s / c_scale) for k, s in ((0, a_scale), (1, b_scale))]
            a = add("DequantizeLinear", [ins[0], ratios[0], ins[2]])
            b = add("DequantizeLinear", [ins[3], ratios[1], ins[5]])
            total = add("Add", [a, b])
        else:  # (A - za) * (B - zb) * (sa * sb / sc), rounded
            a = add("DequantizeLinear", [ins[0], one, ins[2]])
            b = add("DequantizeLinear", [ins[3], one, ins[5]])
            multiplier = constant("multiplier", requant_multiplier(a_scale, b_scale, c_scale))
            total = add("Mul", [add("Mul", [a, b]), multiplier])
        nodes.append(helper.make_node("QuantizeLinear", [total, one, ins[7]], [out]))
        return nodes
    if op in TABLED:  # the NC kernel's result for each byte, as a QuantizedLookup's table
        if len(ins) < 5 or not ins[4] or ins[4] not in weights:
            raise ValueError(f"{op} without a constant Y zero point")
        values = qfunctions.every_byte(weights[ins[4]].dtype)
        params = [weights[name] if name else None for name in ins[1:5]]
        table = KERNELS[op].compute(values, *params, **KERNELS[op].parse_attrs(attrs))
        op, ins = "QuantizedLookup", [ins[0], constant("own", table)]
        weights = {**weights, ins[1]: table}
    if op == "QuantizedLookup":  # table[x mod 256] as table twice over [x + 256]: onnxruntime
        # reads negative indices 3x slower (1.19 ms for 131072 against 0.40)
        if ins[1] not in weights:
            raise ValueError("QuantizedLookup's table is computed, not constant")
        twice = constant("table", np.concatenate([weights[ins[1]]] * 2))
        moved = add(
            "Add", [add("DequantizeLinear", [ins[0], one]), constant("256", np.float32(256))]
        )
        nodes.append(
            helper.make_node("Gather", [twice, add("Cast", [moved], to=TensorProto.INT32)], [out])
        )
        return nodes
    axis = int(attrs.get("axis", -1))
    if axis >= 0:
        raise ValueError(f"{op}'s axis is counted from the front")
    if op == "QuantizedSoftmax":  # onnxruntime's QLinearSoftmax on uint8 (int8 made uint8)
        zero = constant("x_zero", np.uint8(0))
        nodes.append(
            helper.make_node(
                "QLinearSoftmax",
                [ins[0], ins[1], zero, ins[2], ins[3]],
                [out],
                domain="com.microsoft",
                axis=axis,
                opset=13,
            )
        )
        return nodes
    if opset < 15:
        raise ValueError("QuantizedLayerNorm's graph needs opset 15 (Shape's start)")
    axes = list(range(axis, 0))
    d = add("DequantizeLinear", [ins[0], one, ins[2]])  # exact integers, float32
    wide = TensorProto.DOUBLE
    count = add("Cast", [reduce("ReduceProd", add("Shape", [d], start=axis), [0])], to=wide)
    total = add("Cast", [reduce("ReduceSum", d, axes)], to=wide)  # exact: |sum| < 2^24
    whole = add("Cast", [d], to=TensorProto.INT32)
    squares = add("Cast", [reduce("ReduceSumSquare", whole, axes)], to=wide)  # < 2^31
    mean = add("Div", [total, count])
    variance = add("Sub", [add("Div", [squares, count]), add("Mul", [mean, mean])])
    epsilon = qfunctions.layer_norm_epsilon(float(attrs.get("epsilon", 1e-5)), scale(ins[1]))
    spread = add("Sqrt", [add("Add", [variance, constant("epsilon", np.float64(epsilon))])])
    inverse = add("Div", [constant("unit", np.float64(1.0)), spread])
    narrow = [add("Cast", [name], to=TensorProto.FLOAT) for name in (mean, inverse)]
    y = add("Mul", [add("Mul", [add("Sub", [d, narrow[0]]), narrow[1]]), ins[3]])
    if ins[4:5] and ins[4]:
        y = add("Add", [y, ins[4]])
    if len(ins) > 6 and ins[5]:
        nodes.append(helper.make_node("QuantizeLinear", [y, ins[5], ins[6]], [out]))
    else:
        nodes.append(helper.make_node("Identity", [y], [out]))
    return nodes
