"""The loaded models, beside the NCG table: by id (counting up from FIRST_MODEL_ID), and
what happens to one over its life on the devices: built (placed on its NCG's NCs and
DRAM, wired to the host pool and the counters), started (the one READY model of its NCG),
let go (what it runs or holds ended, its DRAM given back: at unload, or a device reset),
and recovered after a hardware error (its devices reset, their models loaded again). The
runtime calls these under its lock; what a session may hold, and the NCGs a load makes,
are the runtime's."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence

from neuron_rtd.errors import InvalidHandle, NrtError
from neuron_rtd.neff import Neff
from neuron_rtd.runtime.compute import ComputeGate
from neuron_rtd.runtime.driver import DeviceApi, driver_errors
from neuron_rtd.runtime.host import HostPool
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.loader import build_model
from neuron_rtd.runtime.model import LoadedModel, ModelParams, ModelState
from neuron_rtd.runtime.ncg import Ncg, NcgTable
from neuron_rtd.runtime.sessions import SessionId
from neuron_rtd.runtime.stats import Stats

log = logging.getLogger("nrtd.NMGR")

FIRST_MODEL_ID = 10001


class ModelTable:
    def __init__(
        self,
        devices: Sequence[DeviceApi],
        ncgs: NcgTable,
        inflight: Inflight,
        stats: Stats,
        host_pool: HostPool,
        compute_gate: ComputeGate,
    ) -> None:
        self._devices = devices
        self._ncgs = ncgs
        self._inflight = inflight
        self._stats = stats
        self._host_pool = host_pool
        self._compute_gate = compute_gate
        self._models: dict[int, LoadedModel] = {}
        self._ids = itertools.count(FIRST_MODEL_ID)

    def __getitem__(self, model_id: int) -> LoadedModel:
        try:
            return self._models[model_id]
        except KeyError:
            raise InvalidHandle(f"model {model_id} is not loaded") from None

    def __iter__(self) -> Iterator[LoadedModel]:
        """The models, by id."""
        return iter(sorted(self._models.values(), key=lambda m: m.id))

    def held_by(self, session_id: SessionId) -> int:
        return sum(m.session_id == session_id for m in self._models.values())

    def add(self, neff: Neff, ncg: Ncg, params: ModelParams, session_id: SessionId) -> LoadedModel:
        """`neff` built on `ncg` as a new model, stopped, in the table and on its NCG."""
        model = self._build(next(self._ids), neff, ncg, params, session_id)
        ncg.models.append(model.id)
        self._models[model.id] = model
        return model

    def start(self, model: LoadedModel) -> LoadedModel:
        """`model` READY (the others of its NCG STANDBY); a FAILED one through its
        devices' reset (`_recover`): the model as it is now (FAILED if that failed)."""
        if model.state is ModelState.FAILED:
            model = self._recover(model)
            if model.state is ModelState.FAILED:
                return model
        for other_id in self._ncgs.get(model.ncg_id).models:
            other = self._models[other_id]
            if other is not model and other.state is ModelState.READY:
                other.set_state(ModelState.STANDBY)
                other.cancel(f"model {model.id} was started on NCG {model.ncg_id}")
                log.info("Model %d is now STANDBY", other.id, extra={"fn": "start"})
        model.set_state(ModelState.READY)
        return model

    def remove(self, model_id: int) -> tuple[LoadedModel, Ncg]:
        """Take a model out of the table and off its NCG (UNLOADING): the model and its
        NCG; `let_go` ends what it holds."""
        model = self._models.pop(model_id, None)
        if model is None:
            raise InvalidHandle(f"model {model_id} is not loaded")
        model.set_state(ModelState.UNLOADING)
        self._stats.model_gone(model_id)
        ncg = self._ncgs.get(model.ncg_id)
        ncg.models.remove(model_id)
        return model, ncg

    def _build(
        self, model_id: int, neff: Neff, ncg: Ncg, params: ModelParams, session_id: SessionId
    ) -> LoadedModel:
        """`neff` placed on `ncg` as model `model_id`, wired to the runtime's host pool
        and counters (a load, or a reload after a reset)."""
        model = build_model(
            model_id=model_id,
            neff=neff,
            ncg=ncg,
            ncgs=self._ncgs,
            devices=self._devices,
            params=params,
            session_id=session_id,
            host_threads=self._host_pool.threads,
        )
        model.host_pool = self._host_pool
        model.compute_gate = self._compute_gate
        model.observer = self._stats
        self._stats.model_built(model_id)
        return model

    def let_go(self, model: LoadedModel, why: str) -> bool:
        """End what `model` runs or holds (NERR_INFER_CANCELLED, `why`), keep only the
        answers of its cookies, and give its DRAM back (unload, or a device reset). False
        if something was still busy when it gave up waiting."""
        idle = model.drop_all(why, model.params.timeout_s + 1)
        self._inflight.forget(model)
        for device, buf in reversed(model.dram):
            device.dram_free(buf)
        model.dram = []  # given back: not again, whatever comes next
        return idle

    def _recover(self, failed: LoadedModel) -> LoadedModel:
        """The reset path after a hardware error (under the runtime's lock): every model
        with an NC on the failed model's devices is stopped (what it runs or holds ends
        NERR_INFER_CANCELLED) and gives its DRAM back, those devices are reset, and each
        such model is loaded again from its NEFF on its NCG, in the state it had (the
        failed one and any other failed one: STANDBY, for `start`). A model that cannot
        be loaded again stays FAILED. Models on other devices serve on throughout. The
        failed model as it is now."""
        slots = {self._ncgs.locate(vnc).device_slot for vnc in failed.vncs}
        hit = [
            m
            for m in self._models.values()
            if any(self._ncgs.locate(vnc).device_slot in slots for vnc in m.vncs)
        ]
        log.warning(
            "Resetting device(s) %s after a hardware error on model %d: reloading model(s) %s",
            ", ".join(self._devices[i].bdf for i in sorted(slots)),
            failed.id,
            ", ".join(str(m.id) for m in hit),
            extra={"fn": "start"},
        )
        states = {m.id: m.state for m in hit}
        for model in hit:
            model.set_state(ModelState.STANDBY)
            self.let_go(model, "its device was reset after a hardware error")
        try:
            with driver_errors("device reset"):
                for i in sorted(slots):
                    self._devices[i].reset()
        except NrtError as exc:
            for model in hit:
                model.set_state(ModelState.FAILED, str(exc))
            raise
        for old in hit:
            try:
                ncg = self._ncgs.get(old.ncg_id)
                model = self._build(old.id, old.neff, ncg, old.params, old.session_id)
            except NrtError as exc:
                old.set_state(ModelState.FAILED, f"not loaded again after a reset: {exc}")
                log.error("Model %d: %s", old.id, old.failure, extra={"fn": "start"})
                continue
            if states[old.id] is ModelState.READY:
                model.set_state(ModelState.READY)
            self._models[old.id] = model
        return self._models[failed.id]
