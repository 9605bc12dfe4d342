"""Shapes of the simulated machines: real inf1 instance types and their devices.

A device has `NC_PER_DEVICE` NeuronCores and `DRAM_CHANNELS` DRAM channels of
`CHANNEL_BYTES` each. The devices of an instance are linked in a chain: device i talks
to i-1 and i+1, so the ends have one neighbour.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

NC_PER_DEVICE = 4
DRAM_CHANNELS = 2
CHANNEL_BYTES = 4 * 2**30
DEVICE_MEMORY_BYTES = DRAM_CHANNELS * CHANNEL_BYTES

DEFAULT_INSTANCE_TYPE = "inf1.6xlarge"
SIM_ROOT_ENV = "NEURON_SIM_ROOT"


@dataclass(frozen=True)
class InstancePreset:
    """An instance type: its name, how many devices it has and their PCI addresses."""

    name: str
    device_count: int
    bdfs: tuple[str, ...]


def _bdf_range(first_slot: int, count: int) -> tuple[str, ...]:
    """`count` consecutive PCI addresses on bus 0, ending at slot 0x1f."""
    return tuple(f"0000:00:{slot:02x}.0" for slot in range(first_slot, first_slot + count))


def _preset(name: str, device_count: int) -> InstancePreset:
    return InstancePreset(name, device_count, _bdf_range(0x20 - device_count, device_count))


PRESETS: dict[str, InstancePreset] = {
    preset.name: preset
    for preset in (
        _preset("inf1.xlarge", 1),
        _preset("inf1.2xlarge", 1),
        _preset("inf1.6xlarge", 4),
        _preset("inf1.24xlarge", 16),
    )
}


def preset_named(name: str) -> InstancePreset:
    """The preset called `name`; ValueError listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(PRESETS)
        raise ValueError(f"unknown instance type {name!r}; known types: {known}") from None


def chain_neighbours(index: int, device_count: int) -> tuple[int, ...]:
    """The devices linked to `index` in a chain of `device_count` devices."""
    return tuple(i for i in (index - 1, index + 1) if 0 <= i < device_count)


SYSTEM_SIM_ROOT = pathlib.Path("/run/neuron-sim")  # the service's machine


def default_sim_root() -> pathlib.Path:
    """`$NEURON_SIM_ROOT`, else /run/neuron-sim for root, and for anyone else who can read
    the machine there (the service's, for the group neuron), else /tmp/neuron-sim-<uid>.
    ValueError when the variable is set but empty (a typo, more likely than a wish)."""
    configured = os.environ.get(SIM_ROOT_ENV)
    if configured is not None:
        if not configured.strip():
            raise ValueError(
                f"{SIM_ROOT_ENV} is set but empty: unset it for the default root, or name "
                "the simulated machine's directory"
            )
        return pathlib.Path(configured)
    uid = os.geteuid()
    if uid == 0 or os.access(SYSTEM_SIM_ROOT / "machine.json", os.R_OK):
        return SYSTEM_SIM_ROOT
    return pathlib.Path(f"/tmp/neuron-sim-{uid}")
