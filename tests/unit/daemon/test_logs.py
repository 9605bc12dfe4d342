"""Log lines reach syslog as `nrtd[PID]: [MODULE:function] message`, or fall back cleanly."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_rtd.daemon import logs
from neuron_rtd.log_format import ROOT_LOGGER
from neuron_rtd.server.request_log import capture


@pytest.fixture(autouse=True)
def clean_logger() -> Iterator[None]:
    yield
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def test_lines_go_to_syslog_with_ident_and_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    fake.bind(str(tmp_path / "log"))
    fake.settimeout(5)
    monkeypatch.setattr(logs, "SYSLOG_SOCKET", str(tmp_path / "log"))
    assert logs.setup_logging("info", console=False) == "syslog"
    logging.getLogger("nrtd.NRTD").info(
        "Server listening on %s", "unix:/x", extra={"fn": "RunServer"}
    )
    line = fake.recv(4096).decode()
    fake.close()
    # <30> is facility daemon (3) * 8 + info (6)
    assert line == f"<30>nrtd[{os.getpid()}]: [NRTD:RunServer] Server listening on unix:/x\x00"


def test_no_syslog_falls_back_without_tracebacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(logs, "SYSLOG_SOCKET", str(tmp_path / "missing"))
    monkeypatch.setattr(logs, "JOURNAL_SOCKET", str(tmp_path / "missing-too"))
    assert logs.setup_logging("warning", console=False) == "stderr"
    log = logging.getLogger("nrtd.NMGR")
    log.info("not shown at warning level")
    log.warning("model %d is busy", 10001)
    err = capsys.readouterr().err
    assert (
        err == f"nrtd[{os.getpid()}]: [NMGR:test_no_syslog_falls_back_without_tracebacks] "
        "model 10001 is busy\n"
    )


def test_request_lines_are_captured_for_details(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "SYSLOG_SOCKET", str(tmp_path / "missing"))
    monkeypatch.setattr(logs, "JOURNAL_SOCKET", str(tmp_path / "missing-too"))
    logs.setup_logging("info", console=False)
    log = logging.getLogger("nrtd.NMGR")
    log.info("before any request")
    with capture() as lines:
        log.error("bad tensor %s", "x", extra={"fn": "infer"})
    log.info("after the request")
    assert lines == ["[NMGR:infer] bad tensor x"]
