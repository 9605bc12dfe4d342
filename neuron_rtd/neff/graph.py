"""`neff.json`: the model graph. Parsing checks its schema and the node-level topology;
the stages' own programs are checked by `program` and chained by `nodes`."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff import jsonfields as jf
from neuron_rtd.neff.model import NodeKind, TensorSpec

GRAPH_FILE = "neff.json"


@dataclasses.dataclass(frozen=True)
class StagePaths:
    program: str
    weights: str


@dataclasses.dataclass(frozen=True)
class NodeDecl:
    name: str
    kind: NodeKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stages: tuple[StagePaths, ...]
    nc: int | None = None  # a Neuron node's first NC ("nc"); None: after the previous one's


@dataclasses.dataclass(frozen=True)
class GraphDecl:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tensors: Mapping[str, TensorSpec]
    nodes: tuple[NodeDecl, ...]
    symbols: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    buckets: tuple[GraphDecl, ...] = ()


def parse_graph(doc: object) -> GraphDecl:
    """The graph of a parsed neff.json; NeffInvalid naming the fault otherwise.

    A bucketed graph has no nodes of its own but a "buckets" list: each bucket is a
    complete graph (static shapes) for the ranges of the dimensions its "symbols" name,
    and the model's inputs and outputs name per axis the symbol it follows."""
    obj = jf.as_object(doc, GRAPH_FILE)
    graph = _graph(obj, GRAPH_FILE)
    if "buckets" in obj:
        items = jf.as_list(obj["buckets"], f"{GRAPH_FILE} buckets")
        buckets = tuple(_bucket(item, f"bucket {i}") for i, item in enumerate(items))
        graph = dataclasses.replace(graph, buckets=buckets)
        _check_buckets(graph)
    return graph


def _graph(obj: jf.JsonObject, where: str) -> GraphDecl:
    graph = GraphDecl(
        name=jf.as_name(jf.get(obj, "name", where), f"{where} name"),
        inputs=_tensor_decls(jf.get(obj, "inputs", where), "model input"),
        outputs=_tensor_decls(jf.get(obj, "outputs", where), "model output"),
        tensors=_tensor_table(jf.get(obj, "tensors", where)),
        nodes=_nodes(jf.get(obj, "nodes", where)),
    )
    _check_model_tensors(graph)
    if "buckets" not in obj:
        _check_topology(graph)
    return graph


def _bucket(value: object, where: str) -> GraphDecl:
    obj = jf.as_object(value, where)
    graph = _graph(obj, where)
    where = f"bucket {graph.name!r}"
    table = jf.as_object(jf.get(obj, "symbols", where), f"{where} symbols")
    symbols: dict[str, tuple[int, int]] = {}
    for symbol, bounds in table.items():
        pair = jf.as_shape(bounds, f"{where} symbol {symbol!r}")
        if len(pair) != 2 or not 1 <= pair[0] <= pair[1]:
            raise NeffInvalid(
                f"{where}: symbol {symbol!r} needs bounds [low, high] with "
                f"1 <= low <= high, got {bounds!r}"
            )
        symbols[symbol] = (pair[0], pair[1])
    return dataclasses.replace(graph, symbols=types.MappingProxyType(symbols))


def _check_buckets(graph: GraphDecl) -> None:
    """A bucketed graph: no nodes of its own, every bucket's inputs and outputs are the
    model's at that bucket's sizes, and every node name is unique across buckets."""
    if graph.nodes:
        raise NeffInvalid(f"{GRAPH_FILE}: a bucketed graph has its nodes in its buckets")
    if not graph.buckets:
        raise NeffInvalid(f"{GRAPH_FILE}: buckets is empty")
    seen: set[str] = set()
    for bucket in graph.buckets:
        where = f"bucket {bucket.name!r}"
        for node in bucket.nodes:
            if node.name in seen:
                raise NeffInvalid(f"{where}: node name {node.name!r} is used by another bucket")
            seen.add(node.name)
        for what, model_specs, own in (
            ("input", graph.inputs, bucket.inputs),
            ("output", graph.outputs, bucket.outputs),
        ):
            if [s.name for s in model_specs] != [s.name for s in own]:
                raise NeffInvalid(f"{where}: its {what}s are not the model's {what}s")
            for spec, mine in zip(model_specs, own, strict=True):
                expected = bucket_shape(spec, bucket.symbols, where)
                if mine.dtype != spec.dtype or mine.shape != expected:
                    raise NeffInvalid(
                        f"{where}: {what} {spec.name!r} is {mine.describe()}, expected "
                        f"{spec.dtype.name} {expected}"
                    )


def bucket_shape(
    spec: TensorSpec, symbols: Mapping[str, tuple[int, int]], where: str
) -> tuple[int, ...]:
    """The static shape of a model tensor in the bucket with these symbol ranges."""
    if not spec.symbols:
        return spec.shape
    shape = list(spec.shape)
    for axis, symbol in enumerate(spec.symbols):
        if symbol is None:
            continue
        if symbol not in symbols:
            raise NeffInvalid(f"{where}: gives no range for symbol {symbol!r} of {spec.name!r}")
        shape[axis] = symbols[symbol][1]
    return tuple(shape)


def _tensor_decls(value: object, what: str) -> tuple[TensorSpec, ...]:
    items = jf.as_list(value, f"{GRAPH_FILE} {what}s")
    specs = tuple(_tensor_decl(item, what, i) for i, item in enumerate(items))
    jf.check_unique(tuple(spec.name for spec in specs), f"{GRAPH_FILE} {what}s")
    return specs


def _tensor_decl(value: object, what: str, index: int) -> TensorSpec:
    where = f"{what} {index}"
    obj = jf.as_object(value, where)
    name = jf.as_name(jf.get(obj, "name", where), f"{where} name")
    return _spec(name, obj, f"{what} {name!r}")


def _spec(name: str, obj: jf.JsonObject, where: str) -> TensorSpec:
    shape = jf.get_shape(obj, where)
    dynamic: tuple[int, ...] = ()
    symbols: tuple[str | None, ...] = ()
    if "dynamic" in obj:
        dynamic = jf.as_shape(obj["dynamic"], f"{where} dynamic")
        jf.check_unique(tuple(map(str, dynamic)), f"{where} dynamic")
        for axis in dynamic:
            if axis >= len(shape):
                raise NeffInvalid(f"{where}: dynamic axis {axis} is outside shape {list(shape)}")
    if "symbols" in obj:
        items = jf.as_list(obj["symbols"], f"{where} symbols")
        if len(items) != len(shape):
            raise NeffInvalid(f"{where}: symbols has {len(items)} entries for {len(shape)} axes")
        symbols = tuple(
            None if item is None else jf.as_name(item, f"{where} symbols[{i}]")
            for i, item in enumerate(items)
        )
    return TensorSpec(
        name=name, dtype=jf.get_dtype(obj, where), shape=shape, dynamic=dynamic, symbols=symbols
    )


def _tensor_table(value: object) -> Mapping[str, TensorSpec]:
    obj = jf.as_object(value, f"{GRAPH_FILE} tensors")
    table: dict[str, TensorSpec] = {}
    for name, entry in obj.items():
        where = f"tensor {name!r}"
        jf.as_name(name, where)
        table[name] = _spec(name, jf.as_object(entry, where), where)
    return types.MappingProxyType(table)


def _nodes(value: object) -> tuple[NodeDecl, ...]:
    items = jf.as_list(value, f"{GRAPH_FILE} nodes")
    nodes = tuple(_node(item, f"node {i}") for i, item in enumerate(items))
    jf.check_unique(tuple(node.name for node in nodes), f"{GRAPH_FILE} nodes")
    return nodes


def _node(value: object, where: str) -> NodeDecl:
    obj = jf.as_object(value, where)
    name = jf.as_name(jf.get(obj, "name", where), f"{where} name")
    where = f"node {name!r}"
    node = NodeDecl(
        name=name,
        kind=_kind(jf.get(obj, "kind", where), where),
        inputs=jf.as_names(jf.get(obj, "inputs", where), f"{where} inputs"),
        outputs=jf.as_names(jf.get(obj, "outputs", where), f"{where} outputs"),
        stages=_stage_paths(jf.get(obj, "stages", where), where),
        nc=_first_nc(obj, where),
    )
    _check_stage_count(node)
    if node.nc is not None and node.kind != NodeKind.NEURON:
        raise NeffInvalid(f"{where}: only a neuron node runs on an NC, this one names nc")
    if not node.outputs:
        raise NeffInvalid(f"{where}: has no outputs")
    return node


def _first_nc(obj: jf.JsonObject, where: str) -> int | None:
    """The node's optional "nc": the NC of the NEFF's its first stage runs on."""
    if "nc" not in obj:
        return None
    nc = jf.as_int(obj["nc"], f"{where} nc")
    if nc < 0:
        raise NeffInvalid(f"{where}: nc must be 0 or more, got {nc}")
    return nc


def _kind(value: object, where: str) -> NodeKind:
    text = jf.as_str(value, f"{where} kind")
    try:
        return NodeKind(text)
    except ValueError:
        known = " or ".join(repr(k.value) for k in NodeKind)
        raise NeffInvalid(f"{where}: unknown kind {text!r} (expected {known})") from None


def _stage_paths(value: object, where: str) -> tuple[StagePaths, ...]:
    items = jf.as_list(value, f"{where} stages")
    return tuple(_stage_path(item, f"{where} stage {j}") for j, item in enumerate(items))


def _stage_path(value: object, where: str) -> StagePaths:
    obj = jf.as_object(value, where)
    return StagePaths(
        program=jf.as_name(jf.get(obj, "program", where), f"{where} program"),
        weights=jf.as_name(jf.get(obj, "weights", where), f"{where} weights"),
    )


def _check_stage_count(node: NodeDecl) -> None:
    count = len(node.stages)
    if node.kind == NodeKind.CPU and count != 1:
        raise NeffInvalid(
            f"node {node.name!r}: a cpu node has exactly 1 stage, this one has {count}"
        )
    if node.kind == NodeKind.NEURON and count == 0:
        raise NeffInvalid(f"node {node.name!r}: a neuron node needs at least 1 stage, it has 0")


def _check_model_tensors(graph: GraphDecl) -> None:
    if not graph.outputs:
        raise NeffInvalid(f"{GRAPH_FILE}: the model has no outputs")
    for what, specs in (("model input", graph.inputs), ("model output", graph.outputs)):
        for spec in specs:
            declared = declared_tensor(graph.tensors, spec.name, f"{what} {spec.name!r}")
            if declared != spec:
                raise NeffInvalid(
                    f'{what} {spec.name!r} is {spec.describe()} but "tensors" declares it '
                    f"{declared.describe()}"
                )


def declared_tensor(tensors: Mapping[str, TensorSpec], name: str, where: str) -> TensorSpec:
    """The "tensors" entry for `name`; NeffInvalid naming `where` if there is none."""
    spec = tensors.get(name)
    if spec is None:
        raise NeffInvalid(f'{where} is not declared in "tensors"')
    return spec


def _check_topology(graph: GraphDecl) -> None:
    """Every tensor is defined once (by the caller or one node), before it is used."""
    origin = {spec.name: "a model input" for spec in graph.inputs}
    for node in graph.nodes:
        where = f"node {node.name!r}"
        for name in node.inputs:
            if name not in origin:
                raise NeffInvalid(
                    f"{where}: input {name!r} is neither a model input nor an output of an "
                    "earlier node (nodes must be in topological order)"
                )
            declared_tensor(graph.tensors, name, f"{where} input {name!r}")
        for name in node.outputs:
            if name in origin:
                raise NeffInvalid(f"{where}: output {name!r} is already {origin[name]}")
            declared_tensor(graph.tensors, name, f"{where} output {name!r}")
            origin[name] = f"an output of node {node.name!r}"
    for spec in graph.outputs:
        if origin.get(spec.name, "a model input") == "a model input":
            raise NeffInvalid(f"model output {spec.name!r} is produced by no node")
