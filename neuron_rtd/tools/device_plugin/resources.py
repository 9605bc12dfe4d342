"""The two resources a node offers, their units, and what a container given units gets.

- `aws.amazon.com/neuroncore`: one unit per NeuronCore, its id the NC's machine-wide index
  (device index * 4 + the NC on it), as `NEURON_RT_VISIBLE_CORES` names it.
- `aws.amazon.com/neuron`: one unit per Neuron device, its id the device index, as
  `AWS_NEURON_VISIBLE_DEVICES` names it.

A unit's place in the device chain (`Unit.position`) orders the units the way the devices
are linked (device i talks to i-1 and i+1 on every preset), so that units next to each
other in that order are contiguous on the hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import driver_sim
from neuron_rtd.visible import CORES_ENV, DEVICES_ENV, show_indices

NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
NEURON_RESOURCE = "aws.amazon.com/neuron"


class RequestError(ValueError):
    """A request the plugin refuses (unknown ids, an impossible size): the kubelet is
    answered INVALID_ARGUMENT with this message."""


@dataclass(frozen=True)
class Unit:
    """One schedulable unit of a resource: a NeuronCore or a Neuron device."""

    id: str  # what the kubelet calls it: the index, in decimal
    index: int  # machine-wide NC index, or device index
    device: int  # the device it is on (itself, for a device)
    position: int  # its place in the chain order of the units
    cores: tuple[int, ...]  # the machine-wide indices of its NCs (its own, for an NC)


@dataclass(frozen=True)
class Grant:
    """What a container given some units of a resource gets: its environment and the
    devices whose nodes it needs."""

    envs: dict[str, str]
    devices: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Resource:
    """An extended resource: its name, the socket it is served on (a file name in the
    device-plugins dir) and its units."""

    name: str
    endpoint: str
    units: tuple[Unit, ...]

    @property
    def per_core(self) -> bool:
        return self.name == NEURONCORE_RESOURCE

    def find(self, ids: Iterable[str]) -> list[Unit]:
        """The units named `ids`, in the order given; RequestError naming every unknown
        id (and the ids this resource has)."""
        by_id = {unit.id: unit for unit in self.units}
        wanted = list(ids)
        unknown = [i for i in wanted if i not in by_id]
        if unknown:
            shown = ", ".join(repr(i) for i in unknown)
            raise RequestError(
                f"unknown device id(s) {shown} for {self.name}: this node has "
                f"{show_indices(u.index for u in self.units)} (ask the kubelet again: "
                "its list may be older than this plugin)"
            )
        return [by_id[i] for i in wanted]

    def grant(self, ids: Sequence[str]) -> Grant:
        """What a container given `ids` gets. NeuronCores: `NEURON_RT_VISIBLE_CORES`.
        Devices: `AWS_NEURON_VISIBLE_DEVICES` (read by a runtime in the container, as the
        original's was) and `NEURON_RT_VISIBLE_CORES` of all their NCs (read by a client
        of the node's daemon)."""
        units = self.find(ids)
        if not units:
            raise RequestError(f"an allocation of {self.name} names no device ids")
        devices = tuple(sorted({u.device for u in units}))
        envs = {CORES_ENV: show_indices(nc for u in units for nc in u.cores)}
        if not self.per_core:
            envs[DEVICES_ENV] = show_indices(devices)
        return Grant(envs=envs, devices=devices)


def chain_order(connected: Sequence[Sequence[int]]) -> list[int]:
    """The device indices in the order of their chain, from the end with the lower index;
    `connected[i]`: the devices linked to device i. Devices the walk does not reach (no
    chain: a ring, or parts) follow in index order."""
    count = len(connected)
    ends = [i for i in range(count) if len(connected[i]) < 2]
    order: list[int] = []
    seen: set[int] = set()
    at: int | None = ends[0] if ends else (0 if count else None)
    while at is not None and at not in seen:
        order.append(at)
        seen.add(at)
        at = next((n for n in sorted(connected[at]) if n not in seen and 0 <= n < count), None)
    return order + [i for i in range(count) if i not in seen]


def resources_of(machine: driver_sim.Machine) -> tuple[Resource, Resource]:
    """The machine's NeuronCores and devices, as the two resources."""
    listings = machine.devices()
    place = {device: at for at, device in enumerate(chain_order([d.connected for d in listings]))}
    per_device = driver_sim.NC_PER_DEVICE
    cores_of = {
        d.index: tuple(d.index * per_device + nc for nc in range(d.core_count)) for d in listings
    }
    cores = tuple(
        Unit(
            id=str(index),
            index=index,
            device=d.index,
            position=place[d.index] * per_device + nc,
            cores=(index,),
        )
        for d in listings
        for nc, index in enumerate(cores_of[d.index])
    )
    devices = tuple(
        Unit(
            id=str(d.index),
            index=d.index,
            device=d.index,
            position=place[d.index],
            cores=cores_of[d.index],
        )
        for d in listings
    )
    return (
        Resource(name=NEURONCORE_RESOURCE, endpoint="neuron-core.sock", units=cores),
        Resource(name=NEURON_RESOURCE, endpoint="neuron.sock", units=devices),
    )
