"""`neuron-top`: a live view of one or more neuron-rtd daemons, one tab each.

Per daemon: NeuronCore utilization over the last interval (per device, each NC with the
NCG holding it), the loaded models per NCG with their state, inference rate and memory,
the daemon's vCPU and memory, and its devices' DRAM. Built on textual; the numbers come
from two ext snapshots (`neuron_rtd.client.observe`).

A daemon that does not answer shows "no runtime answers at ADDRESS" in its tab and the
view keeps polling it, so it recovers when the daemon returns; the view starts even when
no daemon answers, as the original neuron-top starts on an idle machine. `--once` (and
any run whose output is not a terminal) prints one frame instead and exits 1 when a
daemon does not answer.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psutil
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Static, Tab, Tabs

from neuron_rtd import __version__
from neuron_rtd.client import DEFAULT_ADDRESS, NrtClientError
from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.client.observe import Interval, Watch, interval
from neuron_rtd.command_line import EXIT_OK, EXIT_USAGE, add_version, entry

BAR_WIDTH = 10
TALLY_ERRORS = (
    "completed_with_err",
    "completed_with_num_err",
    "timed_out",
    "incorrect_input",
    "failed_to_queue",
)


# --- what one poll of a daemon found ----------------------------------------------------
@dataclass(frozen=True)
class SystemCpu:
    """The machine's vCPU use over the last interval, % of all its vCPUs."""

    user: float
    system: float
    count: int


@dataclass(frozen=True)
class DaemonState:
    """One daemon as last seen. `error` is set when it did not answer; `describe` then
    still holds what it said last (for the title), and `snapshot` is None."""

    address: str
    describe: Any | None = None
    snapshot: Any | None = None
    span: Interval | None = None  # None until two snapshots in a row
    error: str | None = None
    system_cpu: SystemCpu | None = None
    polled_at: float = field(default_factory=time.time)


class Poller:
    """Polls one daemon: describe (devices' DRAM changes as models load) and snapshot, and
    the interval since its previous snapshot. After a failure it starts a new channel and
    a new baseline, so a daemon that comes back (maybe a new process) is read afresh."""

    def __init__(self, address: str, *, timeout_s: float = 2.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._watch: Watch | None = None
        self._describe: Any | None = None
        self._before: Any | None = None
        self._cpu_before = psutil.cpu_times()

    def poll(self) -> DaemonState:
        cpu = self._system_cpu()
        if self._watch is None:
            self._watch = Watch(self.address, timeout_s=self.timeout_s)
        try:
            describe = self._watch.describe()
            snapshot = self._watch.snapshot()
        except NrtClientError as exc:
            self._watch.close()
            self._watch = None
            self._before = None
            error = exc.details if exc.details.startswith("no runtime answers") else str(exc)
            return DaemonState(self.address, self._describe, error=error, system_cpu=cpu)
        if self._describe is not None and describe.pid != self._describe.pid:
            self._before = None  # another process: its counts start again
        span = interval(self._before, snapshot) if self._before is not None else None
        self._describe, self._before = describe, snapshot
        return DaemonState(self.address, describe, snapshot, span, system_cpu=cpu)

    def _system_cpu(self) -> SystemCpu | None:
        now, before = psutil.cpu_times(), self._cpu_before
        total = sum(now) - sum(before)
        if total < 0.05:  # too short a time to say (the first poll comes at once)
            return None
        self._cpu_before = now
        return SystemCpu(
            user=100 * (now.user + now.nice - before.user - before.nice) / total,
            system=100 * (now.system - before.system) / total,
            count=psutil.cpu_count() or 1,
        )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()


# --- what is shown ------------------------------------------------------------------------
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


# --- the live view ------------------------------------------------------------------------
class Polled(Message):
    """A poller thread's news: daemon `index` as it is now."""

    def __init__(self, index: int, state: DaemonState) -> None:
        super().__init__()
        self.index = index
        self.state = state


class NeuronTop(App[int]):
    """One tab per daemon; the body shows the selected one."""

    TITLE = "neuron-top"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #title { background: $primary-background; color: $text; text-style: bold; padding: 0 1; }
    #body { padding: 0 1; }
    .section { margin-bottom: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", show=False, priority=True),
        Binding("right", "next_daemon", "Next daemon", priority=True),
        Binding("left", "previous_daemon", "Previous daemon", priority=True),
        Binding("tab", "next_daemon", show=False, priority=True),
        Binding("shift+tab", "previous_daemon", show=False, priority=True),
        *(Binding(str(k), f"select_daemon({k - 1})", show=False) for k in range(1, 10)),
    ]

    def __init__(
        self, pollers: Sequence[Poller], *, interval_s: float = 1.0, poll: bool = True
    ) -> None:
        super().__init__()
        self.pollers = list(pollers)
        self.interval_s = interval_s
        self.states = [DaemonState(p.address) for p in self.pollers]
        self.selected = 0
        self._poll = poll
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def compose(self) -> ComposeResult:
        yield Static(Text(title(self.states[0])), id="title")
        yield Tabs(
            *(Tab(tab_label(i, p.address), id=f"daemon-{i}") for i, p in enumerate(self.pollers))
        )
        with VerticalScroll(id="body"):
            asking = Text(f"asking {self.pollers[0].address}...")
            yield Static(asking, id="message", classes="section")
            for name in ("util", "vcpu", "models", "devices"):
                yield Static("", id=name, classes="section")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#body", VerticalScroll).focus()  # up/down/page keys scroll it
        if not self._poll:
            return
        for index, poller in enumerate(self.pollers):
            thread = threading.Thread(
                target=self._poll_loop,
                args=(index, poller),
                name=f"neuron-top-poll-{index}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def on_unmount(self) -> None:
        self._stop.set()

    def _poll_loop(self, index: int, poller: Poller) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    state = poller.poll()
                except Exception as exc:  # shown in its tab, never a traceback over the view
                    state = DaemonState(poller.address, error=f"reading it failed: {exc!r}")
                if self._stop.is_set() or not self.post_message(Polled(index, state)):
                    return
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            poller.close()

    def on_polled(self, message: Polled) -> None:
        self.show(message.index, message.state)

    def show(self, index: int, state: DaemonState) -> None:
        """Take daemon `index`'s new state; redraw when it is the one selected."""
        self.states[index] = state
        if index == self.selected:
            self.redraw()

    def redraw(self) -> None:
        state = self.states[self.selected]
        self.query_one("#title", Static).update(Text(title(state)))
        message = self.query_one("#message", Static)
        sections = [self.query_one(f"#{n}", Static) for n in ("util", "vcpu", "models", "devices")]
        if state.error is not None:
            message.update(not_answering(state))
        elif state.snapshot is None:
            message.update(Text(f"asking {state.address}..."))
        message.display = state.error is not None or state.snapshot is None
        shown = frame(state) if state.error is None and state.snapshot is not None else []
        for widget, renderable in zip(sections, shown, strict=False):
            widget.update(renderable)
        for k, widget in enumerate(sections):
            widget.display = k < len(shown)

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        if event.tab is None or event.tab.id is None:
            return
        self.selected = int(event.tab.id.removeprefix("daemon-"))
        self.redraw()

    def action_next_daemon(self) -> None:
        self.query_one(Tabs).action_next_tab()

    def action_previous_daemon(self) -> None:
        self.query_one(Tabs).action_previous_tab()

    def action_select_daemon(self, index: int) -> None:
        if 0 <= index < len(self.pollers):
            self.query_one(Tabs).active = f"daemon-{index}"


# --- once, for pipes and scripts ------------------------------------------------------------
def print_once(pollers: Sequence[Poller], interval_s: float, console: Console) -> int:
    """Two polls `interval_s` apart, one frame per daemon; 1 when one did not answer."""
    first = [p.poll() for p in pollers]
    if any(s.error is None for s in first):
        time.sleep(interval_s)
    states = [p.poll() if s.error is None else s for p, s in zip(pollers, first, strict=True)]
    status = 0
    for state in states:
        if state.error is not None:
            print(f"neuron-top: {state.error}", file=sys.stderr)
            status = 1
            continue
        console.print(Text(title(state), style="bold"))
        console.print(Group(*(Group(section, Text("")) for section in frame(state))))
    return status


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value > 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600 s: {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="neuron-top",
        description="A live view of neuron-rtd daemons: NeuronCore utilization, loaded "
        "models per NCG with state and inference rate, the daemon's vCPU and memory, "
        "device DRAM. One tab per daemon.",
        epilog="Keys: left/right or tab/shift+tab switch daemons, 1-9 pick one, up/down and "
        "page up/down scroll, q (or ctrl+c) quits. "
        "A daemon that does not answer shows 'no runtime answers at ADDRESS' in its tab "
        "and is asked again every interval; the view starts even when none answers. "
        "With --once, or when stdout is not a terminal, one frame is printed instead and "
        "the exit status is 1 when a daemon does not answer (2 for usage errors, 130 or 143 "
        "when Ctrl-C or SIGTERM stops it first).",
    )
    parser.add_argument(
        "addresses",
        nargs="*",
        metavar="ADDRESS",
        help=f"daemons to watch (default: $NEURON_RTD_ADDRESS, else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "-a",
        "--address",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a daemon to watch (repeatable; with the positional ones)",
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="refresh period and measuring interval (default: 1)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame (measured over one interval) and exit",
    )
    add_version(parser)
    return parser.parse_args(argv)


@entry("neuron-top")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # read as every tool reads an address (client/address.py)
        given = [grpc_target(address) for address in [*args.addresses, *args.address]]
        addresses = list(dict.fromkeys(given)) or [default_address()]
    except AddressError as exc:
        print(f"neuron-top: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    timeout_s = min(5.0, max(1.0, args.interval))
    pollers = [Poller(address, timeout_s=timeout_s) for address in addresses]
    try:
        if args.once or not sys.stdout.isatty():
            width = None if sys.stdout.isatty() else 160
            return print_once(pollers, args.interval, Console(width=width))
        NeuronTop(pollers, interval_s=args.interval).run()
        return EXIT_OK
    finally:
        for poller in pollers:
            poller.close()


if __name__ == "__main__":
    sys.exit(main())
