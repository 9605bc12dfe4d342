"""The driver port: the one way the runtime reaches a Neuron device, and its adapter to
the simulated driver (`driver_sim`), the only runtime module that imports it.

The runtime is handed devices that satisfy `DeviceApi`: an owned device with its spec,
reset, DRAM allocation, health counters, and NeuronCores (`NeuronCoreApi`) that load an
NC program (a NEFF `Stage`, its weights placed in DRAM) and give back a run function
(`RunFn`: given a recorder, a profiled run records each instruction in it as an
`InstrRecord`), and that are seeded and read. `SimDevice` adapts a `driver_sim.Device`; a
test plugs in its own device here (wrapping a `SimDevice`, say) instead of patching the
driver. Driver exceptions become runtime exceptions in one place, `driver_errors()`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psutil

import driver_sim
from neuron_rtd import onnxrt
from neuron_rtd.errors import HwError, InvalidError, NrtError, ResourceError
from neuron_rtd.neff import Stage, TensorSpec

# One NC instruction of a recorded (profiled) run, and what a recorded run hands them to.
InstrRecord = driver_sim.InstrRecord
InstrRecorder = driver_sim.InstrRecorder

# How a run takes the lock of what one run uses at a time (an NC, a shared-NC model): the
# runtime's compute gate's `take_turn`, which counts a wait for it as a wait.
TakeTurn = Callable[[threading.Lock], None]


class RunFn(Protocol):
    """A loaded program's run: (inputs, outputs) by tensor name -> the run's NC cycles.
    Given a `recorder`, the run records each instruction in it (timed one by one on the
    reference kernels, whatever the NC's engine)."""

    def __call__(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        recorder: InstrRecorder | None = None,
        /,
    ) -> int: ...


# A CPU node's run: the same, counting nothing.
HostFn = Callable[[Mapping[str, Any], Mapping[str, Any]], None]

DynamicBuffer = driver_sim.DynamicBuffer  # a tensor whose shape its producer decides


NC_CLOCK_HZ = driver_sim.NC_CLOCK_HZ  # the NC clock: simulated time is cycles / this


@dataclass(frozen=True)
class DeviceSpec:
    nc_count: int
    dram_channels: int
    channel_bytes: int

    @property
    def dram_bytes(self) -> int:
        return self.dram_channels * self.channel_bytes

    def channel_of(self, nc: int) -> int:
        """The DRAM channel next to NC `nc`."""
        return nc * self.dram_channels // self.nc_count


class DramBufferApi(Protocol):
    @property
    def nbytes(self) -> int: ...

    def view(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray: ...


# What an NC has counted since its device's last reset (the wire's fields, and its busy
# time and runs), and a device's health counters: the driver's records, declared once.
NcCounters = driver_sim.NcCounters
HealthCounters = driver_sim.HealthCounters


class NeuronCoreApi(Protocol):
    def load(self, program: Stage, inputs: Sequence[TensorSpec], *, profile: bool = False) -> RunFn:
        """Check `program` (its weights already in this device's DRAM, `inputs` the specs
        of its input tensors) and prepare it; what runs it on this NC. `profile`: its runs
        will be recorded, so it is prepared for the reference kernels only."""
        ...

    def seed(self, seed: int, stream: int) -> None: ...

    def counters(self) -> NcCounters: ...


class DeviceApi(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def bdf(self) -> str: ...
    @property
    def spec(self) -> DeviceSpec: ...

    def reset(self) -> None: ...

    def dram_alloc(self, channel: int, nbytes: int, *, tag: str = "") -> DramBufferApi: ...

    def dram_free(self, buf: DramBufferApi) -> None: ...

    def dram_used(self) -> tuple[int, ...]: ...

    def nc(self, i: int) -> NeuronCoreApi: ...

    def hw_counters(self) -> HealthCounters: ...

    def release(self) -> None: ...


class driver_errors:  # a class used as a function: `with driver_errors(context):`
    """Translate driver exceptions raised inside the block, prefixing `context`. Holds
    no state of a block, so one can be made once and entered by many threads."""

    def __init__(self, context: str) -> None:
        self.context = context

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or isinstance(exc, NrtError):
            return
        context = self.context
        if isinstance(exc, driver_sim.DramExhausted):
            raise ResourceError(f"{context}: {exc}") from exc
        if isinstance(exc, driver_sim.KernelError):
            raise InvalidError(f"{context}: {exc}") from exc
        if isinstance(exc, driver_sim.HwFault | driver_sim.InitFailed):
            raise HwError(f"{context}: {exc}") from exc
        if isinstance(exc, driver_sim.DriverError):
            raise NrtError(f"{context}: {exc}") from exc


# --- the simulated driver ---------------------------------------------------------------
NC_ENGINES = driver_sim.fast.ENGINES  # how an NC does its arithmetic (see driver_sim.fast)
DEFAULT_NC_ENGINE = "fast"


def nc_engine(name: str | None = None) -> str:
    """The NC engine: `name`, else fast; ValueError when it names none. (The daemon's
    config reads `NEURON_RTD_NC_ENGINE`; nothing here reads the environment.)"""
    return driver_sim.fast.check_engine(name or DEFAULT_NC_ENGINE)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (a systemd CPUAffinity=, a
    container's cpuset, taskset), not every CPU of the host."""
    return len(os.sched_getaffinity(0)) or 1


def available_memory() -> int:
    """The memory this process may still take: the host's available memory, or less when
    its cgroup has a limit (a unit's MemoryMax=, a container's), what is left of that."""
    available = psutil.virtual_memory().available
    left = _cgroup_memory_left()
    return available if left is None else max(0, min(available, left))


def _cgroup_memory_left(
    proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Its cgroup's memory limit less its usage (v2: memory.max, v1: memory.limit_in_bytes);
    None without a limit, or where none can be read."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            folder = root / path.lstrip("/")
            files = ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's
            folder = root / "memory" / path.lstrip("/")
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        try:
            limit, used = ((folder / name).read_text().strip() for name in files)
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 1 << 60 and used.isdigit():  # v1's "none": huge
            return int(limit) - int(used)
    return None


def nc_threads() -> int:
    """The threads one NC run of the fast engine may use: the usable cores (its pools
    spin only while they run, so NCs running at once share them)."""
    return usable_cpus()


SIM_SPEC = DeviceSpec(
    nc_count=driver_sim.NC_PER_DEVICE,
    dram_channels=driver_sim.DRAM_CHANNELS,
    channel_bytes=driver_sim.CHANNEL_BYTES,
)


def _nc_program(program: Stage, inputs: Sequence[TensorSpec] | None = None) -> driver_sim.NcProgram:
    return driver_sim.NcProgram(
        instructions=[
            driver_sim.Instr(i.op, tuple(i.inputs), tuple(i.outputs), i.attrs)
            for i in program.instructions
        ],
        weights=dict(program.weights),
        inputs=list(program.inputs),
        outputs=list(program.outputs),
        opset=program.opset,
        auto_cast=program.auto_cast,
        auto_cast_type=program.auto_cast_type,
        input_types=None if inputs is None else [(t.dtype, _fixed_dims(t)) for t in inputs],
    )


def _fixed_dims(spec: TensorSpec) -> tuple[int | None, ...]:
    """A program input's shape as the fast engine may fix it: None on an axis whose size
    a run decides (dynamic, or following a bucketed NEFF's symbol)."""
    symbols = spec.symbols or (None,) * len(spec.shape)
    return tuple(
        None if axis in spec.dynamic or symbols[axis] is not None else size
        for axis, size in enumerate(spec.shape)
    )


class SimCore:
    """An NC of a simulated device."""

    def __init__(self, core: driver_sim.NeuronCore) -> None:
        self._core = core

    def load(self, program: Stage, inputs: Sequence[TensorSpec], *, profile: bool = False) -> RunFn:
        loaded = self._core.load(_nc_program(program, inputs), reference=profile)
        return functools.partial(self._core.run, loaded)

    def seed(self, seed: int, stream: int) -> None:
        self._core.seed(seed, stream)

    def counters(self) -> NcCounters:
        return self._core.counters()


class SimDevice:
    """A simulated device this process owns."""

    spec = SIM_SPEC

    def __init__(self, device: driver_sim.Device) -> None:
        self._device = device
        self._cores = [SimCore(device.nc(i)) for i in range(SIM_SPEC.nc_count)]

    @property
    def index(self) -> int:
        return self._device.index

    @property
    def bdf(self) -> str:
        return self._device.bdf

    def reset(self) -> None:
        self._device.reset()

    def dram_alloc(self, channel: int, nbytes: int, *, tag: str = "") -> driver_sim.DramBuffer:
        return self._device.dram_alloc(channel, nbytes, tag=tag)

    def dram_free(self, buf: DramBufferApi) -> None:
        assert isinstance(buf, driver_sim.DramBuffer)
        self._device.dram_free(buf)

    def dram_used(self) -> tuple[int, int]:
        return self._device.dram_used()

    def nc(self, i: int) -> SimCore:
        return self._cores[i]

    def hw_counters(self) -> HealthCounters:
        return self._device.hw_counters()

    def release(self) -> None:
        self._device.release()

    def inject(self, fault: str) -> None:
        """Inject a fault (`driver_sim.FaultSpec` syntax): the simulator's test lever."""
        self._device.inject(fault)


def open_sim(
    root: Path, instance_type: str, *, address: str, version: str, engine: str | None = None
) -> list[SimDevice]:
    """Own every device of the simulated machine at `root` (made if missing)."""
    machine = driver_sim.Machine.open(root, instance_type=instance_type)
    return acquire_sim(
        machine, range(machine.device_count), address=address, version=version, engine=engine
    )


def acquire_sim(
    machine: driver_sim.Machine,
    indices: Sequence[int],
    *,
    address: str,
    version: str,
    engine: str | None = None,
    spinning: str = onnxrt.WHILE_BUSY,
    faults: str = "",
    take_turn: TakeTurn | None = None,
) -> list[SimDevice]:
    """Own devices `indices` of a simulated machine (DriverError names an owner); their
    NCs compute with `engine` (see `nc_engine`), the fast engine's threads waiting for
    work as `spinning` says (see neuron_rtd.onnxrt: spinning between the ops of a run and
    a millisecond after it, then asleep, unless it says otherwise; the benches measure
    each way), with `faults` injected (driver_sim.faults' syntax; ValueError if malformed),
    a run at a busy NC waiting its turn by `take_turn` (the runtime's compute gate's)."""
    devices = machine.acquire(
        indices,
        address=address,
        version=version,
        engine=nc_engine(engine),
        threads=nc_threads(),
        spinning=onnxrt.check_spinning(spinning),
        faults=faults,
        take_turn=take_turn,
    )
    return [SimDevice(d) for d in devices]


def host_program(what: str, program: Stage) -> HostFn:
    """A CPU node (`what`) made of NC instructions, run with the NC's kernels on the host."""
    with driver_errors(what):
        loaded = driver_sim.load_program(f"host ({what})", _nc_program(program))

    def run(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        driver_sim.execute_program(loaded, inputs, outputs)

    return run
