"""Devices written for tests, plugged in through the driver port (`DeviceApi`): each wraps
a simulated device and changes what its NCs' run functions do, never the driver itself."""

from __future__ import annotations

import threading
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


GATE_WAIT_S = 30.0  # a run held longer than this fails: a test that forgot to let it go


class GatedDevice(WrappedDevice):
    """Its NCs' runs say when they begin and, once `hold()` is called, wait there until
    the test lets them through (`let`, `open`): a test orders itself by the runs it has
    seen begin, never by a sleep. `failing`, while set, is raised by every run that is let
    through, in place of its work (the run's error, as the driver would raise it)."""

    def __init__(self, device: DeviceApi) -> None:
        super().__init__(device)
        self.begun: list[int] = []  # the NC of each run begun, in order
        self.failing: BaseException | None = None
        self._passes: int | None = None  # runs still let through; None: all of them
        self._cond = threading.Condition()

    def hold(self) -> None:
        """From now on each run waits where it begins until it is let through."""
        with self._cond:
            self._passes = 0

    def let(self, runs: int = 1) -> None:
        """Let `runs` more held runs through (the first to come, in no promised order)."""
        with self._cond:
            self._passes = (self._passes or 0) + runs
            self._cond.notify_all()

    def open(self) -> None:
        """Let every run through, now and from now on."""
        with self._cond:
            self._passes = None
            self._cond.notify_all()

    def wait_begun(self, count: int, timeout_s: float = GATE_WAIT_S) -> list[int]:
        """The NCs of the first `count` runs begun, once that many have; AssertionError
        if they have not within `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.begun) >= count, timeout_s):
                raise AssertionError(f"{len(self.begun)} run(s) began, not {count}")
            return self.begun[:count]

    def _pass(self, nc: int) -> None:
        with self._cond:
            self.begun.append(nc)
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._passes != 0, GATE_WAIT_S):
                raise AssertionError(f"a run on NC {nc} was never let through")
            if self._passes is not None:
                self._passes -= 1
            failing = self.failing
        if failing is not None:
            raise failing

    def wrap_run(self, nc: int, run: RunFn) -> RunFn:
        def gated(
            inputs: Mapping[str, Any],
            outputs: Mapping[str, Any],
            recorder: InstrRecorder | None = None,
        ) -> int:
            self._pass(nc)
            return run(inputs, outputs, recorder)

        return gated
