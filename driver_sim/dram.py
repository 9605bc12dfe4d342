"""Device DRAM: a first-fit allocator per channel and the buffers it hands out.

Addresses are offsets in a channel's [0, CHANNEL_BYTES). Every allocation is rounded up
to `ALIGN` bytes and starts on an `ALIGN` boundary; a zero-byte allocation still takes one
`ALIGN` unit, so every live buffer has an address of its own. Freed blocks merge with
free neighbours.

A buffer's bytes are a numpy uint8 array made with np.empty on first use: the host pages
behind it are only touched when written, so GiBs of I/O buffers cost no resident memory
until used.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from driver_sim.errors import DriverError

ALIGN = 64

_BACKING_LOCK = threading.Lock()


def aligned_size(nbytes: int) -> int:
    """The bytes an allocation of `nbytes` occupies."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class ChannelAllocator:
    """First-fit allocation over [0, capacity), free blocks sorted by address."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free_starts: list[int] = [0]
        self._free_sizes: list[int] = [capacity]
        self._taken: dict[int, int] = {}
        self.used = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return max(self._free_sizes, default=0)

    def allocate(self, nbytes: int) -> int | None:
        """The address of a new block of `aligned_size(nbytes)`, or None if none fits."""
        size = aligned_size(nbytes)
        for i, block in enumerate(self._free_sizes):
            if block >= size:
                return self._carve(i, size)
        return None

    def _carve(self, i: int, size: int) -> int:
        address = self._free_starts[i]
        if self._free_sizes[i] == size:
            del self._free_starts[i]
            del self._free_sizes[i]
        else:
            self._free_starts[i] += size
            self._free_sizes[i] -= size
        self._taken[address] = size
        self.used += size
        return address

    def free(self, address: int) -> None:
        """Return the block at `address`; KeyError if it is not allocated."""
        size = self._taken.pop(address)
        self.used -= size
        i = bisect.bisect_left(self._free_starts, address)
        merges_next = i < len(self._free_starts) and self._free_starts[i] == address + size
        if merges_next:
            size += self._free_sizes[i]
            del self._free_starts[i]
            del self._free_sizes[i]
        prev = i - 1
        if prev >= 0 and self._free_starts[prev] + self._free_sizes[prev] == address:
            self._free_sizes[prev] += size
        else:
            self._free_starts.insert(i, address)
            self._free_sizes.insert(i, size)

    def clear(self) -> None:
        """Free everything."""
        self._free_starts = [0]
        self._free_sizes = [self.capacity]
        self._taken.clear()
        self.used = 0

    def free_blocks(self) -> list[tuple[int, int]]:
        """(address, size) of every free block, by address (for tests and tools)."""
        return list(zip(self._free_starts, self._free_sizes, strict=True))


def _as_bytes(data: Any) -> np.ndarray:
    """A flat uint8 view (or contiguous copy) of bytes-like or array data."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


class DramBuffer:
    """`nbytes` of DRAM at `address` in `channel` of device `device_index`."""

    __slots__ = ("_backing", "_freed", "address", "channel", "device_index", "nbytes", "tag")

    def __init__(
        self, device_index: int, channel: int, address: int, nbytes: int, tag: str
    ) -> None:
        self.device_index = device_index
        self.channel = channel
        self.address = address
        self.nbytes = nbytes
        self.tag = tag
        self._backing: np.ndarray | None = None
        self._freed = False

    def __repr__(self) -> str:
        return (
            f"DramBuffer(device={self.device_index}, channel={self.channel}, "
            f"address={self.address:#x}, nbytes={self.nbytes}, tag={self.tag!r})"
        )

    @property
    def freed(self) -> bool:
        return self._freed

    def _memory(self) -> np.ndarray:
        if self._freed:
            raise DriverError(f"{self!r} was freed")
        if self._backing is None:
            with _BACKING_LOCK:
                if self._backing is None:
                    self._backing = np.empty(self.nbytes, dtype=np.uint8)
        return self._backing

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(
                f"range [{offset}, {offset + nbytes}) is outside {self!r} (0..{self.nbytes})"
            )

    def write(self, data: Any, offset: int = 0) -> None:
        """Copy bytes-like or array `data` into the buffer at `offset`."""
        source = _as_bytes(data)
        self._check_range(offset, source.size)
        self._memory()[offset : offset + source.size] = source

    def read(self, offset: int = 0, nbytes: int | None = None) -> memoryview:
        """A zero-copy view of `nbytes` (default: the rest) from `offset`."""
        count = self.nbytes - offset if nbytes is None else nbytes
        self._check_range(offset, count)
        return self._memory()[offset : offset + count].data

    def view(self, dtype: Any, shape: Sequence[int] | int) -> np.ndarray:
        """A zero-copy array of `dtype` and `shape` over the start of the buffer."""
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        need = math.prod(dims) * dt.itemsize
        if need > self.nbytes:
            raise ValueError(
                f"{dt} array of shape {dims} needs {need} bytes; {self!r} has {self.nbytes}"
            )
        return self._memory()[:need].view(dt).reshape(dims)

    def invalidate(self) -> None:
        """Mark freed (by dram_free or a reset) and drop the backing memory."""
        self._freed = True
        self._backing = None
