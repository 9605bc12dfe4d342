"""A `load` request stream read into one load: the NCG, session and model parameters, and
the NEFF by chunks into a buffer the runtime admits, or by an absolute file path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from neuron_rtd.errors import InvalidError
from neuron_rtd.proto import pb
from neuron_rtd.runtime import NeffFile


@dataclass(frozen=True)
class LoadRequest:
    neff: memoryview | NeffFile
    ncg_id: int | None
    session_id: int
    timeout_s: float | None
    ninfer: int | None
    profile: bool = False  # model_params.enable_node_profiling


def _until_broken(requests: Iterator[pb.load_request]) -> Iterator[pb.load_request]:
    """The stream's messages; InvalidError if it breaks off (the client went away)."""
    try:
        yield from requests
    except grpc.RpcError:
        raise InvalidError(
            "the load stream broke off before its end (the client went away)"
        ) from None


def read_load_stream(
    requests: Iterator[pb.load_request], buffer_for: Callable[[int], memoryview]
) -> LoadRequest:
    """Collect one load stream; `buffer_for(size)` gives the buffer the chunks fill."""
    ncg_id: int | None = None
    session_id = 0
    timeout_s: float | None = None
    ninfer: int | None = None
    profile = False
    size: int | None = None
    buffer: memoryview | None = None
    filled = 0
    path: str | None = None
    for msg in _until_broken(requests):
        kind = msg.WhichOneof("content")
        if kind == "h_eg":
            ncg_id = msg.h_eg.id
        elif kind == "session_id":
            session_id = msg.session_id
        elif kind == "model_params":
            p = msg.model_params
            timeout_s = p.timeout.data if p.HasField("timeout") else None
            ninfer = p.ninfer.data if p.HasField("ninfer") else None
            profile = p.HasField("enable_node_profiling") and p.enable_node_profiling.data != 0
        elif kind == "neff_size":
            if size is not None:
                raise InvalidError("load stream gives neff_size twice")
            size = msg.neff_size
            buffer = buffer_for(size)
        elif kind == "neff_chunk":
            chunk = msg.neff_chunk.chunk
            if buffer is None or size is None:
                raise InvalidError("load stream sends a neff_chunk before neff_size")
            if filled + len(chunk) > size:
                raise InvalidError(
                    f"NEFF chunks exceed the declared neff_size of {size} bytes "
                    f"(at least {filled + len(chunk)} sent)"
                )
            buffer[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        elif kind == "neff_file":
            path = msg.neff_file
    neff: memoryview | NeffFile
    if path is not None:
        if size is not None:
            raise InvalidError("load stream gives both neff_file and neff_size/chunks")
        neff = NeffFile(path)
    elif buffer is not None and size is not None:
        if filled != size:
            raise InvalidError(
                f"NEFF chunks add up to {filled} bytes, but neff_size declared {size}"
            )
        neff = buffer
    else:
        raise InvalidError("load stream holds no NEFF (neither neff_size+chunks nor neff_file)")
    return LoadRequest(
        neff=neff,
        ncg_id=ncg_id,
        session_id=session_id,
        timeout_s=timeout_s,
        ninfer=ninfer,
        profile=profile,
    )
