"""Shared fixtures: a private simulated machine, and the real daemon on a temp socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client.client import CHANNEL_OPTIONS
from neuron_rtd.proto import pb, pb_grpc


def short_tmpdir() -> Path:
    """unix socket paths must stay under 108 bytes: keep them short."""
    return Path(tempfile.mkdtemp(prefix="nrt-"))


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
