"""The tar archive inside a NEFF: zero-copy reading and deterministic writing.

Reading never copies member data: each member comes back as a memoryview slice of the
archive buffer (tarfile tells where each member's data starts), so weights can be numpy
views straight into the NEFF buffer or its mmap. Nothing is ever written out.

A NEFF is untrusted input. Its archive may hold regular files (and folders, which are
skipped) under relative names only: a link, device, FIFO or any other member type, a name
that is absolute or climbs with `..`, more than `MAX_MEMBERS` members, or a member whose
data would lie past the archive's end is refused; gzip data is decompressed in bounded
steps and refused once it passes the caller's limit (a decompression bomb allocates no
more than that).
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from neuron_rtd.errors import NeffInvalid

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
_FOLDER = (tarfile.DIRTYPE,)
GZIP_LEVEL = 6
MAX_MEMBERS = 65536  # a NEFF holds a graph and a few files per node
_GUNZIP_STEP = 16 << 20


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


def gunzip(data: memoryview, limit: int) -> bytes:
    """The decompressed data; NeffInvalid if it is not one valid gzip stream or would
    take more than `limit` bytes (decompressed in steps, so never more is allocated)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
    out = bytearray()
    pending = data
    try:
        while True:
            step = inflater.decompress(pending, _GUNZIP_STEP)
            out += step
            if len(out) > limit:
                raise NeffInvalid(
                    f"NEFF data decompresses to more than {limit} bytes, the most this "
                    "host takes now"
                )
            pending = memoryview(inflater.unconsumed_tail)
            if inflater.eof or (not pending and len(step) < _GUNZIP_STEP):
                break
    except zlib.error as exc:
        raise NeffInvalid(f"NEFF data is flagged gzip but does not decompress: {exc}") from None
    if not inflater.eof:
        raise NeffInvalid("NEFF data is flagged gzip but its stream is truncated")
    if inflater.unused_data:
        raise NeffInvalid("NEFF data is flagged gzip but has bytes after its gzip stream")
    return bytes(out)


def unpack_members(archive: memoryview) -> dict[str, memoryview]:
    """Every regular file of the tar `archive`, by name, as a slice of `archive`."""
    infos: list[tarfile.TarInfo] = []
    try:
        with tarfile.open(fileobj=_BufferFile(archive), mode="r:") as tar:
            for info in tar:  # one at a time: a bad member stops the walk at once
                _check_member(info)
                infos.append(info)
                if len(infos) > MAX_MEMBERS:
                    raise NeffInvalid(f"NEFF archive holds more than {MAX_MEMBERS} members")
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise NeffInvalid(f"NEFF data is not a valid tar archive: {exc}") from None
    members: dict[str, memoryview] = {}
    for info in infos:
        if info.type in _FOLDER:
            continue
        if info.name in members:
            raise NeffInvalid(f"NEFF archive holds {info.name!r} more than once")
        members[info.name] = _member_data(archive, info)
    return members


def _check_member(info: tarfile.TarInfo) -> None:
    name = info.name
    if info.type not in _REGULAR + _FOLDER:
        kind = _KINDS.get(info.type, f"type {info.type!r}")
        raise NeffInvalid(f"NEFF archive member {name!r} is a {kind}: only files are allowed")
    if name.startswith("/") or ".." in name.split("/"):
        raise NeffInvalid(f"NEFF archive member {name!r} is not a plain relative name")


_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.CONTTYPE: "contiguous file",
}


def _member_data(archive: memoryview, info: tarfile.TarInfo) -> memoryview:
    end = info.offset_data + info.size
    if end > len(archive):
        raise NeffInvalid(
            f"NEFF archive member {info.name!r} is truncated: its data ends at byte {end}, "
            f"the archive has {len(archive)}"
        )
    return archive[info.offset_data : end]


def pack_members(members: Mapping[str, bytes], *, extra: Sequence[tarfile.TarInfo] = ()) -> bytes:
    """A tar of `members`, sorted by name, with fixed times, owners and modes; then the
    `extra` members as they are (data of their size), which tests and fuzz seeds use to
    build the archives a reader must refuse."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            data = members[name]
            tar.addfile(_fixed_info(name, len(data)), io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.size else None)
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
