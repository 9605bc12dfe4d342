"""POSIX shared memory objects that hold a client's tensors.

A `ShmBuffer` is made with `shm_open(3)` (O_CREAT|O_EXCL, mode 0600: open to no one
else), sized with `ftruncate` and mapped here. The daemon gets it passed, its open file
descriptor sent over the daemon's peer socket (`_peer.pass_objects`), or, where the daemon has
none, opens it by name in `shm_map`; either way the name is unlinked then: the object
lives on while either side holds it. Nothing here goes through
`multiprocessing.shared_memory`, whose resource tracker would claim the names.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import contextlib
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


class ShmBuffer:
    """One shm object of `size` bytes, mapped read-write into this process."""

    def __init__(self, size: int) -> None:
        self.path = new_name()
        self.size = 0
        self._map: mmap.mmap | None = None
        self._linked = True
        self._fd: int | None = _posixshmem.shm_open(
            self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600
        )
        try:
            self.resize(size)
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
