"""The KServe v2 / Triton HTTP/REST front end (`--http-address HOST:PORT`) over the serving
core (`neuron_rtd/serving/api.py:ServingApi`): each request routed, its body decoded
(`neuron_rtd/server/kserve_json.py`), one call into the core, its answer encoded.

`KServeApp` is a WSGI application: its routes and endpoints, who may call them, and how
each answers; one request and its reply (body, encodings, the binary extension's split)
are `neuron_rtd/server/http_messages.py`, the server under it (waitress, the
connections, who each comes from, their timeouts and bounds)
`neuron_rtd/server/http_server.py`.

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

Statuses: a `ServingError`'s status through the one table
(`neuron_rtd/server/kserve_errors.py`), with `{"error": message}`; an
unknown path 404, a known path with another method 405, a caller not allowed 403 (a
wrong bearer token 401), a body larger than its route takes 413, an unknown
Content-Encoding 415;
anything unexpected 500 with a one-line message, its traceback in the daemon's log only
(`nrtd.KSERVE`). Health and readiness answer 200, or 400 with an empty body, as Triton's.
"""

from __future__ import annotations

import hmac
import http
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from neuron_rtd.errors import shown
from neuron_rtd.runtime import Caller, group_member, group_name
from neuron_rtd.server.http_messages import (
    BINARY_TYPE,
    HEADER_LENGTH,
    Body,
    HttpRefusal,
    Reply,
    Request,
    compress_for,
    error_reply,
    json_reply,
    split_header,
    status_reply,
)
from neuron_rtd.server.http_messages import JSON_TYPE as JSON_TYPE  # the server's replies
from neuron_rtd.server.kserve_codec import invalid
from neuron_rtd.server.kserve_errors import (
    HTTP_STATUS,
    cuda_shm_register,
    cuda_shm_status,
    refusal,
)
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
from neuron_rtd.serving import ServingApi, ServingError, SharedMemoryApi, Status

log = logging.getLogger("nrtd.KSERVE")

HEADER_TIMEOUT_S = 15.0  # a request's headers must be in within this from its first byte
MAX_CONNECTIONS_PER_USER = 256  # open connections of one uid (all strangers: one)
THREADS = 16  # requests running at once (each may wait in Serving.infer)
PEER_KEY = "neuron_rtd.peer"  # environ: the Caller owning the connection's other end
LOOPBACK_KEY = "neuron_rtd.loopback"  # environ: whether the connection is to loopback

MAX_BODY_BYTES = 64 << 20  # the largest request body taken (and decompressed); more: shm
BODY_SLACK_BYTES = 1 << 20  # an inference's body beyond its tensors: names, parameters
JSON_CHARS_PER_NUMBER = 48  # an input's element in JSON, indentation and separator included

TRACE_UNSUPPORTED = (
    "trace settings are not supported: this server keeps no traces (per-op profiles: load "
    "the model with enable_node_profiling and use neuron-cli profile)"
)
LOGGING_UNSUPPORTED = (
    "log settings are not supported over the protocol: the daemon's log level is its -l "
    "flag (or log_level in its config)"
)


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

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Body:
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
        return Body(body, self._done)  # the request is done once its body is written

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
        except HttpRefusal as exc:
            reply = error_reply(exc.code, exc.message)
            reply.headers.extend(exc.headers)
            return reply
        except Exception as exc:  # a ServingError, or unexpected: the one error table
            what = environ.get("REQUEST_METHOD", "?") + " " + environ.get("PATH_INFO", "?")
            status, message = refusal(exc, what, "http")
            return error_reply(HTTP_STATUS[status], message)

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
            case ["v2", "cudasharedmemory", "status"]:  # none held (no GPUs), as Triton's
                return "GET", self.members_only(lambda r: json_reply([]))
            case ["v2", "cudasharedmemory", "region", name, "status"]:
                return "GET", self.members_only(
                    lambda r: json_reply(shm_status_json(cuda_shm_status(name, self.shm(r))))
                )
            case ["v2", "cudasharedmemory", "region", name, "register"]:
                return "POST", self.members_only(lambda r: self.cuda_shm_register(name))
            case ["v2", "cudasharedmemory", "region", _, "unregister"]:
                return "POST", self.members_only(lambda r: Reply(200))
            case ["v2", "cudasharedmemory", "unregister"]:
                return "POST", self.members_only(lambda r: Reply(200))
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
        BODY_SLACK_BYTES; `max_body_bytes` for a model with an axis of any size or a BYTES
        input (strings of any length). NOT_FOUND or UNAVAILABLE as the model's metadata
        answers (before the body is read)."""
        metadata = self.serving.model_metadata(name, version)
        batch = self.serving.model_config(name, version).max_batch_size
        elements = 0
        for tensor in metadata.inputs:
            shape = list(tensor.shape)
            if batch > 0 and shape and shape[0] == -1:
                shape[0] = batch
            if any(d < 0 for d in shape) or tensor.datatype == "BYTES":  # no bound per element
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

    def cuda_shm_register(self, name: str) -> Reply:
        raise cuda_shm_register(name, "/v2/systemsharedmemory")


def unsupported(message: str) -> Handler:
    def refuse(request: Request) -> Reply:
        raise ServingError(Status.UNSUPPORTED, message)

    return refuse
