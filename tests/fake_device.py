"""Devices written for tests, plugged in through the driver port (`DeviceApi`): each wraps
a simulated device and changes what its NCs' run functions do, never the driver itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_rtd.neff import Stage, TensorSpec
from neuron_rtd.runtime import (
    DeviceApi,
    DeviceSpec,
    DramBufferApi,
    InstrRecorder,
    NcCounters,
    NeuronCoreApi,
    RunFn,
    SimDevice,
)


class WrappedCore:
    """An NC whose loaded programs run through `device.wrap_run`."""

    def __init__(self, device: WrappedDevice, core: NeuronCoreApi, index: int) -> None:
        self._device, self._core, self.index = device, core, index

    def load(self, program: Stage, inputs: Sequence[TensorSpec], *, profile: bool = False) -> RunFn:
        run = self._core.load(program, inputs, profile=profile)
        return run if profile else self._device.wrap_run(self.index, run)

    def seed(self, seed: int, stream: int) -> None:
        self._core.seed(seed, stream)

    def counters(self) -> NcCounters:
        return self._core.counters()


class WrappedDevice:
    """A simulated device seen through the port; subclasses override `wrap_run`."""

    def __init__(self, device: DeviceApi) -> None:
        assert isinstance(device, SimDevice)
        self._device = device
        self._cores = [WrappedCore(self, device.nc(i), i) for i in range(device.spec.nc_count)]

    def wrap_run(self, nc: int, run: RunFn) -> RunFn:
        return run

    @property
    def index(self) -> int:
        return self._device.index

    @property
    def bdf(self) -> str:
        return self._device.bdf

    @property
    def spec(self) -> DeviceSpec:
        return self._device.spec

    def reset(self) -> None:
        self._device.reset()

    def dram_alloc(self, channel: int, nbytes: int, *, tag: str = "") -> DramBufferApi:
        return self._device.dram_alloc(channel, nbytes, tag=tag)

    def dram_free(self, buf: DramBufferApi) -> None:
        self._device.dram_free(buf)

    def dram_used(self) -> tuple[int, ...]:
        return self._device.dram_used()

    def nc(self, i: int) -> WrappedCore:
        return self._cores[i]

    def hw_counters(self) -> Any:
        return self._device.hw_counters()

    def release(self) -> None:
        self._device.release()

    def inject(self, fault: str) -> None:
        self._device.inject(fault)


class OffByOneDevice(WrappedDevice):
    """Its NCs add 1 to every float output: wrong numbers, as a broken kernel gives."""

    def wrap_run(self, nc: int, run: RunFn) -> RunFn:
        def off_by_one(
            inputs: Mapping[str, Any],
            outputs: Mapping[str, Any],
            recorder: InstrRecorder | None = None,
        ) -> int:
            cycles = run(inputs, outputs, recorder)
            for value in outputs.values():
                if value.dtype.kind == "f":
                    value += 1
            return cycles

        return off_by_one
