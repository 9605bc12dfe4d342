"""Collects the log lines one request produced, for its response's `status.details`.

The daemon's log handler calls `record()` for every line; while a request is being
served (`capture()`), the line is also kept for that request. The servicer thread that
serves a request is the one that logs for it, so a context variable suffices.
"""

from __future__ import annotations

import contextvars
import logging

from neuron_rtd.log_format import TaggedFormatter

_lines: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "nrtd_request_lines", default=None
)


class RequestLogHandler(logging.Handler):
    """Keeps each formatted line for the request being served, if any."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.setFormatter(TaggedFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        lines = _lines.get()
        if lines is not None:
            lines.append(self.format(record))


class capture:  # a class used as a function: `with capture() as lines:`
    """The log lines of the block's request, in the list it gives."""

    def __enter__(self) -> list[str]:
        lines: list[str] = []
        self._token = _lines.set(lines)
        return lines

    def __exit__(self, *exc: object) -> None:
        _lines.reset(self._token)
