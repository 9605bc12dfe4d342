"""What a hostile client sends gets a clean refusal: `neff_file` loads of files that are
no NEFF, devices, FIFOs and paths outside the daemon's `neff_file_dirs`, and one model
past a session quota, all through the real daemon. (The NEFF reader's own refusals are in
test_neff_validation.py, the quotas in full in test_runtime.py.)"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_relu
from neuron_rtd.proto import CHANNEL_OPTIONS, pb, pb_grpc


def load_file(stub: Any, path: str | Path) -> Any:
    """A load by path, which must be answered within 20 s (a hang fails it)."""
    return stub.load(iter([pb.load_request(neff_file=str(path))]), timeout=20)


def refused(response: Any, *fragments: str) -> str:
    assert response.status.code == Nerr.INVALID, response.status
    details = response.status.details.decode()
    for fragment in fragments:
        assert fragment in details, details
    return details


def test_files_that_are_no_neff_are_refused_without_their_content(stub: Any) -> None:
    for path in ("/etc/passwd", "/proc/self/environ", "/etc/hostname"):
        if not os.path.exists(path):
            continue
        details = refused(load_file(stub, path), "not a NEFF")
        assert "root:" not in details and "PATH=" not in details, details
        assert not re.search(rf"\b{os.stat(path).st_size} bytes", details), details  # no size


def chunk(data: bytes) -> Any:
    return pb.load_request(neff_chunk=pb.file_chunk(chunk=data))


def test_odd_paths_are_refused(stub: Any) -> None:
    refused(load_file(stub, "/tmp/model\0.neff"), "holds a NUL byte")  # found by fuzzing
    refused(load_file(stub, "models/relu.neff"), "must be an absolute path")
    refused(load_file(stub, "/nonexistent/relu.neff"), "cannot read neff_file")


def test_devices_fifos_and_folders_are_refused_at_once(
    daemon: DaemonProcess, stub: Any, tmp_path: Path
) -> None:
    fifo = tmp_path / "model.neff"
    os.mkfifo(fifo)
    neff = build_relu((1, 8))
    rss = psutil.Process(daemon.pid).memory_info().rss
    for path in ("/dev/zero", "/dev/urandom", str(fifo), str(tmp_path)):
        # answered within the call's deadline, never read to the end of a device
        refused(
            load_file(stub, path), f"cannot read neff_file '{path}' (it is a", "not a regular file"
        )
    assert psutil.Process(daemon.pid).memory_info().rss < rss + (64 << 20)
    loaded = stub.load(iter([pb.load_request(neff_size=len(neff)), chunk(neff)]))
    assert loaded.status.code == 0  # and it still serves


@pytest.fixture(scope="module")
def fenced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    """A daemon that loads NEFF files only from `allowed` (one model per session, requests
    of 2 MiB at most); and a folder beside it."""
    work = tmp_path_factory.mktemp("fenced")
    allowed, outside = work / "allowed", work / "outside"
    allowed.mkdir()
    outside.mkdir()
    config = work / "neuron-rtd.json"
    config.write_text(
        json.dumps({"neff_file_dirs": [str(allowed)], "session_max_models": 1, "max_message_mb": 2})
    )
    with (
        DaemonProcess(sim_root=work / "sim", args=["-c", str(config)]) as daemon,
        grpc.insecure_channel(daemon.address, options=CHANNEL_OPTIONS) as channel,
    ):
        yield pb_grpc.nmgr_v1Stub(channel), allowed, outside


def test_neff_files_load_only_from_the_configured_folders(
    fenced: tuple[Any, Path, Path],
) -> None:
    stub, allowed, outside = fenced
    neff = build_relu((1, 8))
    (allowed / "relu.neff").write_bytes(neff)
    (outside / "relu.neff").write_bytes(neff)
    (allowed / "link.neff").symlink_to(outside / "relu.neff")
    inside = load_file(stub, allowed / "relu.neff")
    assert inside.status.code == 0, inside.status
    for path in (
        outside / "relu.neff",
        allowed / "link.neff",  # a link out of the folder counts where it leads
        f"{allowed}/../outside/relu.neff",
        "/etc/passwd",
    ):
        refused(load_file(stub, path), "is outside the folders", str(allowed), "neff_file_dirs")
    assert stub.unload_all(pb.empty()).code == 0


def test_a_session_quota_refuses_one_model_more(fenced: tuple[Any, Path, Path]) -> None:
    stub = fenced[0]
    neff = build_relu((1, 8))
    stream = [pb.load_request(neff_size=len(neff)), chunk(neff)]
    assert stub.load(iter(stream)).status.code == 0
    second = stub.load(iter(stream))
    assert second.status.code == Nerr.RESOURCE, second.status
    assert "session_max_models 1" in second.status.details.decode()
    assert stub.unload_all(pb.empty()).code == 0
    assert stub.load(iter(stream)).status.code == 0  # its model unloaded, one fits again
    assert stub.unload_all(pb.empty()).code == 0


def test_a_request_past_the_size_cap_is_refused_unread(fenced: tuple[Any, Path, Path]) -> None:
    stub = fenced[0]
    big = pb.infer_request(h_nn=pb.h_nn(id=1), ifmap=[pb.infer_io(name="x", buf=bytes(3 << 20))])
    with pytest.raises(grpc.RpcError) as error:
        stub.infer(big, timeout=20)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.list_egs(pb.empty()).status.code == 0  # and it goes on serving


def test_neff_file_dirs_must_be_absolute(tmp_path: Path) -> None:
    from neuron_rtd.daemon.config import config_from_dict
    from neuron_rtd.typed_json import ConfigError

    with pytest.raises(ConfigError, match="neff_file_dirs must be a list of absolute"):
        config_from_dict({"neff_file_dirs": ["models"]})
    assert config_from_dict({"neff_file_dirs": []}).neff_file_dirs == ()
    with pytest.raises(ConfigError, match="session_max_models must not be negative"):
        config_from_dict({"session_max_models": -1})
    with pytest.raises(ConfigError, match="max_message_mb must be between 1 and 2047"):
        config_from_dict({"max_message_mb": 4096})
