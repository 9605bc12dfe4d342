"""The runtime in this process, on a private simulated machine: no daemon, no gRPC.

    with LocalRuntime() as rt:
        model = rt.load(neff_bytes)
        outputs = rt.infer(model, {"x": array})

Used by the conformance runner and the benches; the daemon serves the same `Runtime`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import driver_sim
from neuron_rtd.neff import Neff, read_neff
from neuron_rtd.runtime.model import Model, ModelParams
from neuron_rtd.runtime.runtime import Runtime


class LocalRuntime:
    """A Runtime owning every device of a fresh simulated machine in a temp folder."""

    def __init__(self, instance_type: str = "inf1.6xlarge", *, root: Path | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="nrt-local-")
            root = Path(self._tmp.name)
        base = root
        self.machine = driver_sim.Machine.open(base / "sim", instance_type=instance_type)
        self.devices = self.machine.acquire(
            range(self.machine.device_count), address="in-process", version="local"
        )
        self.runtime = Runtime(self.devices)
        self.runtime.init_devices()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.runtime.close()
        for device in self.devices:
            device.release()
        if self._tmp is not None:
            self._tmp.cleanup()

    def load(
        self,
        neff: bytes | Neff,
        *,
        ninfer: int = 1,
        timeout_s: float = 60.0,
        ncg_id: int | None = None,
    ) -> Model:
        parsed = read_neff(neff) if isinstance(neff, bytes | bytearray | memoryview) else neff
        params = ModelParams(timeout_s=timeout_s, ninfer=ninfer)
        return self.runtime.load(parsed, ncg_id=ncg_id, params=params)

    def infer(self, model: Model, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run `model` on numpy arrays; the outputs as arrays of their true shapes."""
        raw = {}
        for spec in model.neff.inputs:
            if spec.name in inputs:
                raw[spec.name] = np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype)
        for name in inputs:
            if name not in raw:
                raw[name] = np.ascontiguousarray(inputs[name])
        result = self.runtime.infer(model.id, raw)
        return {t.name: t.array_from(result.outputs[t.name]) for t in model.neff.outputs}

    def unload(self, model: Model) -> None:
        self.runtime.unload(model.id)
