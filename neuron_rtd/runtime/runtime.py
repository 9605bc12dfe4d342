"""The runtime's face: every call of the wire API is one call of `Runtime`, which checks
the call (the devices up, the session it names or presents, the quotas) and hands it to
the concept that does it: the NCG table, the model table, the data path, shared memory,
sessions, readings.

Transport-free: the gRPC server is a thin adapter over `Runtime`, and in-process callers
use it directly. Control-plane calls serialize on one lock; inference takes no global lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from neuron_rtd import __version__
from neuron_rtd.errors import (
    HwError,
    InvalidError,
    InvalidHandle,
    NrtError,
    ResourceError,
    Stopping,
)
from neuron_rtd.runtime.access import Caller
from neuron_rtd.runtime.admission import NeffAdmission
from neuron_rtd.runtime.api import (
    DeviceInfo,
    HwCounters,
    InferResult,
    Input,
    ModelInfo,
    NcgInfo,
    RuntimeOptions,
    SessionRelease,
    ShmOutputs,
    Snapshot,
    SystemCounters,
    Topology,
)
from neuron_rtd.runtime.compute import ComputeGate
from neuron_rtd.runtime.dataplane import DataPath
from neuron_rtd.runtime.devices import DeviceInit
from neuron_rtd.runtime.driver import DeviceApi, NcCounters, driver_errors
from neuron_rtd.runtime.host import HostPool
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.lifecycle import ModelCalls
from neuron_rtd.runtime.model_table import ModelTable
from neuron_rtd.runtime.ncg import NcgTable
from neuron_rtd.runtime.readings import Readings
from neuron_rtd.runtime.sessions import (
    NO_SESSION,
    SessionId,
    SessionTable,
    check_ncs_quota,
)
from neuron_rtd.runtime.shm import ShmMapping, ShmTable
from neuron_rtd.runtime.stats import MetricSeries, NmgrCounters, Stats

log = logging.getLogger("nrtd.NMGR")


class Runtime(ModelCalls):
    """The runtime's face: every call of the wire API is one call here (a model's life,
    load to unload, in `ModelCalls`)."""

    def __init__(
        self,
        devices: Sequence[DeviceApi],
        *,
        options: RuntimeOptions | None = None,
        compute_gate: ComputeGate | None = None,
    ) -> None:
        self._devices = list(devices)
        self.options = options or RuntimeOptions()
        # one computing call per usable core, every front's (see runtime/compute.py); the
        # devices' NCs were handed its take_turn when acquired
        self.compute_gate = compute_gate or ComputeGate()
        first = self._devices[0].index if self._devices else 0
        self._ncgs = NcgTable(len(self._devices), self.options.ncs_per_device, first_device=first)
        self.version = __version__
        self._lock = threading.RLock()
        self._init = DeviceInit(self._devices, self._lock)
        self.started_ns = time.time_ns()
        self._inflight = Inflight(
            ttl_s=self.options.cookie_ttl_s, session_limit=self.options.session_max_inflight
        )
        self._shm = ShmTable(
            enabled=self.options.shmem_enabled, read_threads=self.options.shm_read_threads
        )
        self._data = DataPath(self._shm, self._inflight)
        self._stats = Stats()
        self._admission = NeffAdmission(self.options.neff_file_dirs)
        logging.getLogger("nrtd").addHandler(self._stats.logs)
        host_pool = HostPool(self.options.host_threads)
        self._models = ModelTable(
            self._devices, self._ncgs, self._inflight, self._stats, host_pool, self.compute_gate
        )
        self._readings = Readings(self._devices, self._ncgs, self._models, self._stats, self._lock)
        self._sessions = SessionTable(
            limit=self.options.session_max_open, per_peer=self.options.session_max_per_peer
        )
        self._stopping = False  # `begin_stop`: new work refused

    # --- devices -------------------------------------------------------------------
    def init_devices(self) -> None:
        """Reset and initialize every device; a failure leaves the runtime answering
        NERR_HW_ERROR (retrying the init at most once a second) until one succeeds."""
        self._init.run()

    def begin_stop(self) -> None:
        """The daemon stops: from now on a new inference, load or NCG is refused
        (`Stopping`, saying so), while those under way finish; `close` then unloads."""
        self._stopping = True

    def _refuse_if_stopping(self) -> None:
        if self._stopping:
            raise Stopping

    def ensure_ready(self) -> None:
        """HwError while the devices' init keeps failing (every call that needs them
        starts here)."""
        self._init.ensure()

    def ready(self) -> bool:
        """Whether the devices are up (a failing init is retried, as by every call)."""
        try:
            self.ensure_ready()
        except HwError:
            return False
        return True

    def topology(self) -> Topology:
        return self._readings.topology()

    def devices(self) -> list[DeviceInfo]:
        self.ensure_ready()
        return self._readings.devices()

    # --- sessions ------------------------------------------------------------------
    def open_session(self, peer: int | None = None) -> SessionId:
        """A new session's id (random, for its client's eyes only) for `peer` (the user
        id the caller proved, None if it did not); ResourceError past `session_max_open`
        or `session_max_per_peer`."""
        return self._sessions.open(peer)

    def end_session(self, session_id: SessionId, *, release: bool = True) -> SessionRelease | None:
        """Forget an ended session and, with `release`, unload its models (and any model
        on its NCGs), destroy its NCGs and unmap its shared memory: what a client that
        went away leaves. Nothing new is tied to the session once it is forgotten."""
        with self._lock:
            self._sessions.end(session_id)
            if not release:
                return None
            ncgs = [ncg for ncg in self._ncgs.list() if ncg.session_id == session_id]
            on_them = {m for ncg in ncgs for m in ncg.models}
            models = [m.id for m in self._models if m.session_id == session_id or m.id in on_them]
            for model_id in models:
                self._unload(model_id)
            remaining = {ncg.id for ncg in self._ncgs.list()}  # unloading took the implicit
            for ncg in ncgs:
                if ncg.id in remaining:
                    self._ncgs.destroy(ncg.id)
        maps = self._shm.unmap_session(session_id)
        return SessionRelease(models=models, ncgs=[ncg.id for ncg in ncgs], shm_maps=maps)

    def _check_ncs_quota(self, session_id: SessionId, more: int) -> None:
        held = self._ncgs.ncs_held_by(session_id)
        check_ncs_quota(session_id, held + more, self.options.session_max_ncs)

    # --- NCGs ----------------------------------------------------------------------
    def create_ncg(
        self,
        nc_count: int,
        *,
        session_id: SessionId = NO_SESSION,
        visible: frozenset[int] | None = None,
        implicit: bool = False,
    ) -> NcgInfo:
        """A new NCG of `nc_count` NCs (0: the largest free run); with `visible`, on
        those NCs only (machine-wide indices: device index * 4 + NC, as
        NEURON_RT_VISIBLE_CORES names them). `implicit`: made for one model, as a load
        without an NCG makes one (the model loaded into it is its only one, and its
        unload destroys the NCG)."""
        self._refuse_if_stopping()
        self.ensure_ready()
        with self._lock:
            self._sessions.check(session_id)
            ncg = self._ncgs.create(
                nc_count, session_id=session_id, visible=visible, implicit=implicit
            )
            try:  # checked with the NCG made: nc_count 0 takes the largest free run
                self._check_ncs_quota(session_id, 0)
            except ResourceError:
                self._ncgs.destroy(ncg.id)
                raise
        log.info(
            "Created NCG %d: %d NC(s) from vnc %d",
            ncg.id,
            ncg.nc_count,
            ncg.start,
            extra={"fn": "create_eg"},
        )
        return self._readings.ncg_info(ncg)

    def destroy_ncg(self, ncg_id: int) -> None:
        self.ensure_ready()
        with self._lock:
            ncg = self._ncgs.get(ncg_id)
            if ncg.implicit and ncg.models:
                raise InvalidError(
                    f"NCG {ncg_id} was made for model(s) {ncg.models} and goes with them: "
                    "unload the model instead"
                )
            self._ncgs.destroy(ncg_id)
        log.info("Destroyed NCG %d", ncg_id, extra={"fn": "destroy_eg"})

    def list_ncgs(self) -> list[NcgInfo]:
        self.ensure_ready()
        return [self._readings.ncg_info(ncg) for ncg in self._ncgs.list()]

    def ncg(self, ncg_id: int) -> NcgInfo:
        return self._readings.ncg_info(self._ncgs.get(ncg_id))

    def machine_nc(self, vnc: int) -> int:
        """The machine-wide index of virtual NC `vnc` (device index * 4 + NC)."""
        return self._ncgs.machine_nc(vnc)

    def locate(self, vnc: int) -> tuple[int, int]:
        """Where virtual NC `vnc` is: its device's index and its NC on that device."""
        loc = self._ncgs.locate(vnc)
        return self._devices[loc.device_slot].index, loc.nc

    # --- models --------------------------------------------------------------------
    def model(self, model_id: int) -> ModelInfo:
        return ModelInfo.of(self._models[model_id])

    def models(self) -> list[ModelInfo]:
        with self._lock:
            return [ModelInfo.of(m) for m in self._models]

    # --- inference -----------------------------------------------------------------
    # `session`: the session the call presents (gRPC metadata), whose shared memory its
    # tensors name; None: none (then by-name maps of the model's session, see `shm`).
    def infer(
        self,
        model_id: int,
        inputs: Mapping[str, Input],
        shm_outputs: ShmOutputs | None = None,
        *,
        session: SessionId | None = None,
    ) -> InferResult:
        """One inference, in this thread: inputs as bytes-like objects or `ShmInput`s by
        name; the outputs inline, or written to the shared memory `shm_outputs` names."""
        if self._stopping:
            raise Stopping
        self._init.ensure()  # `ensure_ready`, a call less on the hottest path
        try:
            model = self._models[model_id]
        except InvalidHandle:
            if self._stopping:  # checked just before the stop began; unloaded since
                raise Stopping from None
            raise
        return self._data.infer(model, inputs, shm_outputs or {}, self._sessions.presented(session))

    def post(
        self,
        model_id: int,
        inputs: Mapping[str, Input],
        shm_outputs: ShmOutputs | None = None,
        *,
        session: SessionId | None = None,
    ) -> int:
        """Queue an inference (inputs checked and copied into its slot before this
        returns); its cookie (see `Inflight`)."""
        self._refuse_if_stopping()
        self.ensure_ready()
        model = self._models[model_id]
        return self._data.post(model, inputs, shm_outputs or {}, self._sessions.presented(session))

    def wait(
        self,
        cookie: int,
        shm_outputs: ShmOutputs | None = None,
        *,
        session: SessionId | None = None,
    ) -> InferResult:
        """The result of a posted inference once it has ended; the cookie is spent. Its
        outputs go to the shared memory named here, else to that named by the post."""
        self.ensure_ready()
        return self._data.wait(cookie, shm_outputs or {}, self._sessions.presented(session))

    def poll(
        self,
        cookie: int,
        shm_outputs: ShmOutputs | None = None,
        *,
        session: SessionId | None = None,
    ) -> InferResult | None:
        """As `wait` once the inference has ended; None (the cookie kept) until then."""
        self.ensure_ready()
        return self._data.poll(cookie, shm_outputs or {}, self._sessions.presented(session))

    def completed(self, cookies: Iterable[int]) -> list[int]:
        """The cookies, of those given, whose inferences have ended (still to be waited
        for)."""
        self.ensure_ready()
        return self._data.completed(cookies)

    # --- shared memory -------------------------------------------------------------
    def shm_map(self, path: str | None, prot: int, session_id: SessionId = NO_SESSION) -> None:
        """Map the client's shm object `path` by name, opened with the daemon's rights
        (None: the client gave none, as with hugetlb memory, which is not supported)."""
        self.ensure_ready()
        if path is None:
            raise InvalidError("shm_map: hugetlb shared memory is not supported; give a path")
        self._sessions.check(session_id)
        self._shm.map(path, prot, session_id, limit=self.options.session_max_shm_maps)

    def shm_adopt(self, fd: int, path: str, prot: int, session_id: SessionId, uid: int) -> None:
        """Map the object a client of user `uid` passed (its file descriptor, which this
        takes) as `path` of the open session `session_id`: the caller's own object, named
        only by calls that present the session. A session that belongs to a user takes
        objects from that user only."""
        try:
            self.ensure_ready()
            self._sessions.check_passer(session_id, uid)
        except NrtError:
            os.close(fd)
            raise
        self._shm.adopt(fd, path, prot, session_id, limit=self.options.session_max_shm_maps)

    def shm_unmap(self, path: str, *, session: SessionId | None = None) -> None:
        self.ensure_ready()
        self._shm.unmap(path, self._sessions.presented(session))

    # A KServe region's object: held for a caller who could open it, by the same table.
    def shm_hold(self, path: str, who: Caller, what: str) -> ShmMapping:
        return self._shm.hold(path, who, what)

    def shm_size(self, mapping: ShmMapping, what: str) -> int:
        return self._shm.size(mapping, what)

    def shm_release(self, mapping: ShmMapping) -> None:
        self._shm.release(mapping)

    def shm_read(self, mapping: ShmMapping, offset: int, target: memoryview, what: str) -> None:
        self._shm.read_into(mapping, target, what, offset)

    def shm_write(self, mapping: ShmMapping, offset: int, data: memoryview, what: str) -> None:
        self._shm.write(mapping, data, what, offset)

    # --- counters ------------------------------------------------------------------
    def nc_counters(self, vnc: int) -> NcCounters:
        """The counters of virtual NC `vnc` since the devices were initialized."""
        self.ensure_ready()
        return self._readings.nc_counters(vnc)

    def hw_counters(self, *, bdf: str | None = None, index: int | None = None) -> HwCounters:
        """The health counters of one of this runtime's devices, by PCI BDF or index."""
        self.ensure_ready()
        return self._readings.hw_counters(bdf=bdf, index=index)

    def all_hw_counters(self) -> list[HwCounters]:
        self.ensure_ready()
        return self._readings.all_hw_counters()

    def counters(self) -> NmgrCounters:
        """The inference and model counters (no device needed: always answers)."""
        return self._stats.snapshot()

    def metrics(self, summarize_period_s: int) -> list[MetricSeries]:
        self.ensure_ready()
        return self._stats.read_metrics(summarize_period_s)

    def snapshot(self) -> Snapshot:
        """Everything an observer (neuron-monitor, neuron-top) reads, at one instant."""
        self.ensure_ready()
        return self._readings.snapshot()

    def system_counters(self) -> SystemCounters:
        self.ensure_ready()
        return self._readings.system_counters()

    def random_seed(self, ncg_id: int, seed: int) -> None:
        """Seed the random number generators of the NCs of NCG `ncg_id`: random ops of
        the models there repeat their draws from this point."""
        self.ensure_ready()
        ncg = self._ncgs.get(ncg_id)
        for offset, vnc in enumerate(ncg.vncs):
            loc = self._ncgs.locate(vnc)
            with driver_errors(f"random_seed of NC {vnc}"):
                self._devices[loc.device_slot].nc(loc.nc).seed(seed, offset)
        log.info("Seeded NCG %d with %d", ncg_id, seed, extra={"fn": "random_seed"})

    def set_transfer_adjustment(self, count: int) -> None:
        """Set the static DMA transfer adjustment count the devices report."""
        self.ensure_ready()
        self._readings.transfer_adjustment = count
        log.info("Static transfer adjustment set to %d", count, extra={"fn": "transfer_adjust"})

    # --- the process ---------------------------------------------------------------
    def responsive(self, timeout_s: float) -> bool:
        """True when a control-plane call could run now: the runtime's lock is free
        within `timeout_s` (a wedged load or unload holds it)."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        self._lock.release()
        return True

    def close(self) -> None:
        """Unload everything (the daemon's drain at exit)."""
        self._unload_all()
        self._inflight.close()
        self._shm.close()
        logging.getLogger("nrtd").removeHandler(self._stats.logs)
