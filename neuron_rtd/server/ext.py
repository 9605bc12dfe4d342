"""Our own service (`nrt.ext.nmgr_ext`): what this daemon is and what it serves."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import grpc

from neuron_rtd.errors import NrtError
from neuron_rtd.proto import ext_pb, ext_pb_grpc
from neuron_rtd.runtime import Runtime, SessionId
from neuron_rtd.server import wire
from neuron_rtd.server.caller import presented_session


class ExtServicer(ext_pb_grpc.nmgr_extServicer):
    def __init__(
        self,
        runtime: Runtime,
        *,
        address: str,
        sim_root: str,
        instance_type: str,
        peer_socket: str = "",
    ):
        self.runtime = runtime
        self.address = address
        self.peer_socket = peer_socket
        self.sim_root = sim_root
        self.instance_type = instance_type

    def describe(
        self, request: ext_pb.describe_request, context: grpc.ServicerContext
    ) -> ext_pb.describe_response:
        response = ext_pb.describe_response(
            runtime_version=self.runtime.version,
            pid=os.getpid(),
            address=self.address,
            sim_root=self.sim_root,
            instance_type=self.instance_type,
            start_time_ns=self.runtime.started_ns,
            peer_socket=self.peer_socket,
        )
        try:  # the devices, while they answer (their init may be failing)
            devices = self.runtime.devices()
            counters = self.runtime.all_hw_counters()
        except NrtError as exc:
            response.status_code, response.details = int(exc.code), str(exc)
            return response
        for device, hw in zip(devices, counters, strict=True):
            response.devices.add(
                index=device.index,
                bdf=device.bdf,
                nc_count=device.nc_count,
                memory_bytes=device.memory_bytes,
                memory_used=sum(device.memory_used),
                hw_counters=wire.ext_hw_counters(hw),
            )
        return response

    def snapshot(
        self, request: ext_pb.snapshot_request, context: grpc.ServicerContext
    ) -> ext_pb.snapshot_response:
        return _answer(lambda: wire.snapshot(self.runtime.snapshot()), ext_pb.snapshot_response)

    def profile(
        self, request: ext_pb.profile_request, context: grpc.ServicerContext
    ) -> ext_pb.profile_response:
        def make() -> ext_pb.profile_response:
            session = presented_session(context)
            profile = self.runtime.profile(request.model_id, request.last, session=session)
            return wire.profile(profile)

        return _answer(make, ext_pb.profile_response)

    def create_ncg(
        self, request: ext_pb.create_ncg_request, context: grpc.ServicerContext
    ) -> ext_pb.create_ncg_response:
        def make() -> ext_pb.create_ncg_response:
            visible = frozenset(request.visible_ncs) if request.visible_ncs else None
            ncg = self.runtime.create_ncg(
                request.nc_count,
                session_id=SessionId(request.session_id),
                visible=visible,
                implicit=request.implicit,
            )
            return ext_pb.create_ncg_response(
                ncg_id=ncg.id, nc_count=ncg.nc_count, first_nc=self.runtime.machine_nc(ncg.start)
            )

        return _answer(make, ext_pb.create_ncg_response)


R = TypeVar("R")


def _answer(make: Callable[[], R], response: Callable[..., R]) -> R:
    """`make()`, or, when the runtime raises, the response carrying its nerr and message
    (our messages' `status_code` and `details`)."""
    try:
        return make()
    except NrtError as exc:
        return response(status_code=int(exc.code), details=str(exc))
