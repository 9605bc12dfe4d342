"""Which devices of the machine the daemon serves: those `-t` names, else those
`AWS_NEURON_VISIBLE_DEVICES` names, else all; one contiguous run of them."""

from __future__ import annotations

import driver_sim
from neuron_rtd.visible import DEVICES_ENV, show_indices


class StartupError(Exception):
    """The daemon cannot start; the message says why."""


def select_devices(
    machine: driver_sim.Machine, bdfs: tuple[str, ...], visible: frozenset[int] | None = None
) -> list[int]:
    """Device indices for the BDFs asked for, else for the indices of
    `AWS_NEURON_VISIBLE_DEVICES` (`visible`), else all: contiguous, no repeats. Both
    given, they must name the same devices."""
    if not bdfs:
        return _visible_devices(machine, visible)
    indices = []
    for bdf in bdfs:
        try:
            indices.append(machine.index_of_bdf(bdf))
        except driver_sim.DeviceNotFound:
            known = ", ".join(d.bdf for d in machine.devices())
            raise StartupError(f"no Neuron device at {bdf} (this machine has {known})") from None
    if len(set(indices)) != len(indices):
        raise StartupError(f"a device is named twice in {', '.join(bdfs)}")
    ordered = sorted(indices)
    if ordered != list(range(ordered[0], ordered[0] + len(ordered))):
        raise StartupError(
            f"devices {', '.join(bdfs)} (indices {', '.join(map(str, ordered))}) are not "
            "contiguous: a daemon serves one connected run of devices"
        )
    if visible is not None and set(ordered) != visible:
        raise StartupError(
            f"-t {' -t '.join(bdfs)} names devices {show_indices(ordered)}, but "
            f"{DEVICES_ENV}={show_indices(visible)} names others: drop one of the two "
            "(-t wins nowhere: they must agree)"
        )
    return ordered


def _visible_devices(machine: driver_sim.Machine, visible: frozenset[int] | None) -> list[int]:
    """The devices `AWS_NEURON_VISIBLE_DEVICES` names (all when unset): existing and
    contiguous."""
    every = list(range(machine.device_count))
    if visible is None:
        return every
    missing = sorted(visible - set(every))
    if missing:
        raise StartupError(
            f"{DEVICES_ENV}={show_indices(visible)}: no device {show_indices(missing)} on this "
            f"{machine.instance_type}, whose devices are {show_indices(every)}"
        )
    ordered = sorted(visible)
    if ordered != list(range(ordered[0], ordered[-1] + 1)):
        raise StartupError(
            f"{DEVICES_ENV}={show_indices(visible)} is not a contiguous run of devices: a "
            "daemon serves one connected run (start one daemon per run)"
        )
    return ordered
