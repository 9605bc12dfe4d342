"""The byte format the request harness reads, and writes for its seeds: a sequence of
calls, each `[method index: u8][length: u32 le][body]`; a unary call's body is one
serialized request, a streaming call's body is again `[length: u32 le][message]...`.
A length past the end means "the rest"."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

_LEN = struct.Struct("<I")


def split(data: bytes) -> Iterator[bytes]:
    """The length-prefixed parts of `data`."""
    at = 0
    while at + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, at)
        at += _LEN.size
        yield data[at : at + n]
        at += n


def calls(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The (method index, body) pairs of `data`."""
    at = 0
    while at < len(data):
        method = data[at]
        body = next(split(data[at + 1 :]), b"")
        yield method, body
        at += 1 + _LEN.size + len(body)


def join(parts: Sequence[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def call(method: int, body: bytes) -> bytes:
    return bytes([method]) + join([body])
