"""Client death at scale, the short version (tests/client_deaths.py runs it at full scale):
clients SIGKILLed at random points leave nothing behind, and the observer is served."""

from __future__ import annotations

from pathlib import Path

import pytest
from client_deaths import run

from neuron_rtd.cli.spawn import DaemonProcess

pytestmark = pytest.mark.daemon


def test_killed_clients_at_random_points_leave_nothing(tmp_path: Path) -> None:
    with DaemonProcess(sim_root=tmp_path / "sim") as daemon:
        result = run(daemon.address, daemon.pid, sequential=8, parallel=6, seed=3)
        log = daemon.log()
    assert not result.observer_refused, result.observer_refused[:5]
    assert result.observer_calls > 100
    assert not result.maps_left
    assert (result.after.ncgs, result.after.dram) == (result.before.ncgs, result.before.dram)
    assert result.after.fds <= result.before.fds + 1, (result.before, result.after)
    assert result.after.threads <= result.before.threads + 2, (result.before, result.after)
    assert result.clean
    assert "Traceback" not in log and "internal error" not in log
