"""Assembling nodes: load each stage's program and weights from the archive and check
that the stages chain (stage j reads the node's inputs or earlier stages' outputs), and
that only a CPU node running onnxruntime touches a string tensor (an NC, and the NC
kernels a CPU node may run instead, hold numbers only) or reads a model input with free
axes (a size chosen per inference: the NC's slots are of fixed sizes)."""

from __future__ import annotations

from collections.abc import Mapping

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff.cpu_node import is_ort_stage
from neuron_rtd.neff.dtypes import is_string
from neuron_rtd.neff.graph import GraphDecl, NodeDecl, declared_tensor
from neuron_rtd.neff.jsonfields import load_json
from neuron_rtd.neff.model import Node, NodeKind, Stage, first_ncs
from neuron_rtd.neff.program import parse_stage


def build_nodes(graph: GraphDecl, members: Mapping[str, memoryview]) -> tuple[Node, ...]:
    """Every node of `graph` with its stages loaded from `members` and checked."""
    node_outputs = {name for node in graph.nodes for name in node.outputs}
    taken = {spec.name for spec in graph.inputs} | node_outputs
    neuron = [decl for decl in graph.nodes if decl.kind == NodeKind.NEURON]
    firsts = dict(
        zip(
            (decl.name for decl in neuron),
            first_ncs([(decl.nc, len(decl.stages)) for decl in neuron]),
            strict=True,
        )
    )
    return tuple(
        _build_node(decl, graph, members, taken, firsts.get(decl.name, 0)) for decl in graph.nodes
    )


def _build_node(
    decl: NodeDecl,
    graph: GraphDecl,
    members: Mapping[str, memoryview],
    taken: set[str],
    nc: int,
) -> Node:
    stages = tuple(_load_stage(decl, j, members) for j in range(len(decl.stages)))
    _check_chain(decl, stages, graph, taken)
    _check_strings(decl, stages, graph)
    return Node(
        name=decl.name,
        kind=decl.kind,
        inputs=decl.inputs,
        outputs=decl.outputs,
        stages=stages,
        nc=nc,
    )


def member(members: Mapping[str, memoryview], path: str, what: str) -> memoryview:
    """The data of archive member `path`; NeffInvalid naming `what` needs it if missing."""
    data = members.get(path)
    if data is None:
        raise NeffInvalid(f"NEFF archive has no {path!r} ({what})")
    return data


def _load_stage(decl: NodeDecl, index: int, members: Mapping[str, memoryview]) -> Stage:
    paths = decl.stages[index]
    where = f"node {decl.name!r} stage {index}"
    program = member(members, paths.program, f"the program of {where}")
    blob = member(members, paths.weights, f"the weights of {where}")
    return parse_stage(load_json(program, f"{where} program {paths.program!r}"), blob, where)


def _check_chain(
    decl: NodeDecl, stages: tuple[Stage, ...], graph: GraphDecl, taken: set[str]
) -> None:
    """Stage inputs are available, stage outputs are new and declared, and the stages
    together produce every node output. `taken` gathers names already defined."""
    available = set(decl.inputs)
    produced: set[str] = set()
    for j, stage in enumerate(stages):
        where = f"node {decl.name!r} stage {j}"
        for name in stage.inputs:
            if name not in available:
                raise NeffInvalid(
                    f"{where}: input {name!r} is not available: it is neither an input of the "
                    "node nor an output of an earlier stage"
                )
            declared_tensor(graph.tensors, name, f"{where} input {name!r}")
        for name in stage.outputs:
            _check_new_output(decl, name, produced, taken, where)
            declared_tensor(graph.tensors, name, f"{where} output {name!r}")
            produced.add(name)
            available.add(name)
    for name in decl.outputs:
        if name not in produced:
            raise NeffInvalid(
                f"node {decl.name!r}: output {name!r} is produced by none of its stages"
            )


def _check_strings(decl: NodeDecl, stages: tuple[Stage, ...], graph: GraphDecl) -> None:
    """A string tensor is read and written, a model input with free axes (`dynamic` on a
    model input) read, by onnxruntime's CPU nodes only."""
    if decl.kind == NodeKind.CPU and is_ort_stage(stages[0]):
        return
    free = {spec.name: spec.dynamic for spec in graph.inputs if spec.dynamic}
    for j, stage in enumerate(stages):
        for name in (*stage.inputs, *stage.outputs):
            runs = "an NC" if decl.kind == NodeKind.NEURON else "the NC kernels on the host"
            if is_string(graph.tensors[name].dtype):
                raise NeffInvalid(
                    f"node {decl.name!r} stage {j}: tensor {name!r} is a string tensor, and the "
                    f"node runs on {runs}, which hold numbers only: string tensors belong to "
                    "CPU nodes that run onnxruntime"
                )
            if name in free:
                raise NeffInvalid(
                    f"node {decl.name!r} stage {j}: model input {name!r} has free axes "
                    f"{list(free[name])} (a size chosen per inference), and the node runs on "
                    f"{runs}, whose tensors are of fixed sizes: such an input belongs to CPU "
                    "nodes that run onnxruntime"
                )


def _check_new_output(
    decl: NodeDecl, name: str, produced: set[str], taken: set[str], where: str
) -> None:
    own_output = name in decl.outputs
    if name in produced or name in decl.inputs or (name in taken and not own_output):
        raise NeffInvalid(f"{where}: output {name!r} is already defined elsewhere in the model")
    if not own_output:
        taken.add(name)
