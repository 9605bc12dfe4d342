"""Where the daemon's log lines go: syslog as `nrtd[PID]: [MODULE:function] message`.

No syslog socket (containers, CI): the journal if there is one, else stderr. `-x` adds the
console. Every line is also offered to the request being served (its `status.details`).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import socket
import sys

from neuron_rtd.log_format import ROOT_LOGGER, TaggedFormatter
from neuron_rtd.server import RequestLogHandler

SYSLOG_SOCKET = "/dev/log"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
LEVELS = {
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}


def _socket_accepts(path: str) -> bool:
    """True when a datagram can be sent to the unix socket at `path`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(path)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _syslog_handler(ident: str) -> logging.Handler | None:
    if not _socket_accepts(SYSLOG_SOCKET):
        return None
    handler = logging.handlers.SysLogHandler(
        address=SYSLOG_SOCKET, facility=logging.handlers.SysLogHandler.LOG_DAEMON
    )
    handler.ident = f"{ident}[{os.getpid()}]: "
    return handler


def _journal_handler(ident: str) -> logging.Handler | None:
    if not _socket_accepts(JOURNAL_SOCKET):
        return None
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        return None
    handler: logging.Handler = JournalHandler(SYSLOG_IDENTIFIER=ident)
    return handler


class _StderrFormatter(TaggedFormatter):
    def __init__(self, ident: str) -> None:
        super().__init__()
        self.prefix = f"{ident}[{os.getpid()}]: "

    def format(self, record: logging.LogRecord) -> str:
        return self.prefix + super().format(record)


def setup_logging(level: str, *, console: bool, ident: str = "nrtd") -> str:
    """Install the handlers; returns where the log goes ("syslog", "journal", "stderr")."""
    logger = logging.getLogger(ROOT_LOGGER)
    logger.setLevel(LEVELS[level])
    logger.propagate = False
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    sink = "syslog"
    handler = _syslog_handler(ident)
    if handler is None:
        sink, handler = "journal", _journal_handler(ident)
    if handler is not None:
        handler.setFormatter(TaggedFormatter())
        logger.addHandler(handler)
    if handler is None or console:
        if handler is None:
            sink = "stderr"
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(_StderrFormatter(ident))
        logger.addHandler(stream)
    logger.addHandler(RequestLogHandler(LEVELS[level]))
    return sink
