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
from typing import ClassVar

from rich.console import Console, Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Static, Tab, Tabs

from neuron_rtd.client import DEFAULT_ADDRESS
from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.command_line import EXIT_OK, EXIT_USAGE, add_version, entry
from neuron_rtd.tools.top.frames import frame, not_answering, tab_label, title
from neuron_rtd.tools.top.poll import DaemonState, Poller


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
