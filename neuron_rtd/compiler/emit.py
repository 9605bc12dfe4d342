"""From partitioned segments to NEFF nodes: Neuron nodes (split into stages balanced by
work for model parallelism) with their instructions and weights, and CPU nodes holding an
ONNX sub-model for onnxruntime. Every tensor that crosses a node or stage boundary is
declared with its planned shape (dynamic axes at their bound).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

import driver_sim
from driver_sim import KERNELS
from driver_sim.errors import KernelError
from neuron_rtd import onnxrt
from neuron_rtd.compiler.bounds import Bound, plan_bounds
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.compiler.lower import lower
from neuron_rtd.compiler.onnx_attrs import node_attrs
from neuron_rtd.compiler.onnx_graph import Graph, node_inputs
from neuron_rtd.compiler.partition import CPU, NC, Segment
from neuron_rtd.neff import NeffBuilder, StageSpec
from neuron_rtd.neff.cpu_node import ORT_MODEL, ORT_OP

SUB_MODEL_IR_VERSION = 10  # what onnxruntime 1.31 reads (it stops at 13)
ELEMENT_COST = 32  # a written element costs about as much host time as this many MACs


@dataclasses.dataclass
class NodeReport:
    """What one NEFF node holds, for the compile summary."""

    name: str
    kind: str
    ops: collections.Counter[str]
    macs: int
    weight_bytes: int
    stage_macs: list[int]
    reasons: dict[str, str]  # CPU nodes: op type -> why not on the NC
    # CPU nodes: each ONNX node's name -> why not on the NC (the torch plugin's analysis)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MovedOp:
    """An op the NC runs that went to a CPU node so that the NEFF fits its NCs."""

    name: str
    op: str
    reason: str


@dataclasses.dataclass
class Emitted:
    nodes: list[NodeReport]
    output_shapes: dict[str, tuple[int, ...]]
    output_dtypes: dict[str, np.dtype]
    dynamic_outputs: dict[str, tuple[int, ...]]
    nc_limit: int = 0  # the NCs the graph was fitted into
    moved: list[MovedOp] = dataclasses.field(default_factory=list)


class Emitter:
    """Writes one graph's segments into `builder` (the NEFF's or one bucket's)."""

    def __init__(
        self,
        graph: Graph,
        builder: NeffBuilder,
        refusals: dict[str, str | None],
        prefix: str = "",
    ) -> None:
        self.graph = graph
        self.builder = builder
        self.refusals = refusals
        self.prefix = prefix
        self.bounds = plan_bounds(graph)
        self.declared: set[str] = set()

    # --- tensors ------------------------------------------------------------------------
    def planned(self, name: str) -> tuple[np.dtype, tuple[int, ...], tuple[int, ...]]:
        """dtype, planned shape and dynamic axes of a tensor."""
        kind = self.graph.types.get(name)
        if kind is None or kind.shape is None:
            raise CompileError(f"cannot plan tensor {name!r}: its rank is unknown")
        bound = self.bounds.get(name, ())
        shape = tuple(
            d if isinstance(d, int) else (bound[i] if i < len(bound) else 0)
            for i, d in enumerate(kind.shape)
        )
        dynamic = tuple(i for i, d in enumerate(kind.shape) if not isinstance(d, int))
        return kind.dtype, shape, dynamic

    def declare(self, name: str) -> None:
        if name in self.declared or name in self.graph.inputs:
            return
        dtype, shape, dynamic = self.planned(name)
        self.builder.add_tensor(name, dtype, shape, dynamic=dynamic)
        self.declared.add(name)

    # --- the graph ----------------------------------------------------------------------
    def emit(
        self,
        segments: Sequence[Segment],
        nc_counts: Sequence[int],
        first_ncs: Sequence[int | None] | None = None,
    ) -> Emitted:
        """The segments as NEFF nodes: the i-th Neuron one split into `nc_counts[i]`
        stages, on NCs `first_ncs[i]`, ... of the NEFF's (None: NCs of their own)."""
        graph = self.graph
        for name in graph.inputs:
            dtype, shape, dynamic = self.planned(name)
            if dynamic and not graph.free:
                raise CompileError(f"model input {name!r} has an unknown size: fix its shape")
            self.builder.add_input(name, dtype, shape, dynamic=dynamic)
        outputs: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, np.dtype] = {}
        dynamic_outputs: dict[str, tuple[int, ...]] = {}
        for name in graph.outputs:
            dtype, shape, dynamic = self.planned(name)
            if len(dynamic) > 1 and not graph.free:  # free: outputs go with their shapes
                raise CompileError(
                    f"model output {name!r} has {len(dynamic)} axes whose size is known only "
                    "at run time; the wire carries bytes only, so at most one may vary"
                )
            self.builder.add_output(name, dtype, shape, dynamic=dynamic)
            self.declared.add(name)
            outputs[name], dtypes[name], dynamic_outputs[name] = shape, dtype, dynamic
        later = _later_reads(segments, graph.outputs)
        reports: list[NodeReport] = []
        counts = iter(nc_counts)
        firsts = iter(first_ncs if first_ncs is not None else [None] * len(nc_counts))
        for index, segment in enumerate(segments):
            produced = {out for node in segment.nodes for out in node.output if out}
            node_outputs = [name for name in _ordered_outputs(segment) if name in later[index]]
            node_inputs_ = _reads(segment.nodes, produced, graph)
            name = f"{self.prefix}{segment.kind}{index}"
            sub_model = None
            if segment.kind == CPU:  # onnxruntime must take it before anything is planned
                sub_model = self._sub_model(name, segment, node_inputs_, node_outputs)
                _check_ort(name, segment, sub_model)
            for tensor in [*node_inputs_, *node_outputs]:
                self.declare(tensor)
            if segment.kind == NC:
                stage_count, first = next(counts), next(firsts)
                reports.append(self._neuron_node(name, segment, node_outputs, stage_count, first))
            else:
                assert sub_model is not None
                reports.append(self._cpu_node(name, segment, sub_model, node_inputs_, node_outputs))
        return Emitted(reports, outputs, dtypes, dynamic_outputs)

    # --- Neuron nodes -------------------------------------------------------------------
    def _neuron_node(
        self,
        name: str,
        segment: Segment,
        outputs: list[str],
        stage_count: int,
        first_nc: int | None = None,
    ) -> NodeReport:
        """The segment's ops as `stage_count` Neuron nodes of one NC each, cut where the
        work (MACs plus written elements) is balanced; on NCs `first_nc`, `first_nc + 1`,
        ... of the NEFF's (None: NCs of their own)."""
        nodes = list(segment.nodes)
        costs = [self.cost(node) for node in nodes]
        cuts = split_by_cost(costs, stage_count)
        stages: list[StageSpec] = []
        stage_macs: list[int] = []
        for j, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            part = nodes[lo:hi]
            produced = {out for node in part for out in node.output if out}
            rest = nodes[hi:]
            read_later = {n for node in rest for n in node_inputs(node)} | set(outputs)
            stage_in = _reads(part, produced, self.graph)
            stage_out = [o for node in part for o in node.output if o and o in read_later]
            for tensor in [*stage_in, *stage_out]:
                self.declare(tensor)
            stage = self._stage(name, j, part, stage_in, stage_out)
            stages.append(stage)
            stage_macs.append(sum(self.macs(node) for node in part))
            # Each pipeline stage is a Neuron node of one NC: in normal mode they take
            # one NC each, and shared-NC mode can run them all on fewer NCs.
            node_name = name if len(cuts) == 2 else f"{name}.{j}"
            nc = None if first_nc is None else first_nc + j
            self.builder.add_node(node_name, NC, stage_in, stage_out, [stage], nc=nc)
        weights = sum(w.nbytes for s in stages for w in s.weights.values())
        return NodeReport(
            name=name,
            kind=NC,
            ops=collections.Counter(node.op_type for node in nodes),
            macs=sum(stage_macs),
            weight_bytes=int(weights),
            stage_macs=stage_macs,
            reasons={},
        )

    def _stage(
        self, name: str, j: int, part: list[onnx.NodeProto], inputs: list[str], outputs: list[str]
    ) -> StageSpec:
        consts = self.graph.consts
        instructions: list[driver_sim.Instr] = []
        weights: dict[str, np.ndarray] = {}
        for node in part:
            instr, made = lower(node, self.graph)
            instructions.append(instr)
            weights.update(made)
        for instr in instructions:
            weights.update({n: consts[n] for n in instr.inputs if n in consts})
        program = driver_sim.NcProgram(instructions, weights, inputs, outputs)
        try:
            driver_sim.load_program(f"compiler ({name} stage {j})", program)
        except KernelError as exc:
            bad = part[exc.index] if exc.index is not None and exc.index < len(part) else None
            raise CompileError(
                str(exc), node=bad.name if bad else "", op=bad.op_type if bad else ""
            ) from None
        return StageSpec(
            instructions=instructions,
            weights=weights,
            inputs=inputs,
            outputs=outputs,
            opset=self.graph.opset,
            auto_cast=self.graph.auto_cast[0],
            auto_cast_type=self.graph.auto_cast[1],
        )

    def macs(self, node: onnx.NodeProto) -> int:
        """The op's multiply-accumulates (0 when its shapes are not all known)."""
        kern = KERNELS[node.op_type]
        shapes = [self._static(n) for n in [*node.input, *node.output] if n]
        known = [shape for shape in shapes if shape is not None]
        if len(known) != len(shapes):
            return 0
        count = len([n for n in node.input if n])
        try:
            values = kern.parse_attrs(node_attrs(node))
            return int(kern.macs(known[:count], known[count:], values))
        except (ValueError, TypeError, IndexError, KeyError):
            return 0

    def cost(self, node: onnx.NodeProto) -> int:
        """Estimated host work of one op: its MACs plus ELEMENT_COST per written element."""
        elements = sum(math.prod(s) for n in node.output if n and (s := self._static(n)))
        return self.macs(node) + ELEMENT_COST * elements

    def _static(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape when fully known, else its bound when it has one."""
        kind = self.graph.types.get(name)
        shape = None if kind is None else kind.static_shape
        if shape is not None:
            return shape
        bound: Bound | None = self.bounds.get(name)
        return bound if bound is not None and all(bound) else None

    # --- CPU nodes ----------------------------------------------------------------------
    def on_host(self, segment: Segment) -> bool:
        """Whether onnxruntime runs `segment`'s ops as a CPU node."""
        produced = {out for node in segment.nodes for out in node.output if out}
        inputs = _reads(segment.nodes, produced, self.graph)
        outputs = _ordered_outputs(segment)
        try:
            _check_ort("a trial", segment, self._sub_model("trial", segment, inputs, outputs))
        except CompileError:
            return False
        return True

    def _cpu_node(
        self,
        name: str,
        segment: Segment,
        sub_model: onnx.ModelProto,
        inputs: list[str],
        outputs: list[str],
    ) -> NodeReport:
        data = sub_model.SerializeToString()
        blob = np.frombuffer(data, dtype=np.uint8)
        stage = StageSpec(
            instructions=[(ORT_OP, [*inputs, ORT_MODEL], outputs)],
            weights={ORT_MODEL: blob},
            inputs=inputs,
            outputs=outputs,
        )
        self.builder.add_node(name, CPU, inputs, outputs, [stage])
        return NodeReport(
            name=name,
            kind=CPU,
            ops=collections.Counter(node.op_type for node in segment.nodes),
            macs=0,
            weight_bytes=int(blob.nbytes),
            stage_macs=[],
            reasons={node.op_type: self.refusals.get(node.name) or "" for node in segment.nodes},
            refused={node.name: self.refusals.get(node.name) or "" for node in segment.nodes},
        )

    def _sub_model(
        self, name: str, segment: Segment, inputs: list[str], outputs: list[str]
    ) -> onnx.ModelProto:
        graph = self.graph
        reads = {n for node in segment.nodes for n in node_inputs(node)}
        initializers = [
            numpy_helper.from_array(np.asarray(graph.consts[n]), n)
            for n in sorted(reads)
            if n in graph.consts
        ]
        sub = helper.make_graph(
            list(segment.nodes),
            name,
            [self._value_info(n) for n in inputs],
            [self._value_info(n, shape=False) for n in outputs],
            initializers,
        )
        opsets = list(graph.model.opset_import)
        model = helper.make_model(sub, opset_imports=opsets)
        # As old an IR version as the opsets allow: onnxruntime lags behind onnx here.
        needed = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        model.ir_version = max(needed, min(graph.model.ir_version, SUB_MODEL_IR_VERSION))
        return model

    def _value_info(self, name: str, *, shape: bool = True) -> onnx.ValueInfoProto:
        kind = self.graph.types.get(name)
        if kind is None:
            return helper.make_empty_tensor_value_info(name)
        elem = helper.np_dtype_to_tensor_dtype(kind.dtype)
        if not shape or kind.shape is None:
            return helper.make_tensor_value_info(name, elem, None)
        dims = [d if isinstance(d, int) else None for d in kind.shape]
        return helper.make_tensor_value_info(name, elem, dims)


def _check_ort(name: str, segment: Segment, model: onnx.ModelProto) -> None:
    """onnxruntime must accept the CPU node's sub-model now, not at load time."""
    try:
        onnxrt.session(model, threads=1, log_severity=onnxrt.LOG_SILENT)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        ops = sorted({node.op_type for node in segment.nodes})
        raise CompileError(
            f"unsupported: neither the NC library nor onnxruntime runs CPU node {name} "
            f"(ops {', '.join(ops)}): {first}",
            node=segment.nodes[0].name,
            op=segment.nodes[0].op_type,
        ) from None


def split_by_cost(costs: Sequence[int], parts: int) -> list[int]:
    """Cut points [0, ..., len(costs)] making `parts` contiguous runs of near-equal total
    cost, each with at least one item."""
    count = len(costs)
    parts = max(1, min(parts, count))
    total = sum(costs) or 1
    cuts = [0]
    running = 0
    for i, cost in enumerate(costs):
        running += cost
        needed = parts - len(cuts)  # cuts still to place after this one
        if needed <= 0:
            break
        remaining_items = count - (i + 1)
        if (running >= total * len(cuts) / parts and remaining_items >= needed) or (
            remaining_items == needed
        ):
            cuts.append(i + 1)
    cuts.append(count)
    return cuts


def _ordered_outputs(segment: Segment) -> list[str]:
    return [out for node in segment.nodes for out in node.output if out]


def _reads(nodes: Sequence[onnx.NodeProto], produced: set[str], graph: Graph) -> list[str]:
    """Tensors the nodes read from outside themselves, constants excluded, in order."""
    seen: dict[str, None] = {}
    for node in nodes:
        for name in node_inputs(node):
            if name not in produced and name not in graph.consts:
                seen.setdefault(name)
    return list(seen)


def _later_reads(segments: Sequence[Segment], model_outputs: Sequence[str]) -> list[set[str]]:
    """Per segment, the tensors read after it (by later segments or as model outputs)."""
    after: list[set[str]] = []
    reads: set[str] = set(model_outputs)
    for segment in reversed(segments):
        after.append(set(reads))
        for node in segment.nodes:
            reads.update(node_inputs(node))
    return list(reversed(after))
