"""System shared-memory regions of the v2 protocol (`SystemSharedMemoryRegister`): a
client names a POSIX shm object by its `shm_open` key ("/x" or "x": `/dev/shm/x`), an
offset and a size; requests then read inputs from, and write outputs to, ranges of it.

The daemon opens the object with its own rights (DESIGN.md "Trust"), so the kernel
refuses what the caller could not have shared, and says no more about an object than
anyone may see of `/dev/shm`. The object is never mapped: `read` and `write` copy through
its fd (preadv/pwrite, the one copy the tensors would take anyway), so a client that
truncates its object meanwhile gets a clean error where a mapping would have killed the
daemon with SIGBUS.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from neuron_rtd.serving.api import ServingError, ShmRegion, Status

SHM_ROOT = Path("/dev/shm")


@dataclass(eq=False)
class _Opened:
    region: ShmRegion
    fd: int
    users: int = 0  # reads and writes under way: its fd is closed after the last
    closing: bool = False

    def close(self) -> None:
        os.close(self.fd)


class SystemSharedMemory:
    """The registered regions, by name (`SharedMemoryApi`)."""

    def __init__(self, *, root: Path = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, _Opened] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise ServingError(Status.INVALID_ARGUMENT, "a shared memory region needs a name")
        path = self._path(key)
        with self._lock:
            if name in self._regions:
                raise ServingError(
                    Status.ALREADY_EXISTS,
                    f"shared memory region '{name}' is already registered; unregister it first",
                )
        if offset < 0 or byte_size <= 0:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"shared memory region '{name}': offset {offset} and byte_size {byte_size} "
                "must be >= 0 and > 0",
            )
        fd = _open(path, key)
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"is past the end of shm object '{key}' ({size} bytes)",
                )
        except BaseException:
            os.close(fd)
            raise
        mapped = _Opened(ShmRegion(name, key, offset, byte_size), fd)
        with self._lock:
            if name in self._regions:  # registered by another call meanwhile
                mapped.close()
                raise ServingError(
                    Status.ALREADY_EXISTS, f"shared memory region '{name}' is already registered"
                )
            self._regions[name] = mapped

    def unregister(self, name: str = "") -> None:
        with self._lock:
            if name:
                gone = [self._regions.pop(name)] if name in self._regions else []
            else:
                gone = list(self._regions.values())
                self._regions.clear()
            # Triton answers an unknown name's unregister with success: nothing to do.
            for opened in gone:
                opened.closing = True
                if not opened.users:
                    opened.close()

    def status(self, name: str = "") -> list[ShmRegion]:
        with self._lock:
            if not name:
                return [m.region for m in self._regions.values()]
            mapped = self._regions.get(name)
        if mapped is None:
            raise _unknown(name)
        return [mapped.region]

    def read(self, name: str, offset: int, byte_size: int) -> bytearray:
        """`byte_size` bytes of region `name` from `offset` within it, copied out."""
        buffer = bytearray(byte_size)
        with self._using(name, offset, byte_size) as (opened, start):
            done = os.preadv(opened.fd, [buffer], start)
        if done != byte_size:
            raise _shrunk(opened.region)
        return buffer

    def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        """`data` into region `name` from `offset` within it."""
        view = memoryview(data).cast("B")
        with self._using(name, offset, view.nbytes) as (opened, start):
            while view.nbytes:
                # pwrite past the end of a shm object would grow it: never beyond the region
                if os.fstat(opened.fd).st_size < start + view.nbytes:
                    raise _shrunk(opened.region)
                done = os.pwrite(opened.fd, view, start)
                view, start = view[done:], start + done

    def check(self, name: str, offset: int, byte_size: int) -> None:
        with self._using(name, offset, byte_size):
            pass

    @contextlib.contextmanager
    def _using(self, name: str, offset: int, byte_size: int) -> Iterator[tuple[_Opened, int]]:
        """Region `name`, kept open while the block runs, and where the range starts in
        its object (INVALID_ARGUMENT unless the range lies within the region)."""
        with self._lock:
            opened = self._regions.get(name)
            if opened is None:
                raise _unknown(name)
            opened.users += 1
        try:
            region = opened.region
            if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"{byte_size} bytes at offset {offset} of shared memory region '{name}' do "
                    f"not lie within it ({region.byte_size} bytes)",
                )
            yield opened, region.offset + offset
        finally:
            with self._lock:
                opened.users -= 1
                if opened.closing and not opened.users:
                    opened.close()

    def close(self) -> None:
        self.unregister()

    def _path(self, key: str) -> Path:
        bare = key[1:] if key.startswith("/") else key
        if not bare or "/" in bare or bare in (".", "..") or "\0" in bare:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"shared memory key {key!r} is not a POSIX shm object name: give one name "
                "as shm_open takes it ('/name' or 'name'), with no '/' inside",
            )
        return self.root / bare


_HIDDEN = (errno.ENOENT, errno.EACCES, errno.EPERM)  # told apart for nobody


def _open(path: Path, key: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in _HIDDEN:  # worded alike: the answer does not tell which, as shm_map's
            why = (
                "no such shm object, or the daemon may not open it (it opens objects with "
                "its own rights: its user, or group neuron, needs read and write access)"
            )
        elif exc.errno == errno.ELOOP:
            why = "it is a symbolic link"
        else:
            why = (exc.strerror or str(exc)).lower()
        raise ServingError(
            Status.INVALID_ARGUMENT, f"cannot open shm object '{key}' read-write: {why}"
        ) from None


def _shrunk(region: ShmRegion) -> ServingError:
    return ServingError(
        Status.INVALID_ARGUMENT,
        f"shm object '{region.key}' of shared memory region '{region.name}' has shrunk below "
        "the region registered: keep it at its size while it is registered",
    )


def _unknown(name: str) -> ServingError:
    return ServingError(Status.NOT_FOUND, f"no shared memory region named '{name}' is registered")
