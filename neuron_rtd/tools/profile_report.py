"""`neuron-cli profile`'s report of one profile (an ext profile answer): its rows (each NC
instruction and CPU node averaged over the inferences shown: `rows`), the report they make
(run order, the top by time, the summary by op type, the totals per NC and CPU node:
`build_report`, also printed as JSON) and its tables as text (`render`). The command and
its Chrome trace are `neuron_rtd/tools/profile.py`'s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

TOP = 10  # the report's top ops by time


@dataclass
class Row:
    """One NC instruction or CPU node, averaged over the inferences shown."""

    order: int
    where: str  # "NC 0" or "CPU"
    node: str
    index: int  # in its stage's program; -1 for a CPU node
    op: str  # the op type; a CPU node's is "cpu-node"
    engine: str
    host_ms: float
    nc_us: float
    macs: int
    gmacps: float
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]


def _where(step: Any) -> str:
    return f"NC {step.vnc}" if step.vnc >= 0 else "CPU"


def dims(shapes: Iterable[Any]) -> list[list[int]]:
    """Each shape message's dims as a list."""
    return [list(s.dims) for s in shapes]


def rows(response: Any) -> list[Row]:
    """One row per NC instruction and CPU node, averaged over the inferences (those of
    the last inference's variant, the one the rows follow)."""
    inferences = list(response.inferences)
    if not inferences:
        return []
    shape_of = [(s.node, s.stage, s.vnc, len(s.instrs)) for s in inferences[-1].steps]
    same = [
        i
        for i in inferences
        if [(s.node, s.stage, s.vnc, len(s.instrs)) for s in i.steps] == shape_of
    ]
    count = len(same)
    clock = response.nc_clock_hz or 1
    out: list[Row] = []
    last = same[-1]
    for k, step in enumerate(last.steps):
        if step.vnc < 0:
            host = sum(i.steps[k].host_ns for i in same) / count
            out.append(
                Row(
                    len(out),
                    "CPU",
                    step.node,
                    -1,
                    "cpu-node",
                    "host",
                    host / 1e6,
                    0.0,
                    0,
                    0.0,
                    dims(step.input_shapes),
                    dims(step.output_shapes),
                )
            )
            continue
        for j, instr in enumerate(step.instrs):
            host = sum(i.steps[k].instrs[j].host_ns for i in same) / count
            cycles = sum(i.steps[k].instrs[j].cycles for i in same) / count
            macs = int(instr.macs)
            out.append(
                Row(
                    len(out),
                    _where(step),
                    step.node,
                    instr.index,
                    instr.op,
                    instr.engine,
                    host / 1e6,
                    cycles / clock * 1e6,
                    macs,
                    macs / host if host else 0.0,  # MACs per ns = GMAC/s
                    dims(instr.input_shapes),
                    dims(instr.output_shapes),
                )
            )
    return out


def build_report(response: Any) -> dict[str, Any]:
    table = rows(response)
    total_ms = sum(r.host_ms for r in table) or 1.0
    total_nc = sum(r.nc_us for r in table) or 1.0
    by_type: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "host_ms": 0.0, "nc_us": 0.0, "macs": 0}
    )
    by_track: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "host_ms": 0.0, "nc_us": 0.0, "macs": 0}
    )
    for row in table:
        for key, group in (
            (row.op, by_type),
            (row.where if row.where != "CPU" else f"CPU {row.node}", by_track),
        ):
            entry = group[key]
            entry["count"] += 1
            entry["host_ms"] += row.host_ms
            entry["nc_us"] += row.nc_us
            entry["macs"] += row.macs

    def finish(group: Mapping[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
        out = []
        for key, entry in sorted(group.items(), key=lambda kv: -kv[1]["host_ms"]):
            host_ns = entry["host_ms"] * 1e6
            out.append(
                {
                    name: key,
                    **entry,
                    "percent": 100 * entry["host_ms"] / total_ms,
                    "nc_percent": 100 * entry["nc_us"] / total_nc,
                    "gmacps": entry["macs"] / host_ns if host_ns else 0.0,
                }
            )
        return out

    inferences = list(response.inferences)
    return {
        "model_id": response.model_id,
        "model_name": response.model_name,
        "nc_clock_hz": response.nc_clock_hz,
        "recorded": response.recorded,
        "inferences": len(inferences),
        "time_note": (
            "host_ms: host wall time of each op on the reference kernels (averaged); "
            "nc_us: simulated NC time, cost-model cycles / nc_clock_hz"
        ),
        "inference_host_ms": (
            sum(i.host_ns for i in inferences) / len(inferences) / 1e6 if inferences else 0.0
        ),
        "inference_nc_us": (
            sum(i.cycles for i in inferences) / len(inferences) / response.nc_clock_hz * 1e6
            if inferences and response.nc_clock_hz
            else 0.0
        ),
        "total_macs": sum(r.macs for r in table),
        "run_order": [asdict(r) for r in table],
        "top": [asdict(r) for r in sorted(table, key=lambda r: -r.host_ms)[:TOP]],
        "by_type": finish(by_type, "op"),
        "by_track": finish(by_track, "track"),
    }


def shape_text(shapes: Sequence[Sequence[int]]) -> str:
    """Shapes as text: [1x3x224x224],[1000]."""
    return ",".join("[" + "x".join(map(str, s)) + "]" for s in shapes)


def _table(headers: Sequence[str], lines: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max([len(h), *(len(line[k]) for line in lines)]) for k, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if k in right else c.ljust(w)
                for k, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    return "\n".join([rule, fmt(headers), rule, *(fmt(line) for line in lines), rule]) + "\n"


def _op_lines(table: Sequence[Mapping[str, Any]], total_ms: float) -> list[list[str]]:
    return [
        [
            str(r["order"]),
            r["where"],
            r["node"] if r["index"] < 0 else f"{r['node']}#{r['index']}",
            r["op"],
            f"{r['host_ms']:.4f}",
            f"{100 * r['host_ms'] / total_ms:.1f}",
            f"{r['nc_us']:.3f}",
            str(r["macs"]),
            f"{r['gmacps']:.3f}",
            shape_text(r["output_shapes"]),
        ]
        for r in table
    ]


def render(report: Mapping[str, Any]) -> str:
    total_ms = sum(r["host_ms"] for r in report["run_order"]) or 1.0
    op_headers = [
        "#",
        "where",
        "op",
        "type",
        "host ms",
        "%",
        "NC us",
        "MACs",
        "GMAC/s",
        "output shape",
    ]
    right = {0, 4, 5, 6, 7, 8}
    parts = [
        f"Model {report['model_id']} ({report['model_name']}): {report['inferences']} profiled "
        f"inference(s) shown, {report['recorded']} since load\n"
        f"Inference: {report['inference_host_ms']:.3f} ms host wall, "
        f"{report['inference_nc_us']:.3f} us simulated NC; {report['total_macs']} MACs\n"
        "host ms: wall time on the host (reference kernels, op by op, averaged); "
        f"NC us: the op's engine cycles at {report['nc_clock_hz'] / 1e9:g} GHz (engines run "
        "side by side: a stage takes its busiest engine's time)\n\n",
        "Run order\n",
        _table(op_headers, _op_lines(report["run_order"], total_ms), right),
        f"\nTop {TOP} by host time\n",
        _table(op_headers, _op_lines(report["top"], total_ms), right),
        "\nBy op type\n",
    ]
    group_headers = ["count", "host ms", "%", "NC us", "NC %", "MACs", "GMAC/s"]

    def group_lines(entries: Sequence[Mapping[str, Any]], key: str) -> list[list[str]]:
        return [
            [
                e[key],
                str(e["count"]),
                f"{e['host_ms']:.4f}",
                f"{e['percent']:.1f}",
                f"{e['nc_us']:.3f}",
                f"{e['nc_percent']:.1f}",
                str(e["macs"]),
                f"{e['gmacps']:.3f}",
            ]
            for e in entries
        ]

    parts.append(
        _table(["type", *group_headers], group_lines(report["by_type"], "op"), set(range(1, 8)))
    )
    parts.append("\nBy NC and CPU node\n")
    parts.append(
        _table(
            ["track", *group_headers], group_lines(report["by_track"], "track"), set(range(1, 8))
        )
    )
    return "".join(parts)
