"""The runtime core: NCGs, the model DB, load/start/stop/unload and inference.

Transport-free: the gRPC server is a thin adapter over `Runtime`, and in-process callers
use it directly. Control-plane calls serialize on one lock; inference takes no global lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_rtd import __version__
from neuron_rtd.errors import HwError, InvalidError, InvalidHandle, NrtError, ResourceError
from neuron_rtd.neff import Neff
from neuron_rtd.runtime.driver import DeviceApi, driver_errors
from neuron_rtd.runtime.host import host_threads
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.loader import build_model
from neuron_rtd.runtime.model import InferResult, Model, ModelParams, ModelState
from neuron_rtd.runtime.ncg import Ncg, NcgTable
from neuron_rtd.runtime.stats import Metric, Stats

log = logging.getLogger("nrtd.NMGR")

FIRST_MODEL_ID = 10001
INIT_RETRY_INTERVAL_S = 1.0


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    default_timeout_s: float = 2.0
    default_ninfer: int = 4
    max_ninfer: int = 256
    ncs_per_device: int = 4
    models_per_ncg: int = 4  # models one NCG may hold (one READY, the rest STANDBY); 0: any
    host_workers: int = 0  # CPU nodes running at once, all models (0: the host's CPUs)
    cookie_ttl_s: float = 60.0  # an ended inference nobody waits for is dropped after this


def parse_version(text: str) -> tuple[int, int]:
    major, minor, *_ = (int(p) for p in text.split(".")[:2])
    return major, minor


class Runtime:
    def __init__(
        self, devices: Sequence[DeviceApi], *, options: RuntimeOptions | None = None
    ) -> None:
        self.devices = list(devices)
        self.options = options or RuntimeOptions()
        self.ncgs = NcgTable(len(self.devices), self.options.ncs_per_device)
        self.version = __version__
        self._models: dict[int, Model] = {}
        self._model_ids = itertools.count(FIRST_MODEL_ID)
        self._lock = threading.RLock()
        self._init_error: str | None = None
        self._init_tried = 0.0
        self.started_ns = time.time_ns()
        self.inflight = Inflight(ttl_s=self.options.cookie_ttl_s)
        self.stats = Stats()
        logging.getLogger("nrtd").addHandler(self.stats.logs)
        self.host_pool = threading.BoundedSemaphore(self.options.host_workers or host_threads())
        self.transfer_adjustment = 0
        # Session ids start from the time in microseconds, so that ids from before a
        # restart do not name a session of this run.
        self._session_ids = itertools.count(time.time_ns() // 1000)
        self._sessions: set[int] = set()

    # --- devices -------------------------------------------------------------------
    def init_devices(self) -> None:
        """Reset and initialize every device; a failure leaves the runtime answering
        NERR_HW_ERROR (retrying the init at most once a second) until one succeeds."""
        self._init_tried = time.monotonic()
        try:
            with driver_errors("device init"):
                for device in self.devices:
                    device.reset()
        except NrtError as exc:
            self._init_error = str(exc)
            log.error("%s", exc, extra={"fn": "init_devices"})
            return
        self._init_error = None

    def ensure_ready(self) -> None:
        if self._init_error is None:
            return
        with self._lock:
            if (
                self._init_error is not None
                and time.monotonic() - self._init_tried >= INIT_RETRY_INTERVAL_S
            ):
                self.init_devices()
            if self._init_error is not None:
                raise HwError(f"devices are not initialized: {self._init_error}")

    # --- sessions ------------------------------------------------------------------
    def open_session(self) -> int:
        with self._lock:
            session_id = next(self._session_ids)
            self._sessions.add(session_id)
        return session_id

    def close_session(self, session_id: int) -> None:
        """Forget an ended session (before its resources are released, so that nothing
        new is tied to it meanwhile)."""
        with self._lock:
            self._sessions.discard(session_id)

    def check_session(self, session_id: int) -> None:
        """InvalidError unless `session_id` is 0 (no session) or an open session."""
        if session_id and session_id not in self._sessions:
            raise InvalidError(
                f"session {session_id} is not open (its session_monitor stream ended, or "
                "it was opened with another daemon); use 0 for no session"
            )

    # --- NCGs ----------------------------------------------------------------------
    def create_ncg(self, nc_count: int, *, session_id: int = 0) -> Ncg:
        self.ensure_ready()
        self.check_session(session_id)
        ncg = self.ncgs.create(nc_count, session_id=session_id)
        log.info(
            "Created NCG %d: %d NC(s) from vnc %d",
            ncg.id,
            ncg.nc_count,
            ncg.start,
            extra={"fn": "create_eg"},
        )
        return ncg

    def destroy_ncg(self, ncg_id: int) -> None:
        self.ensure_ready()
        with self._lock:
            ncg = self.ncgs.get(ncg_id)
            if ncg.implicit:
                raise InvalidError(
                    f"NCG {ncg_id} was made for model(s) {ncg.models} and goes with them: "
                    "unload the model instead"
                )
            self.ncgs.destroy(ncg_id)
        log.info("Destroyed NCG %d", ncg_id, extra={"fn": "destroy_eg"})

    def list_ncgs(self) -> list[Ncg]:
        return self.ncgs.list()

    # --- models --------------------------------------------------------------------
    def model(self, model_id: int) -> Model:
        try:
            return self._models[model_id]
        except KeyError:
            raise InvalidHandle(f"model {model_id} is not loaded") from None

    def models(self) -> list[Model]:
        with self._lock:
            return sorted(self._models.values(), key=lambda m: m.id)

    def params(self, *, timeout_s: float | None = None, ninfer: int | None = None) -> ModelParams:
        timeout = self.options.default_timeout_s if timeout_s is None else timeout_s
        depth = self.options.default_ninfer if ninfer is None else ninfer
        if timeout <= 0:
            raise InvalidError(f"model timeout must be at least 1 s, got {timeout_s}")
        if not 1 <= depth <= self.options.max_ninfer:
            raise InvalidError(
                f"ninfer must be between 1 and {self.options.max_ninfer}, got {depth}"
            )
        return ModelParams(timeout_s=float(timeout), ninfer=depth)

    def load(
        self,
        neff: Neff,
        *,
        ncg_id: int | None = None,
        params: ModelParams | None = None,
        session_id: int = 0,
    ) -> Model:
        """Load `neff`: on NCG `ncg_id` (stopped), or on a new NCG of just enough NCs
        (started) when `ncg_id` is None."""
        self.ensure_ready()
        params = params or self.params()
        began = time.monotonic()
        with self._lock:
            self.check_session(session_id)
            implicit = ncg_id is None
            if ncg_id is None:
                ncg = self.ncgs.create(max(neff.nc_count, 1), session_id=session_id, implicit=True)
            else:
                ncg = self.ncgs.get(ncg_id)
                limit = self.options.models_per_ncg
                if limit and len(ncg.models) >= limit:
                    raise ResourceError(
                        f"NCG {ncg.id} already holds {len(ncg.models)} models, the most an NCG "
                        f"may hold (model_cache_count {limit}): unload one first"
                    )
            try:
                model = build_model(
                    model_id=next(self._model_ids),
                    neff=neff,
                    ncg=ncg,
                    ncgs=self.ncgs,
                    devices=self.devices,
                    params=params,
                    session_id=session_id,
                )
            except BaseException:
                if implicit:
                    self.ncgs.destroy(ncg.id)
                raise
            model.host_pool = self.host_pool
            model.observer = self.stats
            ncg.models.append(model.id)
            self._models[model.id] = model
            self.stats.model_loaded(model, time.monotonic() - began)
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
            if implicit:
                self.start(model.id)
            return model

    def start(self, model_id: int) -> None:
        self.ensure_ready()
        began = time.monotonic()
        with self._lock:
            model = self.model(model_id)
            if model.state is ModelState.READY:
                return
            for other_id in self.ncgs.get(model.ncg_id).models:
                other = self._models[other_id]
                if other is not model and other.state is ModelState.READY:
                    other.set_state(ModelState.STANDBY)
                    other.cancel(f"model {model_id} was started on NCG {model.ncg_id}")
                    log.info("Model %d is now STANDBY", other.id, extra={"fn": "start"})
            model.set_state(ModelState.READY)
        self.stats.model_event(Metric.MODEL_START_LATENCY, time.monotonic() - began)
        log.info("Started model %d", model_id, extra={"fn": "start"})

    def stop(self, model_id: int) -> None:
        """Stop a model: inferences not yet ended end with NERR_INFER_CANCELLED."""
        self.ensure_ready()
        began = time.monotonic()
        with self._lock:
            model = self.model(model_id)
            model.set_state(ModelState.STANDBY)
        cancelled = model.cancel("the model was stopped")
        self.stats.model_event(Metric.MODEL_STOP_LATENCY, time.monotonic() - began)
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
            model = self._models.pop(model_id, None)
            if model is None:
                raise InvalidHandle(f"model {model_id} is not loaded")
            model.set_state(ModelState.UNLOADING)
            ncg = self.ncgs.get(model.ncg_id)
            ncg.models.remove(model_id)
        if not model.drop_all("the model was unloaded", model.params.timeout_s + 1):
            log.warning(
                "Model %d still busy at unload; freeing it anyway", model_id, extra={"fn": "unload"}
            )
        for device, buf in reversed(model.dram):
            device.dram_free(buf)
        with self._lock:
            if ncg.implicit and not ncg.models:
                self.ncgs.destroy(ncg.id)
        self.stats.model_event(Metric.MODEL_UNLOAD_LATENCY, time.monotonic() - began)
        log.info("Unloaded model %d", model_id, extra={"fn": "unload"})

    def unload_all(self) -> None:
        """Unload every model and destroy every NCG."""
        with self._lock:
            for model in self.models():
                self._unload(model.id)
            for ncg in self.ncgs.list():
                self.ncgs.destroy(ncg.id)
        log.info("Unloaded all models and destroyed all NCGs", extra={"fn": "unload_all"})

    def release_session(self, session_id: int) -> tuple[list[int], list[int]]:
        """Unload the models of session `session_id` (and any model on its NCGs) and
        destroy its NCGs: what a client that went away leaves. The model and NCG ids."""
        with self._lock:
            ncgs = [ncg for ncg in self.ncgs.list() if ncg.session_id == session_id]
            on_them = {m for ncg in ncgs for m in ncg.models}
            models = [m.id for m in self.models() if m.session_id == session_id or m.id in on_them]
            for model_id in models:
                self._unload(model_id)
            remaining = {ncg.id for ncg in self.ncgs.list()}  # unloading took the implicit ones
            for ncg in ncgs:
                if ncg.id in remaining:
                    self.ncgs.destroy(ncg.id)
        return models, [ncg.id for ncg in ncgs]

    # --- counters ------------------------------------------------------------------
    def nc_counters(self, vnc: int) -> Any:
        """The counters of virtual NC `vnc` since the devices were initialized."""
        self.ensure_ready()
        if not 0 <= vnc < self.ncgs.total_ncs:
            raise InvalidError(
                f"no virtual NC {vnc}: this runtime has {self.ncgs.total_ncs} "
                f"(0..{self.ncgs.total_ncs - 1})"
            )
        loc = self.ncgs.locate(vnc)
        with driver_errors(f"counters of NC {vnc}"):
            return self.devices[loc.device_slot].nc(loc.nc).counters()

    def device(self, *, bdf: str | None = None, index: int | None = None) -> DeviceApi:
        """One of this runtime's devices, by PCI BDF or by its device index."""
        for device in self.devices:
            if (bdf is not None and device.bdf == bdf) or (
                index is not None and device.index == index
            ):
                return device
        owned = ", ".join(f"{d.index} ({d.bdf})" for d in self.devices)
        wanted = f"BDF {bdf}" if bdf is not None else f"index {index}"
        raise InvalidError(f"no device with {wanted} in this runtime; it owns {owned}")

    # --- inference -----------------------------------------------------------------
    def infer(self, model_id: int, inputs: Mapping[str, Any]) -> InferResult:
        """One inference, in this thread; inputs as bytes-like objects by name."""
        self.ensure_ready()
        return self.model(model_id).infer(inputs)

    def post(self, model_id: int, inputs: Mapping[str, Any], extra: Any = None) -> int:
        """Queue an inference; its cookie (see `Inflight`)."""
        self.ensure_ready()
        return self.inflight.post(self.model(model_id), inputs, extra)

    def wait(self, cookie: int) -> InferResult:
        """The result of a posted inference, once it has ended; the cookie is spent."""
        posted = self.inflight.wait(cookie)
        with posted.model.answer(posted.job) as outputs:
            data = {name: value.tobytes() for name, value in outputs.items()}
        return InferResult(outputs=data, code=posted.job.code)

    def poll(self, cookie: int) -> bool:
        """Whether the inference of `cookie` has ended (it stays to be waited for)."""
        return self.inflight.peek(cookie).done

    def random_seed(self, ncg_id: int, seed: int) -> None:
        """Seed the random number generators of the NCs of NCG `ncg_id`: random ops of
        the models there repeat their draws from this point."""
        self.ensure_ready()
        ncg = self.ncgs.get(ncg_id)
        for offset, vnc in enumerate(range(ncg.start, ncg.start + ncg.nc_count)):
            loc = self.ncgs.locate(vnc)
            with driver_errors(f"random_seed of NC {vnc}"):
                self.devices[loc.device_slot].nc(loc.nc).seed(seed, offset)
        log.info("Seeded NCG %d with %d", ncg_id, seed, extra={"fn": "random_seed"})

    def set_transfer_adjustment(self, count: int) -> None:
        """Set the static DMA transfer adjustment count the devices report."""
        self.transfer_adjustment = count
        log.info("Static transfer adjustment set to %d", count, extra={"fn": "transfer_adjust"})

    def responsive(self, timeout_s: float) -> bool:
        """True when a control-plane call could run now: the runtime's lock is free
        within `timeout_s` (a wedged load or unload holds it)."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        self._lock.release()
        return True

    def close(self) -> None:
        """Unload everything (the daemon's drain at exit)."""
        self.unload_all()
        self.inflight.close()
        logging.getLogger("nrtd").removeHandler(self.stats.logs)
