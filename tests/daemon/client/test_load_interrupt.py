"""An interrupted load leaves nothing behind, on the real daemon: Ctrl-C (or SIGTERM) in
`neuron-cli load` while the daemon loads, Ctrl-C in `Client.load` while the NEFF streams and
after the daemon's answer, and a client whose deadline passes during the load. Each moment
is held, not raced: the simulated devices hold every program load (`load_delay_ms`) and
the test acts once the daemon's log says it holds one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from interrupts import as_from_a_terminal
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError, NrtConnectionError
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import pb

pytestmark = pytest.mark.daemon

HOLD_MS = 3000  # far longer than a signal takes to be handled, so the moment is not raced
HOLDING = "Holding a program load"
DROPPED = "the caller of its load left before the answer"


@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    return build_mlp((16, 32, 8), batch=2, seed=7)


@pytest.fixture
def neff(mlp: SampleModel, work: Path) -> Path:
    path = work / "mlp.neff"
    path.write_bytes(mlp.neff)
    return path


class Log:
    """The daemon's log from now on."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.path = Path(daemon.log_path)
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with open(self.path, "rb") as file:
            file.seek(self.start)
            return file.read().decode(errors="replace")

    def wait_for(
        self,
        *words: str,
        timeout_s: float = 60.0,
        client: subprocess.Popen[str] | None = None,
    ) -> str:
        """The first line holding one of `words` (waited for; failing at once, with what
        it said, when `client` ends meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.text().splitlines():
                if any(each in line for each in words):
                    return line
            if client is not None and client.poll() is not None:
                out, err = client.communicate()
                raise AssertionError(
                    f"the client ended ({client.returncode}) before the daemon logged "
                    f"{words!r}:\n{out}{err}\nthe daemon logged:\n{self.text()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"the daemon never logged {words!r}; it logged:\n{self.text()}")


@pytest.fixture
def held(daemon: DaemonProcess) -> Iterator[Log]:
    """Every program load on the daemon's devices held HOLD_MS; nothing loaded before or
    after the test."""
    injects = sorted(Path(daemon.sim_root).glob("neuron*/inject"))
    assert injects
    with Client(daemon.address, session=False) as client:
        client.unload_all()
    for inject in injects:
        inject.write_text(f"load_delay_ms={HOLD_MS}\n")
    yield Log(daemon)
    for inject in injects:
        inject.write_text("load_delay_ms=0\n")
    with Client(daemon.address, session=False) as client:
        client.unload_all()


def loaded(daemon: DaemonProcess) -> tuple[list[int], list[int]]:
    """The models and NCGs on the daemon."""
    with Client(daemon.address, session=False) as client:
        snapshot = client.connection.snapshot()
        return [m.id for m in snapshot.models], [g.id for g in snapshot.ncgs]


def neuron_cli_load(daemon: DaemonProcess, *args: str | Path) -> subprocess.Popen[str]:
    script = Path(sys.executable).parent / "neuron-cli"
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "neuron_rtd.cli.neuron_cli"]
    )
    return subprocess.Popen(
        as_from_a_terminal([*command, "load", *map(str, args), "-a", daemon.address]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("signum", "ncg", "said"),
    [
        (signal.SIGINT, "-1", "interrupted"),  # the NCG the runtime makes goes with the model
        (signal.SIGTERM, "0", "terminated (SIGTERM)"),  # the NCG neuron-cli made goes too
    ],
)
def test_a_signal_while_the_daemon_loads_leaves_nothing(
    daemon: DaemonProcess, held: Log, neff: Path, signum: int, ncg: str, said: str
) -> None:
    command = neuron_cli_load(daemon, neff, "--ncg-id", ncg)
    held.wait_for(HOLDING, client=command)  # the NEFF has come whole; the daemon loads it
    command.send_signal(signum)
    out, err = command.communicate(timeout=60)
    assert (command.returncode, out) == (128 + signum, "")
    assert err == f"neuron-cli: {said}: the load was undone: nothing stays loaded\n"
    line = held.wait_for(DROPPED)  # made, its caller gone: the daemon unloads it
    model_id = int(line.split("Model ", 1)[1].split(":", 1)[0])
    held.wait_for(f"Unloaded model {model_id}")
    assert loaded(daemon) == ([], [])


def test_ctrl_c_while_the_neff_streams_loads_nothing(
    daemon: DaemonProcess, held: Log, mlp: SampleModel, ctrl_c_raises: None
) -> None:
    data = mlp.neff
    streaming, resume = threading.Event(), threading.Event()

    def stream() -> Iterator[pb.load_request]:
        yield pb.load_request(neff_size=len(data))
        yield pb.load_request(neff_chunk=pb.file_chunk(chunk=data[:1024]))
        streaming.set()
        resume.wait(60)  # the rest never goes: the call is cancelled meanwhile
        yield pb.load_request(neff_chunk=pb.file_chunk(chunk=data[1024:]))

    with Client(daemon.address, session=False) as client:
        interrupting = threading.Thread(target=ctrl_c_after, args=(streaming,))
        interrupting.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                client.connection.load(stream)
        finally:
            resume.set()
            interrupting.join()
    # the daemon sees the stream cut (or, as gRPC may tell a cancel, ended early): refused
    line = held.wait_for("the load stream broke off before its end", "NEFF chunks add up to")
    assert "[NMGR:load]" in line
    assert HOLDING not in held.text() and loaded(daemon) == ([], [])


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here during the test, even in a shell's background
    job (`make test &`), which ignores it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def waits_on_the_load_call() -> bool:
    """Whether the main thread is in the load call's wait (`answer_of`, called by the
    client's `_load_once`), where its Ctrl-C is handled."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None and frame.f_back is not None:
        if frame.f_code.co_name == "answer_of" and frame.f_back.f_code.co_name == "_load_once":
            return True
        frame = frame.f_back
    return False


def ctrl_c_after(event: threading.Event) -> None:
    """Ctrl-C for this process once `event` is set and the main thread waits on the call."""
    assert event.wait(60)
    wait_until(waits_on_the_load_call, 60, "the main thread waits on the load call")
    os.kill(os.getpid(), signal.SIGINT)


class AnsweredThenInterrupted:
    """A `load` call whose first wait raises KeyboardInterrupt once the daemon's answer has
    come: Ctrl-C at the worst moment, the model made and its id on its way to a caller that
    will not take it."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.waited = False

    def result(self, timeout: float | None = None) -> Any:
        if self.waited:
            return self.call.result(timeout)
        self.waited = True
        self.call.result(timeout=60)  # answered
        raise KeyboardInterrupt

    def cancel(self) -> bool:
        return bool(self.call.cancel())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.call.add_done_callback(lambda _: callback(self))

    def exception(self, timeout: float | None = None) -> Any:
        return self.call.exception(timeout)


def answered_then_interrupted(client: Client) -> None:
    client.open()
    stub = client.connection.stub

    class Load:
        def future(self, *args: Any, **kwargs: Any) -> AnsweredThenInterrupted:
            return AnsweredThenInterrupted(stub.load.future(*args, **kwargs))

    class Stub:
        load = Load()

        def __getattr__(self, name: str) -> Any:
            return getattr(stub, name)

    client.connection.stub = Stub()  # type: ignore[assignment]


def test_ctrl_c_after_the_answer_unloads_the_model(daemon: DaemonProcess, mlp: SampleModel) -> None:
    with Client(daemon.address, session=False) as client:
        answered_then_interrupted(client)
        with pytest.raises(KeyboardInterrupt) as info:
            client.load(mlp.neff)
        assert getattr(info.value, "__notes__", []) == []  # nothing stays
    assert loaded(daemon) == ([], [])


def test_a_model_that_cannot_be_unloaded_again_is_named(
    daemon: DaemonProcess, mlp: SampleModel
) -> None:
    with Client(daemon.address, session=False) as client:
        answered_then_interrupted(client)
        real_call: Callable[..., None] = client.connection.model_call

        def refuse_unload(method: str, *args: Any) -> None:
            if method == "unload":
                raise NrtClientError(Nerr.FAIL, "refused for the test", "unload")
            real_call(method, *args)

        client.connection.model_call = refuse_unload  # type: ignore[method-assign,assignment]
        with pytest.raises(KeyboardInterrupt) as info:
            client.load(mlp.neff)
    (model_id,), _ = loaded(daemon)
    address = daemon.address
    assert info.value.__notes__ == [
        f"model {model_id} may stay loaded on the daemon at {address} (unloading it failed: "
        f"unload: NERR_FAIL: refused for the test): unload it (neuron-cli -a {address} unload "
        f"{model_id})"
    ]
    with Client(address, session=False) as client:
        client.unload(model_id)


def test_a_deadline_passed_during_the_load_leaves_nothing(
    daemon: DaemonProcess, held: Log, mlp: SampleModel
) -> None:
    client = Client(daemon.address, session=False, timeout_s=HOLD_MS / 3000)
    with client, pytest.raises(NrtConnectionError) as info:
        client.load(mlp.neff)
    assert (
        info.value.nerr is Nerr.TIMEOUT
        and info.value.grpc_code is grpc.StatusCode.DEADLINE_EXCEEDED
    )
    held.wait_for(DROPPED)
    held.wait_for("Unloaded model")
    assert loaded(daemon) == ([], [])
