"""`analyze_model(module, example_inputs)`: which of a module's operators neuron-cc puts
on the NeuronCores and which on CPU nodes, with the compiler's reason for each, as
`torch.neuron.analyze_model` told it for Inferentia.

The module is exported and compiled as `trace` does (neuron-cc's partitioning decides:
`neuron_rtd/compiler/partition.py`); each ONNX node the exporter made is reported with
the submodule it came from, and a table per operator is printed."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import onnx
from torch import nn

from neuron_rtd.torch.compiling import compile_exported, compiler_options
from neuron_rtd.torch.export import as_args, batch_size, export, module_path

NC = "nc"
CPU = "cpu"


@dataclasses.dataclass(frozen=True)
class NodeUse:
    """One ONNX node of the exported module: where it runs, and why not on the NC."""

    name: str
    operator: str
    module_path: str  # the submodule it came from ("" for the top module's own forward)
    on: str  # NC or CPU
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class OperatorUse:
    """One ONNX operator: its nodes on the NC and on CPU nodes, the reasons for the
    latter and the submodules they came from."""

    operator: str
    on_nc: int
    on_cpu: int
    reasons: tuple[str, ...]
    cpu_modules: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What runs where, per node and per operator (`str()`: the table)."""

    name: str
    nodes: tuple[NodeUse, ...]

    @property
    def operators(self) -> tuple[OperatorUse, ...]:
        by_op: dict[str, list[NodeUse]] = collections.defaultdict(list)
        for node in self.nodes:
            by_op[node.operator].append(node)
        uses = []
        for operator, nodes in sorted(by_op.items()):
            cpu = [n for n in nodes if n.on == CPU]
            uses.append(
                OperatorUse(
                    operator,
                    len(nodes) - len(cpu),
                    len(cpu),
                    tuple(sorted({n.reason for n in cpu})),
                    tuple(sorted({n.module_path or "(top)" for n in cpu})),
                )
            )
        return tuple(uses)

    @property
    def on_cpu(self) -> tuple[NodeUse, ...]:
        return tuple(n for n in self.nodes if n.on == CPU)

    @property
    def supported_fraction(self) -> float:
        """The share of the module's operator nodes that run on the NC."""
        return 1 - len(self.on_cpu) / len(self.nodes) if self.nodes else 1.0

    def __str__(self) -> str:
        width = max([len("operator"), *(len(u.operator) for u in self.operators)])
        lines = [f"{'operator':<{width}}  {'NC':>4}  {'CPU':>4}  why on CPU (where)"]
        for use in self.operators:
            why = ""
            if use.on_cpu:
                why = f"{'; '.join(use.reasons)} ({', '.join(use.cpu_modules)})"
            row = f"{use.operator:<{width}}  {use.on_nc:>4}  {use.on_cpu:>4}  {why}"
            lines.append(row.rstrip())
        total = len(self.nodes)
        on_nc = total - len(self.on_cpu)
        lines.append(
            f"{self.name}: {on_nc} of {total} operator nodes on the NeuronCores "
            f"({100 * self.supported_fraction:.1f}%), {len(self.on_cpu)} on CPU nodes"
        )
        return "\n".join(lines)


def analyze_model(
    module: nn.Module,
    example_inputs: Any,
    *,
    compiler_args: Sequence[str] | None = None,
    quiet: bool = False,
) -> Analysis:
    """Export and compile `module` as `trace` would (nothing is loaded), print the table
    of its operators (unless `quiet`) and return the analysis. Raises what `trace` raises
    for a module it cannot export or compile."""
    args = as_args(example_inputs)
    name = type(module).__name__
    batch = batch_size(args)
    options = compiler_options(compiler_args, name=name, dynamic_batch=False, batch=batch)
    exported = export(module, args, dynamic_batch=False)
    result = compile_exported(exported.onnx, options)
    refused: dict[str, str] = {}
    for _, emitted in result.summary.sections:
        for report in emitted.nodes:
            refused.update(report.refused)
    model = onnx.load_model_from_string(exported.onnx)
    nodes = tuple(
        NodeUse(
            node.name,
            node.op_type,
            module_path(node.name) or "",
            CPU if node.name in refused else NC,
            refused.get(node.name, ""),
        )
        for node in model.graph.node
        if node.op_type != "Constant"  # values, folded into the NEFF: no operator runs
    )
    analysis = Analysis(name, nodes)
    if not quiet:
        print(analysis)
    return analysis
