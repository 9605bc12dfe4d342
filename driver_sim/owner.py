"""The `owner` file of a device: who holds the claim, and whether they are still alive."""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

import psutil

CREATE_TIME_TOLERANCE_S = 0.01


@dataclass(frozen=True)
class OwnerInfo:
    """The process that owns a device, and the address it serves on."""

    pid: int
    address: str
    version: str


@dataclass(frozen=True)
class OwnerRecord:
    """The owner file's contents: the owner and its process start time."""

    pid: int
    create_time: float
    address: str
    version: str

    @property
    def info(self) -> OwnerInfo:
        return OwnerInfo(self.pid, self.address, self.version)


def record_for_this_process(address: str, version: str) -> OwnerRecord:
    pid = os.getpid()
    return OwnerRecord(pid, psutil.Process(pid).create_time(), address, version)


def write_owner(path: pathlib.Path, record: OwnerRecord) -> None:
    """Write the owner file atomically (temp file, rename)."""
    body = {
        "pid": record.pid,
        "create_time": record.create_time,
        "address": record.address,
        "version": record.version,
    }
    temp = path.with_name(f".{path.name}.{record.pid}")
    temp.write_text(json.dumps(body) + "\n")
    os.replace(temp, path)


def read_owner(path: pathlib.Path) -> OwnerRecord | None:
    """The owner file's record; None when missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        return OwnerRecord(
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            address=str(data["address"]),
            version=str(data["version"]),
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def is_alive(record: OwnerRecord) -> bool:
    """Whether the recorded process still runs (same pid and start time, not a zombie)."""
    try:
        process = psutil.Process(record.pid)
        if abs(process.create_time() - record.create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def live_owner(path: pathlib.Path) -> OwnerInfo | None:
    """The owner named by the file if that process is alive, else None."""
    record = read_owner(path)
    if record is None or not is_alive(record):
        return None
    return record.info
