"""The KServe v2 / Triton HTTP/REST front end (`--http-address HOST:PORT`) over the serving
core (`neuron_rtd/serving/api.py:ServingApi`): each request routed, its body decoded
(`neuron_rtd/server/kserve_json.py`), one call into the core, its answer encoded.

`KServeApp` is a WSGI application; the server under it (waitress, the connections, who
each comes from, their timeouts and bounds) is `neuron_rtd/server/http_server.py`.

Who may do what (docs/kserve.md "Who may do what"): anyone who reaches the port may ask
health, metadata, configs, statistics and the repository index; loading, unloading,
inferring and every shared-memory route are for root and the members of the daemon's
group (`HttpOptions.group`, the unix socket's), 403 for anyone else. A connection to a
loopback address names its caller: the owner of the socket at its other end
(`neuron_rtd/server/peers.py`), found once as the connection is accepted (by
`http_server.py`, which hands it on in the environ). A connection to
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

import gzip
import hmac
import http
import logging
import math
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from neuron_rtd.errors import shown
from neuron_rtd.runtime import Caller, group_member, group_name
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
from neuron_rtd.serving.api import ServingApi, ServingError, SharedMemoryApi, Status

log = logging.getLogger("nrtd.KSERVE")

HEADER_TIMEOUT_S = 15.0  # a request's headers must be in within this from its first byte
MAX_CONNECTIONS_PER_USER = 256  # open connections of one uid (all strangers: one)
THREADS = 16  # requests running at once (each may wait in Serving.infer)
PEER_KEY = "neuron_rtd.peer"  # environ: the Caller owning the connection's other end
LOOPBACK_KEY = "neuron_rtd.loopback"  # environ: whether the connection is to loopback

MAX_BODY_BYTES = 64 << 20  # the largest request body taken (and decompressed); more: shm
SMALL_BODY_BYTES = 1 << 20  # a body other than an inference's or a load's
BODY_SLACK_BYTES = 1 << 20  # an inference's body beyond its tensors: names, parameters
JSON_CHARS_PER_NUMBER = 48  # an input's element in JSON, indentation and separator included

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


def token_caller(gid: int) -> Caller:
    """Who a bearer of the token is: a member of group `gid` with no user of its own (it
    owns nothing; it may open what the group may)."""
    return Caller((group_member(gid),))


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
