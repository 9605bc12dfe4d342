"""TFRecord files: records framed as the format defines them, every CRC checked.

A record on disk is

    uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes
    | length bytes of data        | uint32 masked CRC32C of the data

where a masked CRC is the CRC32C rotated right by 15 bits plus 0xa282ead8 (mod 2**32).
Files may be compressed whole with GZIP or ZLIB (`compression`, or guessed from the name:
.gz, .zz/.zlib). A corrupt record (a CRC that does not match, a frame cut short) is never
passed on silently: under `on_corrupt="fail"` it raises CorruptRecord naming the file and
offset; under "skip" it is counted in `ReadStats` and logged, and reading goes on (after a
bad length, by finding the next frame whose length CRC holds). A record longer than
`max_record_bytes` (256 MiB unless told) is refused from its header, before any of it is
read (RecordTooLarge, in either mode); one within it is read, and its CRC summed, a chunk
at a time, so that a frame claiming more than the stream holds costs only what it holds.
Offsets are those of the
uncompressed stream, so that an index of them (`build_index`, or the `.index` file the
`tfrecord` package's tfrecord2idx writes: "offset length" per line) serves to resume and to
shard.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, Literal

import crc32c

log = logging.getLogger("neuron_rtd.stream")

Compression = Literal["none", "gzip", "zlib"]
OnCorrupt = Literal["fail", "skip"]

_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")  # masked CRC of the data
_MASK_DELTA = 0xA282EAD8
MAX_RECORD_BYTES = 256 << 20  # the default limit of one record's length
_CHUNK = 1 << 20  # a record's data is read (and its CRC summed) this much at a time


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    return _mask(crc32c.crc32c(data))


class CorruptRecord(Exception):
    """A record whose frame or CRC is wrong, at `offset` of `path`."""

    def __init__(self, path: str, offset: int, why: str) -> None:
        self.path = path
        self.offset = offset
        self.why = why
        super().__init__(f"{path}: corrupt record at offset {offset}: {why}")


class RecordTooLarge(Exception):
    """A record whose header says it is longer than the limit: refused unread."""

    def __init__(self, path: str, offset: int, length: int, limit: int) -> None:
        self.path = path
        self.offset = offset
        self.length = length
        self.limit = limit
        super().__init__(
            f"{path}: the record at offset {offset} is {length} bytes ({_mib(length)}), "
            f"over the limit of {_mib(limit)}: refused unread"
        )


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.{0 if count % (1 << 20) == 0 else 1}f} MiB"


@dataclass(frozen=True)
class Record:
    data: bytes
    path: str
    offset: int  # of its frame, in the uncompressed stream

    @property
    def key(self) -> str:
        """Where it came from, as output records name their input: `path@offset`."""
        return f"{self.path}@{self.offset}"


@dataclass
class ReadStats:
    records: int = 0
    bytes: int = 0  # of record data
    skipped: int = 0  # corrupt records passed over under on_corrupt="skip"
    corrupt: list[tuple[str, int, str]] = field(default_factory=list)  # (path, offset, why)


def guess_compression(name: str) -> Compression:
    lowered = name.lower()
    if lowered.endswith(".gz") or lowered.endswith(".gzip"):
        return "gzip"
    if lowered.endswith(".zz") or lowered.endswith(".zlib"):
        return "zlib"
    return "none"


class _Zlib(io.RawIOBase):
    """A readable stream of a zlib-compressed one."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj()
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            if self._inflate.eof:
                return 0
            chunk = self._raw.read(1 << 16)
            if not chunk:
                self._pending = self._inflate.flush()
                if not self._pending and not self._inflate.eof:
                    raise EOFError("the zlib stream ends before its end marker")
                break
            self._pending = self._inflate.decompress(chunk)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def open_stream(raw: IO[bytes], compression: Compression) -> BinaryIO:
    """The uncompressed bytes of `raw`, buffered."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == "zlib":
        return io.BufferedReader(_Zlib(raw), 1 << 16)
    return raw  # type: ignore[return-value]


class _Broken(Exception):
    """A compressed stream that cannot be read on (its data, or its end, is corrupt)."""


class _Cursor:
    """Reads `count` bytes at a time from a stream, remembering the offset."""

    def __init__(self, stream: BinaryIO, offset: int = 0) -> None:
        self.stream = stream
        self.offset = offset
        self._back = b""  # bytes given back by a resync

    def read(self, count: int) -> bytes:
        if not self._back:  # the usual case: straight from the stream
            data = self._read(count)
            self.offset += len(data)
            return data
        data = self._back[:count]
        self._back = self._back[count:]
        if len(data) < count:
            data += self._read(count - len(data))
        self.offset += len(data)
        return data

    def _read(self, count: int) -> bytes:
        try:
            return self.stream.read(count)
        except (zlib.error, EOFError, gzip.BadGzipFile) as exc:  # compressed data
            raise _Broken(str(exc)) from None

    def unread(self, data: bytes) -> None:
        self._back = data + self._back
        self.offset -= len(data)


def read_records(
    stream: BinaryIO,
    path: str,
    *,
    on_corrupt: OnCorrupt = "fail",
    stats: ReadStats | None = None,
    start: int = 0,
    read_to_start: bool = False,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Record]:
    """The records of an uncompressed TFRecord `stream`, positioned at offset `start` (or
    with `read_to_start`, at 0 and read up to it: a decompressed stream cannot seek); one
    longer than `max_record_bytes` is RecordTooLarge."""
    stats = stats if stats is not None else ReadStats()
    cursor = _Cursor(stream, 0 if read_to_start else start)

    def corrupt(offset: int, why: str) -> None:
        if on_corrupt == "fail":
            raise CorruptRecord(path, offset, why)
        stats.skipped += 1
        stats.corrupt.append((path, offset, why))
        log.warning("%s: skipped a corrupt record at offset %d: %s", path, offset, why)

    offset = cursor.offset
    try:
        while offset < start and cursor.read(min(start - offset, 1 << 20)):
            offset = cursor.offset
        while True:
            offset = cursor.offset
            header = cursor.read(_HEADER.size)
            if not header:
                return
            if len(header) < _HEADER.size:
                corrupt(
                    offset, f"the file ends inside a record's header ({len(header)} of 12 bytes)"
                )
                return
            length, length_crc = _HEADER.unpack(header)
            if masked_crc(header[:8]) != length_crc:
                corrupt(offset, "the length's CRC does not match")
                # skip: look for the next frame whose length CRC holds, one byte further on
                cursor.unread(header[1:])
                if not _resync(cursor, max_record_bytes):
                    return
                continue
            if length > max_record_bytes:
                raise RecordTooLarge(path, offset, length, max_record_bytes)
            data, crc = _read_data(cursor, length)
            footer = cursor.read(_FOOTER.size)
            if len(data) < length or len(footer) < _FOOTER.size:
                corrupt(offset, f"the file ends inside a record of {length} bytes")
                return
            if _mask(crc) != _FOOTER.unpack(footer)[0]:
                corrupt(offset, "the data's CRC does not match")
                continue
            stats.records += 1
            stats.bytes += length
            yield Record(data, path, offset)
    except _Broken as exc:  # nothing past it can be read
        corrupt(offset, f"the compressed stream is corrupt ({exc}); the rest of the file is lost")


def _read_data(cursor: _Cursor, length: int) -> tuple[bytes, int]:
    """Up to `length` bytes (fewer: the stream ended) and their CRC32C, read and summed a
    chunk at a time: what is held is what the stream gave, never what the header claims."""
    if length <= _CHUNK:
        data = cursor.read(length)
        return data, crc32c.crc32c(data)
    chunks: list[bytes] = []
    crc = 0
    left = length
    while left:
        chunk = cursor.read(min(left, _CHUNK))
        if not chunk:
            break
        crc = crc32c.crc32c(chunk, crc)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks), crc


def _resync(cursor: _Cursor, max_record_bytes: int) -> bool:
    """Advance `cursor` to the next offset that starts a plausible frame header; False at
    the end of the stream."""
    window = cursor.read(_HEADER.size)
    while len(window) == _HEADER.size:
        length, length_crc = _HEADER.unpack(window)
        if length <= max_record_bytes and masked_crc(window[:8]) == length_crc:
            cursor.unread(window)
            return True
        window = window[1:] + cursor.read(1)
    return False


def read_file(
    path: str | Path,
    *,
    compression: Compression | None = None,
    on_corrupt: OnCorrupt = "fail",
    stats: ReadStats | None = None,
    start: int = 0,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Record]:
    """The records of a local TFRecord file, from uncompressed offset `start` on."""
    name = str(path)
    with open(name, "rb") as raw:
        kind = compression or guess_compression(name)
        yield from read_raw(
            raw,
            name,
            kind,
            on_corrupt=on_corrupt,
            stats=stats,
            start=start,
            max_record_bytes=max_record_bytes,
        )


def read_raw(
    raw: IO[bytes],
    path: str,
    compression: Compression,
    *,
    on_corrupt: OnCorrupt = "fail",
    stats: ReadStats | None = None,
    start: int = 0,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Record]:
    """The records of a TFRecord file opened as `raw` (named `path` in what is said of
    them), compressed or not, from uncompressed offset `start` on."""
    stream = open_stream(raw, compression)
    compressed = compression != "none"
    if start and not compressed:
        stream.seek(start)
    yield from read_records(
        stream,
        path,
        on_corrupt=on_corrupt,
        stats=stats,
        start=start,
        read_to_start=compressed,
        max_record_bytes=max_record_bytes,
    )


def frame(data: bytes) -> bytes:
    """One record's bytes on disk."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))


class Writer:
    """Writes records to a TFRecord file (GZIP when the name ends in .gz): `file`, opened
    already (and closed by `close`), or else `path` opened."""

    def __init__(self, path: str | Path, file: IO[bytes] | None = None) -> None:
        self.path = str(path)
        raw = file if file is not None else open(self.path, "wb")  # noqa: SIM115 - close()
        self._file: IO[bytes] = raw
        if guess_compression(self.path) == "gzip":
            self._file = gzip.GzipFile(fileobj=raw, mode="wb")  # type: ignore[assignment]
        self._raw = raw
        self.records = 0

    def write(self, data: bytes) -> None:
        self._file.write(frame(data))
        self.records += 1

    def close(self) -> None:
        self._file.close()
        if self._raw is not self._file:
            self._raw.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_index(
    path: str | Path, *, compression: Compression | None = None
) -> list[tuple[int, int]]:
    """(offset, frame length) of every record of a file, corrupt ones failing."""
    return [
        (record.offset, _HEADER.size + len(record.data) + _FOOTER.size)
        for record in read_file(path, compression=compression)
    ]


def is_whole(path: str | Path) -> bool:
    """Whether an uncompressed TFRecord file is whole as far as its frames tell, its data
    unread: each length's CRC holds and the last frame ends where the file does (a file
    cut short, or padded, is not). A cheap look: a seek and 12 bytes a record."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        offset = 0
        while offset < size:
            file.seek(offset)
            header = file.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return False
            length, length_crc = _HEADER.unpack(header)
            if masked_crc(header[:8]) != length_crc:
                return False
            offset += _HEADER.size + length + _FOOTER.size
        return offset == size


def read_index(path: str | Path) -> list[tuple[int, int]]:
    """An `.index` file: one "offset length" line per record (tfrecord2idx's format)."""
    entries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            offset, length = int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{number}: expected 'offset length', got {line!r}") from None
        entries.append((offset, length))
    return entries
