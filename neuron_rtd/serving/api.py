"""What the KServe v2 front ends (gRPC `neuron_rtd/server/kserve.py`, HTTP
`neuron_rtd/server/kserve_http.py`) ask of the serving core, and what it answers: plain
values and numpy arrays, never a wire type except the two messages the protocol defines as
documents (`ModelConfig`, `ModelStatistics`), which both front ends render.

Every failure is a `ServingError` with a `Status`; each front end maps a status to its
own code (gRPC status code, HTTP status) and sends the message as it is.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from neuron_rtd.errors import Nerr
from neuron_rtd.proto import kserve_pb, model_config_pb
from neuron_rtd.runtime import Caller


class Status(enum.Enum):
    """The protocol's error kinds (gRPC code / HTTP status in each front end)."""

    INVALID_ARGUMENT = "invalid argument"  # gRPC INVALID_ARGUMENT, HTTP 400
    NOT_FOUND = "not found"  # gRPC NOT_FOUND, HTTP 404
    UNAVAILABLE = "unavailable"  # gRPC UNAVAILABLE, HTTP 503 (a model not ready, ...)
    ALREADY_EXISTS = "already exists"  # gRPC ALREADY_EXISTS, HTTP 409
    UNSUPPORTED = "unsupported"  # gRPC UNIMPLEMENTED, HTTP 501 (CUDA shared memory, ...)
    INTERNAL = "internal"  # gRPC INTERNAL, HTTP 500


class ServingError(Exception):
    """A request the core refuses or could not carry out. `message` says what was wrong
    and what to do; a runtime error's nerr name and text are kept in it."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class TensorMeta:
    """An input or output as the protocol describes it: `datatype` is the v2 name
    ("FP32", "INT64", "BOOL", "BF16", ...), `shape` has -1 for an axis that varies
    (the batch axis included, for a model with max_batch_size > 0)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]  # the ready ones, as strings ("1", "2")
    platform: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


@dataclass(frozen=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]  # those really supported, named as the protocol does


@dataclass(frozen=True)
class RepositoryModel:
    """One row of the repository index."""

    name: str
    version: str  # "" for a model with no version loaded
    state: str  # "READY", "UNAVAILABLE", "LOADING", "UNLOADING", or "" when never loaded
    reason: str = ""


@dataclass(slots=True)  # not frozen: that sets each field by object.__setattr__, per request
class InferRequest:
    """One inference as a front end decoded it. `inputs` by name, each array already of
    the datatype and shape the request declared (the front end checked that its bytes
    make that shape). `outputs`: the names asked for, None for all of them. `version`
    "" lets the core choose (the newest ready version). `classification`: the outputs
    answered as their top N classes instead (the classification extension), by name."""

    model: str
    inputs: Mapping[str, np.ndarray]
    version: str = ""
    outputs: Sequence[str] | None = None
    id: str = ""
    parameters: Mapping[str, object] = field(default_factory=dict)
    classification: Mapping[str, int] | None = None


@dataclass(slots=True)
class InferResponse:
    model: str
    version: str
    id: str
    outputs: dict[str, np.ndarray]  # the ones asked for, in the model's output order
    # OK, or INFER_COMPLETED_WITH_NUM_ERR when an output of the execution holds NaN/Inf
    code: Nerr = Nerr.OK


@dataclass(frozen=True)
class ShmRegion:
    """A registered system shared-memory region (`SystemSharedMemoryStatus`)."""

    name: str
    key: str
    offset: int
    byte_size: int


class SharedMemoryApi(Protocol):
    """One caller's system shared-memory regions, registered by name
    (`SystemSharedMemoryRegister`): a POSIX shm object `key` (as `shm_open` names it), from
    `offset`, `byte_size` bytes, one the caller could open itself (and the daemon may).
    Tensors are copied in and out through the object's fd: a client that truncates its
    object gets an error, not a daemon killed by SIGBUS."""

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    def unregister(self, name: str = "") -> None:
        """One region, or every one when `name` is ""."""

    def status(self, name: str = "") -> list[ShmRegion]:
        """One region (NOT_FOUND when unknown), or every one when `name` is ""."""

    def check(self, name: str, offset: int, byte_size: int) -> None:
        """Raises unless region `name` is registered (NOT_FOUND) and `byte_size` bytes
        from `offset` within it lie inside it (INVALID_ARGUMENT)."""

    def read(self, name: str, offset: int, byte_size: int) -> bytearray:
        """`byte_size` bytes of region `name` from `offset` within it, copied out (checked
        as by `check`; INVALID_ARGUMENT when the object shrank below the region)."""

    def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        """`data` copied into region `name` from `offset` within it (checked alike)."""


class ServingApi(Protocol):
    """The serving core as the front ends see it (`neuron_rtd.serving.Serving`). Every
    method may be called from many threads at once; `infer` blocks until its answer
    (with dynamic batching, until the batch it joined has run)."""

    def shm(self, caller: Caller) -> SharedMemoryApi:
        """The regions `caller` registered (another caller's are not there)."""

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def server_metadata(self) -> ServerMetadata: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    def model_config(self, name: str, version: str = "") -> model_config_pb.ModelConfig: ...

    def model_statistics(
        self, name: str = "", version: str = ""
    ) -> kserve_pb.ModelStatisticsResponse:
        """Every ready model's (and version's) when `name` is ""."""

    def pending_requests(self) -> dict[tuple[str, str], int]:
        """Each ready version's requests not yet executing, by (name, version)."""

    def infer(self, request: InferRequest) -> InferResponse: ...

    def repository_index(self, ready_only: bool = False) -> list[RepositoryModel]: ...

    def load_model(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None:
        """`RepositoryModelLoad`: (re)load `name` from the repository; `config` a JSON
        ModelConfig overriding config.pbtxt; `files` as the protocol's `file:` parameters
        ("1/model.neff" -> its bytes). UNAVAILABLE unless the control mode is explicit."""

    def unload_model(self, name: str) -> None: ...
