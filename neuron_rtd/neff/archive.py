"""The tar archive inside a NEFF: zero-copy reading and deterministic writing.

Reading never copies member data: each member comes back as a memoryview slice of the
archive buffer (tarfile tells where each member's data starts), so weights can be numpy
views straight into the NEFF buffer or its mmap.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from neuron_rtd.errors import NeffInvalid

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
GZIP_LEVEL = 6


class _BufferFile(io.RawIOBase):
    """A seekable read-only file over a memoryview, so tarfile reads headers without the
    whole buffer being copied into a BytesIO."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__()
        self._buffer = buffer
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._buffer)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, target: WriteableBuffer) -> int:
        out = memoryview(target).cast("B")
        chunk = self._buffer[self._pos : self._pos + len(out)]
        out[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def gunzip(data: memoryview) -> bytes:
    """The decompressed data; NeffInvalid if it is not a valid gzip stream."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise NeffInvalid(f"NEFF data is flagged gzip but does not decompress: {exc}") from None


def unpack_members(archive: memoryview) -> dict[str, memoryview]:
    """Every regular file of the tar `archive`, by name, as a slice of `archive`."""
    try:
        with tarfile.open(fileobj=_BufferFile(archive), mode="r:") as tar:
            infos = tar.getmembers()
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise NeffInvalid(f"NEFF data is not a valid tar archive: {exc}") from None
    members: dict[str, memoryview] = {}
    for info in infos:
        if info.type not in _REGULAR:
            continue
        if info.name in members:
            raise NeffInvalid(f"NEFF archive holds {info.name!r} more than once")
        members[info.name] = _member_data(archive, info)
    return members


def _member_data(archive: memoryview, info: tarfile.TarInfo) -> memoryview:
    end = info.offset_data + info.size
    if end > len(archive):
        raise NeffInvalid(
            f"NEFF archive member {info.name!r} is truncated: its data ends at byte {end}, "
            f"the archive has {len(archive)}"
        )
    return archive[info.offset_data : end]


def pack_members(members: Mapping[str, bytes]) -> bytes:
    """A tar of `members`, sorted by name, with fixed times, owners and modes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            data = members[name]
            tar.addfile(_fixed_info(name, len(data)), io.BytesIO(data))
    return out.getvalue()


def _fixed_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def compress(data: bytes) -> bytes:
    """gzip with mtime 0 and no file name, so equal input gives equal output."""
    return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
