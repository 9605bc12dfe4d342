"""How every call with a status answers: its nerr code in `status.code` and the log lines
the daemon wrote for it in `status.details`. The one place a runtime error meets the wire."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from neuron_rtd.errors import Nerr, NrtError, Stopping
from neuron_rtd.proto import pb
from neuron_rtd.server.request_log import capture

log = logging.getLogger("nrtd.NMGR")


class WithStatus(Protocol):
    @property
    def status(self) -> pb.status: ...


R = TypeVar("R", bound=WithStatus)

# The nerr values, as ints: a response's code is checked to be one at a set's lookup
# (`Nerr(code)` costs a call into the enum machinery per response).
_NERR_CODES = frozenset(int(code) for code in Nerr)


def finish(method: str, make: Callable[[], R], empty: Callable[[], R]) -> R:
    """Run `make`, turning a runtime error into `empty()` with its nerr code (an
    unexpected exception into NERR_FAIL, logged with its traceback); either way
    `status.details` gets the request's log lines. A call refused because the daemon is
    stopping is not logged (each of a client's calls in a loop would be: the daemon
    logged its stop once), its details saying so."""
    with capture() as lines:
        try:
            response = make()
            code = response.status.code
            if code not in _NERR_CODES:
                code = Nerr(code)  # raises: a response with no nerr value is a bug
        except Stopping as exc:
            response, code = empty(), exc.code
            lines.append(str(exc))
        except NrtError as exc:
            log.error("%s", exc, extra={"fn": method})
            response, code = empty(), exc.code
        except Exception:
            log.exception("internal error", extra={"fn": method})
            response, code = empty(), Nerr.FAIL
    status = response.status
    status.code = int(code)
    if lines:
        status.details = "\n".join(lines).encode()
    return response
