"""The daemon asks its own fronts whether they answer (`neuron_rtd/daemon/fronts.py`), and
exits when one has gone silent (issue 38, point 10: grpcio's serve thread died of a
MemoryError and the process lived on with every gRPC call failing).

The watch itself against fronts that answer or not; the questions against a real gRPC
server and a socket that accepts nothing; then the daemon, its front's own loop made to
die as grpcio's did (an exception raised in grpcio's serve thread, in waitress's I/O
thread): it exits with EXIT_FRONT_SILENT, naming the front, and not before."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.daemon import sd
from neuron_rtd.daemon.fronts import EXIT_FRONT_SILENT, Front, FrontWatch, grpc_front, http_front
from neuron_rtd.proto import pb, pb_grpc


class Asked:
    """A fake front: answers while `answering` is set; counts the questions."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.answering = threading.Event()
        self.answering.set()
        self.asked = 0
        self.asked_again = threading.Condition()

    def ask(self, timeout: float) -> None:
        with self.asked_again:
            self.asked += 1
            self.asked_again.notify_all()
        if not self.answering.is_set():
            raise TimeoutError("no answer")

    def wait_asked(self, count: int) -> None:
        with self.asked_again:
            assert self.asked_again.wait_for(lambda: self.asked >= count, 30)

    def front(self) -> Front:
        return Front(self.name, self.ask)


def watched(*fronts: Asked, timeout_s: float) -> tuple[FrontWatch, list[str], threading.Event]:
    said: list[str] = []
    silent = threading.Event()

    def on_silent(why: str) -> None:
        said.append(why)
        silent.set()

    watch = FrontWatch([f.front() for f in fronts], timeout_s, on_silent)
    watch.start()
    return watch, said, silent


def test_fronts_that_answer_are_never_called_silent() -> None:
    a, b = Asked("front A"), Asked("front B")
    watch, said, _ = watched(a, b, timeout_s=0.4)
    try:
        a.wait_asked(12)  # three times the timeout
        b.wait_asked(12)
    finally:
        watch.stop()
    assert said == []


def test_a_front_silent_for_the_timeout_is_named_once() -> None:
    a, b = Asked("front A"), Asked("front B")
    watch, said, silent = watched(a, b, timeout_s=0.4)
    try:
        a.wait_asked(2)
        b.answering.clear()
        started = time.monotonic()
        assert silent.wait(30)
        quiet = time.monotonic() - started
        asked = a.asked
        watch._thread.join(30)  # the watch has stopped asking, of itself: it said so once
        assert not watch._thread.is_alive()
        assert a.asked == asked
    finally:
        watch.stop()
    assert len(said) == 1 and said[0].startswith("front B has answered nothing for ")
    assert "TimeoutError: no answer" in said[0]
    assert quiet >= 0.4 - 0.1  # not before its time (one period of slack: when it failed)


def test_a_front_that_answers_again_in_time_is_not_silent() -> None:
    a = Asked("front A")
    watch, said, _ = watched(a, timeout_s=1.0)
    try:
        a.wait_asked(1)
        a.answering.clear()
        a.wait_asked(3)  # two questions unanswered: half the timeout
        a.answering.set()
        a.wait_asked(10)
    finally:
        watch.stop()
    assert said == []


# --- the questions -----------------------------------------------------------------------


class Blocking(pb_grpc.nmgr_v1Servicer):
    """A server whose calls never return until released: its call threads all held."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def get_version(
        self, request: pb.get_version_request, context: grpc.ServicerContext
    ) -> pb.get_version_response:
        self.entered.set()
        self.release.wait(30)
        return pb.get_version_response()


def test_the_grpc_question_is_answered_by_any_status_and_not_by_a_held_server(
    tmp_path: Path,
) -> None:
    servicer = Blocking()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    pb_grpc.add_nmgr_v1Servicer_to_server(servicer, server)
    target = f"unix:{tmp_path / 's.sock'}"
    server.add_insecure_port(target)
    server.start()
    front = grpc_front(target)
    try:
        front.ask(5)  # no health service: UNIMPLEMENTED is an answer
    finally:
        front.close()
        server.stop(None)
    servicer = Blocking()
    served = grpc.server(futures.ThreadPoolExecutor(1))
    pb_grpc.add_nmgr_v1Servicer_to_server(servicer, served)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), served)
    served.add_insecure_port(target)
    served.start()
    front = grpc_front(target)
    held = grpc.insecure_channel(target)
    try:
        front.ask(5)  # SERVING
        call = pb_grpc.nmgr_v1Stub(held).get_version.future(pb.get_version_request())
        assert servicer.entered.wait(10)  # its one thread held
        with pytest.raises(TimeoutError, match="DEADLINE_EXCEEDED"):
            front.ask(0.5)
        servicer.release.set()
        front.ask(5)
        call.result(10)
    finally:
        held.close()
        front.close()
        servicer.release.set()
        served.stop(None)
    assert "the gRPC front on unix:" in front.name


def test_the_http_question_times_out_on_a_socket_that_accepts_nothing() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # connections wait in the backlog: no one accepts them
    port = listener.getsockname()[1]
    front = http_front("0.0.0.0", port)  # asked on loopback
    try:
        with pytest.raises(TimeoutError):
            front.ask(0.5)
    finally:
        listener.close()
    assert front.name == f"the HTTP front on 127.0.0.1:{port}"


# --- the daemon ----------------------------------------------------------------------------

# The daemon, its front's loop made to die when the trigger file appears, as grpcio's serve
# thread died of the MemoryError in issue 38: an exception raised in that loop itself.
DYING = """
import os, sys
trigger, front = sys.argv[1], sys.argv[2]
def dies(real):
    def step(*args, **kwargs):
        if os.path.exists(trigger):
            raise MemoryError("the test made this loop die")
        return real(*args, **kwargs)
    return step
if front == "grpc":
    from grpc import _server
    _server._process_event_and_continue = dies(_server._process_event_and_continue)
else:
    from waitress import wasyncore
    wasyncore.poll2 = dies(wasyncore.poll2)
from neuron_rtd.daemon.main import main
sys.argv[1:3] = []
sys.exit(main())
"""


class DyingDaemon(DaemonProcess):
    def __init__(self, trigger: Path, front: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.trigger, self.front = trigger, front

    def command(self) -> list[str]:
        command = super().command()
        assert command[1:3] == ["-m", "neuron_rtd.daemon.main"]
        return [sys.executable, "-c", DYING, str(self.trigger), self.front, *command[3:]]


@pytest.mark.daemon
@pytest.mark.parametrize("front", ["grpc", "http"])
def test_the_daemon_exits_when_a_fronts_loop_dies(work: Path, front: str) -> None:
    config = work / "config.json"
    config.write_text(json.dumps({"front_timeout_secs": 4}))
    trigger = work / "die"
    daemon = DyingDaemon(
        trigger,
        front,
        sim_root=work / "sim",
        args=["-c", str(config), "--http-address", "127.0.0.1:0"],
    )
    with daemon:
        proc = daemon.proc
        assert proc is not None
        # healthy, it serves on past its front timeout: the time is what is tested
        try:
            exited: int | None = proc.wait(6)
        except subprocess.TimeoutExpired:
            exited = None
        assert exited is None, daemon.log()
        assert "did not answer" not in daemon.log()
        trigger.touch()
        if front == "grpc":  # the next event kills grpcio's serve thread: the next call
            with pytest.raises(grpc.RpcError):
                pb_grpc.nmgr_v1Stub(grpc.insecure_channel(daemon.address)).get_version(
                    pb.get_version_request(), timeout=1
                )
        assert proc.wait(30) == EXIT_FRONT_SILENT, daemon.log()
        log = daemon.log()
    named = "the gRPC front on unix:" if front == "grpc" else "the HTTP front on 127.0.0.1:"
    assert named in log and "has answered nothing for" in log, log
    assert f"exiting (status {EXIT_FRONT_SILENT})" in log


def test_a_full_notify_socket_freezes_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notify socket no one reads (its queue full: 10 datagrams by default) froze the
    whole daemon: python-systemd's notify sent holding the GIL, and the watchdog pinged
    every period. Now a send waits NOTIFY_TIMEOUT_S at most, and only its own thread."""
    path = tmp_path / "notify.sock"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(path))  # never read
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        sent = [sd.notify("WATCHDOG=1") for _ in range(3)]
        while sent[-1] and len(sent) < 1000:  # until the queue is full
            sent.append(sd.notify("WATCHDOG=1"))
        before = len(ticks)
        assert sd.notify("WATCHDOG=1") is False  # still full: it gave up again
        waited_ticks = len(ticks) - before
    finally:
        done.set()
        ticker.join()
        manager.close()
    assert sent[:3] == [True] * 3 and sent[-1] is False
    assert waited_ticks > 10  # the other thread ran while notify waited
