"""A `load` request stream read into one load: the NCG, session and model parameters, and
the NEFF by chunks into a buffer the runtime admits, or by an absolute file path; read
from an iterator (`read_load_stream`) or a message at a time as they come (`LoadReader`,
for a stream that holds no thread while its client says nothing)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from neuron_rtd.errors import InvalidError
from neuron_rtd.proto import pb
from neuron_rtd.runtime import NO_SESSION, NeffFile, SessionId


@dataclass(frozen=True)
class LoadRequest:
    neff: memoryview | NeffFile
    ncg_id: int | None
    session_id: SessionId
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
    reader = LoadReader(buffer_for)
    for msg in _until_broken(requests):
        reader.add(msg)
    return reader.result()


class LoadReader:
    """One load stream read a message at a time (`add`), then its load (`result`);
    `buffer_for(size)` gives the buffer the chunks fill."""

    def __init__(self, buffer_for: Callable[[int], memoryview]) -> None:
        self.buffer_for = buffer_for
        self.ncg_id: int | None = None
        self.session_id = NO_SESSION
        self.timeout_s: float | None = None
        self.ninfer: int | None = None
        self.profile = False
        self.size: int | None = None
        self.buffer: memoryview | None = None
        self.filled = 0
        self.path: str | None = None

    def add(self, msg: pb.load_request) -> None:
        """One message of the stream; InvalidError (or the buffer's ResourceError) when it
        cannot be part of a load."""
        kind = msg.WhichOneof("content")
        if kind == "h_eg":
            self.ncg_id = msg.h_eg.id
        elif kind == "session_id":
            self.session_id = SessionId(msg.session_id)
        elif kind == "model_params":
            p = msg.model_params
            self.timeout_s = p.timeout.data if p.HasField("timeout") else None
            self.ninfer = p.ninfer.data if p.HasField("ninfer") else None
            self.profile = p.HasField("enable_node_profiling") and p.enable_node_profiling.data != 0
        elif kind == "neff_size":
            if self.size is not None:
                raise InvalidError("load stream gives neff_size twice")
            self.size = msg.neff_size
            self.buffer = self.buffer_for(self.size)
        elif kind == "neff_chunk":
            chunk = msg.neff_chunk.chunk
            if self.buffer is None or self.size is None:
                raise InvalidError("load stream sends a neff_chunk before neff_size")
            filled = self.filled
            if filled + len(chunk) > self.size:
                raise InvalidError(
                    f"NEFF chunks exceed the declared neff_size of {self.size} bytes "
                    f"(at least {filled + len(chunk)} sent)"
                )
            self.buffer[filled : filled + len(chunk)] = chunk
            self.filled = filled + len(chunk)
        elif kind == "neff_file":
            self.path = msg.neff_file

    def result(self) -> LoadRequest:
        """The load the stream asked for, once it has ended; InvalidError if incomplete."""
        neff: memoryview | NeffFile
        if self.path is not None:
            if self.size is not None:
                raise InvalidError("load stream gives both neff_file and neff_size/chunks")
            neff = NeffFile(self.path)
        elif self.buffer is not None and self.size is not None:
            if self.filled != self.size:
                raise InvalidError(
                    f"NEFF chunks add up to {self.filled} bytes, but neff_size declared {self.size}"
                )
            neff = self.buffer
        else:
            raise InvalidError("load stream holds no NEFF (neither neff_size+chunks nor neff_file)")
        return LoadRequest(
            neff=neff,
            ncg_id=self.ncg_id,
            session_id=self.session_id,
            timeout_s=self.timeout_s,
            ninfer=self.ninfer,
            profile=self.profile,
        )
