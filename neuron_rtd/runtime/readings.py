"""What observers read of the runtime and its devices: one NC's counters, a device's
health counters, the system's, and everything at one instant (`snapshot`, for
neuron-monitor and neuron-top). Reading takes nothing from anyone (unlike
`read_all_metrics`), and the runtime checks the devices are up before it reads."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Sequence

import psutil

from neuron_rtd.errors import InvalidError
from neuron_rtd.runtime.api import (
    DeviceInfo,
    HwCounters,
    ModelInfo,
    NcgInfo,
    NcUse,
    Snapshot,
    SystemCounters,
    Topology,
)
from neuron_rtd.runtime.driver import DeviceApi, NcCounters, driver_errors
from neuron_rtd.runtime.model_table import ModelTable
from neuron_rtd.runtime.ncg import Ncg, NcgTable
from neuron_rtd.runtime.sessions import session_tag
from neuron_rtd.runtime.stats import Stats


class Readings:
    def __init__(
        self,
        devices: Sequence[DeviceApi],
        ncgs: NcgTable,
        models: ModelTable,
        stats: Stats,
        lock: threading.RLock,
    ) -> None:
        self._devices = devices
        self._ncgs = ncgs
        self._models = models
        self._stats = stats
        self._lock = lock  # the runtime's: the models and NCGs as one consistent picture
        self.transfer_adjustment = 0  # the static DMA adjustment the devices report

    def topology(self) -> Topology:
        return Topology(
            device_count=len(self._devices),
            ncs_per_device=self._ncgs.ncs_per_device,
            total_ncs=self._ncgs.total_ncs,
        )

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo.of(device) for device in self._devices]

    def ncg_info(self, ncg: Ncg) -> NcgInfo:
        loc = self._ncgs.locate(ncg.start)
        return NcgInfo(
            id=ncg.id,
            start=ncg.start,
            nc_count=ncg.nc_count,
            device_index=self._devices[loc.device_slot].index,
            nc_start=loc.nc,
            session=session_tag(ncg.session_id),
            implicit=ncg.implicit,
            models=tuple(ncg.models),
        )

    def nc_counters(self, vnc: int) -> NcCounters:
        """The counters of virtual NC `vnc` since the devices were initialized."""
        if not 0 <= vnc < self._ncgs.total_ncs:
            raise InvalidError(
                f"no virtual NC {vnc}: this runtime has {self._ncgs.total_ncs} "
                f"(0..{self._ncgs.total_ncs - 1})"
            )
        loc = self._ncgs.locate(vnc)
        with driver_errors(f"counters of NC {vnc}"):
            return self._devices[loc.device_slot].nc(loc.nc).counters()

    def hw_counters(self, *, bdf: str | None = None, index: int | None = None) -> HwCounters:
        """The health counters of one of this runtime's devices, by PCI BDF or index."""
        if bdf is None and index is None:
            raise InvalidError("get_hw_counters needs a bdf or a device_id")
        for device in self._devices:
            if (bdf is not None and device.bdf == bdf) or (
                index is not None and device.index == index
            ):
                return HwCounters.of(device, self.transfer_adjustment)
        owned = ", ".join(f"{d.index} ({d.bdf})" for d in self._devices)
        wanted = f"BDF {bdf}" if bdf is not None else f"index {index}"
        raise InvalidError(f"no device with {wanted} in this runtime; it owns {owned}")

    def all_hw_counters(self) -> list[HwCounters]:
        return [HwCounters.of(device, self.transfer_adjustment) for device in self._devices]

    def snapshot(self) -> Snapshot:
        """Everything an observer (neuron-monitor, neuron-top) reads, at one instant."""
        with self._lock:
            models = list(self._models)
            infos = tuple(ModelInfo.of(m) for m in models)
            ncgs = tuple(self.ncg_info(ncg) for ncg in self._ncgs.list())
        owner = {vnc: ncg.id for ncg in ncgs for vnc in ncg.vncs}
        ncs = []
        for vnc in range(self._ncgs.total_ncs):
            loc = self._ncgs.locate(vnc)
            device = self._devices[loc.device_slot]
            with driver_errors(f"counters of NC {vnc}"):
                busy_ns = device.nc(loc.nc).counters().busy_ns
            ncs.append(NcUse(vnc, device.index, loc.nc, busy_ns, owner.get(vnc, 0)))
        cpu = resource.getrusage(resource.RUSAGE_SELF)  # in us (psutil's: 10 ms ticks)
        latency, nc_latency = self._stats.latency()
        return Snapshot(
            time_ns=time.time_ns(),
            cpu_user_s=cpu.ru_utime,
            cpu_system_s=cpu.ru_stime,
            rss_bytes=psutil.Process().memory_info().rss,
            ncs=tuple(ncs),
            ncgs=ncgs,
            models=infos,
            tallies=tuple(self._stats.tallies(models)),
            counters=self._stats.snapshot(),
            latency=latency,
            nc_latency=nc_latency,
        )

    def system_counters(self) -> SystemCounters:
        logs = self._stats.logs
        return SystemCounters(
            log_errors=logs.errors,
            log_warnings=logs.warnings,
            host_memory_bytes=psutil.Process().memory_info().rss,
            devices=tuple(DeviceInfo.of(device) for device in self._devices),
        )
