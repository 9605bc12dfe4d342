"""Shared memory objects that hold a client's tensors.

A `ShmBuffer` is sized with `ftruncate` and mapped here. The daemon gets it one of two ways:
- passed: its open file descriptor sent over the daemon's peer socket
  (`_peer.pass_objects`). Such a buffer is a memfd (`memfd_create(2)`), nameless, and when
  its size is fixed for good it is sealed against shrinking and growing (`F_SEAL_SHRINK`,
  `F_SEAL_GROW`): the daemon may then map it and copy tensors with memcpy, since no
  truncation can pull its pages away under a copy (see `runtime/shm.py`).
- by name, where the daemon has no peer socket: made with `shm_open(3)` (O_CREAT|O_EXCL,
  mode 0600: open to no one else), and the daemon opens it in `shm_map`; the name is
  unlinked then: the object lives on while either side holds it.
Nothing here goes through `multiprocessing.shared_memory`, whose resource tracker would
claim the names.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import contextlib
import fcntl
import itertools
import math
import mmap
import os
import secrets

import numpy as np

NAME_PREFIX = "/aws_neuron_runtime_"
_serial = itertools.count(1)


def new_name() -> str:
    """A fresh shm name the daemon accepts (`/` then letters, digits and `_`)."""
    return f"{NAME_PREFIX}{os.getpid()}_{next(_serial)}_{secrets.token_hex(4)}"


# A fixed-size passed object: its size can change no more, nor its seals.
FIXED_SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class ShmBuffer:
    """One shm object of `size` bytes, mapped read-write into this process. `passed`:
    made to be passed to the daemon, a memfd with no name (else a named POSIX object);
    `fixed` (passed ones only): its size is sealed, never to change."""

    def __init__(self, size: int, *, passed: bool = False, fixed: bool = False) -> None:
        self.path = new_name()  # for a passed object, only what calls name it by
        self.size = 0
        self._map: mmap.mmap | None = None
        self._linked = not passed
        if passed:
            flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
            self._fd: int | None = os.memfd_create(self.path.lstrip("/"), flags)
        else:
            self._fd = _posixshmem.shm_open(
                self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600
            )
        try:
            self.resize(size)
            if passed and fixed:
                fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, FIXED_SIZE_SEALS)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._fd is None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"shared memory {self.path} is closed")
        return self._fd

    def resize(self, size: int) -> None:
        """Make the object exactly `size` bytes (the mapping follows)."""
        if self._fd is None:
            raise ValueError(f"shared memory {self.path} is closed")
        if size == self.size and (self._map is not None or size == 0):
            return
        self._unmap()  # before a shrink: never touch pages past the end
        os.ftruncate(self._fd, size)
        self.size = size
        if size:
            self._map = mmap.mmap(self._fd, size)

    def write(self, array: np.ndarray, dtype: np.dtype) -> int:
        """Copy `array`, cast to `dtype`, to the start of the object: its byte count."""
        nbytes = array.size * dtype.itemsize
        if nbytes > self.size:
            raise ValueError(f"{nbytes} bytes do not fit in {self.path} ({self.size} bytes)")
        if nbytes:
            target = np.ndarray(array.shape, dtype=dtype, buffer=self._map)
            np.copyto(target, array, casting="unsafe")
            del target
        return nbytes

    def read(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of the tensor of `dtype` and `shape` at the start of the object."""
        count = math.prod(shape)
        if count * dtype.itemsize > self.size:
            raise ValueError(f"{self.path} holds {self.size} bytes, fewer than {shape} {dtype}")
        if count == 0:
            return np.empty(shape, dtype)
        return np.frombuffer(self._map, dtype, count).reshape(shape).copy()  # type: ignore[arg-type]

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor of `dtype` and `shape` at the start of the object, in place (no copy):
        writes go straight to the daemon's view of it. Drop the view before `close`."""
        count = math.prod(shape)
        if count * dtype.itemsize > self.size or self._map is None:
            raise ValueError(f"{self.path} holds {self.size} bytes, fewer than {shape} {dtype}")
        return np.frombuffer(self._map, dtype, count).reshape(shape)

    def unlink(self) -> None:
        """Remove the name; the object stays while it is mapped or open anywhere."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                _posixshmem.shm_unlink(self.path)

    def close(self) -> None:
        self._unmap()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.unlink()

    def _unmap(self) -> None:
        mapped, self._map = self._map, None
        if mapped is not None:
            with contextlib.suppress(BufferError):  # a view still alive: freed with it
                mapped.close()

    def __repr__(self) -> str:
        return f"ShmBuffer({self.path!r}, {self.size} bytes)"
