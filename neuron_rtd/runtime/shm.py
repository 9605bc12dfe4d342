"""Client shared memory: POSIX shm objects a client maps for IFMAPs and OFMAPs.

`shm_map` opens the object at once (the client may unlink its name right after) and keeps
the file descriptor; tensors move with `os.preadv`/`os.pwritev` on it, never through an
mmap, so a client that shrinks its object makes a clean error (a short read), not a
SIGBUS in the daemon. Names are plain shm names (`/name`, no other `/`); the object must
be a regular file in the shm folder. `shm_unmap` of an object an inference is using is
deferred until that inference lets it go.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from neuron_rtd.errors import BadInput, InvalidError, ResourceError
from neuron_rtd.runtime.driver import usable_cpus

SHM_ROOT = Path("/dev/shm")
PROT_READ = 0x1
PROT_WRITE = 0x2
_NAME = re.compile(r"/?([A-Za-z0-9_.\-]{1,255})")


@dataclass(eq=False)
class _Mapping:
    path: str
    fd: int
    writable: bool
    session_id: int
    users: int = 0
    unmapped: bool = False


def session_name(session_id: int) -> str:
    """Who holds what a session holds, in messages (no session: one quota for all)."""
    return f"session {session_id}" if session_id else "the clients with no session"


class ShmTable:
    """The shm objects mapped by clients, by the path they gave."""

    def __init__(self, *, root: Path = SHM_ROOT, enabled: bool = True) -> None:
        self.root = root
        self.enabled = enabled
        self._maps: dict[str, _Mapping] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)

    # --- map / unmap ----------------------------------------------------------------
    def map(self, path: str, prot: int, session_id: int = 0, *, limit: int = 0) -> None:
        """Open the object `path` names (read-write when `prot` has PROT_WRITE); with a
        `limit`, ResourceError if the session has that many objects mapped already."""
        if not self.enabled:
            raise InvalidError(
                "shared memory is disabled in this daemon's config (shmem_enabled false): "
                "send tensors inline"
            )
        name = _plain_name(path)
        writable = bool(prot & PROT_WRITE)
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.root / name, flags | os.O_NONBLOCK)
        except FileNotFoundError:
            raise InvalidError(f"shm_map: no shared memory object '{path}'") from None
        except OSError as exc:
            raise InvalidError(f"shm_map: cannot open '{path}': {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidError(f"shm_map: '{path}' is not a shared memory object")
        mapping = _Mapping(path, fd, writable, session_id)
        with self._lock:
            held = sum(m.session_id == session_id for m in self._maps.values())
            if limit and path not in self._maps and held >= limit:
                os.close(fd)
                raise ResourceError(
                    f"shm_map: {session_name(session_id)} has {held} shared memory objects mapped, "
                    f"the most one may (session_max_shm_maps {limit}): unmap one first"
                )
            old = self._maps.pop(path, None)
            self._maps[path] = mapping
        if old is not None:  # mapped again (the client made a new object of that name)
            self._drop(old)

    def unmap(self, path: str) -> None:
        with self._lock:
            mapping = self._maps.pop(path, None)
        if mapping is None:
            raise InvalidError(f"shm_unmap: '{path}' is not mapped")
        self._drop(mapping)

    def unmap_session(self, session_id: int) -> list[str]:
        """Unmap every object mapped with `session_id`; their paths."""
        with self._lock:
            gone = [m for m in self._maps.values() if m.session_id == session_id]
            for mapping in gone:
                del self._maps[mapping.path]
        for mapping in gone:
            self._drop(mapping)
        return [m.path for m in gone]

    def close(self) -> None:
        with self._lock:
            gone = list(self._maps.values())
            self._maps.clear()
        for mapping in gone:
            self._drop(mapping)

    def _drop(self, mapping: _Mapping) -> None:
        """Close the object now, or when its last user lets it go."""
        with self._lock:
            mapping.unmapped = True
            idle = mapping.users == 0
        if idle:
            os.close(mapping.fd)

    @contextlib.contextmanager
    def _use(self, path: str, what: str) -> Iterator[_Mapping]:
        with self._lock:
            mapping = self._maps.get(path)
            if mapping is None:
                raise BadInput(f"{what}: shared memory '{path}' is not mapped (shm_map it first)")
            mapping.users += 1
        try:
            yield mapping
        finally:
            with self._lock:
                mapping.users -= 1
                close = mapping.unmapped and mapping.users == 0
            if close:
                os.close(mapping.fd)

    # --- tensors --------------------------------------------------------------------
    def size(self, path: str, what: str) -> int:
        with self._use(path, what) as mapping:
            return os.fstat(mapping.fd).st_size

    def read(self, path: str, nbytes: int, what: str) -> bytearray:
        """The first `nbytes` of the object; BadInput if it holds fewer."""
        buffer = bytearray(nbytes)
        self.read_into(path, memoryview(buffer), what)
        return buffer

    def source(self, path: str, nbytes: int | None, what: str) -> ShmSource:
        """An input read from `path` when the model copies it in: its first `nbytes`
        (None: the whole object, as it is now)."""
        if nbytes is None:
            nbytes = self.size(path, what)
        else:
            with self._use(path, what):
                pass  # mapped now: a clean error at once if not
        return ShmSource(self, path, nbytes, what)

    def read_into(self, path: str, target: memoryview, what: str) -> None:
        """Fill `target` from the start of the object; BadInput if it holds fewer bytes.
        A large tensor is read in parts by several threads at once: the kernel's copy out
        of tmpfs runs at a third of memcpy's speed on one core, and reads of one object
        run side by side (writes do not: they take the file's lock)."""
        nbytes = target.nbytes
        with self._use(path, what) as mapping:
            got = _read_parts(mapping.fd, target.cast("B"))
        if got < nbytes:
            raise BadInput(
                f"{what}: shared memory '{path}' holds {got} bytes, the tensor takes {nbytes}"
            )

    def write(self, path: str, data: bytes | memoryview, what: str) -> None:
        """Write `data` at the start of the object, which must already be large enough
        (writing past its end would grow the client's object)."""
        size = memoryview(data).nbytes
        with self._use(path, what) as mapping:
            if not mapping.writable:
                raise BadInput(f"{what}: shared memory '{path}' was mapped without PROT_WRITE")
            held = os.fstat(mapping.fd).st_size
            if held < size:
                raise BadInput(
                    f"{what}: shared memory '{path}' holds {held} bytes, the tensor takes {size}"
                )
            written = os.pwritev(mapping.fd, [data], 0) if size else 0
        if written != size:
            raise BadInput(f"{what}: wrote {written} of {size} bytes to '{path}'")


PARALLEL_READ_BYTES = 4 << 20  # reads this large are split over READ_THREADS threads
READ_THREADS = max(2, min(4, usable_cpus()))
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()


def _read_parts(fd: int, target: memoryview) -> int:
    """preadv `target` from offset 0; the bytes read (fewer: the object is shorter)."""
    nbytes = target.nbytes
    if nbytes < PARALLEL_READ_BYTES:
        return os.preadv(fd, [target], 0) if nbytes else 0
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(READ_THREADS - 1, thread_name_prefix="shm-read")
    step = -(-nbytes // READ_THREADS)
    offsets = range(0, nbytes, step)
    parts = [_readers.submit(_pread_full, fd, target, o, step) for o in offsets[1:]]
    counts = [_pread_full(fd, target, 0, step)] + [p.result() for p in parts]
    total = 0
    for offset, count in zip(offsets, counts, strict=True):
        if count < min(step, nbytes - offset):  # a short part: the object ends there
            return offset + count
        total += count
    return total


def _pread_full(fd: int, target: memoryview, offset: int, size: int) -> int:
    return os.preadv(fd, [target[offset : offset + size]], offset)


@dataclass(frozen=True)
class ShmSource:
    """A model input in client shared memory (a `model.Source`)."""

    table: ShmTable
    path: str
    nbytes: int
    what: str

    def read_into(self, target: memoryview) -> None:
        self.table.read_into(self.path, target, self.what)


def _plain_name(path: str) -> str:
    """The shm name in `path` (`/name` or `name`); InvalidError for anything else."""
    match = _NAME.fullmatch(path)
    if match is None or match.group(1) in (".", ".."):
        raise InvalidError(
            f"shm_map: '{path}' is not a plain shared memory name ('/name' of letters, digits, "
            "'_', '-' and '.')"
        )
    return match.group(1)
