"""The binary `stats` file of a device, and the counter records read from it.

Layout: a flat array of little-endian uint64 slots, `STATS_BYTES` long.

    slot  0..3    ECC counters: mem_ecc_corr, mem_ecc_uncorr, sram_ecc_corr, sram_ecc_uncorr
    slot  4..5    DRAM bytes in use, channel 0 and channel 1
    slot  6..37   per NC n (0..3), at 6 + 8*n + k, field k of `NC_FIELDS`:
                  pe_executed_instr, pe_matmul_executed_instr, act_executed_instr,
                  pool_executed_instr, macs, busy_ns, sb_rmw_count, runs
    -- extension, after the block above --
    slot 38       reset_time_ns: wall clock (time.time_ns) of the device's last reset/claim
    slot 39..50   per NC n, at 39 + 3*n + e, busy cycles of engine e (PE, ACT, POOL)
    slot 51..54   fault counters (`FAULT_FIELDS`): nc_errors, nc_hangs, dma_timeouts,
                  init_failures; like the ECC counters, they survive resets

The owner maps the file (`StatsMap`) and adds to the slots in place, so any process that
reads the file (`read_stats`) sees live values without asking the owner.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import sys
import time
from array import array
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import numpy as np

from driver_sim.cost import Engine, elapsed_cycles
from driver_sim.presets import DRAM_CHANNELS, NC_PER_DEVICE

SLOT_DTYPE = "<u8"  # a slot, as numpy names it (the owner's view, the programs' tallies)
SLOT_BYTES = 8
# What readers index: the slots as unsigned 64-bit ints, a numpy view (the owner's) or an
# array (a reader's snapshot, made without numpy: neuron-ls starts in a third less time).
Slots = Union["np.ndarray", "array[int]"]
NC_FIELDS = (
    "pe_executed_instr",
    "pe_matmul_executed_instr",
    "act_executed_instr",
    "pool_executed_instr",
    "macs",
    "busy_ns",
    "sb_rmw_count",
    "runs",
)
NC_FIELD = {name: k for k, name in enumerate(NC_FIELDS)}


def _health(slots: str) -> Any:
    """A health counter kept in the `slots` block of the file ("ecc" or "fault")."""
    return field(default=0, metadata={"slots": slots})


@dataclass(frozen=True)
class HealthCounters:
    """A device's health counters, counted since its stats file was made: the one list of
    them (the file's ECC and fault slots, the driver port and the runtime's `HwCounters`
    follow it; the wire carries those its messages name)."""

    mem_ecc_corr: int = _health("ecc")
    mem_ecc_uncorr: int = _health("ecc")
    sram_ecc_corr: int = _health("ecc")
    sram_ecc_uncorr: int = _health("ecc")
    nc_errors: int = _health("fault")  # runs that failed with an NC error
    nc_hangs: int = _health("fault")  # runs the completion watchdog gave up on
    dma_timeouts: int = _health("fault")  # runs whose input DMA timed out
    init_failures: int = _health("fault")  # resets whose initialization failed


ECC_FIELDS = tuple(f.name for f in fields(HealthCounters) if f.metadata["slots"] == "ecc")
FAULT_FIELDS = tuple(f.name for f in fields(HealthCounters) if f.metadata["slots"] == "fault")
DRAM_USED_SLOT = len(ECC_FIELDS)
NC_BASE_SLOT = DRAM_USED_SLOT + DRAM_CHANNELS
RESET_TIME_SLOT = NC_BASE_SLOT + NC_PER_DEVICE * len(NC_FIELDS)
CYCLES_BASE_SLOT = RESET_TIME_SLOT + 1
FAULT_BASE_SLOT = CYCLES_BASE_SLOT + NC_PER_DEVICE * len(Engine)
STATS_SLOTS = FAULT_BASE_SLOT + len(FAULT_FIELDS)
STATS_BYTES = STATS_SLOTS * SLOT_BYTES


def nc_slots(nc: int) -> slice:
    """The `NC_FIELDS` slots of NC `nc`."""
    start = NC_BASE_SLOT + nc * len(NC_FIELDS)
    return slice(start, start + len(NC_FIELDS))


def cycle_slots(nc: int) -> slice:
    """The per-engine busy-cycle slots of NC `nc`."""
    start = CYCLES_BASE_SLOT + nc * len(Engine)
    return slice(start, start + len(Engine))


@dataclass(frozen=True)
class NcCounters:
    """One NeuronCore's counters, with the fields of the wire message (see `cost`): the one
    list of them (the driver port and the runtime's face give this record; the wire carries
    those its message names)."""

    pe_num_idle_cycles: int
    pe_num_wait_event_cycles: int
    pe_matmul_num_wait_event_cycles: int
    pe_num_executed_instr: int
    pe_matmul_num_executed_instr: int
    pool_num_idle_cycles: int
    pool_num_wait_event_cycles: int
    pool_num_executed_instr: int
    act_num_idle_cycles: int
    act_num_wait_event_cycles: int
    act_num_executed_instr: int
    sb_rmw_count: int
    macs_count: int
    busy_ns: int
    runs: int


def hw_counters_from(slots: Slots) -> HealthCounters:
    ecc = (int(v) for v in slots[: len(ECC_FIELDS)])
    faults = (int(v) for v in slots[FAULT_BASE_SLOT : FAULT_BASE_SLOT + len(FAULT_FIELDS)])
    return HealthCounters(
        **dict(zip(ECC_FIELDS, ecc, strict=True)), **dict(zip(FAULT_FIELDS, faults, strict=True))
    )


def dram_used_from(slots: Slots) -> tuple[int, int]:
    return int(slots[DRAM_USED_SLOT]), int(slots[DRAM_USED_SLOT + 1])


def nc_counters_from(slots: Slots, nc: int, now_ns: int | None = None) -> NcCounters:
    """NC `nc`'s counters; idle cycles are counted up to `now_ns` (default: now)."""
    fields = [int(v) for v in slots[nc_slots(nc)]]
    busy_cycles = [int(v) for v in slots[cycle_slots(nc)]]
    reset_ns = int(slots[RESET_TIME_SLOT])
    now = time.time_ns() if now_ns is None else now_ns
    elapsed = elapsed_cycles(now - reset_ns) if reset_ns else 0

    def idle(engine: Engine) -> int:
        return max(0, elapsed - busy_cycles[engine])

    def field(name: str) -> int:
        return fields[NC_FIELD[name]]

    return NcCounters(
        pe_num_idle_cycles=idle(Engine.PE),
        pe_num_wait_event_cycles=0,
        pe_matmul_num_wait_event_cycles=0,
        pe_num_executed_instr=field("pe_executed_instr"),
        pe_matmul_num_executed_instr=field("pe_matmul_executed_instr"),
        pool_num_idle_cycles=idle(Engine.POOL),
        pool_num_wait_event_cycles=0,
        pool_num_executed_instr=field("pool_executed_instr"),
        act_num_idle_cycles=idle(Engine.ACT),
        act_num_wait_event_cycles=0,
        act_num_executed_instr=field("act_executed_instr"),
        sb_rmw_count=field("sb_rmw_count"),
        macs_count=field("macs"),
        busy_ns=field("busy_ns"),
        runs=field("runs"),
    )


def create_stats_file(path: pathlib.Path) -> None:
    """A zeroed stats file (part of building the tree)."""
    path.write_bytes(bytes(STATS_BYTES))


def read_stats(path: pathlib.Path) -> array[int]:
    """A snapshot of the slots; a missing or short file reads as zeros."""
    try:
        raw = path.read_bytes()[:STATS_BYTES]
    except FileNotFoundError:
        raw = b""
    slots = array("Q")
    slots.frombytes(raw[: len(raw) // SLOT_BYTES * SLOT_BYTES])
    if sys.byteorder != "little":  # the file's slots are little-endian
        slots.byteswap()
    slots.extend([0] * (STATS_SLOTS - len(slots)))
    return slots


class StatsMap:
    """The owner's writable mapping of a stats file; `slots` is a numpy view of it."""

    def __init__(self, path: pathlib.Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < STATS_BYTES:
                os.ftruncate(fd, STATS_BYTES)
            self._map = mmap.mmap(fd, STATS_BYTES)
        finally:
            os.close(fd)
        import numpy as np  # the owner's side only: a reader needs no numpy

        self.slots: np.ndarray = np.frombuffer(self._map, dtype=SLOT_DTYPE, count=STATS_SLOTS)

    def start_epoch(self) -> None:
        """Zero DRAM usage and NC counters and restart the idle clock (claim or reset);
        the health counters (ECC, faults) stay."""
        self.slots[DRAM_USED_SLOT:RESET_TIME_SLOT] = 0
        self.slots[CYCLES_BASE_SLOT:FAULT_BASE_SLOT] = 0
        self.slots[RESET_TIME_SLOT] = time.time_ns()

    def set_dram_used(self, channel: int, nbytes: int) -> None:
        self.slots[DRAM_USED_SLOT + channel] = nbytes

    def add_ecc(self, field: str, count: int) -> None:
        self.slots[ECC_FIELDS.index(field)] += count

    def add_fault(self, field: str) -> None:
        self.slots[FAULT_BASE_SLOT + FAULT_FIELDS.index(field)] += 1

    def close(self) -> None:
        """Unmap now, or, while some view of `slots` still lives (say, in a frame kept by
        a traceback), as soon as the last one goes."""
        del self.slots
        with contextlib.suppress(BufferError):
            self._map.close()
