"""Fuzz every request of the wire API, decoded and handled by the runtime in this process,
with atheris.

    python fuzz/wire_requests.py fuzz/corpus/wire_requests [libFuzzer flags: -runs=N,
        -max_total_time=S, -timeout=S ...]

An input is a sequence of calls (see `records`): the method of the nmgr service (and the
streamed infer), and the request bytes, decoded as the server would. Handles that count
from 1 (models, NCGs, cookies) name the ones made earlier in the same input, so that the
fuzzer reaches past "no such handle". Each call goes to the
servicer the daemon serves, on a runtime of one simulated device; the runtime starts each
input empty. Whatever the bytes, every call answers a status with a defined nerr code and
never logs an internal error (an exception the runtime did not expect); an exception out
of a servicer is a crash too. Bytes that do not decode are what gRPC itself refuses.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import atheris
from google.protobuf.message import DecodeError, Message

with atheris.instrument_imports(include=["neuron_rtd", "driver_sim"]):
    from neuron_rtd.errors import Nerr
    from neuron_rtd.proto import pb
    from neuron_rtd.runtime import LocalRuntime
    from neuron_rtd.server import NmgrServicer, StreamServicer

from records import calls, split  # fuzz/records.py (a script's folder is on its path)

SERVICE = pb.DESCRIPTOR.services_by_name["nmgr_v1"]
# (name, request type, client-streaming) per method index; the last is the streamed infer.
METHODS: list[tuple[str, type[Message], bool]] = [
    (m.name, getattr(pb, m.input_type.name), m.client_streaming) for m in SERVICE.methods
]
METHODS.append(("infer_stream", pb.infer_request, True))
MAX_CALLS = 16  # per input


class InternalErrors(logging.Handler):
    """Keeps what the servicers log as internal errors (with a traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.seen.append(logging.Formatter().format(record))


class Context:
    """What the servicers read of their gRPC context: the call's metadata (none: the
    calls present no session), and whether its caller still waits (always)."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def is_active(self) -> bool:
        return True


CONTEXT: Any = Context()
RUNTIME = LocalRuntime("inf1.xlarge")
NMGR = NmgrServicer(RUNTIME.runtime)
STREAM = StreamServicer(NMGR)
ERRORS = InternalErrors()
logging.getLogger("nrtd").addHandler(ERRORS)
logging.getLogger("nrtd").propagate = False  # refusals are expected: keep stderr quiet


def decoded(kind: type[Message], data: bytes) -> Message | None:
    try:
        return kind.FromString(data)
    except (DecodeError, ValueError, RecursionError):
        return None


class Handles:
    """The models, NCGs and cookies made so far in this input, in order."""

    def __init__(self) -> None:
        self.made: dict[str, list[int]] = {"h_nn": [], "h_eg": [], "cookie": []}

    def translate(self, message: Any) -> Any:
        fields = message.DESCRIPTOR.fields_by_name
        for kind in ("h_nn", "h_eg"):
            if kind in fields and message.HasField(kind):
                handle = getattr(message, kind)
                handle.id = self._nth(kind, handle.id)
        if "cookie" in fields:
            if not isinstance(message.cookie, int):  # repeated
                message.cookie[:] = [self._nth("cookie", c) for c in message.cookie]
            else:
                message.cookie = self._nth("cookie", message.cookie)
        return message

    def _nth(self, kind: str, value: int) -> int:
        made = self.made[kind]
        return made[value - 1] if 1 <= value <= len(made) else value

    def record(self, response: Any) -> None:
        fields = response.DESCRIPTOR.fields_by_name
        if "status" in fields and response.status.code != Nerr.OK:
            return
        for kind in ("h_nn", "h_eg"):
            if kind in fields and response.HasField(kind):
                self.made[kind].append(getattr(response, kind).id)
        if "cookie" in fields and isinstance(response.cookie, int):  # infer_post's
            self.made["cookie"].append(response.cookie)


def stream(kind: type[Message], body: bytes, handles: Handles) -> Iterator[Any]:
    for part in split(body):
        message = decoded(kind, part)
        if message is not None:
            yield handles.translate(message)


def check(name: str, response: Any) -> None:
    if isinstance(response, pb.status):
        Nerr(response.code)  # ValueError: not a defined nerr code
    elif "status" in response.DESCRIPTOR.fields_by_name:  # get_version has none
        Nerr(response.status.code)
    if ERRORS.seen:
        raise AssertionError(f"{name}: internal error\n" + "\n".join(ERRORS.seen))


def one_input(data: bytes) -> None:
    ERRORS.seen.clear()
    NMGR.unload_all(pb.empty(), CONTEXT)  # every input starts with no model and no NCG
    handles = Handles()
    for count, (index, body) in enumerate(calls(data)):
        if count == MAX_CALLS:
            break
        name, kind, streaming = METHODS[index % len(METHODS)]
        if name == "infer_stream":
            for response in STREAM.infer_stream(stream(kind, body, handles), CONTEXT):
                check(name, response)
            continue
        if streaming:
            response = getattr(NMGR, name)(stream(kind, body, handles), CONTEXT)
        else:
            request = decoded(kind, body)
            if request is None:
                continue
            response = getattr(NMGR, name)(handles.translate(request), CONTEXT)
        check(name, response)
        handles.record(response)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
