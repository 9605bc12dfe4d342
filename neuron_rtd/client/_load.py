"""What a load sends: the NEFF's bytes from what the caller gave (a file is mapped, not
read), the request stream that carries them (or names the file, for the daemon to read
itself), and the signature of a model another client loaded, from the daemon's snapshot.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neuron_rtd.client._config import CHUNK_BYTES
from neuron_rtd.client.errors import NrtClientError
from neuron_rtd.errors import NrtError
from neuron_rtd.neff import Neff, TensorSpec, read_neff
from neuron_rtd.neff.dtypes import parse_dtype
from neuron_rtd.proto import pb

NeffSource = bytes | bytearray | memoryview | str | os.PathLike[str] | Neff


def load_requests(
    ncg: int | None,
    session_id: int,
    params: pb.model_params,
    data: memoryview,
    path: str | None,
) -> Iterator[pb.load_request]:
    """The `load` stream: the NCG and session, if any, then the file's path (`path`: the
    daemon reads it) or the NEFF's size, its parameters and its bytes in chunks."""
    if ncg is not None:
        yield pb.load_request(h_eg=pb.h_eg(id=ncg))
    if session_id:
        yield pb.load_request(session_id=session_id)
    if path is not None:
        yield pb.load_request(model_params=params)
        yield pb.load_request(neff_file=path)
        return
    yield pb.load_request(neff_size=data.nbytes)
    yield pb.load_request(model_params=params)
    for i in range(0, data.nbytes, CHUNK_BYTES):
        chunk = bytes(data[i : i + CHUNK_BYTES])
        yield pb.load_request(neff_chunk=pb.file_chunk(chunk=chunk))


def spec_of(tensor: Any, where: str) -> TensorSpec:
    """A TensorSpec from an ext snapshot's `ext_tensor` (-1: an axis of varying size)."""
    shape = tuple(max(size, 0) for size in tensor.shape)
    varying = tuple(axis for axis, size in enumerate(tensor.shape) if size < 0)
    dtype = parse_dtype(tensor.dtype, f"{where} {tensor.name!r}")
    return TensorSpec(tensor.name, dtype, shape, dynamic=varying)


def read_for_load(data: memoryview) -> Neff:
    """The NEFF about to be loaded, read here for the NCs it needs; refused as the
    daemon would refuse it (NrtClientError with its nerr)."""
    try:
        return read_neff(data)
    except NrtError as exc:
        raise NrtClientError(exc.code, str(exc), "load") from None


def neff_source(neff: NeffSource, by_path: bool) -> tuple[memoryview, str | None]:
    """The NEFF's bytes (a file is mapped, not read) and its absolute path, if a file."""
    if isinstance(neff, Neff):
        if by_path:
            raise ValueError("by_path needs the NEFF as a path, not a Neff")
        if neff.buffer is None:
            raise ValueError("this Neff holds no bytes to send (it was not read from any)")
        return neff.buffer, None
    if isinstance(neff, bytes | bytearray | memoryview):
        if by_path:
            raise ValueError("by_path needs the NEFF as a path, not bytes")
        return memoryview(neff).cast("B"), None
    path = str(Path(neff).resolve())
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return memoryview(b""), path
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return memoryview(mapped), path
