"""Partitioning: which ops the NeuronCore runs and which go to CPU nodes, in an order that
keeps NC <-> CPU transitions few.

An op runs on the NC when the NC library has a kernel for it that implements the op's
version under the model's opset, its attributes parse, and the kernel accepts its input
dtypes; anything else goes to a CPU node (onnxruntime), with the reason recorded. So every
op that reads or writes a string tensor (a string Cast, StringNormalizer, RegexFullMatch,
...) runs on the host: the NC holds numbers only, and a NEFF whose Neuron node touches a
string tensor does not read (`neuron_rtd/neff/nodes.py`).
Ordering is a topological sort that keeps taking ready ops of the current kind and
switches kind only when none is left, so each run of one kind is as long as it can be.

A NEFF must fit a machine: when the runs on the NC (its Neuron nodes) outnumber the NCs
the NEFF may take, `fit_islands` moves the cheapest islands that do no multiply-accumulates
into the CPU nodes around them (onnxruntime runs them as well, and the copies to and from
the NC cost more than the NC saves them); the Neuron nodes left over then share NCs.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx.defs

from driver_sim import KERNELS, NC_PER_DEVICE, PRESETS
from driver_sim.ops.quant import CONTRIB_DOMAIN, CONTRIB_OPS
from neuron_rtd.compiler.fuse import INTERNAL_DOMAIN
from neuron_rtd.compiler.onnx_attrs import UnsupportedAttr, node_attrs
from neuron_rtd.compiler.onnx_graph import Graph, node_inputs
from neuron_rtd.neff.dtypes import ALLOWED_DTYPES, is_string

NC = "neuron"
CPU = "cpu"
# (domain, op) of the ops outside the ONNX domain the NC runs: onnxruntime's quantized
# ops, as its quantizer writes them (QOperator format) and as QDQ fusion makes them.
FOREIGN_DOMAIN_OPS = frozenset((CONTRIB_DOMAIN, op) for op in CONTRIB_OPS)

# The NCs of the smallest and the largest machine (driver_sim's instance presets).
SMALLEST_MACHINE_NCS = min(p.device_count for p in PRESETS.values()) * NC_PER_DEVICE
LARGEST_MACHINE_NCS = max(p.device_count for p in PRESETS.values()) * NC_PER_DEVICE


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of consecutive ops of one kind: one node of the NEFF."""

    kind: str
    nodes: tuple[onnx.NodeProto, ...]


def nc_refusal(node: onnx.NodeProto, graph: Graph) -> str | None:
    """Why the NC cannot run `node` (None when it can)."""
    for name in [*node.input, *node.output]:
        kind = graph.types.get(name) if name else None
        if kind is not None and is_string(kind.dtype):
            return f"{name!r} is a string tensor: the NC holds numbers only"
    internal = node.domain == INTERNAL_DOMAIN  # made by the compiler's own fusions
    foreign = node.domain not in ("", "ai.onnx") and not internal
    if foreign and (node.domain, node.op_type) not in FOREIGN_DOMAIN_OPS:
        return f"domain {node.domain!r} is not in the NC library"
    kern = KERNELS.get(node.op_type)
    if kern is None:
        return "no NC kernel for this op"
    if not internal and not foreign:
        try:
            version = onnx.defs.get_schema(node.op_type, graph.opset, "").since_version
        except onnx.defs.SchemaError:
            return f"no schema for this op under opset {graph.opset}"
        if kern.since is not None and version not in kern.since:
            return f"op version {version} is not one the NC implements {kern.since}"
    try:
        values = kern.parse_attrs(node_attrs(node))
    except (UnsupportedAttr, ValueError) as exc:
        return str(exc)
    outputs = _named_outputs(node)
    if not kern.min_outputs <= len(outputs) <= kern.max_outputs:
        return f"{len(outputs)} outputs requested, the NC kernel gives {kern.max_outputs}"
    dtypes: list[np.dtype] = []
    for name in [*node.input, *outputs]:
        if not name:
            continue
        kind = graph.types.get(name)
        if kind is None:
            return f"the type of {name!r} is unknown"
        if kind.shape is None:  # keep it inside a CPU node: a boundary needs a rank
            return f"shape inference cannot tell the rank of {name!r}"
        if graph.free and not kind.static:  # the NC's slots are of fixed sizes
            return f"{name!r} has a size chosen per inference (an input axis left free)"
        if kind.dtype.name not in ALLOWED_DTYPES:
            return f"{name!r} is {kind.dtype.name}, which the NC does not hold"
    dtypes = [graph.types[name].dtype for name in node.input if name]
    try:
        kern.check_support(dtypes, values)
    except ValueError as exc:
        return str(exc)
    return None


def _named_outputs(node: onnx.NodeProto) -> list[str]:
    """The outputs up to the last one named (trailing optional outputs left out)."""
    outputs = list(node.output)
    while outputs and not outputs[-1]:
        outputs.pop()
    return outputs


def place(graph: Graph) -> dict[str, str | None]:
    """Per node name: None to run it on the NC, else why it goes to a CPU node."""
    return {node.name: nc_refusal(node, graph) for node in graph.nodes}


def order(graph: Graph, refusals: dict[str, str | None]) -> list[onnx.NodeProto]:
    """A topological order of the nodes that switches between NC and CPU ops as rarely
    as it can (ties: the model's own order)."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    producer = {out: node.name for node in graph.nodes for out in node.output if out}
    deps: dict[str, set[str]] = {}
    users: dict[str, list[str]] = {node.name: [] for node in graph.nodes}
    for node in graph.nodes:
        deps[node.name] = {producer[n] for n in node_inputs(node) if n in producer}
        for dep in deps[node.name]:
            users[dep].append(node.name)
    ready: dict[str, list[int]] = {NC: [], CPU: []}
    for node in graph.nodes:
        if not deps[node.name]:
            heapq.heappush(ready[_kind(refusals, node.name)], index[node.name])
    current = NC if ready[NC] else CPU
    ordered: list[onnx.NodeProto] = []
    while ready[NC] or ready[CPU]:
        if not ready[current]:
            current = CPU if current == NC else NC
        node = graph.nodes[heapq.heappop(ready[current])]
        ordered.append(node)
        for user in users[node.name]:
            deps[user].discard(node.name)
            if not deps[user]:
                heapq.heappush(ready[_kind(refusals, user)], index[user])
    if len(ordered) != len(graph.nodes):
        raise ValueError("the graph has a cycle")
    return ordered


def _kind(refusals: dict[str, str | None], name: str) -> str:
    return NC if refusals[name] is None else CPU


def segments(ordered: Sequence[onnx.NodeProto], refusals: dict[str, str | None]) -> list[Segment]:
    """Cut the ordered nodes into runs of one kind."""
    runs: list[Segment] = []
    for node in ordered:
        kind = _kind(refusals, node.name)
        if runs and runs[-1].kind == kind:
            runs[-1] = Segment(kind, (*runs[-1].nodes, node))
        else:
            runs.append(Segment(kind, (node,)))
    return runs


@dataclasses.dataclass(frozen=True)
class IslandCosts:
    """What `fit_islands` asks of the emitter about ops on the NC."""

    cost: Callable[[onnx.NodeProto], int]  # the host work of one op (MACs + written elements)
    macs: Callable[[onnx.NodeProto], int]
    on_host: Callable[[Segment], bool]  # onnxruntime runs these ops as a CPU node


def fit_islands(
    graph: Graph, refusals: dict[str, str | None], limit: int, costs: IslandCosts
) -> tuple[list[Segment], list[onnx.NodeProto]]:
    """The ordered runs of `graph`, with Neuron islands of no multiply-accumulates moved
    into CPU nodes, cheapest first, while there are more islands than `limit` NCs (their
    reason goes into `refusals`); and the ops moved. An island is moved only if
    onnxruntime runs it."""
    runs = segments(order(graph, refusals), refusals)
    moved: list[onnx.NodeProto] = []
    while True:
        islands = [run for run in runs if run.kind == NC]
        excess = len(islands) - limit
        if excess <= 0:
            return runs, moved
        candidates = sorted(
            (island for island in islands if not any(costs.macs(n) for n in island.nodes)),
            key=lambda island: sum(costs.cost(n) for n in island.nodes),
        )
        chosen: list[Segment] = []
        for island in candidates:
            if len(chosen) == excess:
                break
            if costs.on_host(Segment(CPU, island.nodes)):
                chosen.append(island)
        if not chosen:
            return runs, moved
        reason = (
            f"moved to a CPU node: the NEFF had {len(islands)} Neuron nodes for at most "
            f"{limit} NCs, and this one does no multiply-accumulates, so the copies to and "
            "from the NC cost more than the NC saves"
        )
        for island in chosen:
            for node in island.nodes:
                refusals[node.name] = reason
                moved.append(node)
        runs = segments(order(graph, refusals), refusals)
