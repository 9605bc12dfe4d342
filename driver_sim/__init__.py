"""The simulated Neuron kernel driver and hardware: the bottom layer of neuron-rtd.

`Machine.open(root)` finds (or builds) the sysfs-like state tree of a simulated inf1
machine; `Machine.devices()` reads it; `Machine.acquire(...)` owns devices, whose
NeuronCores run `NcProgram`s for real with numpy kernels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from driver_sim import fast
    from driver_sim.core import NeuronCore
    from driver_sim.cost import NC_CLOCK_HZ, Engine
    from driver_sim.device import Device
    from driver_sim.dram import DramBuffer
    from driver_sim.errors import (
        DeviceBusy,
        DeviceNotFound,
        DramExhausted,
        DriverError,
        HwFault,
        InitFailed,
        KernelError,
        MachineMismatch,
        NoMachine,
    )
    from driver_sim.execute import DynamicBuffer, InstrRecord, InstrRecorder, execute_program
    from driver_sim.faults import FaultSpec, parse_fault_spec
    from driver_sim.machine import DeviceListing, Machine
    from driver_sim.ops import KERNELS, Kernel, supported_ops
    from driver_sim.owner import OwnerInfo
    from driver_sim.presets import (
        CHANNEL_BYTES,
        DEFAULT_INSTANCE_TYPE,
        DRAM_CHANNELS,
        NC_PER_DEVICE,
        PRESETS,
        SIM_ROOT_ENV,
        InstancePreset,
        default_sim_root,
    )
    from driver_sim.program import Instr, LoadedProgram, NcProgram, load_program
    from driver_sim.stats import HealthCounters, NcCounters

# Each name and where it lives, imported when first asked for: a reader of the machine's
# tree (neuron-ls) does not import the NC's kernels, scipy and onnxruntime with it.
_WHERE = {
    "NeuronCore": "driver_sim.core",
    "NC_CLOCK_HZ": "driver_sim.cost",
    "Engine": "driver_sim.cost",
    "Device": "driver_sim.device",
    "DramBuffer": "driver_sim.dram",
    "DeviceBusy": "driver_sim.errors",
    "DeviceNotFound": "driver_sim.errors",
    "DramExhausted": "driver_sim.errors",
    "DriverError": "driver_sim.errors",
    "HwFault": "driver_sim.errors",
    "InitFailed": "driver_sim.errors",
    "KernelError": "driver_sim.errors",
    "MachineMismatch": "driver_sim.errors",
    "NoMachine": "driver_sim.errors",
    "DynamicBuffer": "driver_sim.execute",
    "InstrRecord": "driver_sim.execute",
    "InstrRecorder": "driver_sim.execute",
    "execute_program": "driver_sim.execute",
    "FaultSpec": "driver_sim.faults",
    "parse_fault_spec": "driver_sim.faults",
    "DeviceListing": "driver_sim.machine",
    "Machine": "driver_sim.machine",
    "KERNELS": "driver_sim.ops",
    "Kernel": "driver_sim.ops",
    "supported_ops": "driver_sim.ops",
    "OwnerInfo": "driver_sim.owner",
    "CHANNEL_BYTES": "driver_sim.presets",
    "DEFAULT_INSTANCE_TYPE": "driver_sim.presets",
    "DRAM_CHANNELS": "driver_sim.presets",
    "NC_PER_DEVICE": "driver_sim.presets",
    "PRESETS": "driver_sim.presets",
    "SIM_ROOT_ENV": "driver_sim.presets",
    "InstancePreset": "driver_sim.presets",
    "default_sim_root": "driver_sim.presets",
    "Instr": "driver_sim.program",
    "LoadedProgram": "driver_sim.program",
    "NcProgram": "driver_sim.program",
    "load_program": "driver_sim.program",
    "HealthCounters": "driver_sim.stats",
    "NcCounters": "driver_sim.stats",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:  # a submodule, or nothing
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = [
    "CHANNEL_BYTES",
    "DEFAULT_INSTANCE_TYPE",
    "DRAM_CHANNELS",
    "KERNELS",
    "NC_CLOCK_HZ",
    "NC_PER_DEVICE",
    "PRESETS",
    "SIM_ROOT_ENV",
    "Device",
    "DeviceBusy",
    "DeviceListing",
    "DeviceNotFound",
    "DramBuffer",
    "DramExhausted",
    "DriverError",
    "DynamicBuffer",
    "Engine",
    "FaultSpec",
    "HealthCounters",
    "HwFault",
    "InitFailed",
    "InstancePreset",
    "Instr",
    "InstrRecord",
    "InstrRecorder",
    "Kernel",
    "KernelError",
    "LoadedProgram",
    "Machine",
    "MachineMismatch",
    "NcCounters",
    "NcProgram",
    "NeuronCore",
    "NoMachine",
    "OwnerInfo",
    "default_sim_root",
    "execute_program",
    "fast",
    "load_program",
    "parse_fault_spec",
    "supported_ops",
]
