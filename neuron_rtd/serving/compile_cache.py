"""The compile cache: NEFFs compiled from a repository's ONNX models
(`neuron_rtd/serving/onnx_models.py`), kept by content in a folder of the daemon's own
(the config's `compile_cache_dir`), so that a restart, or a second daemon on the same
folder, loads the NEFF instead of compiling again.

An entry is `KEY.neff`, KEY the SHA-256 of the ONNX file's bytes, the compile options
the config calls for (served tensors, reshapes, batch buckets) and the compiler's version
(the package's version and a digest of the compiler's and the NEFF writer's sources, so
that a changed compiler never reuses what an older one wrote). An entry is written whole
or not at all (a private temporary file renamed over it), and one daemon compiles a key at
a time (an advisory lock per key: a second daemon waits, then finds the entry). The folder
is the daemon's: made mode 0700, and refused when another user owns it or others may
write in it, since what it holds is loaded as the daemon's own. An entry is read as any
model file is (`read_model_file`, by `versions.read_model`); one that is not a whole NEFF
(cut short by a full disk, edited) is compiled again.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import neuron_rtd
from neuron_rtd.errors import NrtError
from neuron_rtd.neff import HEADER_SIZE
from neuron_rtd.neff.header import parse_header
from neuron_rtd.serving.api import ServingError, Status

CACHE_FORMAT = 1  # bump when what a key covers changes
SUFFIX = ".neff"


@functools.cache
def compiler_version() -> str:
    """The compiler's version as the cache key takes it: the package's version and a
    digest of the sources that decide the NEFF written (the compiler and the NEFF
    package), so that a development tree's edits are a new version too."""
    digest = hashlib.sha256()
    root = Path(neuron_rtd.__file__).parent
    for package in ("compiler", "neff"):
        for path in sorted((root / package).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return f"{neuron_rtd.__version__}+{digest.hexdigest()[:16]}"


def cache_key(model: bytes, options: Mapping[str, object]) -> str:
    """The key of the NEFF compiled from ONNX bytes `model` with `options` (JSON values)."""
    digest = hashlib.sha256()
    head = {"format": CACHE_FORMAT, "compiler": compiler_version(), "options": options}
    digest.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    digest.update(b"\0")
    digest.update(model)
    return digest.hexdigest()


class CompileCache:
    """The cache folder `root`; None: a private temporary folder, made when first needed
    and removed with the cache (nothing outlives the daemon)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()  # guards _temporary (loads of two models at once)

    def folder(self) -> Path:
        """The cache folder, made if absent; ServingError when it is not the daemon's own."""
        if self.root is None:
            with self._lock:
                if self._temporary is None:
                    self._temporary = tempfile.TemporaryDirectory(prefix="nrt-compile-cache-")
                return Path(self._temporary.name)
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(self.root)
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from None
        if not stat.S_ISDIR(info.st_mode):
            raise self._unusable("it is not a folder (a symbolic link is not followed)")
        if info.st_uid != os.geteuid():
            raise self._unusable(f"it is owned by uid {info.st_uid}, not the daemon's user")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise self._unusable(
                f"others may write in it (mode {stat.S_IMODE(info.st_mode):04o}): "
                "chmod go-w it, or name another folder"
            )
        return self.root

    def _unusable(self, why: str) -> ServingError:
        return ServingError(
            Status.UNAVAILABLE,
            f"the compile cache folder {self.root} cannot be used: {why}; what it holds is "
            "loaded as the daemon's own, so it must be a folder of the daemon's user that "
            "no one else may write in (the config's compile_cache_dir, --compile-cache)",
        )

    def entry(self, key: str) -> Path:
        return self.folder() / f"{key}{SUFFIX}"

    def find(self, key: str) -> Path | None:
        """The entry of `key` when the cache holds it whole."""
        path = self.entry(key)
        return path if _whole(path) else None

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> tuple[Path, bool]:
        """The entry of `key`: found, or `build()`'s bytes written there (True: built now).
        One daemon builds a key at a time; the others wait for it and then find it."""
        found = self.find(key)
        if found is not None:
            return found, False
        folder = self.folder()
        with _locked(folder / f".{key}.lock"):
            found = self.find(key)  # built by another while this one waited
            if found is not None:
                return found, False
            data = build()
            path = self.entry(key)
            _write_whole(folder, path, data)
        return path, True

    def close(self) -> None:
        with self._lock:
            if self._temporary is not None:
                self._temporary.cleanup()
                self._temporary = None


def _whole(path: Path) -> bool:
    """Whether `path` is a regular file of the daemon's user holding a whole NEFF (its
    header's data size is the rest of the file). Its contents are checked again as any
    model file's when it is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if info.st_size < HEADER_SIZE:
            return False
        header = parse_header(os.pread(fd, HEADER_SIZE, 0))
        return bool(header.data_size == info.st_size - HEADER_SIZE)
    except (OSError, NrtError):
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on file `path` (made if absent), held for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_whole(folder: Path, path: Path, data: bytes) -> None:
    """`data` as file `path`, whole or not at all: written to a private temporary file in
    the same folder, synced, and renamed over it."""
    fd, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
