"""A stopping daemon refuses new calls saying so: from the moment its stop begins (before
its models are unloaded), every new inference, load or NCG is answered "the daemon is
stopping", on the fast lane and over gRPC alike, and the client raises DaemonStopping
(never "model ... is not loaded"); no inference is accepted after `unload_all`."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError, NrtConnectionError
from neuron_rtd.client.errors import DaemonStopping
from neuron_rtd.errors import STOPPING, Nerr
from neuron_rtd.neff.samples import build_mlp

pytestmark = pytest.mark.daemon


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("shm", [True, False], ids=["shm-lane", "inline-grpc"])
def test_a_client_looping_inferences_hears_that_the_daemon_stops(
    work: Path, signum: signal.Signals, shm: bool
) -> None:
    daemon = DaemonProcess(sim_root=work / "sim").start()
    before = _shm_objects()
    try:
        client = Client(daemon.address, shm=shm)
        model = client.load(build_mlp().neff)
        x = np.zeros((1, 784), np.float32)
        running = threading.Event()
        failures: list[NrtClientError] = []
        answered = 0

        def loop() -> None:
            nonlocal answered
            while True:  # until the daemon is gone: a failure after its exit ends it
                try:
                    model(x=x)
                    answered += 1
                    running.set()
                except NrtClientError as exc:
                    failures.append(exc)
                    running.set()
                    if daemon.proc is not None and daemon.proc.poll() is not None:
                        return

        thread = threading.Thread(target=loop, name="infer-loop")
        thread.start()
        assert running.wait(30)
        assert daemon.proc is not None
        daemon.proc.send_signal(signum)
        assert daemon.proc.wait(30) == 0
        thread.join(60)
        assert not thread.is_alive()
        client.close()
        log = daemon.log()
    finally:
        daemon.close()
    assert answered > 0 and failures
    # the client's shared memory is freed, the slot made as the daemon went away too
    assert _shm_objects() <= before
    for failure in failures:  # the daemon said it stops, or was gone: never a lost model
        assert failure.nerr != Nerr.INVALID_HANDLE, failure
        assert isinstance(failure, NrtConnectionError), failure
        if not isinstance(failure, DaemonStopping):
            assert "no runtime answers at" in str(failure), failure
    stopping = [f for f in failures if isinstance(f, DaemonStopping)]
    if shm:  # the lane answers until the daemon's very end: each new call told it stops
        assert stopping
    for failure in stopping:
        assert str(failure).startswith(f"infer: NERR_FAIL: {STOPPING}")
    assert log.count("Stopping: draining requests") == 1
    after = log.split("Unloaded all models and destroyed all NCGs", 1)[1]
    assert "[NMGR:infer]" not in after, after  # no inference accepted after unload_all
    assert "is not loaded" not in log


def _shm_objects() -> set[str]:
    """This process's named shm objects (the client names them with its pid)."""
    return {p.name for p in Path("/dev/shm").glob(f"aws_neuron_runtime_{os.getpid()}_*")}
