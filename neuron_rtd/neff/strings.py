"""String tensors (`string` in a NEFF, BYTES in the v2 protocol) as bytes, and as the
arrays the runtime holds.

A string tensor is a numpy object array. Its elements vary in length, so its bytes are
not `itemsize * size`: wherever it travels as bytes (a raw tensor on either KServe wire,
shared memory, the nmgr wire) it takes Triton's encoding, `encode`: each element, in
row-major order, as a 4-byte little-endian length and then that many bytes. `decode`
reads it back, and every malformed encoding (a length cut short, a length past the end,
more or fewer elements than the shape takes, bytes left over) is `BadInput` saying which
element and how, before anything is run.

Callers give and get elements as `bytes` (tritonclient's convention). In a model's slot
they are `str`, what onnxruntime takes and gives (ONNX strings are UTF-8): `as_text` makes
an input so (an element that is not UTF-8 is `BadInput`), `as_bytes` makes an output back.
"""

from __future__ import annotations

import struct

import numpy as np

from neuron_rtd.errors import BadInput

_LENGTH = struct.Struct("<I")
LENGTH_BYTES = _LENGTH.size  # each element's length prefix


def _element_bytes(item: object) -> bytes:
    """An element as bytes: bytes as they are, anything else as its text in UTF-8 (as
    tritonclient's `serialize_byte_tensor` takes a non-bytes element)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    return str(item).encode("utf-8", "surrogateescape")


def encode(array: np.ndarray) -> bytes:
    """Triton's encoding of string tensor `array` (elements in row-major order)."""
    parts: list[bytes] = []
    put = parts.append
    pack = _LENGTH.pack
    for item in np.asarray(array, dtype=object).reshape(-1):
        data = _element_bytes(item)
        put(pack(len(data)))
        put(data)
    return b"".join(parts)


def decode(
    data: bytes | bytearray | memoryview,
    what: str,
    count: int | None = None,
    most: int | None = None,
) -> np.ndarray:
    """The elements (bytes) `data` encodes, as a flat object array: exactly `count` of
    them when it is given, else as many as `data` holds, at most `most`. `what` names the
    tensor in the messages."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    end = view.nbytes
    room = end // LENGTH_BYTES  # the most elements `data` could hold
    if count is not None and count > room:
        raise BadInput(
            f"{what}: its shape takes {count} string elements, and its {end} bytes hold at "
            f"most {room} ({LENGTH_BYTES} bytes of length before each element)"
        )
    limit = count if count is not None else most
    items = np.empty(min(room, limit) if limit is not None else room, dtype=object)
    taken = 0
    at = 0
    unpack = _LENGTH.unpack_from
    while at < end:
        if limit is not None and taken == limit:
            said = f"its shape takes {count}" if count is not None else f"it takes at most {most}"
            raise BadInput(
                f"{what}: {_bytes(end - at)} past its string element {taken - 1}, the last: "
                f"{said} (each element a {LENGTH_BYTES}-byte little-endian length, then its "
                "bytes)"
            )
        if end - at < LENGTH_BYTES:
            raise BadInput(
                f"{what}: string element {taken}'s {LENGTH_BYTES}-byte length is cut short: "
                f"{_bytes(end - at)} left at byte {at}"
            )
        (length,) = unpack(view, at)
        at += LENGTH_BYTES
        if length > end - at:
            raise BadInput(
                f"{what}: string element {taken} declares {length} bytes at byte "
                f"{at - LENGTH_BYTES}, and only {end - at} are left"
            )
        items[taken] = view[at : at + length].tobytes()
        at += length
        taken += 1
    if count is not None and taken != count:
        raise BadInput(
            f"{what}: holds {taken} string elements ({end} bytes), and its shape takes {count}"
        )
    return items[:taken]


def _bytes(count: int) -> str:
    return f"{count} byte" if count == 1 else f"{count} bytes"


def as_text(array: np.ndarray, what: str) -> np.ndarray:
    """String tensor `array` (object, or numpy's bytes or str arrays) as the runtime holds
    it: an object array of `str`, of the same shape. BadInput for an element that is not
    UTF-8 or not a string at all."""
    source = np.asarray(array)
    if source.dtype.kind not in "OSU":
        raise BadInput(f"{what} is {source.dtype}: the model takes strings")
    text = np.empty(source.shape, dtype=object)
    flat = text.reshape(-1)
    for index, item in enumerate(source.reshape(-1)):
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise BadInput(
                        f"{what}: string element {index} is no UTF-8 text ({exc.reason} at "
                        f"character {exc.start})"
                    ) from None
            flat[index] = str(item)
        elif isinstance(item, bytes | bytearray | memoryview):
            try:
                flat[index] = bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadInput(
                    f"{what}: string element {index} is not UTF-8 ({exc.reason} at byte "
                    f"{exc.start}): a model's strings are UTF-8 text, as ONNX's are"
                ) from None
        else:
            raise BadInput(
                f"{what}: element {index} is {type(item).__name__}, not a string (bytes or str)"
            )
    return text


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A string tensor the runtime holds (elements `str`) as callers get it: an object array
    of `bytes` (UTF-8), of the same shape, a copy of its own."""
    source = np.asarray(array, dtype=object)
    out = np.empty(source.shape, dtype=object)
    flat = out.reshape(-1)
    for index, item in enumerate(source.reshape(-1)):
        flat[index] = _element_bytes(item)
    return out
