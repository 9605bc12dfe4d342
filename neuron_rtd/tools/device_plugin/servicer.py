"""The DevicePlugin service of one resource, on its own socket: one call of the concepts
beside it (resources, health, preferred) and the conversion to and from the wire per RPC;
a refused request is INVALID_ARGUMENT with the refusal's message.

A ListAndWatch stream holds no thread: it waits on the health board's next change, and
sends the whole list again only when some unit's health changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

import driver_sim
from neuron_rtd.client.address import ADDRESS_ENV
from neuron_rtd.proto import deviceplugin_pb, deviceplugin_pb_grpc
from neuron_rtd.tools.device_plugin.health import HealthBoard
from neuron_rtd.tools.device_plugin.preferred import preferred
from neuron_rtd.tools.device_plugin.resources import RequestError, Resource

OPTIONS = deviceplugin_pb.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


@dataclass(frozen=True, kw_only=True)
class ContainerSetup:
    """What every container given units gets besides its environment: the daemon's socket
    folder mounted read-only at the same path (connecting to a socket needs no write
    access), `NEURON_RTD_ADDRESS` naming the socket, and, unless `device_specs` is off, the
    device nodes of its devices at /dev/neuron<N>."""

    runtime_socket: Path
    device_specs: bool
    machine: driver_sim.Machine

    def response(self, resource: Resource, ids: list[str]) -> Any:
        grant = resource.grant(ids)
        folder = str(self.runtime_socket.parent)
        answer = deviceplugin_pb.ContainerAllocateResponse(
            envs={**grant.envs, ADDRESS_ENV: f"unix:{self.runtime_socket}"},
            mounts=[deviceplugin_pb.Mount(container_path=folder, host_path=folder, read_only=True)],
        )
        if self.device_specs:
            answer.devices.extend(
                deviceplugin_pb.DeviceSpec(
                    container_path=f"/dev/neuron{d}",
                    host_path=str(self.machine.paths.device_node(d)),
                    permissions="rw",
                )
                for d in grant.devices
            )
        return answer


class DevicePluginServicer(deviceplugin_pb_grpc.DevicePluginServicer):
    """The kubelet's calls for `resource`."""

    def __init__(self, resource: Resource, board: HealthBoard, setup: ContainerSetup) -> None:
        self.resource = resource
        self.board = board
        self.setup = setup

    def _devices(self) -> list[Any]:
        return [
            deviceplugin_pb.Device(ID=unit.id, health=self.board.health(unit.device))
            for unit in self.resource.units
        ]

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return OPTIONS

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        sent: list[Any] | None = None
        while True:
            change = self.board.next_change()
            devices = self._devices()
            if devices != sent:
                yield deviceplugin_pb.ListAndWatchResponse(devices=devices)
                sent = devices
            await change.wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        answers = []
        for wanted in request.container_requests:
            try:
                chosen = preferred(
                    self.resource.units,
                    available=self.resource.find(wanted.available_deviceIDs),
                    must=self.resource.find(wanted.must_include_deviceIDs),
                    size=wanted.allocation_size,
                    resource=self.resource.name,
                )
            except RequestError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            answers.append(
                deviceplugin_pb.ContainerPreferredAllocationResponse(
                    deviceIDs=[unit.id for unit in chosen]
                )
            )
        return deviceplugin_pb.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request: Any, context: Any) -> Any:
        answers = []
        for wanted in request.container_requests:
            try:
                answers.append(self.setup.response(self.resource, list(wanted.devices_ids)))
            except RequestError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return deviceplugin_pb.AllocateResponse(container_responses=answers)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return deviceplugin_pb.PreStartContainerResponse()  # not asked for (OPTIONS)
