"""An owned device: reset, DRAM, NeuronCores, health counters and fault injection.

Locks: each NC has its own lock (held for a whole run); the device lock guards DRAM and
fault state. Whoever needs both takes the NC locks first, in NC order, then the device lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from driver_sim.core import NeuronCore, TakeTurn
from driver_sim.dram import ChannelAllocator, DramBuffer
from driver_sim.errors import DramExhausted, DriverError, HwFault, InitFailed
from driver_sim.faults import (
    DMA_TIMEOUT,
    ECC_FAULTS,
    ECC_UNCORRECTABLE,
    HANG_DETECT_S,
    NC_HANG,
    RUN_FAULT_COUNTERS,
    FaultSpec,
    FaultState,
    InjectFile,
    env_faults_for,
    env_init_fail,
    parse_fault_spec,
)
from driver_sim.owner import OwnerRecord, read_owner, write_owner
from driver_sim.presets import CHANNEL_BYTES, DRAM_CHANNELS, NC_PER_DEVICE
from driver_sim.stats import HealthCounters, StatsMap, hw_counters_from
from neuron_rtd.onnxrt import WHILE_BUSY

if TYPE_CHECKING:
    from driver_sim.machine import Machine

log = logging.getLogger("nrtd.TDRV")


class Device:
    """Device `index` of `machine`, owned by this process until `release()`.

    Made by `Machine.acquire`, which holds `lock_fd` locked for the claim's life.
    """

    def __init__(
        self,
        machine: Machine,
        index: int,
        lock_fd: int,
        owner: OwnerRecord,
        *,
        engine: str = "reference",
        threads: int = 1,
        spinning: str = WHILE_BUSY,
        faults: str | None = None,
        take_turn: TakeTurn | None = None,
    ) -> None:
        self.machine = machine
        self.index = index
        self.bdf = machine.bdf_of(index)
        self._paths = machine.paths
        self._inject = InjectFile(machine.paths.inject(index))
        self._lock_fd: int | None = lock_fd
        self._owner_pid = owner.pid
        self._lock = threading.RLock()
        self._faults = FaultState()
        self._given_faults = faults  # injected at acquire (None: $NEURON_SIM_FAULTS's)
        self._channels = [ChannelAllocator(CHANNEL_BYTES) for _ in range(DRAM_CHANNELS)]
        self._buffers: dict[tuple[int, int], DramBuffer] = {}
        self._cores = tuple(
            NeuronCore(
                self, nc, engine=engine, threads=threads, spinning=spinning, take_turn=take_turn
            )
            for nc in range(NC_PER_DEVICE)
        )
        self._stats: StatsMap | None = None
        try:
            write_owner(self._paths.owner(index), owner)
            self._stats = StatsMap(self._paths.stats(index))
            self._stats.start_epoch()
            for core in self._cores:
                core.attach_stats(self._stats.slots)
            for fault in env_faults_for(index, faults):
                if fault.name != "init_fail":
                    self._apply_fault(fault)
        except BaseException:
            self.release()
            raise

    def __repr__(self) -> str:
        return f"Device({self.index}, {self.bdf})"

    def __enter__(self) -> Device:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # ---- ownership ---------------------------------------------------------------------

    @property
    def released(self) -> bool:
        return self._lock_fd is None

    def check_owned(self) -> None:
        if self._lock_fd is None:
            raise DriverError(f"device {self.index} ({self.bdf}) was released")

    def _owned_stats(self) -> StatsMap:
        if self._stats is None or self._lock_fd is None:
            raise DriverError(f"device {self.index} ({self.bdf}) was released")
        return self._stats

    def release(self) -> None:
        """Give the device up: free its DRAM, drop the owner file, unlock. Idempotent."""
        with self._everything_locked():
            if self._lock_fd is None:
                return
            self._free_all_dram()
            for core in self._cores:
                core.attach_stats(None)
            if self._stats is not None:
                self._stats.close()
                self._stats = None
            self._remove_owner_file()
            self._inject.close()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_owner_file(self) -> None:
        path = self._paths.owner(self.index)
        record = read_owner(path)
        if record is not None and record.pid == self._owner_pid:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @contextlib.contextmanager
    def _everything_locked(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for core in self._cores:
                stack.enter_context(core.lock)
            stack.enter_context(self._lock)
            yield

    # ---- reset -------------------------------------------------------------------------

    def reset(self) -> None:
        """Free all DRAM and zero the NC counters; InitFailed if init fails (injected)."""
        self.check_owned()
        log.info("Resetting %s", self.bdf, extra={"fn": "reset_mla"})
        with self._everything_locked():
            stats = self._owned_stats()
            self._free_all_dram()
            stats.start_epoch()
            self._poll_inject_file()
            failing = self._faults.take_init_fail() or env_init_fail(self.index, self._given_faults)
            if failing:
                stats.add_fault("init_failures")
        if failing:
            log.error(
                "Failed to initialize Inferentia: %s (injected init_fail)",
                self.bdf,
                extra={"fn": "tdrv_init_one_mla_phase2"},
            )
            raise InitFailed(f"device {self.index} ({self.bdf}): initialization failed (injected)")
        log.info("Initialized Inferentia: %s", self.bdf, extra={"fn": "tdrv_init_one_mla_phase2"})

    # ---- DRAM --------------------------------------------------------------------------

    def dram_alloc(self, channel: int, nbytes: int, *, tag: str = "") -> DramBuffer:
        """Allocate `nbytes` in `channel` (first fit, 64-byte aligned)."""
        _check_channel(channel)
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative size ({nbytes})")
        with self._lock:
            stats = self._owned_stats()
            allocator = self._channels[channel]
            address = allocator.allocate(nbytes)
            if address is None:
                raise DramExhausted(
                    device_index=self.index,
                    bdf=self.bdf,
                    channel=channel,
                    requested=nbytes,
                    free=allocator.free_bytes,
                    total=allocator.capacity,
                    largest_free=allocator.largest_free,
                )
            buf = DramBuffer(self.index, channel, address, nbytes, tag)
            self._buffers[channel, address] = buf
            stats.set_dram_used(channel, allocator.used)
        return buf

    def dram_free(self, buf: DramBuffer) -> None:
        """Free `buf`; DriverError if it is not a live buffer of this device."""
        with self._lock:
            stats = self._owned_stats()
            key = (buf.channel, buf.address)
            if buf.device_index != self.index or self._buffers.get(key) is not buf:
                raise DriverError(f"{buf!r} is not allocated on device {self.index} (double free?)")
            del self._buffers[key]
            self._channels[buf.channel].free(buf.address)
            buf.invalidate()
            stats.set_dram_used(buf.channel, self._channels[buf.channel].used)

    def dram_used(self) -> tuple[int, int]:
        """Bytes allocated per channel (allocations count rounded up to 64 bytes)."""
        return self._channels[0].used, self._channels[1].used

    def _free_all_dram(self) -> None:
        for buf in self._buffers.values():
            buf.invalidate()
        self._buffers.clear()
        for channel, allocator in enumerate(self._channels):
            allocator.clear()
            if self._stats is not None:
                self._stats.set_dram_used(channel, 0)

    # ---- NCs and counters ---------------------------------------------------------------

    def nc(self, i: int) -> NeuronCore:
        """NeuronCore `i` (0..3)."""
        if not 0 <= i < NC_PER_DEVICE:
            raise ValueError(f"device {self.index} has NCs 0..{NC_PER_DEVICE - 1}, not {i}")
        return self._cores[i]

    def hw_counters(self) -> HealthCounters:
        with self._lock:
            return hw_counters_from(self._owned_stats().slots)

    # ---- faults ------------------------------------------------------------------------

    def inject(self, fault: str) -> None:
        """Inject a fault, `name[:nc][=value]` (see `driver_sim.faults`)."""
        spec = parse_fault_spec(fault)
        with self._lock:
            self._apply_fault(spec)

    def _apply_fault(self, fault: FaultSpec) -> None:
        if fault.name in ECC_FAULTS:
            self._owned_stats().add_ecc(fault.name, fault.value or 0)
            if fault.name in ECC_UNCORRECTABLE and fault.value:
                self._faults.apply(fault)  # and the next run meets it
        else:
            self._faults.apply(fault)

    def _poll_inject_file(self) -> None:
        lines = self._inject.take()
        if not lines:
            return
        with self._lock:
            for line in lines:
                try:
                    self._apply_fault(parse_fault_spec(line))
                except ValueError as exc:
                    log.warning("inject file of %s: %s (skipped)", self.bdf, str(exc))

    def before_load(self, nc: int) -> None:
        """Fault checks before a program load on `nc`: its injected delay, if any."""
        self.check_owned()
        self._poll_inject_file()
        delay = self._faults.load_delay_s
        if delay:
            log.info(
                "Holding a program load on %s NC %d for %g ms (injected load_delay_ms)",
                self.bdf,
                nc,
                delay * 1000,
                extra={"fn": "load_program"},
            )
            time.sleep(delay)

    def before_run(self, nc: int) -> None:
        """Fault checks before a run on `nc` (called under that NC's lock)."""
        self.check_owned()
        self._poll_inject_file()
        if not self._faults.quiet:  # almost never: the rest is skipped at one test
            self._meet_faults(nc)

    def _meet_faults(self, nc: int) -> None:
        """The run on `nc` meets its pending fault (raised), else its delay."""
        faults = self._faults
        if faults.any_pending():
            with self._lock:
                fault = faults.take(nc)
                if fault in RUN_FAULT_COUNTERS:
                    self._owned_stats().add_fault(RUN_FAULT_COUNTERS[fault])
            if fault is not None:
                raise self._run_fault(fault, nc)
        delay = faults.delays_s[nc]
        if delay:
            time.sleep(delay)

    def _run_fault(self, fault: str, nc: int) -> HwFault:
        where = f"device {self.index} ({self.bdf}) NC {nc}"
        if fault == NC_HANG:  # the run never completes: the watchdog gives up on it
            time.sleep(HANG_DETECT_S)
            return HwFault(
                f"{where}: the NC did not complete its run within {HANG_DETECT_S:g} s "
                "(hung; injected)"
            )
        if fault == DMA_TIMEOUT:
            return HwFault(f"{where}: DMA of the run's inputs timed out (injected)")
        if fault in ECC_UNCORRECTABLE:
            memory = "device memory" if fault.startswith("mem") else "SRAM"
            return HwFault(f"{where}: uncorrectable ECC error in {memory} (injected)")
        return HwFault(f"{where}: hardware error during execution (injected)")


def _check_channel(channel: int) -> None:
    if not 0 <= channel < DRAM_CHANNELS:
        raise ValueError(f"DRAM channel must be 0..{DRAM_CHANNELS - 1}, not {channel}")
