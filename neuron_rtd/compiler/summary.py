"""The compile summary: per NEFF node what runs where, its MACs and weight bytes."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_rtd.compiler.emit import Emitted


@dataclasses.dataclass
class Summary:
    name: str
    sections: list[tuple[str | None, Emitted]] = dataclasses.field(default_factory=list)
    nc_count: int = 0  # NCs in normal mode: those its Neuron nodes span
    shared_nc_count: int = 0  # the fewest NCs it loads on: shared-NC mode, its largest node
    requested_ncs: int = 1  # --num-neuroncores
    nc_limit: int = 0  # the most NCs it may take (--num-neuroncores, else the smallest machine's)
    neff_bytes: int = 0
    stored_weight_bytes: int = 0  # each array shared by buckets or stages once

    def add(self, bucket: str | None, emitted: Emitted) -> None:
        self.sections.append((bucket, emitted))

    @property
    def nc_ops(self) -> int:
        return sum(
            sum(n.ops.values()) for _, e in self.sections for n in e.nodes if n.kind != "cpu"
        )

    @property
    def cpu_ops(self) -> int:
        return sum(
            sum(n.ops.values()) for _, e in self.sections for n in e.nodes if n.kind == "cpu"
        )

    def as_json(self) -> dict[str, Any]:
        """The summary as plain data (`neuron-cc compile --json`)."""
        return {
            "name": self.name,
            "nc_count": self.nc_count,
            "shared_nc_count": self.shared_nc_count,
            "requested_ncs": self.requested_ncs,
            "nc_limit": self.nc_limit,
            "neff_bytes": self.neff_bytes,
            "stored_weight_bytes": self.stored_weight_bytes,
            "nc_ops": self.nc_ops,
            "cpu_ops": self.cpu_ops,
            "buckets": [
                {
                    "bucket": bucket,
                    "nodes": [
                        {
                            "name": node.name,
                            "on": "cpu" if node.kind == "cpu" else "nc",
                            "ops": dict(sorted(node.ops.items())),
                            "macs": node.macs,
                            "weight_bytes": node.weight_bytes,
                            "stage_macs": list(node.stage_macs),
                            "cpu_reasons": dict(sorted(node.reasons.items())),
                        }
                        for node in emitted.nodes
                    ],
                    "moved_to_cpu": [
                        {"name": m.name, "op": m.op, "reason": m.reason} for m in emitted.moved
                    ],
                }
                for bucket, emitted in self.sections
            ],
        }

    def _nc_line(self) -> str:
        neuron_nodes = [n for n in self.sections[-1][1].nodes if n.kind != "cpu"]
        line = f"NeuronCores: {self.nc_count} in normal mode"
        stages = sum(len(n.stage_macs) for n in neuron_nodes)
        if stages > self.nc_count:
            line += f" ({len(neuron_nodes)} Neuron nodes sharing them, at most {self.nc_limit})"
        elif len(neuron_nodes) > 1:
            each = " + ".join(str(len(n.stage_macs)) for n in neuron_nodes)
            line += f" ({len(neuron_nodes)} Neuron nodes: {each})"
        if self.shared_nc_count < self.nc_count:
            line += f", {self.shared_nc_count} in shared-NC mode"
        if self.nc_count > self.requested_ncs:
            line += (
                f" (--num-neuroncores {self.requested_ncs}, but each Neuron node takes NCs "
                "of its own)"
            )
        return line

    def __str__(self) -> str:
        weights = self.stored_weight_bytes / 2**20
        listed = sum(n.weight_bytes for _, e in self.sections for n in e.nodes) / 2**20
        head = f"model {self.name!r}: NEFF {self.neff_bytes} bytes, weights {weights:.2f} MiB"
        if len(self.sections) > 1 and listed > weights:
            head += f" (stored once; the buckets below list {listed:.2f} MiB between them)"
        lines = [head, self._nc_line()]
        for bucket, emitted in self.sections:
            if bucket is not None:
                lines.append(f"bucket {bucket}:")
            indent = "  " if bucket is not None else ""
            lines.extend(f"{indent}{line}" for line in _moved_lines(emitted))
            for node in emitted.nodes:
                ops = ", ".join(f"{op} x{n}" for op, n in sorted(node.ops.items()))
                where = "NC " if node.kind != "cpu" else "CPU"
                head = (
                    f"{indent}{node.name:<14} {where} {sum(node.ops.values()):>4} ops  "
                    f"{node.macs / 1e6:>10.1f} MMACs  {node.weight_bytes / 2**20:>8.2f} MiB"
                )
                if len(node.stage_macs) > 1:
                    stages = " / ".join(f"{m / 1e6:.1f}" for m in node.stage_macs)
                    head += f"  stages (MMACs): {stages}"
                lines.append(head)
                lines.append(f"{indent}    {ops}")
                for op, reason in sorted(node.reasons.items()):
                    lines.append(f"{indent}    {op} on CPU: {reason}")
        lines.append(f"total: {self.nc_ops} ops on the NC, {self.cpu_ops} on the CPU")
        return "\n".join(lines)


MOVED_SHOWN = 8  # moved ops the printed summary names (--json lists them all)


def _moved_lines(emitted: Emitted) -> list[str]:
    """Which NC ops went to CPU nodes to fit the NCs, and why (the first few by name)."""
    if not emitted.moved:
        return []
    shown = ", ".join(f"{m.name} ({m.op})" for m in emitted.moved[:MOVED_SHOWN])
    more = len(emitted.moved) - MOVED_SHOWN
    if more > 0:
        shown += f" and {more} more"
    why = emitted.moved[0].reason.removeprefix("moved to a CPU node: ")
    return [
        f"moved to CPU nodes to fit at most {emitted.nc_limit} NCs: {len(emitted.moved)} ops "
        f"the NC runs: {shown}",
        f"    (why: {why})",
    ]
