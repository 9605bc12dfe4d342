"""A model's life on the runtime's face: its NEFF admitted and loaded (on an NCG given,
or one made for it), started, stopped, unloaded, and its kept profiles. `Runtime` answers
these calls through `ModelCalls`, with its tables (declared below, made by
`Runtime.__init__`) and under its control-plane lock.
"""

from __future__ import annotations

import logging
import threading
import time

from neuron_rtd.errors import HwError, InvalidError
from neuron_rtd.neff import Neff
from neuron_rtd.runtime.admission import NeffAdmission, NeffSource
from neuron_rtd.runtime.api import ModelInfo, RuntimeOptions
from neuron_rtd.runtime.model import ModelParams, ModelState
from neuron_rtd.runtime.model_table import ModelTable
from neuron_rtd.runtime.ncg import NcgTable
from neuron_rtd.runtime.profile import ModelProfile, model_profile
from neuron_rtd.runtime.sessions import (
    NO_SESSION,
    SessionId,
    SessionTable,
    check_models_quota,
    session_name,
)
from neuron_rtd.runtime.stats import Metric, Stats

log = logging.getLogger("nrtd.NMGR")


class ModelCalls:
    """The model calls of `Runtime` (its base: the attributes and checks below are its)."""

    options: RuntimeOptions
    _lock: threading.RLock
    _admission: NeffAdmission
    _models: ModelTable
    _ncgs: NcgTable
    _sessions: SessionTable
    _stats: Stats

    def ensure_ready(self) -> None:
        raise NotImplementedError

    def _refuse_if_stopping(self) -> None:
        raise NotImplementedError

    def _check_ncs_quota(self, session_id: SessionId, more: int) -> None:
        raise NotImplementedError

    def profile(
        self, model_id: int, last: int = 0, *, session: SessionId | None = None
    ) -> ModelProfile:
        """The per-op profiles a model loaded with `enable_node_profiling` kept of its
        last inferences (the `last` most recent, 0: all kept), oldest first. A model of a
        session tells them only to a call that presents that session (`session`)."""
        model = self._models[model_id]
        if model.session_id != NO_SESSION and self._sessions.presented(session) != model.session_id:
            raise InvalidError(
                f"model {model_id} belongs to {session_name(model.session_id)}: its profile "
                "is told only to calls that present the session (gRPC metadata "
                "nrt-session-id)"
            )
        return model_profile(model.id, model.name, model.profiler, last)

    def params(
        self, *, timeout_s: float | None = None, ninfer: int | None = None, profile: bool = False
    ) -> ModelParams:
        return self.options.model_params(timeout_s=timeout_s, ninfer=ninfer, profile=profile)

    def neff_buffer(self, size: int) -> memoryview:
        """A buffer for a NEFF of `size` bytes a client sends, admitted and reserved until
        its load is over (see `admission`)."""
        self.ensure_ready()
        return self._admission.buffer(size)

    def load(
        self,
        neff: NeffSource,
        *,
        ncg_id: int | None = None,
        timeout_s: float | None = None,
        ninfer: int | None = None,
        session_id: SessionId = NO_SESSION,
        profile: bool = False,
        visible: frozenset[int] | None = None,
    ) -> ModelInfo:
        """Load `neff` (parsed, its bytes, or an absolute file path): on NCG `ncg_id`
        (stopped, unless the NCG was made implicit for it), or on a new NCG of just enough
        NCs (started) when `ncg_id` is None,
        among the NCs `visible` when given (as `create_ncg`).
        `profile` (enable_node_profiling): its inferences record each op (`profile`)."""
        self._refuse_if_stopping()
        self.ensure_ready()
        parsed: Neff | None = None
        try:
            parsed = self._admission.read(neff)
            return self._load(parsed, ncg_id, timeout_s, ninfer, session_id, profile, visible)
        finally:
            if parsed is not None:
                self._admission.settle(parsed.buffer)
            elif isinstance(neff, memoryview):
                self._admission.settle(neff)

    def _load(
        self,
        parsed: Neff,
        ncg_id: int | None,
        timeout_s: float | None,
        ninfer: int | None,
        session_id: SessionId,
        profile: bool,
        visible: frozenset[int] | None,
    ) -> ModelInfo:
        params = self.params(timeout_s=timeout_s, ninfer=ninfer, profile=profile)
        began = time.monotonic()
        with self._lock:
            self._sessions.check(session_id)
            held = self._models.held_by(session_id)
            check_models_quota(session_id, held, self.options.session_max_models)
            implicit = ncg_id is None
            if ncg_id is None:
                self._check_ncs_quota(session_id, max(parsed.nc_count, 1))
                ncg = self._ncgs.create(
                    max(parsed.nc_count, 1), session_id=session_id, implicit=True, visible=visible
                )
            else:
                ncg = self._ncgs.to_load_into(ncg_id, self.options.model_cache_count)
            try:
                model = self._models.add(parsed, ncg, params, session_id)
            except BaseException:
                if implicit:
                    self._ncgs.destroy(ncg.id)
                raise
            self._stats.model_loaded(model, time.monotonic() - began)
            log.info(
                "Loaded model %d '%s' on NCG %d (%s mode, NCs %s, %d bytes of DRAM, ninfer %d)",
                model.id,
                model.name,
                ncg.id,
                model.mode.value,
                ",".join(map(str, model.vncs)) or "none",
                model.dram_bytes,
                params.ninfer,
                extra={"fn": "load"},
            )
            if ncg.implicit:  # made by this load, or for the model (create_ncg implicit)
                self.start(model.id)
            return ModelInfo.of(model)

    def start(self, model_id: int) -> None:
        """Start a model (the others of its NCG go STANDBY). A model that failed on a
        hardware error is started through its devices' reset (`ModelTable.start`)."""
        self.ensure_ready()
        began = time.monotonic()
        with self._lock:
            model = self._models[model_id]
            if model.state is ModelState.READY:
                return
            model = self._models.start(model)
            if model.state is ModelState.FAILED:
                raise HwError(f"model {model_id} cannot start: {model.failure}")
        self._stats.model_event(Metric.MODEL_START_LATENCY, time.monotonic() - began)
        log.info("Started model %d", model_id, extra={"fn": "start"})

    def stop(self, model_id: int) -> None:
        """Stop a model: inferences not yet ended end with NERR_INFER_CANCELLED."""
        self.ensure_ready()
        began = time.monotonic()
        with self._lock:
            model = self._models[model_id]
            model.set_state(ModelState.STANDBY)
        cancelled = model.cancel("the model was stopped")
        self._stats.model_event(Metric.MODEL_STOP_LATENCY, time.monotonic() - began)
        log.info(
            "Stopped model %d%s",
            model_id,
            f" ({cancelled} inference(s) cancelled)" if cancelled else "",
            extra={"fn": "stop"},
        )

    def unload(self, model_id: int) -> None:
        self.ensure_ready()
        self._unload(model_id)

    def _unload(self, model_id: int) -> None:
        began = time.monotonic()
        with self._lock:
            model, ncg = self._models.remove(model_id)
        if not self._models.let_go(model, "the model was unloaded"):
            log.warning(
                "Model %d still busy at unload; freeing it anyway", model_id, extra={"fn": "unload"}
            )
        with self._lock:
            if ncg.implicit and not ncg.models:
                self._ncgs.destroy(ncg.id)
        self._stats.model_event(Metric.MODEL_UNLOAD_LATENCY, time.monotonic() - began)
        log.info("Unloaded model %d", model_id, extra={"fn": "unload"})

    def unload_all(self) -> None:
        """Unload every model and destroy every NCG."""
        self.ensure_ready()
        self._unload_all()

    def _unload_all(self) -> None:
        with self._lock:
            for model in list(self._models):
                self._unload(model.id)
            for ncg in self._ncgs.list():
                self._ncgs.destroy(ncg.id)
        log.info("Unloaded all models and destroyed all NCGs", extra={"fn": "unload_all"})
