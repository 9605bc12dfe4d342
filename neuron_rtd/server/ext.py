"""Our own service (`nrt.ext.nmgr_ext`): what this daemon is and what it serves."""

from __future__ import annotations

import os

import grpc

from neuron_rtd.errors import NrtError
from neuron_rtd.proto import ext_pb, ext_pb_grpc
from neuron_rtd.runtime import Runtime
from neuron_rtd.server import wire


class ExtServicer(ext_pb_grpc.nmgr_extServicer):
    def __init__(self, runtime: Runtime, *, address: str, sim_root: str, instance_type: str):
        self.runtime = runtime
        self.address = address
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
                hw_counters=ext_pb.ext_hw_counters(
                    mem_ecc_corr=hw.mem_ecc_corr,
                    mem_ecc_uncorr=hw.mem_ecc_uncorr,
                    sram_ecc_corr=hw.sram_ecc_corr,
                    sram_ecc_uncorr=hw.sram_ecc_uncorr,
                    nc_errors=hw.nc_errors,
                    nc_hangs=hw.nc_hangs,
                    dma_timeouts=hw.dma_timeouts,
                    init_failures=hw.init_failures,
                ),
            )
        return response

    def snapshot(
        self, request: ext_pb.snapshot_request, context: grpc.ServicerContext
    ) -> ext_pb.snapshot_response:
        try:
            return wire.snapshot(self.runtime.snapshot())
        except NrtError as exc:
            return ext_pb.snapshot_response(status_code=int(exc.code), details=str(exc))

    def profile(
        self, request: ext_pb.profile_request, context: grpc.ServicerContext
    ) -> ext_pb.profile_response:
        try:
            return wire.profile(self.runtime.profile(request.model_id, request.last))
        except NrtError as exc:
            return ext_pb.profile_response(status_code=int(exc.code), details=str(exc))
