"""System shared-memory regions of the v2 protocol (`SystemSharedMemoryRegister`): a
client names a POSIX shm object by its `shm_open` key ("/x" or "x": `/dev/shm/x`), an
offset and a size; requests then read inputs from, and write outputs to, ranges of it.

Only the protocol's bookkeeping lives here: which regions a caller registered, by name,
and whether a range lies within one. The objects are the runtime's (`Runtime.shm_hold`,
the same table and rules as `shm_map`: a regular file opened without blocking, never a
link, `shmem_enabled`), and the runtime opens one only for a caller who could open it
itself (`runtime/access.py`): the daemon's rights are never lent to a caller. A region
belongs to the caller that registered it: another caller neither sees, uses nor
unregisters it, and each caller holds at most `limit` regions. Tensors are copied through
the object's fd, so a client that truncates its object gets a clean error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from neuron_rtd.errors import NrtError, shown
from neuron_rtd.runtime import Caller, Runtime, ShmMapping
from neuron_rtd.serving.api import ServingError, SharedMemoryApi, ShmRegion, Status

MAX_NAME_BYTES = 255  # a region's name, as long as a file name


@dataclass(eq=False)
class _Held:
    region: ShmRegion
    mapping: ShmMapping


class SystemSharedMemory:
    """Every caller's regions; `of(caller)` is what one caller may do with its own."""

    def __init__(self, runtime: Runtime, *, limit: int = 256) -> None:
        self.runtime = runtime
        self.limit = limit
        self._regions: dict[str, dict[str, _Held]] = {}  # caller's key -> name -> region
        self._lock = threading.Lock()

    def of(self, caller: Caller) -> SharedMemoryApi:
        return CallerRegions(self, caller)

    def close(self) -> None:
        with self._lock:
            gone = [held for regions in self._regions.values() for held in regions.values()]
            self._regions.clear()
        for held in gone:
            self.runtime.shm_release(held.mapping)


class CallerRegions:
    """One caller's regions (`SharedMemoryApi`)."""

    def __init__(self, shared: SystemSharedMemory, caller: Caller) -> None:
        self._shared = shared
        self.caller = caller
        self._key = caller.key

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        _check_name(name)
        what = f"shared memory region '{name}'"
        if offset < 0 or byte_size <= 0:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"{what}: offset {offset} and byte_size {byte_size} must be >= 0 and > 0",
            )
        shared = self._shared
        with shared._lock:
            self._check_room(shared._regions.get(self._key, {}), name, what)
        path = _path(key)
        try:
            mapping = shared.runtime.shm_hold(path, self.caller, "SystemSharedMemoryRegister")
        except NrtError as exc:
            raise ServingError(Status.INVALID_ARGUMENT, exc.message) from None
        try:
            size = shared.runtime.shm_size(mapping, what)
            if offset + byte_size > size:
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"{what}: offset {offset} + byte_size {byte_size} is past the end of shm "
                    f"object '{key}' ({size} bytes)",
                )
            with shared._lock:  # another call may have registered meanwhile: again
                mine = shared._regions.setdefault(self._key, {})
                self._check_room(mine, name, what)
                mine[name] = _Held(ShmRegion(name, key, offset, byte_size), mapping)
        except BaseException:
            shared.runtime.shm_release(mapping)
            raise

    def _check_room(self, mine: dict[str, _Held], name: str, what: str) -> None:
        """Raises unless this caller may register region `name` besides `mine`."""
        if name in mine:
            raise _exists(name)
        if len(mine) >= self._shared.limit:
            raise ServingError(
                Status.UNAVAILABLE,
                f"{what}: {self.caller.describe()} has {len(mine)} regions registered, the "
                f"most one caller may (session_max_shm_maps {self._shared.limit}): "
                "unregister one",
            )

    def unregister(self, name: str = "") -> None:
        shared = self._shared
        with shared._lock:
            mine = shared._regions.get(self._key, {})
            if name:
                gone = [mine.pop(name)] if name in mine else []
            else:
                gone = list(mine.values())
                mine.clear()
            if not mine:
                shared._regions.pop(self._key, None)
        # Triton answers an unknown name's unregister with success: nothing to do.
        for held in gone:
            shared.runtime.shm_release(held.mapping)

    def status(self, name: str = "") -> list[ShmRegion]:
        with self._shared._lock:
            mine = self._shared._regions.get(self._key, {})
            if not name:
                return [held.region for held in mine.values()]
            held = mine.get(name)
        if held is None:
            raise _unknown(name)
        return [held.region]

    def check(self, name: str, offset: int, byte_size: int) -> None:
        self._place(name, offset, byte_size)

    def read(self, name: str, offset: int, byte_size: int) -> bytearray:
        """`byte_size` bytes of region `name` from `offset` within it, copied out; the
        region and range are checked before anything is allocated."""
        held, start = self._place(name, offset, byte_size)
        buffer = bytearray(byte_size)
        try:
            self._shared.runtime.shm_read(held.mapping, start, memoryview(buffer), _what(name))
        except NrtError as exc:
            raise _shrunk(held.region, exc) from None
        return buffer

    def write(self, name: str, offset: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        held, start = self._place(name, offset, view.nbytes)
        try:
            self._shared.runtime.shm_write(held.mapping, start, view, _what(name))
        except NrtError as exc:
            raise _shrunk(held.region, exc) from None

    def _place(self, name: str, offset: int, byte_size: int) -> tuple[_Held, int]:
        """Region `name` of this caller and where the range starts in its object
        (INVALID_ARGUMENT unless the range lies within the region)."""
        with self._shared._lock:
            held = self._shared._regions.get(self._key, {}).get(name)
        if held is None:
            raise _unknown(name)
        region = held.region
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"{byte_size} bytes at offset {offset} of shared memory region "
                f"'{shown(name)}' do not lie within it ({region.byte_size} bytes)",
            )
        return held, region.offset + offset


def _check_name(name: str) -> None:
    if not name:
        raise ServingError(Status.INVALID_ARGUMENT, "a shared memory region needs a name")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"shared memory region name '{shown(name)}' is longer than {MAX_NAME_BYTES} "
            "bytes: give a shorter name",
        )


def _path(key: str) -> str:
    """The shm object `key` names, as `shm_map` takes it ("/name")."""
    bare = key[1:] if key.startswith("/") else key
    if not bare or "/" in bare or bare in (".", "..") or "\0" in bare:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"shared memory key {shown(key)!r} is not a POSIX shm object name: give one name "
            "as shm_open takes it ('/name' or 'name'), with no '/' inside",
        )
    return "/" + bare


def _what(name: str) -> str:
    return f"shared memory region '{shown(name)}'"


def _exists(name: str) -> ServingError:
    return ServingError(
        Status.ALREADY_EXISTS,
        f"shared memory region '{shown(name)}' is already registered; unregister it first",
    )


def _shrunk(region: ShmRegion, exc: NrtError) -> ServingError:
    return ServingError(
        Status.INVALID_ARGUMENT,
        f"shm object '{region.key}' of shared memory region '{shown(region.name)}': "
        f"{exc.message} (keep it at its size while it is registered)",
    )


def _unknown(name: str) -> ServingError:
    return ServingError(
        Status.NOT_FOUND, f"no shared memory region named '{shown(name)}' is registered"
    )
