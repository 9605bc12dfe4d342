"""NEFFs coming in: the memory a load may take, and the files a `neff_file` load may read.

A NEFF's buffer is admitted only while half the memory this process may still take (the
host's available memory, or less under a cgroup limit), less what loads in progress were
admitted, holds it; it is reserved from then until its load is over (`settle`), so loads
at once cannot pass the bound together. Its memory is an anonymous mapping, taken as it is
written: a size claimed and never sent costs nothing.

Every model file the daemon reads itself (a `neff_file`, and the serving core's: a
repository version's file, a load's uploaded one) is read by one reader,
`read_model_file`: with the daemon's own rights, only from within the folders it is given
(`neff_file_dirs`; a model's version folder), symbolic links resolved first and none
followed at the open; opened non-blocking, and read only when it is a regular file (a
FIFO, a device, a socket or a folder is refused at once, a device never opened); its
header first, the size it declares checked against the file's, and its memory admitted
as a streamed NEFF's, before any of its body is read. A file that does not exist and one
the daemon may not read get the same answer.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import weakref
from collections.abc import Callable, Sequence

from neuron_rtd.errors import InvalidError, ModelFileRefused, NeffInvalid, ResourceError, shown
from neuron_rtd.neff import HEADER_SIZE, Neff, read_neff
from neuron_rtd.neff.header import parse_header
from neuron_rtd.runtime.access import HIDDEN_ERRNOS
from neuron_rtd.runtime.api import NeffFile
from neuron_rtd.runtime.driver import available_memory

NeffSource = Neff | bytes | bytearray | memoryview | NeffFile  # parsed, its bytes, or a file
UNREADABLE = "no such file, or the daemon may not read it"


class NeffAdmission:
    def __init__(self, neff_file_dirs: tuple[str, ...]) -> None:
        self.neff_file_dirs = neff_file_dirs
        self.reserved = 0  # bytes admitted to loads not yet over
        self._reservations: dict[int, weakref.finalize] = {}
        self._lock = threading.Lock()

    def buffer(self, size: int) -> memoryview:
        """A buffer for a NEFF of `size` bytes, reserved until `settle` (or until it is
        dropped); ResourceError when it is not admitted."""
        with self._lock:
            available = available_memory()
            if size > available // 2 - self.reserved:
                raise ResourceError(
                    f"a NEFF of {size} bytes is more than the host can hold now "
                    f"({available} bytes available, {self.reserved} taken by loads in "
                    "progress): load it when memory is free, or a smaller NEFF"
                )
            if not size:
                return memoryview(bytearray())
            self.reserved += size
            mapping = mmap.mmap(-1, size)
            self._reservations[id(mapping)] = weakref.finalize(mapping, self._unreserve, size)
        return memoryview(mapping)

    def _unreserve(self, size: int) -> None:
        with self._lock:
            self.reserved -= size

    def settle(self, buffer: memoryview | None) -> None:
        """The load that took `buffer` is over: its memory is the model's now, or free."""
        if buffer is not None:
            with self._lock:
                finalizer = self._reservations.pop(id(buffer.obj), None)
            if finalizer is not None:
                finalizer()

    def read(self, neff: NeffSource) -> Neff:
        """`neff` parsed: as it is, from its bytes, or from the file it names."""
        if isinstance(neff, Neff):
            return neff
        if not isinstance(neff, NeffFile):
            return read_neff(neff)
        path = neff.path
        if "\0" in path:
            raise InvalidError(f"neff_file {shown(path)!r} holds a NUL byte: give a file's path")
        if not os.path.isabs(path):
            raise InvalidError(f"neff_file '{shown(path)}' must be an absolute path")
        folders = self.neff_file_dirs
        try:
            return read_model_file(path, folders, into=self.buffer)
        except ModelFileRefused as exc:
            if exc.outside:
                raise InvalidError(
                    f"neff_file '{shown(path)}' is outside the folders this daemon loads NEFF "
                    f"files from ({', '.join(folders) or 'none'}): stream the NEFF instead, "
                    "or add its folder to neff_file_dirs in the daemon's config"
                ) from None
            raise InvalidError(
                f"cannot read neff_file '{shown(path)}' ({exc.reason}): the daemon reads it "
                "with its own rights; make it a regular file readable to the daemon's user in "
                "one of neff_file_dirs, or stream the NEFF instead"
            ) from None


def _refused(name: str, reason: str, *, outside: bool = False) -> ModelFileRefused:
    return ModelFileRefused(
        f"cannot read '{shown(name)}': {reason}", reason=reason, outside=outside
    )


def read_model_file(
    path: str | os.PathLike[str],
    folders: Sequence[str | os.PathLike[str]],
    *,
    into: Callable[[int], memoryview],
) -> Neff:
    """The NEFF in file `path`, read only from within one of `folders` (its real path, every
    symbolic link resolved, inside one of theirs), as data: opened non-blocking, never
    following a link, and read only when it is a regular file whose size is the one its
    header declares, into the buffer `into(size)` gives (which refuses what it will not
    admit: `NeffAdmission.buffer`, `Runtime.neff_buffer`).

    ModelFileRefused when the file is not read (missing and unreadable worded alike);
    NeffInvalid (or UnsupportedVersion) when what it holds is not a NEFF this runtime reads;
    whatever `into` raises."""
    name = os.fspath(path)
    if "\0" in name:
        raise _refused(name, "its path holds a NUL byte")
    real = os.path.realpath(name)
    roots = [os.path.realpath(os.fspath(folder)) for folder in folders]
    root = next((r for r in roots if _within(real, r)), None)
    if root is None:
        shown_roots = ", ".join(roots) or "none"
        raise _refused(
            name, f"it is outside the folders it may be read from ({shown_roots})", outside=True
        )
    fd = _open_beneath(name, root, real)
    try:
        opened = os.fstat(fd)
        _check_regular(name, opened.st_mode)  # swapped since it was looked at
        size = opened.st_size
        if size < HEADER_SIZE:
            raise NeffInvalid(
                f"'{shown(name)}' is not a NEFF: it is shorter than a NEFF header "
                f"({HEADER_SIZE} bytes)"
            )
        header = parse_header(_pread_exactly(fd, HEADER_SIZE, name))
        if header.data_size != size - HEADER_SIZE:
            said = "NEFF is truncated" if header.data_size > size - HEADER_SIZE else "too long"
            raise NeffInvalid(
                f"'{shown(name)}' is not a whole NEFF ({said}): its header declares "
                f"{header.data_size} data bytes, the file holds {size - HEADER_SIZE}"
            )
        data = into(size)
        _read_exactly(fd, data, name)
    except OSError as exc:
        raise _refused(name, _why(exc)) from None
    finally:
        os.close(fd)
    return read_neff(data)


def _open_beneath(name: str, root: str, real: str) -> int:
    """File `real` opened from folder `root` one component at a time, following no
    symbolic link (one put in since `realpath` looked is refused), and only when it is a
    regular file: a device is refused before it is opened."""
    *folders, last = os.path.relpath(real, root).split("/")
    walk = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        at = os.open(root, walk)
    except OSError as exc:
        raise _refused(name, _why(exc)) from None
    try:
        for folder in folders:
            step = os.open(folder, walk | os.O_NOFOLLOW, dir_fd=at)
            os.close(at)
            at = step
        _check_regular(name, os.stat(last, dir_fd=at, follow_symlinks=False).st_mode)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
        return os.open(last, flags, dir_fd=at)
    except OSError as exc:
        raise _refused(name, _why(exc)) from None
    finally:
        os.close(at)


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _check_regular(name: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((what for test, what in _KINDS if test(mode)), "not a file")
        raise _refused(
            name, f"it is {kind}, not a regular file: a model file must be a regular file"
        )


def _pread_exactly(fd: int, size: int, name: str) -> bytes:
    head = os.pread(fd, size, 0)
    if len(head) < size:
        raise NeffInvalid(f"'{shown(name)}' shrank while it was being read")
    return head


def _read_exactly(fd: int, target: memoryview, name: str) -> None:
    done = 0
    while done < len(target):
        got = os.preadv(fd, [target[done:]], done)
        if got == 0:
            raise NeffInvalid(f"'{shown(name)}' shrank while it was being read")
        done += got


def _why(exc: OSError) -> str:
    if exc.errno in HIDDEN_ERRNOS:
        return UNREADABLE
    return (exc.strerror or str(exc)).lower()


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
