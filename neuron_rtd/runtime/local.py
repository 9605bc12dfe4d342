"""The runtime in this process, on a private simulated machine: no daemon, no gRPC.

    with LocalRuntime() as rt:
        model = rt.load(neff_bytes, ninfer=4)
        outputs = rt.infer(model, {"x": array})          # in this thread (outputs.code)
        cookies = [rt.post(model, {"x": a}) for a in batch]  # pipelined on a worker pool
        results = [rt.wait(model, c) for c in cookies]

Used by the conformance runner and the benches; the daemon serves the same `Runtime`.
As a client of the daemon does, it honours `NEURON_RT_VISIBLE_CORES`: every NCG it makes
lies within those NeuronCores (machine-wide indices of its simulated machine).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from neuron_rtd.errors import ResourceNcError
from neuron_rtd.neff import Neff, input_array
from neuron_rtd.runtime.api import InferResult, ModelInfo, NcgInfo
from neuron_rtd.runtime.driver import DeviceApi, open_sim
from neuron_rtd.runtime.runtime import Runtime
from neuron_rtd.visible import visible_cores


class LocalRuntime:
    """A Runtime owning every device of a fresh simulated machine in a temp folder. Its
    NCs compute with `engine` (reference or fast; default fast: `NEURON_RTD_NC_ENGINE`
    is the daemon's); `wrap_device` puts a test's own device in front of each simulated one. Its
    NCGs lie within `NEURON_RT_VISIBLE_CORES` when that is set (read here: InvalidError
    when it is no list)."""

    def __init__(
        self,
        instance_type: str = "inf1.6xlarge",
        *,
        root: Path | None = None,
        engine: str | None = None,
        wrap_device: Callable[[DeviceApi], DeviceApi] | None = None,
    ) -> None:
        self.visible = visible_cores()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="nrt-local-")
            root = Path(self._tmp.name)
        devices = open_sim(
            root / "sim", instance_type, address="in-process", version="local", engine=engine
        )
        self.devices = [wrap_device(d) for d in devices] if wrap_device else list(devices)
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
        profile: bool = False,
    ) -> ModelInfo:
        """Load on NCG `ncg_id` (stopped), or on an NCG of its own (started)."""
        visible = self.visible.ncs if self.visible is not None else None
        with self._explained():
            return self.runtime.load(
                neff,
                ncg_id=ncg_id,
                timeout_s=timeout_s,
                ninfer=ninfer,
                profile=profile,
                visible=visible,
            )

    def create_ncg(self, nc_count: int = 0) -> NcgInfo:
        """A new NCG of `nc_count` NCs (0: the largest free run) for `load(ncg_id=...)`."""
        visible = self.visible.ncs if self.visible is not None else None
        with self._explained():
            return self.runtime.create_ncg(nc_count, visible=visible)

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """Not enough NeuronCores among the visible ones: said with the variable."""
        try:
            yield
        except ResourceNcError as exc:
            if self.visible is None:
                raise
            raise ResourceNcError(self.visible.explain(str(exc))) from None

    def infer(self, model: ModelInfo, inputs: Mapping[str, Any], *, cast: bool = False) -> Outputs:
        """Run `model` on numpy arrays in this thread; the outputs as arrays of their true
        shapes, with the inference's code. Inputs of another dtype or shape than the NEFF's
        are taken or refused (BadInput) as the client's `Model.infer` takes them; `cast`:
        numpy's unsafe cast instead."""
        return Outputs(self.runtime.infer(model.id, _checked(model, inputs, cast)))

    def post(self, model: ModelInfo, inputs: Mapping[str, Any], *, cast: bool = False) -> int:
        """Queue an inference (its inputs are copied in before this returns); a cookie."""
        return self.runtime.post(model.id, _checked(model, inputs, cast))

    def wait(self, model: ModelInfo, cookie: int) -> Outputs:
        """The outputs of a posted inference of `model`, once it has ended."""
        return Outputs(self.runtime.wait(cookie))

    def unload(self, model: ModelInfo) -> None:
        self.runtime.unload(model.id)


class Outputs(dict[str, np.ndarray]):
    """An inference's outputs by name (the runtime's `InferResult` arrays), and its `code`:
    OK, or INFER_COMPLETED_WITH_NUM_ERR when an output holds NaN/Inf."""

    def __init__(self, result: InferResult) -> None:
        super().__init__(result.outputs)
        self.code = result.code


def _checked(model: ModelInfo, inputs: Mapping[str, Any], cast: bool) -> dict[str, np.ndarray]:
    """The inputs as arrays of the model's dtypes and shapes, under the one dtype policy
    and shape check (`neuron_rtd.neff.casting.input_array`; unknown names kept, for the
    model to refuse); the runtime takes them from there (`Runtime.infer`)."""
    specs = {spec.name: spec for spec in model.neff.inputs}
    return {
        name: np.asarray(value)
        if (spec := specs.get(name)) is None
        else input_array(value, spec, cast=cast)
        for name, value in inputs.items()
    }
