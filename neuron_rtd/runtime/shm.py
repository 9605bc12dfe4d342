"""Client shared memory: POSIX shm objects a client maps for IFMAPs and OFMAPs.

A mapping belongs to the session that made it: the same name mapped by another session is
another mapping, never the first one's. An object comes in one of two ways:
- passed: the client sends the open object itself over the daemon's peer socket
  (`server/peer_socket.py`), so the daemon uses exactly what the caller could open, and the
  object may stay private to its owner (mode 0600). Only calls that present the session
  (gRPC metadata `nrt-session-id`) name it.
- by name (`shm_map`, the original interface): the daemon opens `/dev/shm/NAME` with its
  own rights at once (the client may unlink the name right after), so the kernel refuses
  what the daemon's user may not open. Calls that present no session name it through
  the session of the model they run (as the original's clients expect).
Either way the daemon keeps the file descriptor: an object replaced under the same name
since is never used. Tensors move with `os.preadv`/`os.pwritev` on it, so a client that
shrinks its object makes a clean error (a short read), not a SIGBUS in the daemon; the one
exception is a passed object sealed against shrinking (a memfd with `F_SEAL_SHRINK`, as
the client library makes for tensors of a fixed size): no one can take its pages away, so
the daemon maps it once and tensors move by memcpy, three to four times faster than
through the kernel's copy for large ones. `shm_unmap` of an object an inference is using
is deferred until that inference lets it go.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from neuron_rtd.errors import BadInput, InvalidError, ResourceError
from neuron_rtd.runtime.access import HIDDEN_ERRNOS, Caller, may_open
from neuron_rtd.runtime.driver import usable_cpus
from neuron_rtd.runtime.sessions import NO_SESSION, SessionId, session_name

SHM_ROOT = Path("/dev/shm")
VIEW_BYTES = 256 << 20  # of a passed sealed object mapped; larger tensors move by preadv
VIEWS_TOTAL_BYTES = 64 << 30  # of all passed objects mapped at once
PROT_READ = 0x1
PROT_WRITE = 0x2
_NAME = re.compile(r"/?([A-Za-z0-9_.\-]{1,255})")
PRESENT_SESSION = (
    "present the session that mapped it (gRPC metadata 'nrt-session-id', see docs/wire-api.md)"
)


@dataclass(eq=False)
class ShmMapping:
    """One mapped object: what a call's tensor names once resolved."""

    path: str
    fd: int
    writable: bool
    session_id: SessionId
    passed: bool  # the client passed the object itself (else: opened by name)
    # Its first bytes mapped here, when no one can shrink it (`sealed_view`).
    view: mmap.mmap | None = None
    users: int = 0
    unmapped: bool = False

    def close(self) -> None:
        if self.view is not None:
            self.view.close()
        os.close(self.fd)


class ShmTable:
    """The shm objects mapped by clients, by session and the path they gave."""

    def __init__(
        self,
        *,
        root: Path = SHM_ROOT,
        enabled: bool = True,
        view_bytes: int = VIEW_BYTES,
        views_total_bytes: int = VIEWS_TOTAL_BYTES,
        read_threads: int = 0,
    ) -> None:
        self.root = root
        self.enabled = enabled
        self.view_bytes = view_bytes
        self.views_total_bytes = views_total_bytes
        self._maps: dict[tuple[int, str], ShmMapping] = {}
        self._viewed = 0  # bytes of passed objects mapped into this process (views)
        self._lock = threading.Lock()
        self._readers = _Readers(read_threads or default_read_threads())

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)

    # --- map / unmap ----------------------------------------------------------------
    def map(
        self, path: str, prot: int, session_id: SessionId = NO_SESSION, *, limit: int = 0
    ) -> None:
        """Open the object `path` names with the daemon's own rights (read-write when
        `prot` has PROT_WRITE); with a `limit`, ResourceError if the session has that many
        objects mapped already. An object this process may not open, or that does not
        exist, is refused alike: the answer does not tell which."""
        writable = bool(prot & PROT_WRITE)
        fd = self.open(path, writable, None, "shm_map")
        self._add(ShmMapping(path, fd, writable, session_id, passed=False), limit)

    def open(self, path: str, writable: bool, who: Caller | None, what: str) -> int:
        """A new fd on the regular shm object `path` names (never a device, a FIFO or a
        link), opened without blocking; with `who`, only one that caller could open."""
        self._check_enabled()
        name = _plain_name(path)
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.root / name, flags | os.O_NONBLOCK)
        except OSError as exc:
            hidden = exc.errno in HIDDEN_ERRNOS
            raise _refused(what, path, None if hidden else exc.strerror, who) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidError(f"{what}: '{path}' is not a shared memory object")
            if who is not None and not may_open(fd, who, write=writable):
                raise _refused(what, path, None, who)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def adopt(
        self, fd: int, path: str, prot: int, session_id: SessionId, *, limit: int = 0
    ) -> None:
        """Take the object a client passed (its open file descriptor, now ours) as
        `path` of `session_id`; the fd is closed here on a refusal."""
        try:
            self._check_enabled()
            _plain_name(path)
        except InvalidError:
            os.close(fd)
            raise
        writable = bool(prot & PROT_WRITE)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidError(f"shm_map: '{path}' is not a shared memory object")
        mapping = ShmMapping(path, fd, writable, session_id, passed=True)
        self._give_view(mapping)  # while it is ours alone: no call can close it yet
        self._add(mapping, limit)

    def _give_view(self, mapping: ShmMapping) -> None:
        """Map the first bytes of a passed object sealed against shrinking (at most
        `view_bytes` of it, and while all views stay under `views_total_bytes`), so its
        tensors move by memcpy; else they go through preadv/pwritev. A client's object
        never costs the daemon more address space than that, however large it says it is."""
        size = min(os.fstat(mapping.fd).st_size, self.view_bytes)
        with self._lock:
            if self._viewed + size > self.views_total_bytes:
                return
            self._viewed += size
        mapping.view = sealed_view(mapping.fd, mapping.writable, size)
        if mapping.view is None:
            with self._lock:
                self._viewed -= size

    def _close(self, mapping: ShmMapping) -> None:
        """Close the object (and its view, counted off)."""
        if mapping.view is not None:
            with self._lock:
                self._viewed -= len(mapping.view)
        mapping.close()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise InvalidError(
                "shared memory is disabled in this daemon's config (shmem_enabled false): "
                "send tensors inline"
            )

    def _add(self, mapping: ShmMapping, limit: int) -> None:
        """Put a regular object's mapping in the table (`open` and `adopt` checked it)."""
        key = (mapping.session_id, mapping.path)
        with self._lock:
            held = sum(s == mapping.session_id for s, _ in self._maps)
            full = bool(limit) and key not in self._maps and held >= limit
            old = None if full else self._maps.pop(key, None)
            if not full:
                self._maps[key] = mapping
        if full:
            self._close(mapping)
            raise ResourceError(
                f"shm_map: {session_name(mapping.session_id)} has {held} shared memory "
                f"objects mapped, the most one may (session_max_shm_maps {limit}): unmap "
                "one first"
            )
        if old is not None:  # mapped again (the client made a new object of that name)
            self._drop(old)

    def hold(self, path: str, who: Caller, what: str) -> ShmMapping:
        """The object `path` names, opened read-write for `who` (see `open`) and held
        outside any session until `release`: a region of the KServe protocol."""
        return ShmMapping(path, self.open(path, True, who, what), True, NO_SESSION, passed=False)

    def release(self, mapping: ShmMapping) -> None:
        """Let go of a held object (closed when its last read or write ends)."""
        self._drop(mapping)

    def unmap(self, path: str, presented: SessionId | None = None) -> None:
        """Unmap `path` of the session the call presents; a call that presents none
        unmaps it among the clients with no session, else the one mapping by name of
        that path there is."""
        with self._lock:
            if presented is not None:
                key: tuple[int, str] | None = (presented, path)
            elif (NO_SESSION, path) in self._maps:
                key = (NO_SESSION, path)
            else:
                named = [k for k, m in self._maps.items() if k[1] == path and not m.passed]
                key = named[0] if len(named) == 1 else None
            mapping = self._maps.pop(key, None) if key is not None else None
        if mapping is None:
            where = "" if presented is None else f" by {session_name(presented)}"
            raise InvalidError(f"shm_unmap: '{path}' is not mapped{where}")
        self._drop(mapping)

    def unmap_session(self, session_id: SessionId) -> list[str]:
        """Unmap every object mapped with `session_id`; their paths."""
        with self._lock:
            gone = [m for (s, _), m in self._maps.items() if s == session_id]
            for mapping in gone:
                del self._maps[(session_id, mapping.path)]
        for mapping in gone:
            self._drop(mapping)
        return [m.path for m in gone]

    def close(self) -> None:
        with self._lock:
            gone = list(self._maps.values())
            self._maps.clear()
        for mapping in gone:
            self._drop(mapping)

    def _drop(self, mapping: ShmMapping) -> None:
        """Close the object now, or when its last user lets it go."""
        with self._lock:
            mapping.unmapped = True
            idle = mapping.users == 0
        if idle:
            self._close(mapping)

    # --- naming ---------------------------------------------------------------------
    def find(
        self, path: str, presented: SessionId | None, owner: SessionId, what: str
    ) -> ShmMapping:
        """The mapping a call's tensor names: in the session the call presents
        (`presented`); for a call that presents none, a by-name mapping of the session of
        the model it runs (`owner`), or of the clients with no session."""
        with self._lock:
            if presented is not None:
                mapping = self._maps.get((presented, path))
            else:
                mapping = self._maps.get((owner, path))
                if mapping is not None and mapping.passed:
                    raise BadInput(
                        f"{what}: shared memory '{path}' of {session_name(owner)} is named "
                        f"only by calls that present it: {PRESENT_SESSION}"
                    )
                if mapping is None:
                    mapping = self._maps.get((NO_SESSION, path))
        if mapping is None:
            whose = session_name(presented if presented is not None else owner)
            raise BadInput(
                f"{what}: shared memory '{path}' is not mapped for {whose} (shm_map it first "
                "in the session this call presents)"
            )
        return mapping

    @contextlib.contextmanager
    def _use(self, mapping: ShmMapping, what: str) -> Iterator[int]:
        """The mapping's fd, held open while in use; BadInput once it was unmapped."""
        with self._lock:
            if mapping.unmapped:
                raise BadInput(f"{what}: shared memory '{mapping.path}' was unmapped")
            mapping.users += 1
        try:
            yield mapping.fd
        finally:
            with self._lock:
                mapping.users -= 1
                close = mapping.unmapped and mapping.users == 0
            if close:
                self._close(mapping)

    # --- tensors --------------------------------------------------------------------
    def size(self, mapping: ShmMapping, what: str) -> int:
        with self._use(mapping, what) as fd:
            return os.fstat(fd).st_size

    def read(self, mapping: ShmMapping, nbytes: int, what: str) -> bytearray:
        """The first `nbytes` of the object; BadInput if it holds fewer."""
        buffer = bytearray(nbytes)
        self.read_into(mapping, memoryview(buffer), what)
        return buffer

    def source(self, mapping: ShmMapping, nbytes: int | None, what: str) -> ShmSource:
        """An input read from `mapping` when the model copies it in: its first `nbytes`
        (None: the whole object, as it is now)."""
        if nbytes is None:
            nbytes = self.size(mapping, what)
        else:
            with self._use(mapping, what):
                pass  # still mapped now: a clean error at once if not
        return ShmSource(self, mapping, nbytes, what)

    def read_into(
        self, mapping: ShmMapping, target: memoryview, what: str, offset: int = 0
    ) -> None:
        """Fill `target` from `offset` in the object; BadInput if it holds fewer bytes.
        A large tensor is read in parts by several threads at once: the kernel's copy out
        of tmpfs runs at a third of memcpy's speed on one core, and reads of one object
        run side by side (writes do not: they take the file's lock)."""
        nbytes = target.nbytes
        with self._use(mapping, what) as fd:
            view = mapping.view
            if view is not None and offset + nbytes <= len(view):
                with memoryview(view) as held:
                    target.cast("B")[:] = held[offset : offset + nbytes]
                return
            got = self._readers.read(fd, target.cast("B"), offset)
        if got < nbytes:
            raise BadInput(
                f"{what}: shared memory '{mapping.path}' holds {offset + got} bytes, the "
                f"tensor takes {nbytes} from offset {offset}"
            )

    def write(
        self, mapping: ShmMapping, data: bytes | memoryview, what: str, offset: int = 0
    ) -> None:
        """Write `data` at `offset` in the object, which must already be large enough
        (writing past its end would grow the client's object)."""
        size = memoryview(data).nbytes
        path = mapping.path
        with self._use(mapping, what) as fd:
            if not mapping.writable:
                raise BadInput(f"{what}: shared memory '{path}' was mapped without PROT_WRITE")
            view = mapping.view
            if view is not None and offset + size <= len(view):
                with memoryview(view) as mapped, memoryview(data) as source:
                    mapped[offset : offset + size] = source.cast("B")
                return
            held = os.fstat(fd).st_size
            if held < offset + size:
                raise BadInput(
                    f"{what}: shared memory '{path}' holds {held} bytes, the tensor takes "
                    f"{size} from offset {offset}"
                )
            written = os.pwritev(fd, [data], offset) if size else 0
        if written != size:
            raise BadInput(f"{what}: wrote {written} of {size} bytes to '{path}'")


def _refused(what: str, path: str, reason: str | None, who: Caller | None) -> InvalidError:
    """The refusal of an object that cannot be opened; `reason` None: one that does not
    exist, that the daemon may not open, or that the caller could not open itself, worded
    alike (the answer does not tell which)."""
    if reason is not None:
        said, remedy = reason, ""
    elif who is None:
        said = "no such object, or the daemon may not open it"
        remedy = (
            "pass the object itself over the daemon's peer socket, or let the daemon's user open it"
        )
    else:
        said = (
            f"no such object, or the daemon may not open it, or {who.describe()} could "
            "not open it itself"
        )
        remedy = "make it an object both you and the daemon's user may open"
    hint = f": {remedy} (docs/wire-api.md, shared memory)" if remedy else ""
    return InvalidError(f"{what}: cannot map '{path}' ({said}){hint}")


def sealed_view(fd: int, writable: bool, size: int) -> mmap.mmap | None:
    """The object's first `size` bytes mapped (shared; writable or not), when it is sealed
    against shrinking: its pages then stay as long as the map, so copies through it never
    fault. None for an unsealed object (any shm_open one), an empty one, or one the kernel
    will not map so (F_SEAL_FUTURE_WRITE on a writable one, say): its tensors go through
    preadv/pwritev."""
    try:
        if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
            return None
        if size == 0:
            return None
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    except OSError:  # not sealable (EINVAL), not mappable so
        return None


PARALLEL_READ_BYTES = 4 << 20  # reads this large are split over the table's readers


def default_read_threads() -> int:
    """Threads one large read is split over when the config names none: the usable
    cores, 2 to 4 (past 4 the kernel's copies gain nothing here)."""
    return max(2, min(4, usable_cpus()))


class _Readers:
    """The table's large reads, each split over `threads` threads at once (the caller's
    and threads of a pool made at the first such read)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def read(self, fd: int, target: memoryview, base: int = 0) -> int:
        """preadv `target` from offset `base`; the bytes read (fewer: the object is
        shorter)."""
        nbytes = target.nbytes
        if nbytes < PARALLEL_READ_BYTES or self.threads == 1:
            return _pread_full(fd, target, 0, nbytes, base) if nbytes else 0
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="shm-read")
            pool = self._pool
        step = -(-nbytes // self.threads)
        offsets = range(0, nbytes, step)
        parts = [pool.submit(_pread_full, fd, target, o, step, base) for o in offsets[1:]]
        counts = [_pread_full(fd, target, 0, step, base)] + [p.result() for p in parts]
        total = 0
        for offset, count in zip(offsets, counts, strict=True):
            if count < min(step, nbytes - offset):  # a short part: the object ends there
                return offset + count
            total += count
        return total


def _pread_full(fd: int, target: memoryview, offset: int, size: int, base: int) -> int:
    return os.preadv(fd, [target[offset : offset + size]], base + offset)


@dataclass(frozen=True)
class ShmSource:
    """A model input in client shared memory (a `model.Source`)."""

    table: ShmTable
    mapping: ShmMapping
    nbytes: int
    what: str

    def read_into(self, target: memoryview) -> None:
        self.table.read_into(self.mapping, target, self.what)


def _plain_name(path: str) -> str:
    """The shm name in `path` (`/name` or `name`); InvalidError for anything else."""
    match = _NAME.fullmatch(path)
    if match is None or match.group(1) in (".", ".."):
        raise InvalidError(
            f"shm_map: '{path}' is not a plain shared memory name ('/name' of letters, digits, "
            "'_', '-' and '.')"
        )
    return match.group(1)
