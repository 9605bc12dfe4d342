"""One HTTP request and its reply as the KServe v2 routes (`neuron_rtd/server/kserve_http.py`)
see them: the request's path segments, headers and body (read up to what its route takes,
decompressed within that bound: a gzip bomb is refused after inflating that much), the
JSON header and binary data of an inference's body, a reply and its compression, and the
refusals HTTP itself says (`HttpRefusal`: no such path, method, encoding; a body too
large)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from neuron_rtd.runtime import Caller
from neuron_rtd.server.kserve_codec import invalid
from neuron_rtd.server.kserve_json import dumps, loads_object
from neuron_rtd.serving import ServingError

SMALL_BODY_BYTES = 1 << 20  # a body other than an inference's or a load's
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"


class HttpRefusal(Exception):
    """A request refused for what HTTP itself says (no such path, method, encoding), not
    for what the protocol's statuses say (`ServingError`)."""

    def __init__(self, code: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = list(headers)


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: list[tuple[str, str]] = field(default_factory=list)


def json_reply(document: object, status: int = 200) -> Reply:
    return Reply(status, dumps(document))


def error_reply(status: int, message: str) -> Reply:
    return Reply(status, dumps({"error": message}))


def status_reply(ok: bool) -> Reply:
    """Health and readiness, as Triton answers them: 200 or 400, no body."""
    return Reply(200 if ok else 400)


class Request:
    """One HTTP request as the handlers see it: its method, path segments, headers, body
    (read and decompressed on first use, up to `limit` bytes) and caller: the user owning
    the other end of its connection, or the token's bearer (None: a stranger; see
    `KServeApp.caller_of`)."""

    def __init__(self, environ: Mapping[str, Any], max_body_bytes: int) -> None:
        self.environ = environ
        self.method: str = environ.get("REQUEST_METHOD", "GET")
        self.parts = path_parts(environ)
        self.max_body_bytes = max_body_bytes
        self.limit = SMALL_BODY_BYTES  # what the route takes; set by its handler
        self.limit_reason = "the most this request takes"
        self.caller: Caller | None = None
        self._body: bytes | None = None

    def header(self, name: str) -> str | None:
        value = self.environ.get("HTTP_" + name.upper().replace("-", "_"))
        return value if isinstance(value, str) else None

    def body(self) -> bytes:
        if self._body is None:
            self._body = self._read_body()
        return self._body

    def json(self, what: str) -> dict[str, Any]:
        return loads_object(self.body(), what)

    def _read_body(self) -> bytes:
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise invalid("Content-Length is not a number") from None
        encoding = (self.header("Content-Encoding") or "identity").strip().lower()
        limit = min(self.limit, self.max_body_bytes)
        if encoding == "identity" and length > limit:
            raise HttpRefusal(413, too_large(f"the body's {length} bytes are", limit, self))
        data: bytes = self.environ["wsgi.input"].read(length) if length > 0 else b""
        if len(data) != length:
            raise invalid(f"the body has {len(data)} bytes, not the {length} of Content-Length")
        if encoding == "identity":
            return data
        if encoding == "gzip":
            return inflate(data, 16 + zlib.MAX_WBITS, "gzip", limit, self)
        if encoding == "deflate":  # zlib's format, as HTTP means it; raw deflate as well
            try:
                return inflate(data, zlib.MAX_WBITS, "deflate", limit, self)
            except ServingError:
                return inflate(data, -zlib.MAX_WBITS, "deflate", limit, self)
        raise HttpRefusal(
            415,
            f"Content-Encoding {encoding!r} is not supported: send the body as it is, or "
            "compressed with gzip or deflate",
        )


def too_large(what: str, limit: int, request: Request | None) -> str:
    reason = request.limit_reason if request is not None else "the most this server takes"
    if request is not None and limit >= request.max_body_bytes:
        reason = "the most this server takes (http_max_body_bytes)"
    return (
        f"{what} more than {limit} bytes, {reason}: pass large tensors in system shared "
        "memory, or as the binary tensor data extension"
    )


def inflate(
    data: bytes, wbits: int, name: str, limit: int, request: Request | None = None
) -> bytes:
    """`data` decompressed, no larger than `limit` bytes (413 beyond, found after inflating
    `limit` bytes at most: a small body must not make the daemon allocate a huge one)."""
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise invalid(f"the body is not valid {name} data: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise HttpRefusal(413, too_large("the body decompresses to", limit, request))
    if not inflater.eof:
        raise invalid(f"the body's {name} data is truncated")
    return out


def path_parts(environ: Mapping[str, Any]) -> list[str]:
    """The request path's segments, each percent-decoded (so an encoded '/' stays inside
    its segment); a trailing '/' is dropped."""
    target = environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/"
    path = target.split("?", 1)[0]
    if "://" in path:  # the absolute form: http://host:port/v2/...
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    parts = [unquote(p) for p in path.split("/")[1:]]
    while parts and not parts[-1]:
        parts.pop()
    return parts


class Body:
    """A response body that tells `done` when the server has written it (WSGI's close())."""

    def __init__(self, body: bytes, done: Callable[[], None]) -> None:
        self._body = body
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        yield self._body

    def __len__(self) -> int:
        return 1

    def close(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()


def split_header(body: memoryview, declared: str | None) -> tuple[memoryview, memoryview]:
    """The JSON header and the binary data after it (none without Inference-Header-
    Content-Length: the whole body is JSON)."""
    if declared is None:
        return body, body[:0]
    try:
        length = int(declared)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise invalid(
            f"{HEADER_LENGTH} {declared!r} is not the JSON header's length: expected a number "
            f"of bytes from 0 to the body's {len(body)}"
        )
    return body[:length], body[length:]


def compress_for(reply: Reply, accepted: str | None) -> None:
    """`reply`'s body compressed with the first of gzip or deflate the client accepts."""
    if not accepted:
        return
    codings = {}
    for item in accepted.split(","):
        coding, _, weight = item.strip().partition(";")
        quality = weight.strip().removeprefix("q=")
        try:
            codings[coding.strip().lower()] = float(quality) if quality else 1.0
        except ValueError:
            continue
    if codings.get("gzip", 0) > 0:
        reply.body = gzip.compress(reply.body, compresslevel=1)
        reply.headers.append(("Content-Encoding", "gzip"))
    elif codings.get("deflate", 0) > 0:
        reply.body = zlib.compress(reply.body, 1)
        reply.headers.append(("Content-Encoding", "deflate"))
