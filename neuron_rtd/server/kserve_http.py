"""The KServe v2 / Triton HTTP/REST front end (`--http-address HOST:PORT`) over the serving
core (`neuron_rtd/serving/api.py:ServingApi`): each request routed, its body decoded
(`neuron_rtd/server/kserve_json.py`), one call into the core, its answer encoded.

The HTTP stack is waitress (a maintained pure-Python WSGI server): one I/O thread reads
and parses requests and holds every connection, so an idle keep-alive client costs a
socket, not a thread (DESIGN.md "Trust"); a fixed pool of workers runs the requests,
whose `Serving.infer` blocks until its (possibly batched) answer. Waitress buffers a
request's body as it comes (in memory, then a temporary file), refuses one longer than
`max_body_bytes` from its Content-Length alone, and answers malformed HTTP itself: here
its error answers are JSON `{"error": ...}` like every other.

Who may do what (docs/kserve.md "Who may do what"): anyone who reaches the port may ask
health, metadata, configs, statistics and the repository index; loading, unloading,
inferring and every shared-memory route are for root and the members of the daemon's
group (`HttpOptions.group`, the unix socket's), 403 for anyone else. A connection to a
loopback address names its caller: the owner of the socket at its other end
(`neuron_rtd/server/peers.py`), found once as the connection is accepted. A connection to
any other address is a stranger's, unless the request carries the configured token
(`Authorization: Bearer TOKEN`, compared in constant time), whose bearer counts as a
member of the group with no user of its own.

Bounded work per client: a body is taken up to what its route needs (an inference: its
model's inputs at their largest shapes, a JSON number at `JSON_CHARS_PER_NUMBER`
characters, plus `BODY_SLACK_BYTES`; a load: `max_body_bytes`; anything else
`SMALL_BODY_BYTES`), compressed or not: a gzip bomb is refused after inflating that much;
a connection must finish each request's headers within `header_timeout_s` (a client
trickling them is closed); one user holds at most `max_connections_per_user` connections.

Statuses: a `ServingError`'s status through `HTTP_STATUS`, with `{"error": message}`; an
unknown path 404, a known path with another method 405, a caller not allowed 403 (a
wrong bearer token 401), a body larger than its route takes 413, an unknown
Content-Encoding 415;
anything unexpected 500 with a one-line message, its traceback in the daemon's log only
(`nrtd.KSERVE`). Health and readiness answer 200, or 400 with an empty body, as Triton's.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import gzip
import hmac
import http
import ipaddress
import logging
import math
import os
import resource
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask
from waitress.utilities import Error

from neuron_rtd.errors import shown
from neuron_rtd.runtime import Caller, User
from neuron_rtd.server.kserve_json import (
    decode_infer,
    dumps,
    encode_infer,
    load_parameters,
    loads_object,
    message_json,
    model_metadata_json,
    repository_index_json,
    server_metadata_json,
    shm_register_fields,
    shm_status_json,
    statistics_json,
)
from neuron_rtd.server.kserve_tensors import internal_message, invalid
from neuron_rtd.server.peers import tcp_caller
from neuron_rtd.serving.api import ServingApi, ServingError, SharedMemoryApi, Status

log = logging.getLogger("nrtd.KSERVE")

THREADS = 16  # requests running at once (each may wait in Serving.infer)
MAX_BODY_BYTES = 64 << 20  # the largest request body taken (and decompressed); more: shm
SMALL_BODY_BYTES = 1 << 20  # a body other than an inference's or a load's
BODY_SLACK_BYTES = 1 << 20  # an inference's body beyond its tensors: names, parameters
JSON_CHARS_PER_NUMBER = 48  # an input's element in JSON, indentation and separator included
MAX_CONNECTIONS = 4096  # open connections (fewer under a low RLIMIT_NOFILE); beyond: backlog
MAX_CONNECTIONS_PER_USER = 256  # open connections of one uid (all strangers: one)
HEADER_TIMEOUT_S = 15.0  # a request's headers must be in within this from its first byte
IDLE_TIMEOUT_S = 120  # an idle keep-alive connection is closed after this
MAINTENANCE_S = 1  # how often connections are checked against their timeouts
STOP_GRACE_S = 2.0  # how long stop() lets requests under way finish
# A request's body, or an answer, larger than this goes through a temporary file instead
# of memory (waitress's default: 512 KB and 1 MB); most tensors stay in memory.
BUFFER_IN_MEMORY_BYTES = 16 << 20

# The protocol's status kinds as HTTP statuses.
HTTP_STATUS: dict[Status, int] = {
    Status.INVALID_ARGUMENT: 400,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.ALREADY_EXISTS: 409,
    Status.UNSUPPORTED: 501,
    Status.INTERNAL: 500,
}

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

CUDA_SHM_UNSUPPORTED = (
    "CUDA shared memory is not supported: this server has no GPUs (its devices are Neuron "
    "devices); use system shared memory (/v2/systemsharedmemory) instead"
)
TRACE_UNSUPPORTED = (
    "trace settings are not supported: this server keeps no traces (per-op profiles: load "
    "the model with enable_node_profiling and use neuron-cli profile)"
)
LOGGING_UNSUPPORTED = (
    "log settings are not supported over the protocol: the daemon's log level is its -l "
    "flag (or log_level in its config)"
)


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


@dataclass(frozen=True)
class HttpOptions:
    """What the HTTP front end allows, and how much of it (see the module's doc)."""

    group: int | None = None  # whose members (and root) may do more than read; None: ours
    token: str | None = None  # a bearer token making its bearer a member; None: no token
    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections_per_user: int = MAX_CONNECTIONS_PER_USER
    threads: int = THREADS

    @property
    def gid(self) -> int:
        return os.getegid() if self.group is None else self.group


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def token_caller(gid: int) -> Caller:
    """Who a bearer of the token is: a member of group `gid` with no user of its own (it
    owns nothing; it may open what the group may)."""
    return Caller((User(-1, frozenset({gid})),))


# --- one request ------------------------------------------------------------------------
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


Handler = Callable[[Request], Reply]


# --- the application --------------------------------------------------------------------
class KServeApp:
    """The v2 endpoints as a WSGI application over `serving`."""

    def __init__(
        self,
        serving: ServingApi,
        options: HttpOptions | None = None,
        *,
        max_body_bytes: int | None = None,
    ) -> None:
        self.serving = serving
        self.options = options or HttpOptions()
        self.max_body_bytes = (
            self.options.max_body_bytes if max_body_bytes is None else max_body_bytes
        )
        self._token = self.options.token.encode() if self.options.token else None
        self._busy = 0  # requests under way
        self._idle = threading.Condition()
        self.stopping = False

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> _Body:
        with self._idle:
            self._busy += 1
        try:
            reply = self.reply(environ)
            headers = [
                ("Content-Type", reply.content_type),
                ("Content-Length", str(len(reply.body))),
                *reply.headers,
            ]
            start_response(f"{reply.status} {http.HTTPStatus(reply.status).phrase}", headers)
        except BaseException:
            self._done()
            raise
        body = b"" if environ.get("REQUEST_METHOD") == "HEAD" else reply.body
        return _Body(body, self._done)  # the request is done once its body is written

    def _done(self) -> None:
        with self._idle:
            self._busy -= 1
            if not self._busy:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once no request is under way; False if some still are after `timeout` s."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def reply(self, environ: Mapping[str, Any]) -> Reply:
        """The answer to one request; never raises."""
        try:
            request = Request(environ, self.max_body_bytes)
            if self.stopping:
                return error_reply(503, "the daemon is stopping: retry on its next start")
            request.caller = self.caller_of(request)
            methods, handler = self.route(request.parts)
            if "GET" in methods.split():
                methods += " HEAD"  # as GET, without the body (load balancers' checks)
            if request.method not in methods.split():
                raise HttpRefusal(
                    405,
                    f"{request.method} is not allowed on /{'/'.join(request.parts)}: use "
                    f"{' or '.join(methods.split())}",
                    [("Allow", ", ".join(methods.split()))],
                )
            return handler(request)
        except ServingError as exc:
            return error_reply(HTTP_STATUS[exc.status], exc.message)
        except HttpRefusal as exc:
            reply = error_reply(exc.code, exc.message)
            reply.headers.extend(exc.headers)
            return reply
        except Exception as exc:
            what = environ.get("REQUEST_METHOD", "?") + " " + environ.get("PATH_INFO", "?")
            log.exception("internal error in %s", what, extra={"fn": "http"})
            return error_reply(500, internal_message(what, exc))

    def caller_of(self, request: Request) -> Caller | None:
        """Who sends `request`: the token's bearer when it carries the token (401 for a
        wrong one), else the user owning the other end of a loopback connection; None
        for anyone else (a stranger)."""
        authorization = request.header("Authorization")
        if self._token is not None and authorization is not None:
            scheme, _, presented = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                presented.strip().encode("utf-8", "replace"), self._token
            ):
                raise HttpRefusal(
                    401,
                    "the Authorization header is not this server's bearer token: send "
                    "'Authorization: Bearer TOKEN' with the token of the daemon's "
                    "http_token_file, or no Authorization header",
                    [("WWW-Authenticate", 'Bearer error="invalid_token"')],
                )
            return token_caller(self.options.gid)
        peer = request.environ.get(PEER_KEY)
        return peer if isinstance(peer, Caller) else None

    def members_only(self, handler: Handler) -> Handler:
        """`handler`, for root and members of the group only (403 for anyone else)."""

        def guarded(request: Request) -> Reply:
            caller = request.caller
            if caller is None or not caller.in_group(self.options.gid):
                raise HttpRefusal(*self.refusal(request))
            return handler(request)

        return guarded

    def refusal(self, request: Request) -> tuple[int, str, list[tuple[str, str]]]:
        group = group_name(self.options.gid)
        what = f"/{'/'.join(request.parts)}"
        if request.caller is not None:
            who = request.caller.describe()
        elif request.environ.get(LOOPBACK_KEY):
            who = "a caller this server cannot name (its socket is gone, or not on this host)"
        else:
            who = "a client beyond loopback without this server's bearer token"
        how = "run the client as such a user, or use the daemon's unix socket (gRPC)"
        if self._token is not None:
            how += ", or send 'Authorization: Bearer TOKEN' with the daemon's http_token_file"
        headers = [] if self._token is None else [("WWW-Authenticate", "Bearer")]
        code = 401 if self._token is not None and request.caller is None else 403
        message = (
            f"{request.method} {what} is for root and members of group {group}, and "
            f"{who} is neither: {how}"
        )
        return code, message, headers

    def route(self, parts: list[str]) -> tuple[str, Handler]:
        """The methods allowed on path `parts` and its handler; 404 for an unknown path."""
        match parts:
            case ["v2"]:
                return "GET", self.server_metadata
            case ["v2", "health", "live"]:
                return "GET", lambda r: status_reply(self.serving.live())
            case ["v2", "health", "ready"]:
                return "GET", lambda r: status_reply(self.serving.ready())
            case ["v2", "models", "stats"]:
                return "GET", lambda r: self.statistics("", "")
            case ["v2", "models", name, "versions", version, *rest] if version:
                return self.model_route(name, version, rest)
            case ["v2", "models", name, *rest] if name:
                return self.model_route(name, "", rest)
            case ["v2", "repository", "index"]:
                return "POST", self.repository_index
            case ["v2", "repository", "models", name, "load"]:
                return "POST", self.members_only(lambda r: self.load(r, name))
            case ["v2", "repository", "models", name, "unload"]:
                return "POST", self.members_only(lambda r: self.unload(r, name))
            case ["v2", "systemsharedmemory", "status"]:
                return "GET", self.members_only(lambda r: self.shm_status(r, ""))
            case ["v2", "systemsharedmemory", "region", name, "status"]:
                return "GET", self.members_only(lambda r: self.shm_status(r, name))
            case ["v2", "systemsharedmemory", "region", name, "register"]:
                return "POST", self.members_only(lambda r: self.shm_register(r, name))
            case ["v2", "systemsharedmemory", "region", name, "unregister"]:
                return "POST", self.members_only(lambda r: self.shm_unregister(r, name))
            case ["v2", "systemsharedmemory", "unregister"]:
                return "POST", self.members_only(lambda r: self.shm_unregister(r, ""))
            case ["v2", "cudasharedmemory", *_]:
                return "GET POST", unsupported(CUDA_SHM_UNSUPPORTED)
            case ["v2", "trace", "setting"]:
                return "GET POST", unsupported(TRACE_UNSUPPORTED)
            case ["v2", "logging"]:
                return "GET POST", unsupported(LOGGING_UNSUPPORTED)
        raise HttpRefusal(404, f"no such endpoint: {shown('/' + '/'.join(parts))}")

    def model_route(self, name: str, version: str, rest: list[str]) -> tuple[str, Handler]:
        match rest:
            case []:
                return "GET", lambda r: json_reply(
                    model_metadata_json(self.serving.model_metadata(name, version))
                )
            case ["ready"]:
                return "GET", lambda r: status_reply(self.serving.model_ready(name, version))
            case ["config"]:
                return "GET", lambda r: json_reply(
                    message_json(self.serving.model_config(name, version))
                )
            case ["stats"]:
                return "GET", lambda r: self.statistics(name, version)
            case ["infer"]:
                return "POST", self.members_only(lambda r: self.infer(r, name, version))
            case ["trace", "setting"]:
                return "GET POST", unsupported(TRACE_UNSUPPORTED)
        at = shown(f"/v2/models/{name}" + (f"/versions/{version}" if version else ""))
        raise HttpRefusal(
            404,
            f"no such endpoint: {at}/{shown('/'.join(rest))} (a model has metadata at {at}, and "
            "ready, config, stats and infer under it)",
        )

    # --- the endpoints ------------------------------------------------------------------
    def server_metadata(self, request: Request) -> Reply:
        return json_reply(server_metadata_json(self.serving.server_metadata()))

    def statistics(self, name: str, version: str) -> Reply:
        return json_reply(statistics_json(self.serving.model_statistics(name, version)))

    def infer(self, request: Request, name: str, version: str) -> Reply:
        request.limit, request.limit_reason = self.infer_body_limit(name, version)
        body = memoryview(request.body())
        header, binary = split_header(body, request.header(HEADER_LENGTH))
        document = loads_object(header, "the inference request's JSON header")
        shm = self.shm(request)
        decoded = decode_infer(name, version, document, binary, shm)
        response = self.serving.infer(decoded.request)
        answer, chunks = encode_infer(decoded, response, shm)
        head = dumps(answer)
        reply = Reply(200, head)
        if chunks:
            reply = Reply(200, b"".join([head, *chunks]), BINARY_TYPE)
            reply.headers.append((HEADER_LENGTH, str(len(head))))
        compress_for(reply, request.header("Accept-Encoding"))
        return reply

    def repository_index(self, request: Request) -> Reply:
        body = request.json("the repository index request")
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("the repository index request: 'ready' must be true or false")
        return json_reply(repository_index_json(self.serving.repository_index(ready_only=ready)))

    def infer_body_limit(self, name: str, version: str) -> tuple[int, str]:
        """The largest body an inference of model `name` takes, and why: its inputs at their
        largest shapes (the batch axis at max_batch_size), a JSON number at
        JSON_CHARS_PER_NUMBER characters (more than the binary extension's bytes take), plus
        BODY_SLACK_BYTES; `max_body_bytes` for a model with an axis of any size. NOT_FOUND
        or UNAVAILABLE as the model's metadata answers (before the body is read)."""
        metadata = self.serving.model_metadata(name, version)
        batch = self.serving.model_config(name, version).max_batch_size
        elements = 0
        for tensor in metadata.inputs:
            shape = list(tensor.shape)
            if batch > 0 and shape and shape[0] == -1:
                shape[0] = batch
            if any(d < 0 for d in shape):
                return self.max_body_bytes, "the most this server takes (http_max_body_bytes)"
            elements += math.prod(shape)
        need = elements * JSON_CHARS_PER_NUMBER + BODY_SLACK_BYTES
        return need, (
            f"the most an inference of model '{name}' takes (its inputs' {elements} "
            f"elements at their largest shapes, {JSON_CHARS_PER_NUMBER} bytes each, and "
            f"{BODY_SLACK_BYTES} bytes more)"
        )

    def shm(self, request: Request) -> SharedMemoryApi:
        """The shared-memory regions of the request's caller (a member: `members_only`)."""
        caller = request.caller
        if caller is None:  # members_only let no stranger here
            raise HttpRefusal(*self.refusal(request))
        return self.serving.shm(caller)

    def load(self, request: Request, name: str) -> Reply:
        request.limit = self.max_body_bytes  # its `file:` parameters: a NEFF in base64
        config, files = load_parameters(request.json("the load request"))
        self.serving.load_model(name, config, files or None)
        return Reply(200)

    def unload(self, request: Request, name: str) -> Reply:
        body = request.json("the unload request")
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):
            raise invalid("the unload request: 'parameters' must be an object")
        self.serving.unload_model(name)  # unload_dependents: a model here has none
        return Reply(200)

    def shm_status(self, request: Request, name: str) -> Reply:
        return json_reply(shm_status_json(self.shm(request).status(name)))

    def shm_register(self, request: Request, name: str) -> Reply:
        key, offset, byte_size = shm_register_fields(request.json("the register request"))
        self.shm(request).register(name, key, offset, byte_size)
        return Reply(200)

    def shm_unregister(self, request: Request, name: str) -> Reply:
        self.shm(request).unregister(name)
        return Reply(200)


class _Body:
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


def unsupported(message: str) -> Handler:
    def refuse(request: Request) -> Reply:
        raise ServingError(Status.UNSUPPORTED, message)

    return refuse


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


# --- waitress, with JSON error answers --------------------------------------------------
class _JsonErrorTask(ErrorTask):
    """Waitress's answer to malformed HTTP (a bad Content-Length, headers or body too
    large, ...), as `{"error": ...}`."""

    def execute(self) -> None:
        error: Error = cast(Any, self.request).error  # the stubs take the parser for its error
        message = f"{error.reason}: {error.body}"
        if error.code == 413:
            limit = self.channel.adj.max_request_body_size
            message = (
                f"the request body is larger than {limit} bytes, the most this server takes: "
                "pass large tensors in system shared memory"
            )
        body = dumps({"error": message})
        self.status = f"{error.code} {error.reason}"
        self.response_headers = [
            *self.response_headers,
            ("Content-Type", JSON_TYPE),
            ("Content-Length", str(len(body))),
        ]
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


PEER_KEY = "neuron_rtd.peer"  # environ: the Caller owning the connection's other end
LOOPBACK_KEY = "neuron_rtd.loopback"  # environ: whether the connection is to loopback


class _Task(WSGITask):
    """Waitress's request task, telling the application who is at the other end."""

    def get_environment(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environment()
        channel = cast(_Channel, self.channel)
        environ[PEER_KEY] = channel.peer
        environ[LOOPBACK_KEY] = channel.loopback
        return environ


def _is_loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except (ValueError, TypeError, IndexError):
        return False


class _Channel(HTTPChannel):
    """One connection: who is at its other end (found once, as it is accepted), and the
    deadline for the headers of the request it is receiving (None between requests)."""

    task_class = _Task
    error_task_class = _JsonErrorTask

    def __init__(
        self, server: Any, sock: socket.socket, addr: Any, adj: Adjustments, map: Any = None
    ) -> None:
        listener = cast(_Listener, server)
        self.peer: Caller | None = None
        self.loopback = False
        try:
            local = sock.getsockname()
        except OSError:
            local = None
        if local is not None and _is_loopback(local):
            self.loopback = True
            self.peer = tcp_caller((local[0], local[1]), (addr[0], addr[1]))
        self.user = self.peer.named.uid if self.peer and self.peer.named else None
        self.header_deadline: float | None = time.monotonic() + listener.header_timeout_s
        self.counted = False
        super().__init__(server, sock, addr, adj, map)
        listener.channel_opened(self, sock)

    def received(self, data: bytes) -> bool:
        if data and self.request is None and self.header_deadline is None:
            listener = cast(_Listener, self.server)
            self.header_deadline = time.monotonic() + listener.header_timeout_s
        received: bool = super().received(data)
        if self.request is None or self.request.headers_finished:
            self.header_deadline = None
        return received

    def del_channel(self, map: Any = None) -> None:
        if self.counted:
            self.counted = False
            cast(_Listener, self.server).channel_closed(self)
        super().del_channel(map)


class _Listener(TcpWSGIServer):
    """Waitress's TCP server, stopped from another thread in steps, closing connections
    whose headers are late, and holding at most `per_user` connections of one user (the
    I/O thread does all of this). (Its stubs miss `_map` and give `trigger` the wrong
    type: hence the casts.)"""

    channel_class = _Channel
    header_timeout_s = HEADER_TIMEOUT_S
    per_user = MAX_CONNECTIONS_PER_USER

    def set_limits(self, header_timeout_s: float, per_user: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.per_user = per_user
        self._users: dict[int | None, int] = {}

    def channel_opened(self, channel: _Channel, sock: socket.socket) -> None:
        users = self._users
        held = users.get(channel.user, 0)
        users[channel.user] = held + 1
        channel.counted = True
        if held >= self.per_user:
            who = "strangers" if channel.user is None else f"uid {channel.user}"
            message = (
                f"{who} hold {held} connections to this server, the most one user may: "
                "close some, or reuse keep-alive connections"
            )
            body = dumps({"error": message})
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                sock.send(head.encode() + body)  # a fresh socket's buffer takes it
            channel.will_close = True

    def channel_closed(self, channel: _Channel) -> None:
        users = self._users
        left = users.get(channel.user, 1) - 1
        if left > 0:
            users[channel.user] = left
        else:
            users.pop(channel.user, None)

    def maintenance(self, now: Any) -> None:
        """Waitress's (idle connections closed), and connections whose request's headers
        are late closed: a client trickling its headers holds no slot for long."""
        super().maintenance(now)
        late = time.monotonic()
        for channel in list(cast(Any, self).active_channels.values()):
            deadline = getattr(channel, "header_deadline", None)
            if deadline is not None and deadline < late and not channel.requests:
                channel.will_close = True

    @property
    def port(self) -> int:
        return int(cast(Any, self).effective_port)

    def close(self) -> None:
        """The listening socket closed; the trigger stays open until `close_connections`
        (waitress's own `close` closes both, on an error in the listener say, and a stop
        under way then had no way left to wake the I/O thread: EBADF, seen as a thread's
        exception in a test and, once, as the daemon's exit code 1 on SIGTERM)."""
        wasyncore.dispatcher.close(self)

    def call_in_loop(self, thunk: Callable[[], None]) -> None:
        """`thunk` run by the I/O thread, which it wakes; not run when that thread is gone
        (its trigger closed: nothing is left for it to do)."""
        with contextlib.suppress(OSError):
            cast(Any, self).trigger.pull_trigger(thunk)

    def stop_accepting(self) -> None:
        """The listening socket closed (in the I/O thread)."""
        self.accepting = False
        self.close()

    def close_connections(self) -> None:
        """Every connection closed once what it has to send is sent, and the trigger: the
        I/O loop then ends (in the I/O thread)."""
        server = cast(Any, self)
        for channel in list(server._map.values()):
            if isinstance(channel, HTTPChannel):
                channel.close_when_flushed = True
        server.trigger.close()


# --- the server -------------------------------------------------------------------------
class HttpServer:
    """The v2 HTTP/REST front end over `serving`, listening on `address` ("HOST:PORT", port
    0 for any free one) once started: an I/O thread and `threads` workers of its own."""

    def __init__(
        self,
        serving: ServingApi,
        address: str,
        options: HttpOptions | None = None,
        *,
        threads: int | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self.serving = serving
        self.address = address
        self.options = options or HttpOptions()
        self.threads = self.options.threads if threads is None else threads
        self.app = KServeApp(serving, self.options, max_body_bytes=max_body_bytes)
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self._dispatcher: ThreadedTaskDispatcher | None = None
        self._loop: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        """Listen and serve; an OSError saying what is wrong and what to do when the
        address is not one to listen on."""
        with self._lock:
            if self._listener is not None or self._stopped:
                raise RuntimeError("an HttpServer starts once")
            sock, sockinfo = bind(self.address)
            adj = Adjustments(
                threads=self.threads,
                ident="neuron-rtd",
                max_request_body_size=self.app.max_body_bytes,
                inbuf_overflow=BUFFER_IN_MEMORY_BYTES,
                outbuf_overflow=BUFFER_IN_MEMORY_BYTES,
                connection_limit=connection_limit(),
                channel_timeout=IDLE_TIMEOUT_S,
                cleanup_interval=MAINTENANCE_S,
                asyncore_use_poll=True,  # select() fails on fds past 1024
                expose_tracebacks=False,
            )
            dispatcher = ThreadedTaskDispatcher()
            dispatcher.set_thread_count(self.threads)
            try:
                listener = _Listener(
                    self.app,
                    map={},
                    _sock=sock,
                    dispatcher=dispatcher,
                    adj=adj,
                    bind_socket=False,
                    sockinfo=sockinfo,
                )
            except BaseException:
                sock.close()
                dispatcher.shutdown(timeout=1)
                raise
            listener.set_limits(
                self.options.header_timeout_s, self.options.max_connections_per_user
            )
            self._listener, self._dispatcher = listener, dispatcher
            self._loop = threading.Thread(target=listener.run, name="kserve-http", daemon=True)
            self._loop.start()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the HTTP server is not started")
        return self._listener.port

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop listening, let requests under way finish (up to `grace_s` s), then close
        every connection. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            listener, dispatcher, loop = self._listener, self._dispatcher, self._loop
        if listener is None or dispatcher is None or loop is None:
            return
        listener.call_in_loop(listener.stop_accepting)
        self.app.wait_idle(grace_s)
        self.app.stopping = True  # a request arriving now on an open connection: 503
        self.app.wait_idle(0.1)
        listener.call_in_loop(listener.close_connections)
        loop.join(5.0)
        dispatcher.shutdown(cancel_pending=True, timeout=1)


def connection_limit() -> int:
    """MAX_CONNECTIONS, or fewer when the process may open fewer files (a connection is one;
    the rest of the daemon keeps 256): past it, new connections wait in the backlog
    instead of failing to be accepted."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - 256))


def split_http_address(address: str) -> tuple[str, int] | None:
    """The host (brackets stripped) and port of "HOST:PORT" or "[v6]:PORT"; None when
    `address` is not one. The daemon's config checks `http_address` with it too."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (sep and host and port_text.isdigit() and int(port_text) <= 65535):
        return None
    return host, int(port_text)


def bind(address: str) -> tuple[socket.socket, tuple[Any, ...]]:
    """A TCP socket bound to `address` ("HOST:PORT", "[v6]:PORT") and waitress's sockinfo
    for it; OSError with a message saying what to do."""
    split = split_http_address(address)
    if split is None:
        raise OSError(
            errno.EINVAL,
            f"{address!r} is not HOST:PORT (127.0.0.1:8000, [::1]:8000; port 0: any free port)",
        )
    host, port = split
    try:
        found = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, socket.IPPROTO_TCP, socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise OSError(
            errno.EINVAL,
            f"host {host!r} does not resolve ({exc.strerror}): give an address of this "
            "machine (127.0.0.1 for loopback)",
        ) from None
    family, kind, proto, _, sockaddr = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, bind_failure(host, port, exc)) from None
    return sock, (family, kind, proto, sock.getsockname())


def bind_failure(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use: stop what listens there, or choose another "
            "port (0: any free port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine: give one of its addresses"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges the daemon does not have: choose one above 1023"
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"
