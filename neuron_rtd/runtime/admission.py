"""NEFFs coming in: the memory a load may take, and the files a `neff_file` load may read.

A NEFF's buffer is admitted only while half the memory this process may still take (the
host's available memory, or less under a cgroup limit), less what loads in progress were
admitted, holds it; it is reserved from then until its load is over (`settle`), so loads
at once cannot pass the bound together. Its memory is an anonymous mapping, taken as it is
written: a size claimed and never sent costs nothing.

A `neff_file` is read with the daemon's own rights, only from `neff_file_dirs` (symbolic
links resolved first), header first (`neff.read_neff_file`); a file that does not exist and
one the daemon may not read get the same answer.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref

from neuron_rtd.errors import InvalidError, ResourceError
from neuron_rtd.neff import Neff, read_neff, read_neff_file
from neuron_rtd.runtime.api import NeffFile
from neuron_rtd.runtime.driver import available_memory

NeffSource = Neff | bytes | bytearray | memoryview | NeffFile  # parsed, its bytes, or a file
_HIDDEN = (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ELOOP)  # told apart for nobody


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
            raise InvalidError(f"neff_file {path!r} holds a NUL byte: give a file's path")
        if not os.path.isabs(path):
            raise InvalidError(f"neff_file '{path}' must be an absolute path")
        folders = self.neff_file_dirs
        real = os.path.realpath(path)
        if not any(_within(real, folder) for folder in folders):
            raise InvalidError(
                f"neff_file '{path}' is outside the folders this daemon loads NEFF files "
                f"from ({', '.join(folders) or 'none'}): stream the NEFF instead, or add "
                "its folder to neff_file_dirs in the daemon's config"
            )
        try:
            return read_neff_file(real, into=self.buffer)
        except OSError as exc:
            reason = (
                "no such file, or the daemon may not read it"
                if exc.errno in _HIDDEN
                else exc.strerror
            )
            raise InvalidError(
                f"cannot read neff_file '{path}' ({reason}): the daemon reads it with its own "
                "rights; make it readable to the daemon's user in one of neff_file_dirs, or "
                "stream the NEFF instead"
            ) from None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
