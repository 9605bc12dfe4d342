"""The devices' health, read from the simulated machine's tree as neuron-ls and
neuron-monitor read it (each device's `stats` file, `driver_sim.stats`), no daemon needed.

A device is Unhealthy, and every NC on it, while
- an uncorrectable ECC error (device memory or SRAM) was counted since its last reset, or
- its last reset failed (its init: the `init_failures` counter rose with it), or
- its state is gone from the tree (no `stats` file).
A reset that succeeds (the runtime's recovery after a hardware error does one; so does a
claim) makes it Healthy again. The counters count for the device's life, so the plugin
judges by what changed between its readings: a device is Healthy when the plugin starts,
whatever happened before (what the counters said then is the baseline).

`HealthBoard` polls every device (every 0.5 s by default, a read of a 440-byte file each)
and tells its watchers when the health of some device changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

import driver_sim
from driver_sim.stats import RESET_TIME_SLOT, hw_counters_from, read_stats

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
POLL_S = 0.5


@dataclass(frozen=True)
class Reading:
    """What one look at a device's stats file tells of its health."""

    present: bool  # its stats file is there
    epoch: int = 0  # wall-clock ns of its last reset or claim (changes with each)
    uncorrectable: int = 0  # uncorrectable ECC errors, device memory and SRAM, ever
    init_failures: int = 0  # resets whose init failed, ever


def read_device(machine: driver_sim.Machine, index: int) -> Reading:
    """Device `index`'s health counters and reset time, from one read of its stats file."""
    path = machine.paths.stats(index)
    if not path.is_file():
        return Reading(present=False)
    slots = read_stats(path)
    hw = hw_counters_from(slots)
    return Reading(
        present=True,
        epoch=int(slots[RESET_TIME_SLOT]),
        uncorrectable=hw.mem_ecc_uncorr + hw.sram_ecc_uncorr,
        init_failures=hw.init_failures,
    )


class DeviceHealth:
    """One device's health, judged from its successive readings (see the module doc)."""

    def __init__(self, first: Reading) -> None:
        self._baseline = first  # the counters as the current epoch began
        self._last = first

    def update(self, reading: Reading) -> str | None:
        """Take a new reading: why the device is Unhealthy now, or None when Healthy."""
        if reading.epoch != self._last.epoch:
            # A reset (or claim) since the last look: what was counted before it is past.
            # A failed init is counted at the reset itself (after the new epoch is
            # written), so the failures already counted by the last look are the baseline.
            self._baseline = replace(reading, init_failures=self._last.init_failures)
        self._last = reading
        if not reading.present:
            return "its state is gone from the simulated machine's tree"
        if reading.init_failures > self._baseline.init_failures:
            return "its last reset failed to initialize it"
        if reading.uncorrectable > self._baseline.uncorrectable:
            return "an uncorrectable ECC error since its last reset"
        return None


Log = Callable[[str], None]


class HealthBoard:
    """The current health of every device of `machine`, polled, and the next change of it
    (`next_change`). `unhealthy[i]`: why device i is Unhealthy, None while it is Healthy."""

    def __init__(self, machine: driver_sim.Machine, log: Log, *, poll_s: float = POLL_S) -> None:
        self.machine = machine
        self.poll_s = poll_s
        self._log = log
        self._devices = [DeviceHealth(read_device(machine, i)) for i in range(machine.device_count)]
        self.unhealthy: tuple[str | None, ...] = (None,) * machine.device_count
        self._change = asyncio.Event()

    def health(self, device: int) -> str:
        """ "Healthy" or "Unhealthy", as ListAndWatch says it."""
        return HEALTHY if self.unhealthy[device] is None else UNHEALTHY

    def poll(self) -> bool:
        """Read every device once; whether any device's health changed (logged)."""
        now = tuple(
            health.update(read_device(self.machine, i)) for i, health in enumerate(self._devices)
        )
        changed = [i for i, why in enumerate(now) if (why is None) != (self.unhealthy[i] is None)]
        for i in changed:
            bdf = self.machine.bdf_of(i)
            why = now[i]
            self._log(
                f"device {i} ({bdf}) and its NeuronCores are Unhealthy: {why}"
                if why
                else f"device {i} ({bdf}) and its NeuronCores are Healthy again"
            )
        self.unhealthy = now
        if changed:
            self._change.set()
            self._change = asyncio.Event()
        return bool(changed)

    def next_change(self) -> asyncio.Event:
        """Set at the next change of any device's health: taken before reading the health,
        awaited after, so that no change between the two goes unseen."""
        return self._change

    async def watch(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            self.poll()
