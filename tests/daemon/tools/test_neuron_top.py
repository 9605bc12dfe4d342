"""neuron-top: what it shows for given snapshots (in process, textual's pilot), and the
real thing under tmux against real daemons running inferences, read off the screen."""

from __future__ import annotations

import asyncio
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from rich.console import Console, RenderableType
from textual.widgets import Static

from neuron_rtd.cli.neuron_top import NeuronTop
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.client.observe import Watch, interval
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import ext_pb
from neuron_rtd.tools.top.frames import frame
from neuron_rtd.tools.top.poll import DaemonState, Poller, SystemCpu

GIB = 2**30


# --- in process: snapshots in, text out --------------------------------------------------
def text_of(renderable: RenderableType) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(renderable)
    return out.getvalue()


def describe(pid: int = 4242, address: str = "unix:/a.sock") -> ext_pb.describe_response:
    return ext_pb.describe_response(
        runtime_version="9.9.9",
        pid=pid,
        address=address,
        instance_type="inf1.2xlarge",
        devices=[
            ext_pb.ext_device(
                index=0, bdf="0000:00:1f.0", nc_count=4, memory_bytes=8 * GIB, memory_used=GIB
            )
        ],
    )


def model(
    model_id: int, ncg: int, state: str, completed: int, *, failure: str = ""
) -> ext_pb.ext_model:
    return ext_pb.ext_model(
        id=model_id,
        name=f"net{model_id}",
        ncg_id=ncg,
        state=state,
        vncs=[ncg - 1],
        device_bytes=3 * 2**20,
        host_bytes=5 * 2**20,
        failure=failure,
        tally=ext_pb.ext_infer_tally(completed=completed, timed_out=completed // 10),
    )


def snapshot(time_s: float, busy_ms: Sequence[int], completed: int) -> ext_pb.snapshot_response:
    """Device 0's four NCs; NCG 1 (NC 0) runs model 10001, NCG 2 (NC 1) holds a STANDBY
    and a FAILED model, NCG 3 (NC 2) is empty."""
    ncg_of = {0: 1, 1: 2, 2: 3, 3: 0}
    return ext_pb.snapshot_response(
        time_ns=int(time_s * 1e9),
        cpu_user_s=time_s / 4,
        cpu_system_s=time_s / 8,
        rss_bytes=300 * 2**20,
        ncs=[
            ext_pb.ext_nc(vnc=i, device_index=0, nc_index=i, busy_ns=ms * 10**6, ncg_id=ncg_of[i])
            for i, ms in enumerate(busy_ms)
        ],
        ncgs=[
            ext_pb.ext_ncg(id=1, vnc_start=0, nc_count=1, model_ids=[10001]),
            ext_pb.ext_ncg(id=2, vnc_start=1, nc_count=1, model_ids=[10002, 10003]),
            ext_pb.ext_ncg(id=3, vnc_start=2, nc_count=1),
        ],
        models=[
            model(10001, 1, "READY", completed),
            model(10002, 2, "STANDBY", 0),
            model(10003, 2, "FAILED", 0, failure="NC error on nd0:1"),
        ],
    )


def answering(address: str = "unix:/a.sock") -> DaemonState:
    before = snapshot(10.0, [0, 0, 0, 0], completed=100)
    after = snapshot(12.0, [1500, 0, 0, 0], completed=300)  # NC 0 busy 75%, 100 inf/s
    return DaemonState(
        address,
        describe(address=address),
        after,
        interval(before, after),
        None,
        SystemCpu(40.0, 10.0, 2),
    )


def test_a_frame_shows_utilization_models_per_ncg_vcpu_and_memory() -> None:
    util, vcpu, models, devices = (text_of(section) for section in frame(answering()))
    row = next(line for line in util.splitlines() if line.startswith("nd0"))
    cells = re.findall(r"NC(\d) [█░]+ +([\d.]+)% (ncg \d|free)", row)
    assert cells == [
        ("0", "75.0", "ncg 1"),
        ("1", "0.0", "ncg 2"),
        ("2", "0.0", "ncg 3"),
        ("3", "0.0", "free"),
    ]
    assert "last 2.0 s" in util
    assert re.search(r"Runtime vCPU +user +25\.0% +system +12\.5%", vcpu)
    assert re.search(r"System vCPU +user +40\.0% +system +10\.0% +\(of 2 vCPUs\)", vcpu)
    assert "host RSS 300.0 MiB" in vcpu
    ready = next(line for line in models.splitlines() if "net10001" in line)
    assert ready.split()[:5] == ["1", "0", "10001", "net10001", "READY"]
    # in flight, inferences/s, errors (the timed out ones), device and host memory
    assert ready.split()[5:] == ["0", "100.0", "20", "3.0", "MiB", "5.0", "MiB"]
    standby = next(line for line in models.splitlines() if "net10002" in line)
    assert standby.split()[:5] == ["2", "1", "10002", "net10002", "STANDBY"]
    failed = next(line for line in models.splitlines() if "net10003" in line)
    assert failed.split()[:4] == ["10003", "net10003", "FAILED", "(NC"]  # same NCG, no repeat
    assert "NC error on nd0:1" in failed
    assert re.search(r"^3 +2 +- +\(no model\)", models, re.M)
    assert sum("net" in line for line in models.splitlines()) == 3
    assert re.search(r"nd0 +0000:00:1f\.0 +4 +1\.0 GiB / 8\.0 GiB", devices)


def test_before_a_second_snapshot_rates_read_as_measuring() -> None:
    state = DaemonState("unix:/a.sock", describe(), snapshot(1.0, [5, 0, 0, 0], 7), None)
    util, vcpu, models, _ = (text_of(section) for section in frame(state))
    assert "measuring..." in util and "--%" in util
    assert "Runtime vCPU    measuring..." in vcpu
    ready = next(line for line in models.splitlines() if "net10001" in line)
    assert ready.split()[5:8] == ["0", "--", "--"]


class FakePoller(Poller):
    def poll(self) -> DaemonState:
        raise AssertionError("the pilot test feeds states itself")


def test_tabs_switch_daemons_and_a_silent_one_says_so() -> None:
    a, b = "unix:/a.sock", "unix:/b.sock"

    async def drive() -> None:
        app = NeuronTop([FakePoller(a), FakePoller(b)], poll=False)
        async with app.run_test(size=(160, 48)) as pilot:

            def shown(widget_id: str) -> str:
                widget = app.query_one(widget_id, Static)
                assert widget.display, f"{widget_id} is hidden"
                return text_of(widget.content)  # type: ignore[arg-type]

            assert "asking unix:/a.sock..." in shown("#message")
            app.show(0, answering(a))
            app.show(1, DaemonState(b, error=f"no runtime answers at {b}: connect failed"))
            await pilot.pause()
            assert "pid 4242" in shown("#title") and a in shown("#title")
            assert "net10001" in shown("#models")
            assert not app.query_one("#message", Static).display
            await pilot.press("right")
            assert app.selected == 1
            assert "NOT ANSWERING" in shown("#title") and b in shown("#title")
            assert shown("#message").startswith(f"no runtime answers at {b}\nconnect failed")
            assert not app.query_one("#models", Static).display
            await pilot.press("right")  # wraps around
            assert app.selected == 0
            await pilot.press("2")
            assert app.selected == 1
            app.show(1, answering(b))  # it came back
            await pilot.pause()
            assert "NOT ANSWERING" not in shown("#title") and "net10003" in shown("#models")
            await pilot.press("tab")
            assert app.selected == 0
            await pilot.press("q")
        assert app.return_code == 0

    async def interrupt() -> None:
        app = NeuronTop([FakePoller(a)], poll=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("ctrl+c")
        assert app.return_code == 0

    asyncio.run(drive())
    asyncio.run(interrupt())


# --- the command line ------------------------------------------------------------------------
def neuron_top(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    return subprocess.run(
        [*NEURON_TOP, *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


SCRIPT = Path(sys.executable).parent / "neuron-top"
NEURON_TOP = (
    [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "neuron_rtd.cli.neuron_top"]
)


def test_help_usage_errors_and_once_without_a_daemon(work: Path) -> None:
    helped = neuron_top("--help")
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())  # as argparse wraps it
    for option in (
        "ADDRESS",
        "--address",
        "--interval",
        "--once",
        "q (or ctrl+c) quits",
        "exit status is 1",
        "the view starts even when none answers",
    ):
        assert option in text, option
    for bad in (["--interval", "0"], ["--interval", "soon"], ["--frobnicate"]):
        done = neuron_top(*bad)
        assert done.returncode == 2, bad
        assert "usage: neuron-top" in done.stderr and "Traceback" not in done.stderr
    gone = f"unix:{work}/none.sock"
    done = neuron_top("--once", gone)
    assert done.returncode == 1
    assert f"neuron-top: no runtime answers at {gone}" in done.stderr
    assert "Traceback" not in done.stderr


# --- under tmux, as a person sees it --------------------------------------------------------
TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
EXIT_MARK = "NEURON-TOP-EXIT="


class Terminal:
    """A detached tmux session of its own server (160 x 48) running one command; the shell
    prints the command's exit status after it and stays for us to read."""

    def __init__(self, command: Sequence[str]) -> None:
        assert TMUX is not None
        self.tmux = [TMUX, "-L", f"ntop-{os.getpid()}-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
        script = f"{shlex.join(command)}; echo {EXIT_MARK}$?; sleep 600"
        self._run("new-session", "-d", "-x", "160", "-y", "48", script)

    def _run(self, *args: str) -> str:
        return subprocess.run(
            [*self.tmux, *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def screen(self) -> str:
        return self._run("capture-pane", "-p")

    def keys(self, *keys: str) -> None:
        self._run("send-keys", *keys)

    def wait_for(self, what: str, ok: Callable[[str], bool], timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if ok(screen):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"the screen did not show {what} within {timeout_s} s:\n{screen}")
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminals() -> Iterator[Callable[[Sequence[str]], Terminal]]:
    made: list[Terminal] = []

    def make(args: Sequence[str]) -> Terminal:
        # COLUMNS and LINES (set under pytest) would fix the size textual draws at
        env = ["env", "-u", "NEURON_RTD_ADDRESS", "-u", "COLUMNS", "-u", "LINES"]
        made.append(Terminal([*env, *NEURON_TOP, *args]))
        return made[-1]

    yield make
    for terminal in made:
        terminal.close()


class Inferring:
    """A client that loads an MLP and keeps inferring from a thread until closed."""

    def __init__(self, address: str, name: str) -> None:
        self.client = Client(address).open()
        self.sample = build_mlp(name=name)
        self.model = self.client.load(self.sample.neff)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        inputs = self.sample.random_inputs()
        while not self._stop.is_set():
            self.model.infer(inputs)
            self.count += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.client.close()


def line_with(screen: str, word: str) -> str | None:
    return next((line for line in screen.splitlines() if word in line.split()), None)


def rate_of(screen: str, model_id: int) -> float | None:
    """The INFER/S cell of a model's row (the columns after its state: in flight, rate)."""
    line = line_with(screen, str(model_id))
    match = re.search(rf"\b{model_id}\s+\S+\s+READY\s+\d+\s+([\d.]+)\s", line or "")
    return float(match.group(1)) if match else None


def nc_percent(screen: str, device: int, nc: int) -> float | None:
    row = next((ln for ln in screen.splitlines() if ln.strip().startswith(f"nd{device} ")), "")
    match = re.search(rf"NC{nc} [█░]+ +([\d.]+)% ncg \d+", row)
    return float(match.group(1)) if match else None


@needs_tmux
@pytest.mark.daemon
def test_live_view_of_two_daemons_under_tmux(
    daemon: DaemonProcess, module_work: Path, terminals: Callable[[Sequence[str]], Terminal]
) -> None:
    running = Inferring(daemon.address, "top-mlp")
    with DaemonProcess(sim_root=module_work / "sim-b") as other, Client(other.address) as idle:
        try:
            ncg, _ = idle.create_ncg(1)
            standby = idle.load(build_mlp(name="idle-mlp").neff, ncg=ncg)  # loaded, not started
            with Watch(daemon.address) as watch:
                (mine,) = (m for m in watch.snapshot().models if m.id == running.model.id)
                (vnc,) = mine.vncs
                (nc,) = (n for n in watch.snapshot().ncs if n.vnc == vnc)
            term = terminals([daemon.address, other.address])

            screen = term.wait_for(
                "daemon 1 with its model READY, a non-zero rate and NC utilization",
                lambda s: (
                    (rate_of(s, running.model.id) or 0) > 0
                    and (nc_percent(s, nc.device_index, nc.nc_index) or 0) > 0
                ),
            )
            assert f"pid {daemon.pid}" in screen and daemon.address in screen.splitlines()[0]
            assert "top-mlp" in (line_with(screen, str(running.model.id)) or "")
            assert re.search(r"Runtime memory +host RSS [\d.]+ MiB", screen)
            assert re.search(r"Runtime vCPU +user +[\d.]+% +system +[\d.]+%", screen)
            assert re.search(r"nd0 +0000:00:1c\.0 +4 +[\d.]+ [KM]iB / 8\.0 GiB", screen)
            assert "idle-mlp" not in screen

            term.keys("Right")
            screen = term.wait_for(
                "daemon 2's STANDBY model after the Right key",
                lambda s: (
                    "STANDBY" in (line_with(s, str(standby.id)) or "")
                    and other.address in s.splitlines()[0]
                ),
            )
            assert f"pid {other.pid}" in screen and "top-mlp" not in screen
            assert "idle-mlp" in (line_with(screen, str(standby.id)) or "")

            term.keys("1")
            term.wait_for("daemon 1 again after the 1 key", lambda s: "top-mlp" in s)

            other.stop()
            term.keys("Tab")
            screen = term.wait_for(
                "the message for the stopped daemon",
                lambda s: f"no runtime answers at {other.address}" in s,
            )
            assert "NOT ANSWERING" in screen.splitlines()[0]
            term.keys("Left")  # the view kept running: daemon 1 still updates
            term.wait_for("daemon 1 after the Left key", lambda s: "top-mlp" in s)

            term.keys("q")
            screen = term.wait_for("neuron-top's exit", lambda s: EXIT_MARK in s)
            assert f"{EXIT_MARK}0" in screen
            assert "Loaded Models" not in screen  # the alternate screen is gone
        finally:
            running.close()


@needs_tmux
@pytest.mark.daemon
def test_starts_without_a_daemon_and_recovers_when_one_comes(
    work: Path, terminals: Callable[[Sequence[str]], Terminal]
) -> None:
    socket_path = work / "later.sock"
    address = f"unix:{socket_path}"
    term = terminals(["--interval", "0.5", address])
    screen = term.wait_for(
        "the no-daemon message", lambda s: f"no runtime answers at {address}" in s
    )
    assert "Traceback" not in screen
    with DaemonProcess(sim_root=work / "sim", socket_path=socket_path) as late:
        screen = term.wait_for(
            "the daemon that came", lambda s: f"pid {late.pid}" in s and "Loaded Models" in s
        )
        assert "no runtime answers" not in screen
        term.keys("q")
        term.wait_for("a clean exit", lambda s: f"{EXIT_MARK}0" in s)


@pytest.mark.daemon
def test_once_prints_a_frame_of_a_daemon(daemon: DaemonProcess) -> None:
    done = neuron_top("--once", "--interval", "0.3", "-a", daemon.address)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("neuron-top ") and f"pid {daemon.pid}" in first
    for section in (
        "NeuronCore Utilization (last",
        "vCPU and Memory",
        "Loaded Models",
        "Neuron Devices",
    ):
        assert section in done.stdout
