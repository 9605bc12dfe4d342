"""The client's exceptions: a daemon answer other than success, with its nerr code.

Transport failures (no daemon, a deadline passed) stay `grpc.RpcError`s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from neuron_rtd.errors import Nerr

# INFER_COMPLETED_WITH_NUM_ERR finished with NaN/Inf: the clients treat it as success.
SUCCESS = frozenset({Nerr.OK, Nerr.INFER_COMPLETED_WITH_NUM_ERR})


class NrtClientError(Exception):
    """The daemon answered `method` with nerr `code`; `details` holds its log lines."""

    def __init__(self, code: int, details: str, method: str) -> None:
        self.code = code
        self.details = details
        self.method = method
        nerr = self.nerr
        name = f"NERR_{nerr.name}" if nerr is not None else f"nerr {code}"
        super().__init__(f"{method}: {name}: {details}")

    @property
    def nerr(self) -> Nerr | None:
        """The code as a `Nerr` (None for a code the wire API does not define)."""
        try:
            return Nerr(self.code)
        except ValueError:
            return None


def check(method: str, status: Any) -> None:
    """Raise NrtClientError unless `status` (a wire `status`) is a success."""
    if status.code not in SUCCESS:
        raise NrtClientError(status.code, status.details.decode(errors="replace"), method)


def code_of(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The gRPC status code of a failed call (None when the error carries none)."""
    return exc.code() if isinstance(exc, grpc.Call) else None


T = TypeVar("T")


def retry_unavailable(call: Callable[[], T]) -> T:
    """`call()`, made once more when the daemon is UNAVAILABLE (restarting, or its
    socket not yet there): the clients' one retry."""
    try:
        return call()
    except grpc.RpcError as exc:
        if code_of(exc) != grpc.StatusCode.UNAVAILABLE:
            raise
    return call()
