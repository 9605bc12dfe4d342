"""The simulated machine: its state tree, what anyone can read of its devices, and the
claims through which a process owns some of them."""

from __future__ import annotations

import fcntl
import os
import pathlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from driver_sim.errors import (
    DeviceBusy,
    DeviceNotFound,
    DriverError,
    MachineMismatch,
    NoMachine,
)
from driver_sim.faults import faults_from_env, parse_env_faults
from driver_sim.owner import OwnerInfo, is_alive, live_owner, read_owner, record_for_this_process
from driver_sim.presets import DEFAULT_INSTANCE_TYPE, NC_PER_DEVICE, default_sim_root, preset_named
from driver_sim.stats import (
    HealthCounters,
    NcCounters,
    dram_used_from,
    hw_counters_from,
    nc_counters_from,
    read_stats,
)
from driver_sim.tree import TreePaths, build_tree, parse_connected, read_machine_json, read_text

if TYPE_CHECKING:  # a device, its NCs and their kernels: imported by `acquire` only
    from driver_sim.core import TakeTurn
    from driver_sim.device import Device

OWNER_WAIT_S = 0.5  # how long DeviceBusy waits for a new owner to write its owner file


@dataclass(frozen=True)
class DeviceListing:
    """What anyone can read about a device from the tree (no claim needed).

    `dram_used` is (0, 0) and `owner` None while nobody (alive) owns the device.
    `nc_counters` holds each NC's counters since the device's last reset or claim.
    """

    index: int
    bdf: str
    core_count: int
    memory_bytes: int
    connected: tuple[int, ...]
    owner: OwnerInfo | None
    hw: HealthCounters
    dram_used: tuple[int, int]
    nc_counters: tuple[NcCounters, ...] = ()


@dataclass(frozen=True)
class _StaticInfo:
    bdf: str
    core_count: int
    memory_bytes: int
    connected: tuple[int, ...]


def _read_static(paths: TreePaths, index: int) -> _StaticInfo:
    return _StaticInfo(
        bdf=read_text(paths.bdf(index)),
        core_count=int(read_text(paths.core_count(index))),
        memory_bytes=int(read_text(paths.memory_size(index))),
        connected=parse_connected(read_text(paths.connected_devices(index))),
    )


class Machine:
    """A simulated machine rooted at `root`; use `Machine.open`."""

    def __init__(self, root: pathlib.Path, instance_type: str, device_count: int) -> None:
        self.root = root
        self.instance_type = instance_type
        self.device_count = device_count
        self.paths = TreePaths(root)
        self._static = [_read_static(self.paths, i) for i in range(device_count)]

    def __repr__(self) -> str:
        return f"Machine({str(self.root)!r}, {self.instance_type}, {self.device_count} devices)"

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str] | None = None,
        *,
        instance_type: str | None = None,
        create: bool = True,
    ) -> Machine:
        """The machine whose tree is at `root` (default: `default_sim_root()`), building
        the tree from the preset `instance_type` (default inf1.6xlarge) if there is none
        and `create` (inspection tools pass False: NoMachine instead). MachineMismatch if
        the tree is of another instance type than the one given."""
        path = default_sim_root() if root is None else pathlib.Path(root)
        if path.exists() and not path.is_dir():
            raise DriverError(f"the simulated machine's root {path} is not a directory")
        paths = TreePaths(path)
        description = read_machine_json(paths)
        if description is None and not create:
            raise NoMachine(f"no simulated machine at {path}")
        if description is None:
            build_tree(path, preset_named(instance_type or DEFAULT_INSTANCE_TYPE))
            description = read_machine_json(paths)
            assert description is not None, "build_tree leaves a tree behind"
        found = str(description["instance_type"])
        if instance_type is not None and found != instance_type:
            raise MachineMismatch(
                f"the simulator tree at {path} is an {found}, not the {instance_type} asked for"
            )
        return cls(path, found, int(description["device_count"]))

    # ---- reading the tree ----------------------------------------------------------------

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.device_count:
            raise DeviceNotFound(
                f"no device {index}: this {self.instance_type} has devices "
                f"0..{self.device_count - 1}"
            )

    def bdf_of(self, index: int) -> str:
        self._check_index(index)
        return self._static[index].bdf

    def index_of_bdf(self, bdf: str) -> int:
        """The index of the device at PCI address `bdf`."""
        wanted = bdf.strip().lower()
        for index, info in enumerate(self._static):
            if info.bdf.lower() == wanted:
                return index
        raise DeviceNotFound(f"no device with BDF {bdf} on this {self.instance_type}")

    def device_info(self, index: int) -> DeviceListing:
        """Device `index` as the tree shows it now."""
        self._check_index(index)
        static = self._static[index]
        owner = live_owner(self.paths.owner(index))
        slots = read_stats(self.paths.stats(index))
        now = time.time_ns()
        return DeviceListing(
            index=index,
            bdf=static.bdf,
            core_count=static.core_count,
            memory_bytes=static.memory_bytes,
            connected=static.connected,
            owner=owner,
            hw=hw_counters_from(slots),
            dram_used=dram_used_from(slots) if owner else (0, 0),
            nc_counters=tuple(nc_counters_from(slots, nc, now) for nc in range(NC_PER_DEVICE)),
        )

    def devices(self) -> list[DeviceListing]:
        return [self.device_info(i) for i in range(self.device_count)]

    # ---- claims ----------------------------------------------------------------------------

    def acquire(
        self,
        indices: Sequence[int],
        *,
        address: str,
        version: str,
        engine: str = "reference",
        threads: int = 1,
        spinning: str | None = None,
        faults: str | None = None,
        take_turn: TakeTurn | None = None,
    ) -> list[Device]:
        """Own the devices `indices`, all or none: DeviceBusy names a current owner. Their
        NCs compute with `engine` (`threads`: the fast engine's threads per NC run,
        `spinning`: how they wait for work, see `neuron_rtd.onnxrt`; None: WHILE_BUSY), with
        `faults` injected (`NEURON_SIM_FAULTS`' syntax; None: that variable's), a run at a busy
        NC waiting its turn by `take_turn` (None: plainly)."""
        # a device, its NCs, their kernels and onnxruntime: imported here, not by a reader
        # of the tree (neuron-ls)
        from driver_sim.device import Device
        from neuron_rtd.onnxrt import WHILE_BUSY

        wanted = list(indices)
        for index in wanted:
            self._check_index(index)
        if len(set(wanted)) != len(wanted):
            raise ValueError(f"device indices repeat: {wanted}")
        parse_env_faults(faults_from_env() if faults is None else faults)
        record = record_for_this_process(address, version)
        taken: list[Device] = []
        try:
            for index in wanted:
                device = Device(
                    self,
                    index,
                    self._lock_device(index),
                    record,
                    engine=engine,
                    threads=threads,
                    spinning=WHILE_BUSY if spinning is None else spinning,
                    faults=faults,
                    take_turn=take_turn,
                )
                taken.append(device)
        except BaseException:
            for device in reversed(taken):
                device.release()
            raise
        return taken

    def _lock_device(self, index: int) -> int:
        fd = os.open(self.paths.owner_lock(index), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self._wait_for_owner(index)
            raise DeviceBusy(
                index,
                self.bdf_of(index),
                owner.pid if owner else None,
                owner.address if owner else None,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _wait_for_owner(self, index: int) -> OwnerInfo | None:
        """The owner of a locked device; a new owner may not have written its file yet."""
        deadline = time.monotonic() + OWNER_WAIT_S
        while True:
            record = read_owner(self.paths.owner(index))
            if record is not None and is_alive(record):
                return record.info
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
