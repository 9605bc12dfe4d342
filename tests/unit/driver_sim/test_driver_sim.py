"""driver_sim: presets, the state tree, ownership across processes, reset."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest
from waiting import wait_until

import driver_sim
from driver_sim import (
    PRESETS,
    DeviceBusy,
    DeviceNotFound,
    DriverError,
    InitFailed,
    Machine,
    MachineMismatch,
    OwnerInfo,
    presets,
)

ADDRESS = "unix:/tmp/test-nrtd.sock"


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "sim"


@pytest.fixture
def machine(root: pathlib.Path) -> Machine:
    return Machine.open(root)


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---- presets ---------------------------------------------------------------------------


def test_presets_shapes_and_bdfs() -> None:
    assert driver_sim.NC_PER_DEVICE == 4
    assert driver_sim.DRAM_CHANNELS == 2
    assert driver_sim.CHANNEL_BYTES == 4 * 2**30
    assert driver_sim.DEFAULT_INSTANCE_TYPE == "inf1.6xlarge"
    assert PRESETS["inf1.xlarge"].bdfs == ("0000:00:1f.0",)
    assert PRESETS["inf1.2xlarge"].bdfs == ("0000:00:1f.0",)
    assert PRESETS["inf1.6xlarge"].bdfs == (
        "0000:00:1c.0",
        "0000:00:1d.0",
        "0000:00:1e.0",
        "0000:00:1f.0",
    )
    big = PRESETS["inf1.24xlarge"]
    assert big.device_count == 16 == len(big.bdfs)
    assert big.bdfs[0] == "0000:00:10.0"
    assert big.bdfs[-1] == "0000:00:1f.0"
    for preset in PRESETS.values():
        assert preset.device_count == len(preset.bdfs)


def test_chain_topology(tmp_path: pathlib.Path) -> None:
    machine = Machine.open(tmp_path / "big", instance_type="inf1.24xlarge")
    infos = machine.devices()
    assert infos[0].connected == (1,)
    assert infos[5].connected == (4, 6)
    assert infos[15].connected == (14,)
    single = Machine.open(tmp_path / "small", instance_type="inf1.xlarge")
    assert single.devices()[0].connected == ()


def test_default_sim_root(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("NEURON_SIM_ROOT", "/somewhere/sim")
    assert driver_sim.default_sim_root() == pathlib.Path("/somewhere/sim")
    monkeypatch.delenv("NEURON_SIM_ROOT")
    assert pathlib.Path("/run/neuron-sim") == presets.SYSTEM_SIM_ROOT
    system = tmp_path / "run-neuron-sim"  # the service's machine, here, not the host's
    monkeypatch.setattr(presets, "SYSTEM_SIM_ROOT", system)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert driver_sim.default_sim_root() == system
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    assert driver_sim.default_sim_root() == pathlib.Path("/tmp/neuron-sim-1234")
    system.mkdir()
    (system / "machine.json").write_text("{}")  # readable: a member of the service's group
    monkeypatch.setattr(os, "access", lambda path, mode: path == system / "machine.json")
    assert driver_sim.default_sim_root() == system


# ---- the state tree --------------------------------------------------------------------


def test_tree_layout(machine: Machine, root: pathlib.Path) -> None:
    assert machine.root == root
    assert machine.instance_type == "inf1.6xlarge"
    assert machine.device_count == 4
    assert json.loads((root / "machine.json").read_text()) == {
        "instance_type": "inf1.6xlarge",
        "device_count": 4,
        "format": 1,
    }
    for i in range(4):
        assert (root / "dev" / f"neuron{i}").is_file()
        device_dir = root / f"neuron{i}"
        assert (device_dir / "core_count").read_text().strip() == "4"
        assert (device_dir / "memory_size").read_text().strip() == str(8 * 2**30)
        assert (device_dir / "owner.lock").exists()
        assert (device_dir / "inject").read_text() == ""
        assert not (device_dir / "owner").exists()
    assert (root / "neuron1" / "bdf").read_text().strip() == "0000:00:1d.0"
    assert (root / "neuron1" / "connected_devices").read_text().strip() == "0,2"
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]


def test_device_info_of_a_fresh_tree(machine: Machine) -> None:
    info = machine.device_info(2)
    assert info.index == 2
    assert info.bdf == "0000:00:1e.0"
    assert info.core_count == 4
    assert info.memory_bytes == 8 * 2**30
    assert info.connected == (1, 3)
    assert info.owner is None
    assert info.hw == driver_sim.HealthCounters()
    assert info.dram_used == (0, 0)
    assert len(info.nc_counters) == 4


def test_reopen_uses_existing_tree(machine: Machine, root: pathlib.Path) -> None:
    again = Machine.open(root)
    assert again.instance_type == "inf1.6xlarge"
    assert Machine.open(root, instance_type="inf1.6xlarge").device_count == 4


def test_machine_mismatch_names_both(machine: Machine, root: pathlib.Path) -> None:
    with pytest.raises(MachineMismatch, match=r"inf1\.6xlarge.*inf1\.24xlarge"):
        Machine.open(root, instance_type="inf1.24xlarge")


def test_unknown_instance_type_lists_presets(root: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"inf1\.huge.*inf1\.xlarge.*inf1\.24xlarge"):
        Machine.open(root, instance_type="inf1.huge")
    assert not root.exists()


def test_tree_in_an_existing_empty_dir(tmp_path: pathlib.Path) -> None:
    machine = Machine.open(tmp_path, instance_type="inf1.xlarge")
    assert machine.device_count == 1
    assert (tmp_path / "neuron0" / "bdf").read_text().strip() == "0000:00:1f.0"


def test_a_non_empty_dir_without_tree_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(DriverError, match="not a simulator tree"):
        Machine.open(tmp_path)


def test_concurrent_creation_yields_one_tree(root: pathlib.Path) -> None:
    barrier = threading.Barrier(8)
    results: list[object] = []

    def open_it() -> None:
        barrier.wait()
        try:
            results.append(Machine.open(root).instance_type)
        except Exception as exc:  # pragma: no cover - reported by the assert below
            results.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["inf1.6xlarge"] * 8
    assert not [p for p in root.parent.iterdir() if p.name != "sim"]


def test_index_of_bdf(machine: Machine) -> None:
    assert machine.index_of_bdf("0000:00:1e.0") == 2
    assert machine.index_of_bdf("0000:00:1C.0") == 0
    with pytest.raises(DeviceNotFound, match=r"0000:00:05\.0"):
        machine.index_of_bdf("0000:00:05.0")


# ---- ownership ---------------------------------------------------------------------------


def test_acquire_writes_owner_and_release_removes_it(machine: Machine, root: pathlib.Path) -> None:
    (device,) = machine.acquire([1], address=ADDRESS, version="2.0")
    assert (device.index, device.bdf, device.machine) == (1, "0000:00:1d.0", machine)
    owner = json.loads((root / "neuron1" / "owner").read_text())
    assert owner["pid"] == os.getpid()
    assert owner["address"] == ADDRESS
    assert owner["version"] == "2.0"
    assert owner["create_time"] == pytest.approx(psutil.Process().create_time())
    assert machine.device_info(1).owner == OwnerInfo(os.getpid(), ADDRESS, "2.0")
    device.release()
    device.release()
    assert not (root / "neuron1" / "owner").exists()
    assert machine.device_info(1).owner is None
    (again,) = machine.acquire([1], address=ADDRESS, version="2.0")
    again.release()


def test_busy_in_the_same_process_names_pid_and_address(
    machine: Machine, root: pathlib.Path
) -> None:
    (held,) = machine.acquire([0], address=ADDRESS, version="1")
    other = Machine.open(root)
    with pytest.raises(DeviceBusy) as caught:
        other.acquire([0], address="unix:/other.sock", version="1")
    err = caught.value
    assert (err.device_index, err.owner_pid, err.owner_address) == (0, os.getpid(), ADDRESS)
    message = str(err)
    for part in ("device 0", "0000:00:1c.0", str(os.getpid()), ADDRESS):
        assert part in message
    with pytest.raises(DeviceBusy):
        machine.acquire([0], address=ADDRESS, version="1")
    held.release()


def test_acquire_is_all_or_nothing(machine: Machine) -> None:
    (held,) = machine.acquire([2], address=ADDRESS, version="1")
    with pytest.raises(DeviceBusy, match="device 2"):
        machine.acquire([0, 1, 2, 3], address=ADDRESS, version="1")
    assert [info.owner is None for info in machine.devices()] == [True, True, False, True]
    devices = machine.acquire([0, 1, 3], address=ADDRESS, version="1")
    assert [d.index for d in devices] == [0, 1, 3]
    for device in [*devices, held]:
        device.release()


def test_acquire_unknown_or_repeated_index(machine: Machine) -> None:
    with pytest.raises(DeviceNotFound, match="no device 4"):
        machine.acquire([0, 4], address=ADDRESS, version="1")
    with pytest.raises(ValueError, match="repeat"):
        machine.acquire([1, 1], address=ADDRESS, version="1")
    assert all(info.owner is None for info in machine.devices())


def test_released_device_refuses_work(machine: Machine) -> None:
    (device,) = machine.acquire([0], address=ADDRESS, version="1")
    device.release()
    with pytest.raises(DriverError, match="released"):
        device.dram_alloc(0, 64)
    with pytest.raises(DriverError, match="released"):
        device.reset()


def test_context_manager_releases(machine: Machine) -> None:
    (device,) = machine.acquire([3], address=ADDRESS, version="1")
    with device:
        assert machine.device_info(3).owner is not None
    assert machine.device_info(3).owner is None


_HOLD_DEVICE = """
import sys, time
from driver_sim import Machine
(device,) = Machine.open(sys.argv[1]).acquire([0], address="unix:/child.sock", version="9")
print("held", flush=True)
time.sleep(60)
"""

_TRY_DEVICE = """
import sys
from driver_sim import DeviceBusy, Machine
try:
    Machine.open(sys.argv[1]).acquire([0], address="unix:/child.sock", version="9")
    print("acquired")
except DeviceBusy as exc:
    print(f"busy {exc.owner_pid} {exc.owner_address}")
    print(exc)
"""


def test_busy_in_another_process(machine: Machine, root: pathlib.Path) -> None:
    (held,) = machine.acquire([0], address=ADDRESS, version="1")
    child = _python(_TRY_DEVICE, str(root))
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.splitlines()[0] == f"busy {os.getpid()} {ADDRESS}"
    held.release()


def test_dead_owner_releases_its_claim(machine: Machine, root: pathlib.Path) -> None:
    child = _python(_HOLD_DEVICE, str(root))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        assert machine.device_info(0).owner == OwnerInfo(child.pid, "unix:/child.sock", "9")
        with pytest.raises(DeviceBusy, match=f"pid {child.pid}"):
            machine.acquire([0], address=ADDRESS, version="1")
        child.send_signal(signal.SIGKILL)
        _wait_until_zombie_or_gone(child.pid)
        assert machine.device_info(0).owner is None  # a zombie is not an owner
    finally:
        child.kill()
        child.communicate()
    assert machine.device_info(0).owner is None
    (device,) = machine.acquire([0], address=ADDRESS, version="1")
    assert machine.device_info(0).owner == OwnerInfo(os.getpid(), ADDRESS, "1")
    device.release()


def _wait_until_zombie_or_gone(pid: int) -> None:
    def dead() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(dead, 10, f"pid {pid} dead")


# ---- reset -------------------------------------------------------------------------------


def test_reset_logs_and_frees(machine: Machine, caplog: pytest.LogCaptureFixture) -> None:
    (device,) = machine.acquire([1], address=ADDRESS, version="1")
    buf = device.dram_alloc(0, 1000)
    caplog.set_level(logging.INFO, logger="nrtd.TDRV")
    device.reset()
    records = [r for r in caplog.records if r.name == "nrtd.TDRV"]
    assert [(r.levelno, r.getMessage(), getattr(r, "fn", None)) for r in records] == [
        (logging.INFO, "Resetting 0000:00:1d.0", "reset_mla"),
        (logging.INFO, "Initialized Inferentia: 0000:00:1d.0", "tdrv_init_one_mla_phase2"),
    ]
    assert device.dram_used() == (0, 0)
    assert buf.freed
    with pytest.raises(DriverError, match="freed"):
        buf.read()
    device.release()


def test_injected_init_fail(machine: Machine, caplog: pytest.LogCaptureFixture) -> None:
    (device,) = machine.acquire([0], address=ADDRESS, version="1")
    device.inject("init_fail")
    caplog.set_level(logging.INFO, logger="nrtd.TDRV")
    with pytest.raises(InitFailed, match=r"0000:00:1c\.0"):
        device.reset()
    records = [r for r in caplog.records if r.name == "nrtd.TDRV"]
    assert records[0].getMessage() == "Resetting 0000:00:1c.0"
    assert records[-1].levelno == logging.ERROR
    assert getattr(records[-1], "fn", None) == "tdrv_init_one_mla_phase2"
    assert not any(r.getMessage().startswith("Initialized") for r in records)
    device.reset()  # one-shot: the next reset works
    device.release()


def test_open_without_create_never_makes_a_machine(tmp_path: pathlib.Path) -> None:
    with pytest.raises(driver_sim.NoMachine, match="no simulated machine at"):
        driver_sim.Machine.open(tmp_path / "none", create=False)
    assert not (tmp_path / "none").exists()
    made = driver_sim.Machine.open(tmp_path / "made")
    assert driver_sim.Machine.open(tmp_path / "made", create=False).root == made.root


def test_an_empty_sim_root_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_SIM_ROOT", " ")
    with pytest.raises(ValueError, match="NEURON_SIM_ROOT is set but empty"):
        driver_sim.default_sim_root()
