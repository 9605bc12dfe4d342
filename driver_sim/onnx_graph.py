"""A loaded NC program as an ONNX model, for the fast engine's onnxruntime session
(`driver_sim/fast.py`): its instructions as ONNX nodes, the NC's own fused ones (MatMulBias,
WinogradConv, the compiler's GELU) as their ONNX equivalents, its weights as initializers.

The model computes what the NC defines, not what onnxruntime happens to: under auto-cast
the fp32 inputs of the ops cast are rounded to the 16-bit type first, as the reference
kernels round them; the int8 products are rewritten to give the exact integer sums on
every CPU (`driver_sim/int8_graph.py`); and an op whose onnxruntime kernel gives other
numbers is refused (ValueError), so the program runs on the reference kernels instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim import autocast
from driver_sim.int8_graph import (
    BINARY,
    FUNCTIONS,
    TABLED,
    exact_int8,
    function_nodes,
    output_source,
    quantized,
)
from driver_sim.ops.quant import CONTRIB_DOMAIN, CONTRIB_OPS
from driver_sim.ops.registry import KERNELS, tensor_attr
from driver_sim.program import Instr, LoadedProgram

Dims = tuple[int | None, ...]  # an input's shape, None for an axis of any size
InputTypes = tuple[tuple[str, int | Dims], ...]  # per program input: dtype string, rank or dims


def declared_types(declared: Sequence[tuple[Any, Any]] | None) -> InputTypes | None:
    """A program's declared input types (`NcProgram.input_types`) as InputTypes."""
    if declared is None:
        return None
    return tuple(
        (np.dtype(dtype).str, dims if isinstance(dims, int) else tuple(dims))
        for dtype, dims in declared
    )


def run_types(declared: InputTypes | None, arrays: Sequence[np.ndarray]) -> InputTypes:
    """The types of a run of these input arrays: each input's declared dims where the array
    has them (so a session for those sizes serves it), else its rank (any size)."""
    types: list[tuple[str, int | Dims]] = []
    for k, array in enumerate(arrays):
        dims = declared[k][1] if declared is not None else array.ndim
        fits = (
            isinstance(dims, tuple)
            and len(dims) == array.ndim
            and all(d in (None, n) for d, n in zip(dims, array.shape, strict=True))
        )
        types.append((array.dtype.str, dims if fits else array.ndim))
    return tuple(types)


# The Winograd weight transform's left inverse: W = L U L^T undoes U = G W G^T.
_L = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, -1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])


def to_onnx(loaded: LoadedProgram, types: InputTypes, opset: int) -> Any:
    """The program as an ONNX model: instructions as nodes (the NC's own fused ones as
    their ONNX equivalents), weights as initializers, inputs of the dtypes and ranks or
    dims `types` gives (in the program's input order). Under auto-cast, the fp32 inputs of the
    ops cast go through a round trip to the 16-bit type (Cast, Cast back), as the
    reference kernels round them."""
    from onnx import helper, numpy_helper

    program = loaded.program
    weights = {name: np.asarray(value) for name, value in program.weights.items()}
    inputs = [
        helper.make_tensor_value_info(
            name,
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            [None] * dims if isinstance(dims, int) else list(dims),
        )
        for (name, _), (dtype, dims) in zip(loaded.input_slots, types, strict=True)
    ]
    outputs = [helper.make_empty_tensor_value_info(name) for name, _, _ in loaded.output_slots]
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]

    def model(nodes: list[Any], extra: Mapping[str, np.ndarray]) -> Any:
        used = {name for node in nodes for name in node.input}
        initializers = [
            numpy_helper.from_array(np.asarray(value, order="C"), name)
            for name, value in {**weights, **extra}.items()
            if name in used
        ]
        graph = helper.make_graph(nodes, "nc_program", inputs, outputs, initializers)
        made = helper.make_model(graph, opset_imports=opsets)
        made.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        return made

    nodes, extra = _nodes(program, weights, opset, None)
    if program.auto_cast != "none":
        floats = _fp32_tensors(model(nodes, extra))
        nodes, extra = _nodes(program, weights, opset, _Rounding(floats, program.auto_cast_type))
    if quantized(nodes):
        elements = _tensor_types(model(nodes, extra))
        constants = {**weights, **extra}
        names = {v.name for v in inputs}, {v.name for v in outputs}
        nodes = exact_int8(nodes, constants, elements, *names)
        extra.update({k: v for k, v in constants.items() if k not in weights})
    return model(nodes, extra)


class _Rounding:
    """The rounded twin of each fp32 tensor an auto-cast op reads, made once."""

    def __init__(self, floats: set[str], type_name: str) -> None:
        self.floats = floats
        self.narrow = {"bf16": 16, "fp16": 10}[type_name]  # TensorProto BFLOAT16, FLOAT16
        self.made: dict[str, str] = {}
        self.nodes: list[Any] = []

    def __call__(self, name: str) -> str:
        from onnx import helper

        if name not in self.floats:
            return name
        if name not in self.made:
            narrow, back = f"{name}/narrow", f"{name}/rounded"
            self.nodes.append(helper.make_node("Cast", [name], [narrow], to=self.narrow))
            self.nodes.append(helper.make_node("Cast", [narrow], [back], to=1))  # FLOAT
            self.made[name] = back
        return self.made[name]


def _nodes(
    program: Any, weights: Mapping[str, np.ndarray], opset: int, rounding: _Rounding | None
) -> tuple[list[Any], dict[str, np.ndarray]]:
    import onnx
    from onnx import helper

    nodes: list[Any] = []
    extra: dict[str, np.ndarray] = {}
    for index, raw in enumerate(program.instructions):
        instr = Instr(*raw)
        ins, outs = list(instr.inputs), list(instr.outputs)
        if rounding is not None and autocast.casts(instr.op, program.auto_cast):
            before = len(rounding.nodes)
            ins = [rounding(name) for name in ins]
            nodes.extend(rounding.nodes[before:])
        attrs = dict(instr.attrs or {})
        if instr.op == "MatMulBias":
            product = f"{outs[0]}/matmul{index}"
            nodes.append(helper.make_node("MatMul", ins[:2], [product]))
            nodes.append(helper.make_node("Add", [product, ins[2]], outs))
        elif instr.op == "WinogradConv":
            weight = f"{instr.inputs[1]}/conv{index}"
            extra[weight] = _winograd_inverse(weights[instr.inputs[1]])
            if rounding is not None and autocast.casts(instr.op, program.auto_cast):
                before = len(rounding.nodes)
                weight = rounding(weight)
                nodes.extend(rounding.nodes[before:])
            conv_ins = [ins[0], weight, *ins[2:]]
            nodes.append(helper.make_node("Conv", conv_ins, outs, kernel_shape=[3, 3], **attrs))
        elif instr.op == "Gelu" and opset < 20:  # the compiler's fused GELU: exact (erf)
            tanh = attrs.get("approximate", "none") == "tanh"
            op = "FastGelu" if tanh else "Gelu"
            nodes.append(helper.make_node(op, ins, outs, domain="com.microsoft"))
        elif instr.op in FUNCTIONS | BINARY | TABLED:  # the NC's int8 steps
            nodes.extend(function_nodes(instr.op, ins, outs, attrs, weights, extra, opset))
        elif _onnxruntime_differs(instr.op, ins, attrs):
            raise ValueError(f"onnxruntime's {instr.op} computes this otherwise than the NC")
        elif instr.op == "ConvInteger" and not _one_element(weights, ins[3:]):
            # onnxruntime takes a per-tensor W zero point only: the reference kernels run it
            raise ValueError("ConvInteger with a per-channel W zero point")
        elif instr.op in CONTRIB_OPS:  # onnxruntime's own quantized ops (QLinearAdd...)
            parsed = KERNELS[instr.op].parse_attrs(attrs)
            typed = {name: value for name, value in parsed.items() if value is not None}
            nodes.append(helper.make_node(instr.op, ins, outs, domain=CONTRIB_DOMAIN, **typed))
        else:
            schema = onnx.defs.get_schema(instr.op, opset, "")
            typed = {name: _attr(schema, name, value) for name, value in attrs.items()}
            nodes.append(helper.make_node(instr.op, ins, outs, **typed))
    return nodes, extra


def _tensor_types(model: Any) -> dict[str, int]:
    """The element type (TensorProto's) of each tensor of `model` ONNX type inference
    tells, onnxruntime's own ops taken as giving what `output_source` says (their first
    data input's shape, their output zero point's type: QLinearConcat's first input is a
    float scale, and a zero point has no rank for the ops after to take)."""
    import onnx

    typing = onnx.ModelProto()
    typing.CopyFrom(model)
    constant_types = {t.name: t.data_type for t in typing.graph.initializer}
    for node in typing.graph.node:
        if node.domain == CONTRIB_DOMAIN:
            source, to = output_source(node, constant_types)
            kept = node.input[source]
            del node.input[:], node.attribute[:]
            node.input.append(kept)
            node.op_type, node.domain = ("Identity", "") if to is None else ("Cast", "")
            if to is not None:
                node.attribute.append(onnx.helper.make_attribute("to", to))
    graph = onnx.shape_inference.infer_shapes(typing).graph
    types = {t.name: t.data_type for t in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        types[value.name] = value.type.tensor_type.elem_type
    return types


def _onnxruntime_differs(op: str, ins: Sequence[str], attrs: Mapping[str, Any]) -> bool:
    """Whether onnxruntime's kernel of `op` gives other numbers than the NC's for these
    inputs and attributes (the reference kernels then run the program): its DFT and STFT
    are computed in float32, off by more than fp32 tolerance where a bin is 0; its
    Attention misplaces the -inf of a masked causal qk_matmul_output (mode 2) and
    refuses an attn_mask with nonpad_kv_seqlen; its cubic GridSample clamps other points
    than the spec's at the border."""
    if op in ("DFT", "STFT"):
        return True
    if op == "GridSample":
        return attrs.get("mode") in ("cubic", "bicubic") and attrs.get("padding_mode") == "border"
    if op == "Attention":
        masked = len(ins) > 3 and bool(ins[3])
        padded = len(ins) > 6 and bool(ins[6])
        return attrs.get("qk_matmul_output_mode", 0) == 2 or (masked and padded)
    return False


def _one_element(weights: Mapping[str, np.ndarray], names: Sequence[str]) -> bool:
    """Whether each of `names` (absent ones aside) is a weight of one element."""
    return all(not name or (name in weights and weights[name].size == 1) for name in names)


def _fp32_tensors(model: Any) -> set[str]:
    """The names of the model's fp32 tensors, by ONNX type inference (the contrib GELU
    keeps its input's type)."""
    import onnx

    typing = onnx.ModelProto()
    typing.CopyFrom(model)
    for node in typing.graph.node:
        if node.domain == "com.microsoft":
            node.op_type, node.domain = "Identity", ""
    inferred = onnx.shape_inference.infer_shapes(typing)
    graph = inferred.graph
    fp32 = onnx.TensorProto.FLOAT
    floats = {t.name for t in graph.initializer if t.data_type == fp32}
    for value in [*graph.input, *graph.value_info]:
        if value.type.tensor_type.elem_type == fp32:
            floats.add(value.name)
    return floats


def _attr(schema: Any, name: str, value: Any) -> Any:
    """An instruction attribute as the type the op's schema gives it."""
    from onnx import defs, numpy_helper

    kind = schema.attributes[name].type
    types = defs.OpSchema.AttrType
    if kind == types.FLOAT:
        return float(value)
    if kind == types.INT:
        return int(value)
    if kind == types.FLOATS:
        return [float(v) for v in value]
    if kind == types.INTS:
        return [int(v) for v in value]
    if kind == types.TENSOR:
        return numpy_helper.from_array(tensor_attr(value))
    return value


def _winograd_inverse(u: np.ndarray) -> np.ndarray:
    """The Conv weight W (Cout, Cin, 3, 3) of WinogradConv weights U (16, Cout, Cin)."""
    tiles = np.asarray(u, dtype=np.float64).reshape(4, 4, *u.shape[1:])
    w = np.einsum("ia,aboc,jb->ocij", _L, tiles, _L)
    return np.asarray(w, dtype=np.float32, order="C")
