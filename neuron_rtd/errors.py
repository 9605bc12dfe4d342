"""One exception tree for the runtime and its clients: every error carries the nerr code
it answers with, and each code has one class (`for_code`), so that `except QueueFull`
catches a full queue alike from `LocalRuntime` and from the client, whose errors
(`neuron_rtd/client/errors.py`) are these classes too.

The server maps an exception to the wire with `exc.code` alone; `tests/daemon/client/test_errors.py`
proves every class here has a code that exists in the wire API's `nerr` enum.
"""

from __future__ import annotations

import enum


class Nerr(enum.IntEnum):
    """The wire API's `nerr` values (`proto/nrt/nmgr.proto`, `docs/wire-api.md`)."""

    OK = 0
    FAIL = 1
    INVALID = 2
    INVALID_HANDLE = 3
    RESOURCE = 4
    TIMEOUT = 5
    HW_ERROR = 6
    QUEUE_FULL = 7
    FAILED_STATE = 8
    RESOURCE_NC = 9
    UNSUPPORTED_VERSION = 10
    INFER_PENDING = 1000
    INFER_CANCELLED = 1001
    INFER_BAD_INPUT = 1002
    INFER_COMPLETED_WITH_NUM_ERR = 1003
    INFER_COMPLETED_WITH_ERR = 1004


class NrtError(Exception):
    """Base of every runtime error; `code` is what the client sees in `status.code`."""

    code: Nerr = Nerr.FAIL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidError(NrtError):
    """Corrupt or invalid input: a NEFF, an instruction, a tensor name or size."""

    code = Nerr.INVALID


class ModelFileRefused(InvalidError):
    """A model file the daemon did not read (`runtime/admission.py:read_model_file`):
    `reason` says why, worded alike for a file that does not exist and one the daemon may
    not read; `outside`: it is not within the folders it may be read from."""

    def __init__(self, message: str, *, reason: str = "", outside: bool = False) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.outside = outside


class NeffInvalid(InvalidError):
    """A NEFF that is truncated, fails its hash, or holds a malformed graph."""


class UnsupportedVersion(NrtError):
    code = Nerr.UNSUPPORTED_VERSION


class InvalidHandle(NrtError):
    code = Nerr.INVALID_HANDLE


class ResourceError(NrtError):
    """Device DRAM or host memory exhausted."""

    code = Nerr.RESOURCE


class ResourceNcError(NrtError):
    """Not enough free NeuronCores."""

    code = Nerr.RESOURCE_NC


class InferTimeout(NrtError):
    """A request or an inference ran past its time limit."""

    code = Nerr.TIMEOUT


class HwError(NrtError):
    code = Nerr.HW_ERROR


class QueueFull(NrtError):
    code = Nerr.QUEUE_FULL


class FailedState(NrtError):
    """The model was stopped after an unrecoverable error."""

    code = Nerr.FAILED_STATE


class ModelNotRunning(NrtError):
    """Inference asked of a model that is loaded but not started."""

    code = Nerr.FAIL


# What a stopping daemon answers every new call (its `Stopping`), and what the client
# recognizes in an answer's details: the wire API has no nerr of its own for it.
STOPPING = "the daemon is stopping"


class Stopping(NrtError):
    """A new call to a daemon that is stopping (NERR_FAIL): it takes none, while the calls
    under way finish and its models are unloaded."""

    code = Nerr.FAIL

    def __init__(self, message: str = "") -> None:
        super().__init__(
            message
            or f"{STOPPING}: it takes no new calls (those under way finish, then every model "
            "is unloaded); call again once a daemon is back"
        )


class BadInput(NrtError):
    """Missing, unknown or wrongly sized input tensors."""

    code = Nerr.INFER_BAD_INPUT


class InferCancelled(NrtError):
    code = Nerr.INFER_CANCELLED


class InferNumericalError(NrtError):
    code = Nerr.INFER_COMPLETED_WITH_NUM_ERR


class InferError(NrtError):
    code = Nerr.INFER_COMPLETED_WITH_ERR


def shown(text: str, limit: int = 100) -> str:
    """A caller's `text` (a name, a path) as a message shows it: cut to `limit` characters,
    "..." saying it was, so that no message or log line carries a caller's 100 KB."""
    return text if len(text) <= limit else text[:limit] + "..."


def for_code(code: int) -> type[NrtError]:
    """The class that stands for nerr `code` (NrtError for FAIL, INFER_PENDING and a code
    the wire API does not define)."""
    return _BY_CODE.get(code, NrtError)


_BY_CODE: dict[int, type[NrtError]] = {
    Nerr.INVALID: InvalidError,
    Nerr.INVALID_HANDLE: InvalidHandle,
    Nerr.RESOURCE: ResourceError,
    Nerr.TIMEOUT: InferTimeout,
    Nerr.HW_ERROR: HwError,
    Nerr.QUEUE_FULL: QueueFull,
    Nerr.FAILED_STATE: FailedState,
    Nerr.RESOURCE_NC: ResourceNcError,
    Nerr.UNSUPPORTED_VERSION: UnsupportedVersion,
    Nerr.INFER_CANCELLED: InferCancelled,
    Nerr.INFER_BAD_INPUT: BadInput,
    Nerr.INFER_COMPLETED_WITH_NUM_ERR: InferNumericalError,
    Nerr.INFER_COMPLETED_WITH_ERR: InferError,
}


def all_error_classes() -> list[type[NrtError]]:
    """Every class of the tree defined here, NrtError included (not the client's, which
    are these classes too, made with a client's answer)."""
    found: list[type[NrtError]] = []
    todo: list[type[NrtError]] = [NrtError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == __name__ and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found
