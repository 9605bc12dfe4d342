"""How neuron-top shows one poll of a daemon: its title, NeuronCore utilization, vCPU and
memory, models and devices, as rich tables (one frame: `frame`), the same in the live view
and in `--once`'s printout."""

from __future__ import annotations

import time
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from neuron_rtd import __version__
from neuron_rtd.client.observe import Interval
from neuron_rtd.tools.top.poll import DaemonState

BAR_WIDTH = 10
TALLY_ERRORS = (
    "completed_with_err",
    "completed_with_num_err",
    "timed_out",
    "incorrect_input",
    "failed_to_queue",
)


def size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def bar(percent: float, width: int = BAR_WIDTH) -> Text:
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    if percent > 0 and filled == 0:
        filled = 1  # a busy NC never looks idle
    style = "green" if percent < 50 else "yellow" if percent < 85 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "grey37"))


def title(state: DaemonState) -> str:
    d = state.describe
    parts = [f"neuron-top {__version__}"]
    if d is not None:
        parts += [f"neuron-rtd {d.runtime_version}", d.instance_type or "?"]
    parts.append(state.address)
    if d is not None:
        parts.append(f"pid {d.pid}")
    if state.error is not None:
        parts.append("NOT ANSWERING")
    return "  |  ".join(parts)


def tab_label(index: int, address: str) -> str:
    return f"{index + 1}: {address}"


def not_answering(state: DaemonState) -> Text:
    seen = time.strftime("%H:%M:%S", time.localtime(state.polled_at))
    error = state.error or ""
    headline, _, rest = error.partition(": ")
    if not error.startswith("no runtime answers"):
        headline, rest = f"the runtime at {state.address} answered an error", error
    return Text.assemble(
        (f"{headline}\n", "bold red"),
        (f"{rest}\n", "red"),
        f"(last tried {seen}; asked again every interval)",
    )


def section(name: str, *, header: bool = False) -> Table:
    """One section of the view: a borderless table under its name."""
    return Table(
        title=name,
        title_justify="left",
        show_header=header,
        header_style="bold",
        box=None,
        padding=(0, 2, 0, 0),
    )


def utilization(state: DaemonState) -> Table:
    snap, span = state.snapshot, state.span
    seconds = f"last {span.seconds:.1f} s" if span is not None else "measuring..."
    table = section(f"NeuronCore Utilization ({seconds})")
    if snap is None:
        return table
    by_device: dict[int, list[Any]] = {}
    for nc in sorted(snap.ncs, key=lambda nc: (nc.device_index, nc.nc_index)):
        by_device.setdefault(nc.device_index, []).append(nc)
    for device, ncs in sorted(by_device.items()):
        cells: list[RenderableType] = [Text(f"nd{device}", style="bold")]
        for nc in ncs:
            pct = span.nc_utilization.get(nc.vnc) if span is not None else None
            shown = f"{pct:5.1f}%" if pct is not None else "   --%"
            holder = f"ncg {nc.ncg_id}" if nc.ncg_id else "free"
            cells.append(
                Text.assemble(
                    f"NC{nc.nc_index} ", bar(pct or 0.0), f" {shown} ", (f"{holder:<7}", "cyan")
                )
            )
        table.add_row(*cells)
    return table


def vcpu_memory(state: DaemonState) -> Table:
    snap, span = state.snapshot, state.span
    table = section("vCPU and Memory")
    if snap is None:
        return table
    if span is not None:
        runtime = f"user {span.vcpu_user:5.1f}%  system {span.vcpu_system:5.1f}%  (% of one vCPU)"
    else:
        runtime = "measuring..."
    table.add_row("Runtime vCPU", runtime)
    if state.system_cpu is not None:
        c = state.system_cpu
        table.add_row(
            "System vCPU", f"user {c.user:5.1f}%  system {c.system:5.1f}%  (of {c.count} vCPUs)"
        )
    device_bytes = sum(m.device_bytes for m in snap.models)
    host_bytes = sum(m.host_bytes for m in snap.models)
    table.add_row(
        "Runtime memory",
        f"host RSS {size(snap.rss_bytes)}  "
        f"(models: host {size(host_bytes)}, device {size(device_bytes)})",
    )
    latency = span.latency_us if span is not None else None
    if latency is not None:
        table.add_row(
            "Latency", f"p50 {latency['p50'] / 1000:.2f} ms  p99 {latency['p99'] / 1000:.2f} ms"
        )
    return table


def models(state: DaemonState) -> Table:
    snap, span = state.snapshot, state.span
    table = section("Loaded Models", header=True)
    for column in ("NCG", "NCS", "MODEL ID", "NAME", "STATE", "IN FLIGHT"):
        table.add_column(column)
    for column in ("INFER/S", "ERRORS", "DEVICE MEM", "HOST MEM"):
        table.add_column(column, justify="right")
    if snap is None:
        return table
    by_id = {m.id: m for m in snap.models}
    listed: set[int] = set()
    for ncg in sorted(snap.ncgs, key=lambda g: g.id):
        ncs = (
            f"{ncg.vnc_start}-{ncg.vnc_start + ncg.nc_count - 1}"
            if ncg.nc_count > 1
            else (str(ncg.vnc_start))
        )
        group = [by_id[i] for i in sorted(ncg.model_ids) if i in by_id]
        if not group:
            table.add_row(str(ncg.id), ncs, "-", "(no model)", *[""] * 6)
        for k, model in enumerate(group):
            listed.add(model.id)
            table.add_row(
                *model_cells(model, span, str(ncg.id) if k == 0 else "", ncs if k == 0 else "")
            )
    for model in sorted(snap.models, key=lambda m: m.id):
        if model.id not in listed:  # an NCG the snapshot did not list (should not happen)
            table.add_row(*model_cells(model, span, str(model.ncg_id), ""))
    if not snap.models and not snap.ncgs:
        table.add_row("", "", "", "(no models loaded)", *[""] * 6)
    return table


STATE_STYLES = {"READY": "green", "STANDBY": "yellow", "FAILED": "bold red"}


def model_cells(model: Any, span: Interval | None, ncg: str, ncs: str) -> list[RenderableType]:
    rate = span.model_rates.get(model.id) if span is not None else None
    tally = span.model_tallies.get(model.id) if span is not None else None
    errors = sum(tally[k] for k in TALLY_ERRORS) if tally is not None else None
    state = Text(model.state, style=STATE_STYLES.get(model.state, ""))
    if model.state == "FAILED" and model.failure:
        state.append(f" ({model.failure})")
    return [
        ncg,
        ncs,
        str(model.id),
        model.name,
        state,
        str(model.in_flight),
        f"{rate:.1f}" if rate is not None else "--",
        str(errors) if errors is not None else "--",
        size(model.device_bytes),
        size(model.host_bytes),
    ]


def devices(state: DaemonState) -> Table:
    table = section("Neuron Devices", header=True)
    for column in ("DEVICE", "BDF", "NCS", "DRAM USED", "", "HW ERRORS"):
        table.add_column(column)
    if state.describe is None or state.snapshot is None:
        return table
    for d in state.describe.devices:
        pct = 100 * d.memory_used / d.memory_bytes if d.memory_bytes else 0.0
        hw = d.hw_counters
        errors = (
            hw.mem_ecc_uncorr
            + hw.sram_ecc_uncorr
            + hw.nc_errors
            + hw.nc_hangs
            + hw.dma_timeouts
            + hw.init_failures
        )
        table.add_row(
            f"nd{d.index}",
            d.bdf,
            str(d.nc_count),
            f"{size(d.memory_used)} / {size(d.memory_bytes)}",
            bar(pct),
            str(errors),
        )
    return table


def frame(state: DaemonState) -> list[RenderableType]:
    """The sections shown for one daemon, top to bottom."""
    if state.error is not None:
        return [not_answering(state)]
    return [utilization(state), vcpu_memory(state), models(state), devices(state)]
