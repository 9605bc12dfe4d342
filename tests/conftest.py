"""Shared fixtures: a private simulated machine, and the real daemon on a temp socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.proto import CHANNEL_OPTIONS, pb, pb_grpc


def short_tmpdir() -> Path:
    """unix socket paths must stay under 108 bytes: keep them short."""
    return Path(tempfile.mkdtemp(prefix="nrt-"))


# What a user's environment may name outside their HOME for the tools a test starts.
_USER_FOLDERS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
_OWN_HOME = pytest.StashKey[tuple[pytest.MonkeyPatch, Path]]()


def pytest_configure(config: pytest.Config) -> None:
    """The session, from before it imports the test modules, and whatever its tests start,
    run with a HOME of its own, empty, and no XDG folders: nothing in the user's home
    (~/.ray's auth token, ~/.cache, ~/.config) or left there by an earlier run reaches
    them. Each process of the session (pytest-xdist's workers too) has its own; the venv's
    paths do not depend on HOME."""
    home = Path(tempfile.mkdtemp(prefix="nrt-home-"))
    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(home))
    for name in _USER_FOLDERS:
        patch.delenv(name, raising=False)
    config.stash[_OWN_HOME] = (patch, home)


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_HOME, None)
    if own is not None:
        patch, home = own
        patch.undo()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_env_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faults come only from what a test injects, never from the caller's environment."""
    monkeypatch.delenv("NEURON_SIM_FAULTS", raising=False)


@pytest.fixture
def machine(tmp_path: Path) -> driver_sim.Machine:
    """A private simulated inf1.6xlarge (the default preset)."""
    return driver_sim.Machine.open(tmp_path / "sim")


@pytest.fixture
def device(machine: driver_sim.Machine) -> Iterator[driver_sim.Device]:
    """Device 0 of `machine`, owned by this process for the test."""
    (dev,) = machine.acquire([0], address="unix:/t.sock", version="1")
    yield dev
    dev.release()


@pytest.fixture
def work() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_work() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(module_work: Path) -> Iterator[DaemonProcess]:
    """One daemon per test module, on a simulated inf1.6xlarge."""
    with DaemonProcess(sim_root=module_work / "sim") as proc:
        yield proc


@pytest.fixture(scope="module")
def channel(daemon: DaemonProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address, options=CHANNEL_OPTIONS) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> Iterator[pb_grpc.nmgr_v1Stub]:
    """The generated client; every test starts and ends with nothing loaded."""
    s = pb_grpc.nmgr_v1Stub(channel)
    assert s.unload_all(pb.empty()).code == 0
    yield s
    assert s.unload_all(pb.empty()).code == 0
