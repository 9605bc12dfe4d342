"""The ONNX side of the compiler: load and check a model, fix its input shapes, infer every
tensor's type and shape, fold what is constant, and fold BatchNormalization into Conv.

`Graph` is the working form: the nodes in order, the constants (initializers and folded
values) by name, and each tensor's `TensorType` as far as shape inference knows it.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from neuron_rtd.compiler.errors import CompileError

Dim = int | str | None  # a size, a symbol (dim_param), or unknown


@dataclasses.dataclass(frozen=True)
class TensorType:
    dtype: np.dtype
    shape: tuple[Dim, ...] | None  # None: rank unknown

    @property
    def static(self) -> bool:
        return self.static_shape is not None

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dimension is known, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(int(d) for d in self.shape if isinstance(d, int))


@dataclasses.dataclass
class Graph:
    """A model being compiled. `nodes` stay in a valid topological order."""

    model: onnx.ModelProto
    nodes: list[onnx.NodeProto]
    consts: dict[str, np.ndarray]
    types: dict[str, TensorType]
    inputs: list[str]
    outputs: list[str]
    auto_cast: tuple[str, str] = ("none", "bf16")  # mode and type (neff.program.AUTO_CAST_*)
    free: bool = False  # some input axis is left free: a tensor of unknown size stays on CPU

    @property
    def opset(self) -> int:
        return default_opset(self.model)


def load_model(source: str | Path | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """The model from a path, its bytes or itself; CompileError if it is not ONNX."""
    if isinstance(source, onnx.ModelProto):
        return source
    try:
        if isinstance(source, bytes):
            return onnx.load_model_from_string(source)
        return onnx.load_model(str(source))
    except FileNotFoundError:
        raise CompileError(f"no such ONNX file: {source!s}") from None
    except Exception as exc:  # protobuf's DecodeError and friends
        raise CompileError(f"not an ONNX model: {exc}") from None


def check_model(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileError(f"the ONNX checker rejects the model: {first}") from None


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise CompileError("the model imports no default-domain (ai.onnx) opset")


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: graph inputs that are not also initializers."""
    constant = {init.name for init in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in constant]


def value_type(vi: onnx.ValueInfoProto) -> TensorType | None:
    """The tensor type of a value info; None for sequences, maps and optionals."""
    if not vi.type.HasField("tensor_type"):
        return None
    tensor = vi.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = np.dtype("V")  # an element type numpy has no name for: no NEFF carries it
    if not tensor.HasField("shape"):
        return TensorType(dtype, None)
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorType(dtype, tuple(dims))


def input_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Each real input's declared dims."""
    dims: dict[str, tuple[Dim, ...]] = {}
    for vi in graph_inputs(model):
        kind = value_type(vi)
        if kind is None or kind.shape is None:
            raise CompileError(f"model input {vi.name!r} is not a tensor of known rank")
        dims[vi.name] = kind.shape
    return dims


def with_input_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | str]]
) -> onnx.ModelProto:
    """A copy of `model` whose inputs have these shapes (a str is a symbolic dimension),
    with the shapes of the inner tensors forgotten (shape inference works them out)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.value_info[:]
    for vi in fixed.graph.input:
        if vi.name not in shapes:
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for size in shapes[vi.name]:
            if isinstance(size, str):
                shape.dim.add().dim_param = size
            else:
                shape.dim.add().dim_value = int(size)
    return fixed


SMALL_CONSTANT = 4096  # bytes: larger initializers go to shape inference as typed inputs


def _without_big_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every large initializer replaced by a graph input of its type and
    shape: shape inference needs their shapes, not their bytes (and copying hundreds of
    MB of weights through it dominated compile time)."""
    graph = model.graph
    small = [init for init in graph.initializer if len(init.raw_data) <= SMALL_CONSTANT]
    big = [init for init in graph.initializer if len(init.raw_data) > SMALL_CONSTANT]
    typed = [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in big]
    named = {vi.name for vi in graph.input}
    light = helper.make_graph(
        list(graph.node),
        graph.name,
        [*graph.input, *(vi for vi in typed if vi.name not in named)],
        list(graph.output),
        small,
        value_info=list(graph.value_info),
    )
    out = helper.make_model(light, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def infer_types(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, TensorType]]:
    """Every known tensor's type, and the model's graph with inferred value infos (the
    model returned keeps only its small initializers: the constants live in `Graph`)."""
    try:
        inferred = shape_inference.infer_shapes(
            _without_big_weights(model), check_type=True, data_prop=True
        )
    except Exception as exc:  # onnx raises InferenceError and others
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileError(f"shape inference fails: {first}") from None
    types: dict[str, TensorType] = {}
    graph = inferred.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        kind = value_type(vi)
        if kind is not None:
            types[vi.name] = kind
    for init in graph.initializer:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        types[init.name] = TensorType(dtype, tuple(int(d) for d in init.dims))
    return inferred, types


def subgraph_refs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    refs: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            refs |= _outer_names(sub)
    return refs


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    defined = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(name for name in node.input if name)
        used |= subgraph_refs(node)
        defined.update(node.output)
    used.update(out.name for out in graph.output)
    return used - defined


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Everything `node` reads: its inputs and its subgraphs' outer references."""
    return [name for name in node.input if name] + sorted(subgraph_refs(node) - set(node.input))


def build_graph(model: onnx.ModelProto) -> Graph:
    """The working graph of a model whose input shapes are fixed: types inferred,
    constants folded (types inferred again with the folded values), BatchNormalization
    folded into the Conv before it."""
    inferred, types = infer_types(model)
    graph = Graph(
        model=inferred,
        nodes=list(inferred.graph.node),
        consts={init.name: numpy_helper.to_array(init) for init in model.graph.initializer},
        types=types,
        inputs=[vi.name for vi in graph_inputs(model)],
        outputs=[out.name for out in model.graph.output],
    )
    _name_nodes(graph.nodes)
    if fold_constants(graph):
        graph = _reinfer(graph)
    fold_batchnorm(graph)
    return graph


def _name_nodes(nodes: Iterable[onnx.NodeProto]) -> None:
    seen: set[str] = set()
    for index, node in enumerate(nodes):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)


def _reinfer(graph: Graph) -> Graph:
    """Shape inference again, now that folded values are constants: small ones go in as
    initializers (their values matter to inference), large ones as typed inputs."""
    used = {name for node in graph.nodes for name in node_inputs(node)} | set(graph.outputs)
    consts = {k: v for k, v in graph.consts.items() if k in used}
    small = {k: v for k, v in consts.items() if v.nbytes <= SMALL_CONSTANT}
    real_inputs = [vi for vi in graph.model.graph.input if vi.name in graph.inputs]
    typed = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in consts.items()
        if k not in small
    ]
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            graph.model.graph.name,
            [*real_inputs, *typed],
            list(graph.model.graph.output),
            [numpy_helper.from_array(np.asarray(v), k) for k, v in small.items()],
        ),
        opset_imports=list(graph.model.opset_import),
    )
    model.ir_version = graph.model.ir_version
    inferred, types = infer_types(model)
    return dataclasses.replace(
        graph,
        model=inferred,
        nodes=list(inferred.graph.node),
        consts=consts,
        types={**graph.types, **types},
    )


# ---- constant folding ----------------------------------------------------------------

_NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
        # a quantized weight stays quantized: QDQ fusion reads it as int8 (fuse.py)
        "DequantizeLinear",
    }
)
FOLD_LIMIT = 1 << 26  # bytes: a folded value larger than this stays a computation


def fold_constants(graph: Graph) -> bool:
    """Replace every node whose inputs are all known by its values (Shape of a tensor of
    static shape counts as known). True if anything was folded."""
    kept: list[onnx.NodeProto] = []
    folded = False
    for node in graph.nodes:
        values = _try_fold(node, graph)
        if values is None:
            kept.append(node)
            continue
        folded = True
        for name, value in zip(node.output, values, strict=False):
            if name:
                graph.consts[name] = value
                graph.types[name] = TensorType(value.dtype, tuple(value.shape))
    graph.nodes = kept
    return folded


def _try_fold(node: onnx.NodeProto, graph: Graph) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return None
    if node.op_type == "Shape":
        return _fold_shape(node, graph)
    if node.op_type == "Size":
        kind = graph.types.get(node.input[0])
        shape = None if kind is None else kind.static_shape
        if shape is not None:
            return [np.array(math.prod(shape), dtype=np.int64)]
        return None
    reads = node_inputs(node)
    if any(name not in graph.consts for name in reads):
        return None
    if any(graph.consts[name].nbytes > FOLD_LIMIT for name in reads):
        return None
    return _evaluate(node, graph)


def _fold_shape(node: onnx.NodeProto, graph: Graph) -> list[np.ndarray] | None:
    kind = graph.types.get(node.input[0])
    if kind is None or not kind.static:
        return None
    assert kind.shape is not None
    rank = len(kind.shape)
    start, end = 0, rank
    for attr in node.attribute:
        if attr.name == "start":
            start = attr.i
        elif attr.name == "end":
            end = attr.i
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [np.array(kind.shape[start:end], dtype=np.int64)]


def _evaluate(node: onnx.NodeProto, graph: Graph) -> list[np.ndarray] | None:
    """Run one node on constants with the ONNX reference implementation."""
    from onnx.reference import ReferenceEvaluator

    feeds = {name: graph.consts[name] for name in node_inputs(node)}
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape
        )
        for name, value in feeds.items()
    ]
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    single = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(single, opset_imports=list(graph.model.opset_import))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            results = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # an op the reference cannot run stays a computation
        return None
    values = [np.asarray(r) for r in results]
    if any(v.dtype == object or v.nbytes > FOLD_LIMIT for v in values):
        return None
    return values


# ---- BatchNormalization into Conv ------------------------------------------------------


def fold_batchnorm(graph: Graph) -> None:
    """Conv -> BatchNormalization (inference form, constant parameters, the Conv's
    output read by nothing else) becomes one Conv with scaled weights and a bias."""
    readers: dict[str, int] = {}
    for node in graph.nodes:
        for name in node_inputs(node):
            readers[name] = readers.get(name, 0) + 1
    producer = {out: node for node in graph.nodes for out in node.output}
    kept: list[onnx.NodeProto] = []
    for node in graph.nodes:
        conv = producer.get(node.input[0]) if node.op_type == "BatchNormalization" else None
        if conv is not None and _fold_one(graph, conv, node, readers):
            continue
        kept.append(node)
    graph.nodes = kept


def _fold_one(
    graph: Graph, conv: onnx.NodeProto, bn: onnx.NodeProto, readers: Mapping[str, int]
) -> bool:
    if conv.op_type != "Conv" or readers.get(conv.output[0], 0) != 1:
        return False
    if graph.outputs.count(conv.output[0]) or len([o for o in bn.output if o]) != 1:
        return False
    params = [graph.consts.get(name) for name in bn.input[1:5]]
    weight = graph.consts.get(conv.input[1])
    bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
    bias = graph.consts.get(bias_name) if bias_name else None
    if weight is None or any(p is None for p in params) or (bias_name and bias is None):
        return False
    if weight.dtype != np.float32 or _attr(bn, "training_mode", 0):
        return False
    scale, shift, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    eps = float(_attr(bn, "epsilon", 1e-5))
    factor = scale / np.sqrt(var + eps)
    new_weight = (weight * factor.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(np.float32)
    old_bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
    new_bias = ((old_bias - mean) * factor + shift).astype(np.float32)
    w_name, b_name = f"{conv.name}.folded_weight", f"{conv.name}.folded_bias"
    graph.consts[w_name], graph.consts[b_name] = new_weight, new_bias
    graph.types[w_name] = TensorType(new_weight.dtype, new_weight.shape)
    graph.types[b_name] = TensorType(new_bias.dtype, new_bias.shape)
    data = conv.input[0]
    del conv.input[:]
    conv.input.extend([data, w_name, b_name])
    conv.output[0] = bn.output[0]
    return True


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default
