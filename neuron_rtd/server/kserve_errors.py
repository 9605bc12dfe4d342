"""How both KServe v2 front ends answer a failure: one table from the protocol's status
kinds to a gRPC status code and an HTTP status, and one reading of an exception
(`refusal`): a `ServingError` says its status and message as they are; anything else is
INTERNAL with a one-line message, its traceback going to the daemon's log only
(`nrtd.KSERVE`). gRPC applies it to every method by one decorator
(`neuron_rtd/server/kserve.py:answered`), HTTP to every route in `KServeApp.reply`."""

from __future__ import annotations

import logging

import grpc

from neuron_rtd.errors import shown
from neuron_rtd.serving import ServingError, SharedMemoryApi, ShmRegion, Status

log = logging.getLogger("nrtd.KSERVE")

# Each status kind: its gRPC code and its HTTP status.
STATUS_CODES: dict[Status, tuple[grpc.StatusCode, int]] = {
    Status.INVALID_ARGUMENT: (grpc.StatusCode.INVALID_ARGUMENT, 400),
    Status.NOT_FOUND: (grpc.StatusCode.NOT_FOUND, 404),
    Status.UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE, 503),  # a model not ready, ...
    Status.ALREADY_EXISTS: (grpc.StatusCode.ALREADY_EXISTS, 409),
    Status.UNSUPPORTED: (grpc.StatusCode.UNIMPLEMENTED, 501),  # trace settings, ...
    Status.INTERNAL: (grpc.StatusCode.INTERNAL, 500),
}
# CUDA shared memory, as Triton built without GPUs serves it: it holds no region, so
# status lists none and unregister has nothing to do; register is refused in Triton's
# words (which clients match), then ours, each front naming its own way to register
# system shared memory instead (`how`).
CUDA_SHM_REFUSED = (
    "failed to register CUDA shared memory region: '{name}', GPUs not supported: this "
    "server's devices are Neuron devices; use system shared memory ({how}) instead"
)
GRPC_CODES = {status: codes[0] for status, codes in STATUS_CODES.items()}
HTTP_STATUS = {status: codes[1] for status, codes in STATUS_CODES.items()}


def refusal(exc: Exception, what: str, fn: str) -> tuple[Status, str]:
    """The status and message a call that raised `exc` answers with (`what`: the call, as
    the message names it; `fn`: the log line's function)."""
    if isinstance(exc, ServingError):
        return exc.status, exc.message
    log.exception("internal error in %s", what, extra={"fn": fn})
    return Status.INTERNAL, internal_message(what, exc)


def internal_message(what: str, exc: BaseException) -> str:
    """What a client is told of an unexpected error: one line, no traceback (that goes
    to the daemon's log)."""
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return f"{what}: internal error ({detail}); the daemon's log has the details"


def cuda_shm_register(name: str, how: str) -> ServingError:
    """What registering CUDA shared memory region `name` answers: INVALID_ARGUMENT, as
    Triton built without GPUs answers it."""
    return ServingError(Status.INVALID_ARGUMENT, CUDA_SHM_REFUSED.format(name=shown(name), how=how))


def cuda_shm_status(name: str, regions: SharedMemoryApi) -> list[ShmRegion]:
    """The CUDA shared-memory regions a status asks for: none ("" asks for all); a named
    one is NOT_FOUND, worded as Triton words it (a region of the caller's system shared
    memory of that name, as Triton says, is not CUDA shared memory)."""
    if not name:
        return []
    if any(r.name == name for r in regions.status()):
        message = (
            f"The region named '{shown(name)}' is registered as system shared memory, not "
            "CUDA shared memory"
        )
    else:
        message = (
            f"Unable to find cuda shared memory region: '{shown(name)}' (this server holds "
            "no CUDA shared memory: it has no GPUs)"
        )
    raise ServingError(Status.NOT_FOUND, message)
