"""The simulated Neuron kernel driver and hardware: the bottom layer of neuron-rtd.

`Machine.open(root)` finds (or builds) the sysfs-like state tree of a simulated inf1
machine; `Machine.devices()` reads it; `Machine.acquire(...)` owns devices, whose
NeuronCores run `NcProgram`s for real with numpy kernels.
"""

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
from driver_sim.turns import spend_waits_in, take_turn

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
    "spend_waits_in",
    "supported_ops",
    "take_turn",
]
