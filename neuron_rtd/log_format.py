"""The daemon's log line: `[MODULE:function] message`, as its syslog shows it.

Loggers are named `nrtd.<MODULE>` (`nrtd.NRTD`, `nrtd.NMGR`, `nrtd.TDRV`, ...); a call
may name its function with `extra={"fn": "reset_mla"}`, else Python's function name is used.
"""

from __future__ import annotations

import logging

ROOT_LOGGER = "nrtd"


class TaggedFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        tag = record.name.rpartition(".")[2] if record.name != ROOT_LOGGER else "NRTD"
        fn = getattr(record, "fn", None) or record.funcName
        line = f"[{tag}:{fn}] {record.getMessage()}"
        if record.exc_info and record.levelno >= logging.ERROR:
            line += "\n" + self.formatException(record.exc_info)
        return line
