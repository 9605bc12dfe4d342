"""A hostile local user against the KServe HTTP front of the daemon as the unit runs it
(issue 38, points 1, 7 and 11).

The daemon runs under its unit's settings as another user (test_service_user.py's
`unit_service`), with a model repository and `http_address` on loopback; its callers run as
other uids through `setpriv`: a *member* (a user the user database puts in the socket's
group: on a test machine only the daemon's stand-in user, nobody, is), a *stranger*
(STRANGER_UID, no groups), and root (this process). Who may do what over HTTP: anyone
health, metadata and statistics; root and the group's members (and the bearer of the
configured token) load, unload, infer and shared memory. HTTP knows its caller's uid, not
its process's groups: membership is the user database's, so OTHER_UID, in the group only
by setpriv's --groups, is a stranger here (it is a member on the unix socket)."""

from __future__ import annotations

import contextlib
import grp
import gzip
import http.client
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import test_service_user
from test_hostile_local import printed
from test_service_user import (
    OTHER_UID,
    STAND_IN_GID,
    STAND_IN_UID,
    Service,
    as_user,
    model_repository,
    unit_service,
)

from neuron_rtd.daemon.config import load_config
from neuron_rtd.daemon.trusted_files import read_http_token
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.runtime import caller
from neuron_rtd.server.kserve_http import LOOPBACK_KEY, PEER_KEY, HttpOptions, KServeApp
from neuron_rtd.serving.api import ServingApi
from neuron_rtd.typed_json import ConfigError

pytestmark = pytest.mark.daemon

STRANGER_UID = 65532  # a uid of no group the daemon knows
MODEL = "mlp"  # 784 inputs: as the gzip bomb's model
OTHER_MODEL = "mlp2"  # in the repository, not loaded at start
BIG = "big"  # a model whose inputs make a legitimately large JSON body
BIG_SHAPE = (256, 1024)
HEADER_TIMEOUT_S = 3
TRICKLERS = 1100  # as the slowloris

CLIENT = """
import http.client, json, sys
port = int(sys.argv[1])

def call(method, path, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    connection.request(method, path, body=data, headers=headers or {})
    answer = connection.getresponse()
    text = answer.read().decode("utf-8", "replace")
    connection.close()
    try:
        document = json.loads(text) if text else None
    except ValueError:
        document = text
    return [answer.status, document]
"""


@dataclass
class Daemon:
    service: Service
    port: int
    token: str
    group: str  # the socket's group's name
    big: np.ndarray


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    top = Path(tempfile.mkdtemp(prefix="nrtd-http-"))
    try:
        repository = model_repository(
            top,
            {
                MODEL: build_mlp(name=MODEL).neff,
                OTHER_MODEL: build_mlp((16, 8, 4), name=OTHER_MODEL).neff,
                BIG: build_relu(BIG_SHAPE, name=BIG),
            },
        )
        token = secrets.token_urlsafe(32)
        token_file = top / "http-token"
        token_file.write_text(token + "\n")
        os.chown(token_file, 0, STAND_IN_GID)  # root's, read by the socket's group
        token_file.chmod(0o640)
        port = free_port()
        settings = {
            "model_repository": str(repository),
            "model_control_mode": "explicit",
            "load_models": [MODEL, BIG],
            "http_address": f"127.0.0.1:{port}",
            "http_token_file": str(token_file),
            "http_header_timeout_secs": HEADER_TIMEOUT_S,
        }
        with with_settings(settings), unit_service() as service:
            big = np.random.default_rng(3).standard_normal(BIG_SHAPE).astype(np.float32)
            yield Daemon(service, port, token, grp.getgrgid(STAND_IN_GID).gr_name, big)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def with_settings(settings: dict[str, Any]) -> Iterator[None]:
    """unit_service's packaged config with `settings` over it."""
    real = test_service_user.build_deb_module

    class Packaged:
        def __init__(self, module: Any) -> None:
            self.module = module

        def packaged_config(self, path: Path) -> str:
            config = json.loads(self.module.packaged_config(path))
            return json.dumps({**config, **settings})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test_service_user, "build_deb_module", lambda: Packaged(real()))
        yield


def member() -> list[str]:
    """A user in the socket's group by the user database (nobody, by its primary group)."""
    return as_user(STAND_IN_UID, STAND_IN_GID)


def stranger() -> list[str]:
    return as_user(STRANGER_UID, STRANGER_UID)


def process_member() -> list[str]:
    """OTHER_UID with the socket's group as a supplementary group of its process only."""
    return as_user(OTHER_UID, OTHER_UID, STAND_IN_GID)


def run_as(who: list[str], daemon: Daemon, code: str, timeout: float = 120) -> Any:
    """`code` run as `who` (setpriv) with CLIENT's `call` at hand; what it printed last,
    as JSON."""
    code = CLIENT + textwrap.dedent(code)
    return printed([*who, sys.executable, "-c", code, str(daemon.port)], timeout)


def calls(who: list[str], daemon: Daemon, requests: list[list[Any]]) -> list[list[Any]]:
    """Each request [method, path, body, headers] as `who`: its [status, JSON body]."""
    code = f"print(json.dumps([call(*r) for r in json.loads({json.dumps(requests)!r})]))"
    result: list[list[Any]] = run_as(who, daemon, code)
    return result


def infer_body(shape: tuple[int, ...], values: list[float] | None = None) -> dict[str, Any]:
    count = int(np.prod(shape))
    return {
        "inputs": [
            {
                "name": "x",
                "shape": list(shape),
                "datatype": "FP32",
                "data": values if values is not None else [0.5] * count,
            }
        ]
    }


def mlp_input_shape(daemon: Daemon) -> tuple[int, ...]:
    status, metadata = root_call(daemon, "GET", f"/v2/models/{MODEL}")
    assert status == 200, metadata
    return tuple(metadata["inputs"][0]["shape"])


def root_call(
    daemon: Daemon,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        connection.request(method, path, body=data, headers=headers or {})
        answer = connection.getresponse()
        text = answer.read()
    finally:
        connection.close()
    return answer.status, json.loads(text) if text else None


RESTRICTED: list[list[Any]] = [
    ["POST", f"/v2/repository/models/{OTHER_MODEL}/load", {}],
    ["POST", f"/v2/repository/models/{MODEL}/unload", {}],
    ["POST", f"/v2/models/{MODEL}/infer", None],  # the body: filled in per test
    ["POST", "/v2/systemsharedmemory/region/r/register", {"key": "/x", "byte_size": 8}],
    ["GET", "/v2/systemsharedmemory/status", None],
    ["GET", "/v2/systemsharedmemory/region/r/status", None],
    ["POST", "/v2/systemsharedmemory/region/r/unregister", {}],
    ["POST", "/v2/systemsharedmemory/unregister", {}],
]
OPEN: list[list[Any]] = [
    ["GET", "/v2/health/live", None],
    ["GET", "/v2/health/ready", None],
    ["GET", "/v2", None],
    ["GET", f"/v2/models/{MODEL}", None],
    ["GET", f"/v2/models/{MODEL}/ready", None],
    ["GET", f"/v2/models/{MODEL}/config", None],
    ["GET", f"/v2/models/{MODEL}/stats", None],
    ["GET", "/v2/models/stats", None],
    ["POST", "/v2/repository/index", {}],
]


def restricted(daemon: Daemon) -> list[list[Any]]:
    shape = mlp_input_shape(daemon)
    return [[m, p, infer_body(shape) if p.endswith("/infer") else b, {}] for m, p, b in RESTRICTED]


def test_a_stranger_reads_but_may_do_nothing_else(daemon: Daemon) -> None:
    answers = calls(stranger(), daemon, restricted(daemon))
    for (method, path, *_), (status, body) in zip(RESTRICTED, answers, strict=True):
        assert status == 403, (method, path, body)
        error = body["error"]
        assert f"root and members of group {daemon.group}" in error, error
        assert f"uid {STRANGER_UID}" in error and "unix socket" in error, error
    # a group its process has but the user database does not give it: not a member here
    infer = next(r for r in restricted(daemon) if r[1].endswith("/infer"))
    ((status, body),) = calls(process_member(), daemon, [infer])
    assert status == 403 and f"uid {OTHER_UID}" in body["error"], body
    opened = calls(stranger(), daemon, [[*r, {}] for r in OPEN])
    for (method, path, _), (status, body) in zip(OPEN, opened, strict=True):
        assert status == 200, (method, path, body)
    # nothing it asked happened: the model it tried to unload still serves
    assert root_call(daemon, "GET", f"/v2/models/{MODEL}/ready")[0] == 200
    assert root_call(daemon, "GET", f"/v2/models/{OTHER_MODEL}/ready")[0] == 400


def test_a_member_loads_infers_and_keeps_its_own_region(daemon: Daemon) -> None:
    shape = mlp_input_shape(daemon)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    name = f"/nrtd-http-member-{secrets.token_hex(4)}"
    body = infer_body(shape, x.ravel().tolist())
    code = f"""
    import os, mmap
    results = []
    results.append(call("POST", "/v2/repository/models/{OTHER_MODEL}/load", {{}}))
    results.append(call("POST", "/v2/models/{MODEL}/infer", json.loads({json.dumps(body)!r})))
    fd = os.open("/dev/shm{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    try:
        results.append(call("POST", "/v2/systemsharedmemory/region/mine/register",
                            {{"key": "{name}", "byte_size": 4096}}))
        results.append(call("GET", "/v2/systemsharedmemory/status"))
        results.append(call("POST", "/v2/systemsharedmemory/region/mine/unregister", {{}}))
    finally:
        os.close(fd)
        os.unlink("/dev/shm{name}")
    results.append(call("POST", "/v2/repository/models/{OTHER_MODEL}/unload", {{}}))
    print(json.dumps(results))
    """
    load, infer, register, status, unregister, unload = run_as(member(), daemon, code)
    assert load[0] == 200, load
    assert infer[0] == 200, infer
    (output,) = infer[1]["outputs"]
    assert output["shape"][0] == shape[0] and len(output["data"]) == int(np.prod(output["shape"]))
    assert register[0] == 200, register
    assert status[0] == 200 and [r["name"] for r in status[1]] == ["mine"], status
    assert unregister[0] == 200, unregister
    assert unload[0] == 200, unload


def test_the_bearer_of_the_token_is_a_member_and_a_wrong_one_is_401(daemon: Daemon) -> None:
    shape = mlp_input_shape(daemon)
    body = infer_body(shape)
    path = f"/v2/models/{MODEL}/infer"
    good = {"Authorization": f"Bearer {daemon.token}"}
    wrong = {"Authorization": f"Bearer {daemon.token[:-1]}x"}
    bearer, other, basic = calls(
        stranger(),
        daemon,
        [
            ["POST", path, body, good],
            ["POST", path, body, wrong],
            ["POST", path, body, {"Authorization": "Basic dXNlcjpwYXNz"}],
        ],
    )
    assert bearer[0] == 200, bearer
    assert other[0] == 401 and "bearer token" in other[1]["error"], other
    assert basic[0] == 401, basic


def test_the_gzip_bomb_is_refused_quickly_and_cheaply(daemon: Daemon) -> None:
    shape = mlp_input_shape(daemon)
    head = json.dumps({"inputs": [{"name": "x", "shape": list(shape), "datatype": "FP32"}]})
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip
    parts = [squeeze.compress(head[:-3].encode() + b', "data": [')]
    chunk = b"0," * (1 << 20)
    parts += [squeeze.compress(chunk) for _ in range(127)]  # 254 MB of zeros
    parts.append(squeeze.compress(b"0]}]}") + squeeze.flush())
    bomb = b"".join(parts)
    assert len(bomb) < 300_000
    before = peak_rss(daemon)
    status, body = root_call(
        daemon, "POST", f"/v2/models/{MODEL}/infer", bomb, {"Content-Encoding": "gzip"}, timeout=30
    )
    assert status == 413, body
    assert "decompresses to more than" in body["error"] and f"model '{MODEL}'" in body["error"]
    assert peak_rss(daemon) - before < 64 << 20  # refused as it inflated, not once it had
    # a legitimate large request within the model's need works, compressed or not
    data = daemon.big.ravel().tolist()
    plain = json.dumps(infer_body(BIG_SHAPE, data)).encode()
    assert len(plain) > 2 << 20
    for headers, payload in (({}, plain), ({"Content-Encoding": "gzip"}, gzip.compress(plain))):
        status, answer = root_call(daemon, "POST", f"/v2/models/{BIG}/infer", payload, headers)
        assert status == 200, answer
        (output,) = answer["outputs"]
        np.testing.assert_allclose(
            np.array(output["data"], np.float32).reshape(BIG_SHAPE), np.maximum(daemon.big, 0)
        )


def peak_rss(daemon: Daemon) -> int:
    """The daemon's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{daemon.service.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


TRICKLE = """
import socket, time
count, timeout = int(sys.argv[2]), float(sys.argv[3])
sockets = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v2/health/ready HTTP/1.1\\r\\n")
    sockets.append(s)
print("open", flush=True)
started = time.monotonic()
closed, refused = {}, 0
while time.monotonic() - started < timeout and len(closed) < count:
    for i, s in enumerate(sockets):
        if i in closed:
            continue
        try:
            data = s.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:  # still open: one more header byte, never their end
            try:
                s.send(b"X", socket.MSG_DONTWAIT)
                continue
            except OSError:
                data = b""
        except OSError:
            data = b""
        refused += data.startswith(b"HTTP/1.1 503")
        closed[i] = round(time.monotonic() - started, 2)
    time.sleep(1.0)
print(json.dumps({"closed": list(closed.values()), "refused": refused}))
"""


def test_slowloris_holds_no_slot_past_the_header_timeout(daemon: Daemon) -> None:
    attack = subprocess.Popen(
        [
            *stranger(),
            sys.executable,
            "-c",
            CLIENT + TRICKLE,
            str(daemon.port),
            str(TRICKLERS),
            "30",
        ],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert attack.stdout is not None
        assert attack.stdout.readline().strip() == "open", (
            attack.stderr.read() if attack.stderr else ""
        )
        # while the tricklers hold what they can: a new client is answered within 5 s,
        # and a member's inference works
        for _ in range(3):  # a probe every half second while they hold on
            status, _ = root_call(daemon, "GET", "/v2/health/ready", timeout=5)
            assert status == 200
            time.sleep(0.5)
        shape = mlp_input_shape(daemon)
        ((status, answer),) = calls(
            member(), daemon, [["POST", f"/v2/models/{MODEL}/infer", infer_body(shape), {}]]
        )
        assert status == 200, answer
        out, err = attack.communicate(timeout=60)
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    assert out.strip(), err
    result = json.loads(out.strip().splitlines()[-1])
    closed = result["closed"]
    assert len(closed) == TRICKLERS, err  # every one closed by the daemon
    # beyond the user's connection cap, refused at once with a 503 saying why
    assert result["refused"] >= TRICKLERS - 256
    late = sorted(closed)[-256:]  # those it held: closed once their headers were late
    assert max(late) <= HEADER_TIMEOUT_S + 4, late
    assert root_call(daemon, "GET", "/v2/health/ready", timeout=5)[0] == 200


def test_sigterm_ends_the_daemon_after_the_attacks(daemon: Daemon) -> None:
    proc = daemon.service.proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)  # past it, TimeoutExpired: the daemon did not end
    assert proc.returncode == 0, daemon.service.log.read_text()[-3000:]


# --- without a daemon: the token's file, and a listener beyond loopback -----------------
class _Loads:
    """A serving core that only loads (what the routes below reach)."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load_model(self, name: str, config: str = "", files: object = None) -> None:
        self.loaded.append(name)


def _environ(path: str, loopback: bool, peer: Any = None, **headers: str) -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "CONTENT_LENGTH": "2",
        "wsgi.input": io.BytesIO(b"{}"),
        LOOPBACK_KEY: loopback,
        PEER_KEY: peer,
    }
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    return environ


def test_beyond_loopback_only_the_token_s_bearer_may_load() -> None:
    serving = _Loads()
    token = secrets.token_urlsafe(32)
    app = KServeApp(cast(ServingApi, serving), HttpOptions(group=12345, token=token))
    path = "/v2/repository/models/m/load"
    refused = app.reply(_environ(path, loopback=False))
    assert refused.status == 401 and ("WWW-Authenticate", "Bearer") in refused.headers
    assert b"beyond loopback without this server's bearer token" in refused.body
    wrong = app.reply(_environ(path, loopback=False, AUTHORIZATION="Bearer nope"))
    assert wrong.status == 401 and b"not this server's bearer token" in wrong.body
    assert serving.loaded == []
    bearer = app.reply(_environ(path, loopback=False, AUTHORIZATION=f"Bearer {token}"))
    assert bearer.status == 200 and serving.loaded == ["m"]
    # a named user not in the group: 403, even with a token configured
    outsider = app.reply(_environ(path, loopback=True, peer=caller(STRANGER_UID)))
    assert outsider.status == 403 and b"members of group" in outsider.body
    # with no token configured, a caller beyond loopback is a stranger: 403
    plain = KServeApp(cast(ServingApi, serving), HttpOptions(group=12345))
    assert plain.reply(_environ(path, loopback=False)).status == 403
    root = plain.reply(_environ(path, loopback=True, peer=caller(0)))
    assert root.status == 200


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_token_file_must_be_kept_from_others(tmp_path: Path) -> None:
    good = secrets.token_urlsafe(32)
    gid = os.getegid()
    assert read_http_token(token_file(tmp_path, good + "\n"), gid) == good
    assert read_http_token(token_file(tmp_path, good, 0o640), gid) == good  # the group's
    for mode, words in ((0o604, "read by others"), (0o602, "writable by others")):
        with pytest.raises(ConfigError, match=words):
            read_http_token(token_file(tmp_path, good, mode), gid)
    if os.geteuid() == 0:  # a group other than the socket's (or the owner's own) may not read
        shared = token_file(tmp_path, good, 0o640)
        os.chown(shared, 0, STAND_IN_GID)
        with pytest.raises(ConfigError, match="read by others"):
            read_http_token(shared, STAND_IN_GID + 1)
        assert read_http_token(shared, STAND_IN_GID) == good
    for text, words in (("short", "fewer than 16"), ("two words " * 3, "one token"), ("", "one")):
        with pytest.raises(ConfigError, match=words):
            read_http_token(token_file(tmp_path, text), gid)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):  # refused, not waited on
        read_http_token(str(fifo), gid)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_http_token(str(tmp_path / "missing"), gid)
    with pytest.raises(ConfigError, match="absolute"):
        load_config(overrides={"http_token_file": "token"}, environ={})
    with pytest.raises(ConfigError, match="http_max_body_mb"):
        load_config(overrides={"http_max_body_mb": 0}, environ={})
    with pytest.raises(ConfigError, match="http_header_timeout_secs"):
        load_config(overrides={"http_header_timeout_secs": 0}, environ={})
