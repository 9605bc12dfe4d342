"""The values the runtime's face takes and gives: what its callers (the gRPC server, the
in-process runtime, tools) see instead of its models, jobs and tables.

Inputs of an inference are bytes-like objects (numpy arrays included), `ShmInput`s (a
tensor in a client's mapped shared memory) or `Rows` (a batch's row blocks). Outputs
come back in the `InferResult`, or go straight into the client's shared memory when the
call names `shm_outputs` (output name -> shm path): then only those outputs are written,
and none comes back inline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from neuron_rtd.errors import InvalidError, Nerr
from neuron_rtd.neff import Neff
from neuron_rtd.neff.strings import encode
from neuron_rtd.runtime.driver import DeviceApi, HealthCounters
from neuron_rtd.runtime.model import LoadedModel, LoadMode, ModelParams, ModelState
from neuron_rtd.runtime.sessions import session_tag
from neuron_rtd.runtime.stats import Histogram, NmgrCounters, Tally


@dataclass(frozen=True)
class ShmInput:
    """An input read from the client's mapped shared memory object `path` straight into
    the model's slot."""

    path: str


@dataclass(frozen=True)
class NeffFile:
    """A NEFF the runtime reads itself, from an absolute path on its host."""

    path: str


@dataclass(frozen=True)
class Rows:
    """An input given as blocks of rows along axis 0 (a dynamic batch's requests, in
    order), read into the model's slot one block after another: no concatenated copy on
    the way. Each block is C-contiguous and of the input's dtype; the blocks share their
    shape beyond axis 0."""

    blocks: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks)

    @property
    def shape(self) -> tuple[int, ...]:
        rows = sum(block.shape[0] for block in self.blocks)
        return (rows, *self.blocks[0].shape[1:])

    def read_into(self, target: memoryview) -> None:
        """The blocks' bytes, one after another, into `target` (bytes)."""
        at = 0
        for block in self.blocks:
            data = block.reshape(-1).view(np.uint8)
            target[at : at + data.nbytes] = data.data
            at += data.nbytes


Input = bytes | bytearray | memoryview | np.ndarray | ShmInput | Rows
ShmOutputs = Mapping[str, str]  # output name -> the shm path it is written to


@dataclass(frozen=True)
class InferResult:
    """An inference's answer. Each inline output is an array of its true shape (cut to
    the inference's sizes), read-only, over a `bytes` object of its own copied once from
    the slot: a wire takes those bytes as they are (`wire_bytes`), a numpy caller the
    array. A string output is an object array of `bytes` elements of its own."""

    outputs: dict[str, np.ndarray]  # inline outputs (none when they went to shared memory)
    code: Nerr  # OK, or INFER_COMPLETED_WITH_NUM_ERR when an output holds NaN/Inf


def wire_bytes(array: np.ndarray) -> bytes:
    """An output's bytes for a wire: the `bytes` object an `InferResult` array lies over
    when the array is all of it (no copy), else a copy (a batch's rows, say); a string
    tensor's, Triton's encoding of its elements (`neuron_rtd/neff/strings.py`)."""
    if array.dtype.hasobject:
        return encode(array)
    owner = array.base
    if type(owner) is np.ndarray:  # the result's reshape of the flat array over the bytes
        owner = owner.base
    if type(owner) is bytes and len(owner) == array.nbytes and array.flags.c_contiguous:
        return owner
    return np.ascontiguousarray(array).tobytes()


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model as it is when asked."""

    id: int
    name: str
    neff: Neff
    ncg_id: int
    mode: LoadMode
    state: ModelState
    params: ModelParams
    vncs: tuple[int, ...]
    dram_bytes: int
    host_bytes: int
    in_flight: int  # inferences holding a slot: submitted, not yet answered
    session: str  # its session's tag ("": none); the id itself is its client's secret
    failure: str  # why it FAILED, when it did

    @classmethod
    def of(cls, model: LoadedModel) -> ModelInfo:
        return cls(
            id=model.id,
            name=model.name,
            neff=model.neff,
            ncg_id=model.ncg_id,
            mode=model.mode,
            state=model.state,
            params=model.params,
            vncs=model.vncs,
            dram_bytes=model.dram_bytes,
            host_bytes=model.host_bytes,
            in_flight=model.in_flight,
            session=session_tag(model.session_id),
            failure=model.failure,
        )


@dataclass(frozen=True)
class NcgInfo:
    id: int
    start: int  # its first virtual NC
    nc_count: int
    device_index: int  # the device of its first NC
    nc_start: int  # its first NC's index on that device
    session: str  # its session's tag ("": none)
    implicit: bool  # made for a model's load, and goes with it
    models: tuple[int, ...]

    @property
    def vncs(self) -> range:
        return range(self.start, self.start + self.nc_count)


@dataclass(frozen=True)
class Topology:
    device_count: int
    ncs_per_device: int
    total_ncs: int


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    bdf: str
    nc_count: int
    memory_bytes: int
    memory_used: tuple[int, ...]  # per DRAM channel

    @classmethod
    def of(cls, device: DeviceApi) -> DeviceInfo:
        spec = device.spec
        return cls(
            index=device.index,
            bdf=device.bdf,
            nc_count=spec.nc_count,
            memory_bytes=spec.dram_bytes,
            memory_used=device.dram_used(),
        )


@dataclass(frozen=True, kw_only=True)
class HwCounters(HealthCounters):
    """One device's health counters (the driver's list of them: ECC, and, not in the
    original's message but served by the ext service, failed runs and resets), named by
    the device, with the static DMA adjustment it reports."""

    bdf: str
    device_index: int
    transfer_adjustment: int

    @classmethod
    def of(cls, device: DeviceApi, transfer_adjustment: int) -> HwCounters:
        hw = device.hw_counters()
        counted = {f.name: getattr(hw, f.name) for f in fields(HealthCounters)}
        return cls(
            bdf=device.bdf,
            device_index=device.index,
            transfer_adjustment=transfer_adjustment,
            **counted,
        )


@dataclass(frozen=True)
class NcUse:
    """One virtual NC: where it is, its busy time since its device's last reset, and the
    NCG that holds it (0: free)."""

    vnc: int
    device_index: int
    nc: int
    busy_ns: int
    ncg_id: int


@dataclass(frozen=True)
class Snapshot:
    """The runtime at one instant, for observers: everything in it only grows (or is a
    level), so that two snapshots give rates and percentiles over their interval."""

    time_ns: int  # wall clock, ns since the epoch
    cpu_user_s: float  # the runtime's process, since it started
    cpu_system_s: float
    rss_bytes: int
    ncs: tuple[NcUse, ...]
    ncgs: tuple[NcgInfo, ...]
    models: tuple[ModelInfo, ...]
    tallies: tuple[Tally, ...]  # each model's, in the order of `models`
    counters: NmgrCounters
    latency: Histogram  # every inference's, microseconds, posted to answered
    nc_latency: Histogram  # ... on the NCs


@dataclass(frozen=True)
class SystemCounters:
    log_errors: int
    log_warnings: int
    host_memory_bytes: int  # the runtime's process, resident
    devices: tuple[DeviceInfo, ...]


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """What the runtime is told. The daemon's fields of the same names give them
    (`neuron_rtd/daemon/config.py:runtime_options`): a name here is the config's key."""

    default_timeout: float = 2.0  # seconds one inference may take
    default_ninfer: int = 4
    max_ninfer: int = 256
    ncs_per_device: int = 4
    model_cache_count: int = 4  # models one NCG may hold (one READY, the rest STANDBY); 0: any
    # onnxruntime threads of one CPU node (0: the usable cores); CPU nodes at once: the
    # usable cores / this (`neuron_rtd/runtime/host.py:HostPool`)
    host_threads: int = 0
    cookie_ttl_s: float = 60.0  # an ended inference nobody waits for is dropped after this
    shmem_enabled: bool = True  # clients may map shared memory for tensors
    # threads one large shared-memory read is split over (0: the usable cores, 2 to 4)
    shm_read_threads: int = 0
    # The folders `neff_file` loads may read from (symbolic links resolved first).
    neff_file_dirs: tuple[str, ...] = ("/",)
    # What one session may hold at once (clients with no session share one quota); 0: any.
    session_max_ncs: int = 0
    session_max_models: int = 64
    session_max_shm_maps: int = 256
    session_max_inflight: int = 1024  # cookies posted and not waited for, by model session
    session_max_open: int = 4096  # sessions open at once, all clients (0: any)
    session_max_per_peer: int = 1024  # of them, one user's (the unidentified: together)

    def model_params(
        self, *, timeout_s: float | None = None, ninfer: int | None = None, profile: bool = False
    ) -> ModelParams:
        """A load's parameters, the defaults where it gives none; InvalidError out of
        bounds."""
        timeout = self.default_timeout if timeout_s is None else timeout_s
        depth = self.default_ninfer if ninfer is None else ninfer
        if timeout <= 0:
            raise InvalidError(f"model timeout must be at least 1 s, got {timeout_s}")
        if not 1 <= depth <= self.max_ninfer:
            raise InvalidError(f"ninfer must be between 1 and {self.max_ninfer}, got {depth}")
        return ModelParams(timeout_s=float(timeout), ninfer=depth, profile=profile)


def parse_version(text: str) -> tuple[int, int]:
    major, minor, *_ = (int(p) for p in text.split(".")[:2])
    return major, minor


@dataclass(frozen=True)
class SessionRelease:
    """What an ended session left and the runtime released."""

    models: list[int]
    ncgs: list[int]
    shm_maps: list[str]
