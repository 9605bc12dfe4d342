"""Our own service (`nrt.ext.nmgr_ext`): what this daemon is and what it serves."""

from __future__ import annotations

import os

import grpc

from neuron_rtd.proto import ext_pb, ext_pb_grpc
from neuron_rtd.runtime import Runtime


class ExtServicer(ext_pb_grpc.nmgr_extServicer):
    def __init__(self, runtime: Runtime, *, address: str, sim_root: str, instance_type: str):
        self.runtime = runtime
        self.address = address
        self.sim_root = sim_root
        self.instance_type = instance_type

    def describe(
        self, request: ext_pb.describe_request, context: grpc.ServicerContext
    ) -> ext_pb.describe_response:
        devices = [
            ext_pb.ext_device(
                index=device.index,
                bdf=device.bdf,
                nc_count=device.nc_count,
                memory_bytes=device.memory_bytes,
                memory_used=sum(device.memory_used),
            )
            for device in self.runtime.devices()
        ]
        return ext_pb.describe_response(
            runtime_version=self.runtime.version,
            pid=os.getpid(),
            address=self.address,
            sim_root=self.sim_root,
            instance_type=self.instance_type,
            devices=devices,
            start_time_ns=self.runtime.started_ns,
        )
