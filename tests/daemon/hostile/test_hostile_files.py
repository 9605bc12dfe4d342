"""Model files read as data and names bounded (issue 38, points 3, 4, 5 and 8).

First the runtime's one model-file reader (`read_model_file`) and the serving core in
process; then the daemon as the unit starts it (test_service_user.py's `unit_service`),
with a model repository and the HTTP front, probed as a member of the socket's group and
as a stranger (`setpriv`): each attack refused, while a legitimate load, an inference and
`health/ready` beside it answer within 5 s, and SIGTERM ends the daemon within 15 s."""

from __future__ import annotations

import functools
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from test_service_user import OTHER_UID, STAND_IN_GID, STAND_IN_UID, Service, as_user, unit_service
from waiting import wait_until

from neuron_rtd.errors import InvalidError, ModelFileRefused, NeffInvalid, Nerr, ResourceError
from neuron_rtd.neff import HEADER_SIZE, build_mlp
from neuron_rtd.runtime import LocalRuntime, NeffFile, read_model_file
from neuron_rtd.runtime.admission import NeffAdmission
from neuron_rtd.serving import InferRequest, Serving, ServingError, Status
from neuron_rtd.serving.loading import Loader

MLP = build_mlp((32, 16, 4), name="mlp")
MLP2 = build_mlp((32, 16, 4), seed=7, name="mlp")  # same shapes, other weights
STRANGER = 65532  # a uid with no group at all
DATA_SIZE_AT = 24  # the header's data_size field: after the magic, package and header sizes


@dataclass
class Reads:
    """An `into` for read_model_file that records the sizes it was asked for."""

    asked: list[int]

    def __call__(self, size: int) -> memoryview:
        self.asked.append(size)
        return memoryview(bytearray(size))


def read(path: Path, folder: Path | str) -> tuple[Any, Reads]:
    into = Reads([])
    return read_model_file(path, (folder,), into=into), into


def refused(path: Path, folder: Path | str) -> tuple[ModelFileRefused, Reads]:
    into = Reads([])
    with pytest.raises(ModelFileRefused) as caught:
        read_model_file(path, (folder,), into=into)
    return caught.value, into


def in_time(call: Callable[[], Any], seconds: float = 5.0) -> Any:
    """`call()`'s result, failing the test if it takes longer than `seconds` (or hangs)."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if errors:
        raise errors[0]
    return result[0]


# --- the reader --------------------------------------------------------------------------
def test_the_reader_reads_a_neff_inside_its_folder(tmp_path: Path) -> None:
    (tmp_path / "model.neff").write_bytes(MLP.neff)
    (tmp_path / "alias.neff").symlink_to("model.neff")  # a link that stays inside
    for name in ("model.neff", "alias.neff"):
        neff, into = read(tmp_path / name, tmp_path)
        assert neff.name == "mlp" and into.asked == [len(MLP.neff)]
        assert bytes(neff.buffer) == MLP.neff


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.neff")
    error, into = in_time(lambda: refused(tmp_path / "model.neff", tmp_path))
    assert "it is a FIFO, not a regular file" in error.reason and not into.asked


def test_devices_are_refused_unopened(tmp_path: Path) -> None:
    error, into = in_time(lambda: refused(Path("/dev/zero"), "/dev"))
    assert "a character device, not a regular file" in error.reason and not into.asked
    # a link to it from a model's folder leads outside that folder
    (tmp_path / "model.neff").symlink_to("/dev/zero")
    error, into = in_time(lambda: refused(tmp_path / "model.neff", tmp_path))
    assert error.outside and "outside" in error.reason and not into.asked
    if os.geteuid() == 0:  # a device node inside the folder: refused before it is opened
        os.mknod(tmp_path / "zero.neff", stat.S_IFCHR | 0o666, os.makedev(1, 5))
        error, into = in_time(lambda: refused(tmp_path / "zero.neff", tmp_path))
        assert "a character device" in error.reason and not into.asked


def test_sockets_and_folders_are_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock.neff"))
        error, _ = refused(tmp_path / "sock.neff", tmp_path)
        assert "it is a socket, not a regular file" in error.reason
    (tmp_path / "dir.neff").mkdir()
    error, _ = refused(tmp_path / "dir.neff", tmp_path)
    assert "it is a folder, not a regular file" in error.reason
    error, _ = refused(tmp_path, tmp_path)
    assert "a folder" in error.reason


def test_a_symlink_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    inside, outside = tmp_path / "repo" / "m" / "1", tmp_path / "secret"
    inside.mkdir(parents=True)
    outside.mkdir()
    (outside / "model.neff").write_bytes(MLP.neff)
    (inside / "model.neff").symlink_to(outside / "model.neff")
    (inside / "up.neff").symlink_to("../../../secret/model.neff")
    (inside / "sub").symlink_to(outside)
    for path in (inside / "model.neff", inside / "up.neff", inside / "sub" / "model.neff"):
        error, into = refused(path, inside)
        assert error.outside and not into.asked, path
    error, _ = refused(inside / ".." / ".." / ".." / "secret" / "model.neff", inside)
    assert error.outside
    assert read(outside / "model.neff", outside)[0].name == "mlp"  # its own folder reads it


def test_missing_and_unreadable_are_worded_alike(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    reasons = {
        refused(tmp_path / "absent.neff", tmp_path)[0].reason,
        refused(tmp_path / "file" / "model.neff", tmp_path)[0].reason,  # ENOTDIR
        refused(tmp_path / "no" / "model.neff", tmp_path)[0].reason,
    }
    assert reasons == {"no such file, or the daemon may not read it"}
    error, _ = refused(Path(str(tmp_path) + "/a\0b"), tmp_path)
    assert "NUL" in error.reason


def test_header_lies_are_refused_before_the_body_is_read(tmp_path: Path) -> None:
    path = tmp_path / "model.neff"
    for data in (MLP.neff + b"\0" * (1 << 20), MLP.neff[:-100], MLP.neff[: HEADER_SIZE - 1]):
        path.write_bytes(data)
        with pytest.raises(NeffInvalid) as caught:
            read_model_file(path, (tmp_path,), into=(into := Reads([])))
        assert "not a" in str(caught.value) and not into.asked, caught.value
    path.write_bytes(b"\0" * 4096)  # no NEFF at all
    with pytest.raises(NeffInvalid, match="not a NEFF"):
        read_model_file(path, (tmp_path,), into=(into := Reads([])))
    assert not into.asked


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A sparse file of 1 TiB whose header declares just that: the size is checked against
    what the daemon admits before any of its body is read."""
    path = tmp_path / "big.neff"
    size = 1 << 40
    head = bytearray(MLP.neff[:HEADER_SIZE])
    struct.pack_into("<Q", head, DATA_SIZE_AT, size - HEADER_SIZE)
    with path.open("wb") as out:
        out.write(head)
        out.truncate(size)
    admission = NeffAdmission((str(tmp_path),))
    rss = psutil.Process().memory_info().rss
    with pytest.raises(ResourceError, match="more than the host can hold"):
        in_time(lambda: read_model_file(path, (tmp_path,), into=admission.buffer))
    assert admission.reserved == 0
    assert psutil.Process().memory_info().rss - rss < 64 << 20


def test_neff_file_loads_use_the_same_reader(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.neff")
    (tmp_path / "model.neff").write_bytes(MLP.neff)
    with LocalRuntime() as local:  # neff_file_dirs: "/", the runtime's default
        with pytest.raises(InvalidError) as caught:
            in_time(lambda: local.runtime.load(NeffFile(str(tmp_path / "pipe.neff"))))
        assert str(caught.value).startswith(f"cannot read neff_file '{tmp_path}/pipe.neff' (it")
        assert "a FIFO, not a regular file" in str(caught.value)
        assert local.runtime.load(NeffFile(str(tmp_path / "model.neff"))).id > 0


# --- the serving core, in process ------------------------------------------------------------
@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


def serve(local: LocalRuntime, root: Path | None, **kwargs: Any) -> Serving:
    serving = Serving(local.runtime, repository=root, **kwargs)
    serving.start()
    return serving


def model_dir(root: Path, name: str, files: dict[str, bytes] | None = None) -> Path:
    """`root/name/1/` holding `files` (model.neff, MLP's, by default)."""
    version = root / name / "1"
    version.mkdir(parents=True)
    for filename, data in ({"model.neff": MLP.neff} if files is None else files).items():
        (version / filename).write_bytes(data)
    return version


def failure(call: Callable[[], Any]) -> ServingError:
    with pytest.raises(ServingError) as caught:
        call()
    assert len(caught.value.message) < 1000, caught.value.message[:2000]
    return caught.value


BAD_FILENAMES = ("../../secret.neff", "/etc/passwd", ".", "..", "1/model.neff", "a\0b", "n" * 256)


def test_default_model_filename_is_a_plain_file_name(local: LocalRuntime, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    model_dir(root, "m", {"model.neff": MLP.neff, "net.neff": MLP.neff})
    (tmp_path / "secret.neff").write_bytes(MLP.neff)
    serving = serve(local, root, control_mode="explicit")
    for filename in BAD_FILENAMES:
        config = json.dumps({"default_model_filename": filename})
        error = failure(functools.partial(serving.load_model, "m", config=config))
        assert error.status is Status.INTERNAL, filename  # a model unread: as Triton answers
        assert "default_model_filename" in error.message and "plain file name" in error.message
        assert not serving.model_ready("m")
    # in config.pbtxt alike
    (root / "m" / "config.pbtxt").write_text('default_model_filename: "../../secret.neff"')
    error = failure(lambda: serving.load_model("m"))
    assert error.status is Status.INTERNAL and "plain file name" in error.message
    # a file name inside the version's folder loads, from the config given or config.pbtxt
    serving.load_model("m", config=json.dumps({"default_model_filename": "net.neff"}))
    assert serving.model_config("m").default_model_filename == "net.neff"
    (root / "m" / "config.pbtxt").write_text('default_model_filename: "net.neff"')
    serving.load_model("m")
    x = MLP.random_inputs()
    out = serving.infer(InferRequest("m", x)).outputs["probs"]
    np.testing.assert_allclose(out, MLP.reference(x)["probs"], rtol=1e-5)
    serving.close()


def test_repository_model_files_are_read_as_data(local: LocalRuntime, tmp_path: Path) -> None:
    """A FIFO, a device, a socket, a folder, a link out of the version folder: each model
    UNAVAILABLE at once with its reason, the others served."""
    root = tmp_path / "repo"
    os.mkfifo(model_dir(root, "fifo", {}) / "model.neff")
    (model_dir(root, "zero", {}) / "model.neff").symlink_to("/dev/zero")
    (model_dir(root, "folder", {}) / "model.neff").mkdir()
    (tmp_path / "secret.neff").write_bytes(MLP.neff)
    (model_dir(root, "escape", {}) / "model.neff").symlink_to(tmp_path / "secret.neff")
    model_dir(root, "missing", {})
    model_dir(root, "good")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(model_dir(root, "sock", {}) / "model.neff"))
        serving = in_time(lambda: serve(local, root))
    reasons = {r.name: r.reason for r in serving.repository_index() if r.state != "READY"}
    assert "it is a FIFO, not a regular file" in reasons["fifo"]
    assert "leads outside its version folder" in reasons["zero"]
    assert "leads outside its version folder" in reasons["escape"]
    assert "it is a folder, not a regular file" in reasons["folder"]
    assert "it is a socket, not a regular file" in reasons["sock"]
    assert "no such file, or the daemon may not read it" in reasons["missing"]
    assert serving.model_ready("good")
    serving.close()


def test_a_config_pbtxt_is_read_as_data(local: LocalRuntime, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    model_dir(root, "fifo")
    os.mkfifo(root / "fifo" / "config.pbtxt")
    model_dir(root, "huge")
    with (root / "huge" / "config.pbtxt").open("wb") as out:
        out.truncate(1 << 30)
    model_dir(root, "good")
    serving = in_time(lambda: serve(local, root))
    reasons = {r.name: r.reason for r in serving.repository_index() if r.state != "READY"}
    assert "not a regular file" in reasons["fifo"]
    assert "more than a config.pbtxt may be" in reasons["huge"]
    assert serving.model_ready("good")
    serving.close()


def test_the_poll_thread_outlives_any_model(
    local: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error loading one model is that model's reason; polling goes on."""
    root = tmp_path / "repo"
    model_dir(root, "a")
    os.mkfifo(model_dir(root, "b", {}) / "model.neff")
    real = Loader._load_version

    def broken(self: Loader, scanned: Any, *args: Any) -> Any:
        if scanned.name == "a":
            raise RuntimeError("a surprise")
        return real(self, scanned, *args)

    monkeypatch.setattr(Loader, "_load_version", broken)
    serving = serve(local, root, control_mode="poll", poll_s=3600)
    model_dir(root, "c")
    in_time(serving.poll_once)
    rows = {r.name: r for r in serving.repository_index()}
    assert "RuntimeError: a surprise" in rows["a"].reason and rows["a"].state != "READY"
    assert "FIFO" in rows["b"].reason
    assert rows["c"].state == "READY"
    monkeypatch.setattr(Loader, "_load_version", real)
    (root / "a" / "1" / "model.neff").write_bytes(MLP2.neff)  # changed: tried again
    in_time(serving.poll_once)
    assert serving.model_ready("a")
    serving.close()


def test_names_are_bounded_and_leave_nothing_behind(local: LocalRuntime, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    model_dir(root, "m")
    serving = serve(local, root, control_mode="explicit", load_models=["m"])
    x = MLP.random_inputs()
    for n in (256, 300, 100_000):
        name = f"{secrets.token_hex(4)}{'n' * n}"
        calls: list[Callable[[str], Any]] = [
            serving.load_model,
            lambda name: serving.load_model(name, files={"1/model.neff": MLP.neff}),
            serving.unload_model,
            lambda name: serving.infer(InferRequest(name, x)),
            serving.model_metadata,
            serving.model_statistics,
        ]
        for call in calls:
            error = failure(functools.partial(call, name))
            assert error.status is Status.INVALID_ARGUMENT, error.message[:200]
            assert "at most 255 bytes" in error.message and error.message.count("n") < 200
        assert not serving.model_ready(name)
    # a name of 255 bytes is a name like another: not found, no ENAMETOOLONG
    error = failure(lambda: serving.load_model("n" * 255))
    assert error.status is Status.INTERNAL and "failed to poll" in error.message  # Triton's
    error = failure(lambda: serving.infer(InferRequest("m", x, version="9" * 5000)))
    assert error.status is Status.INVALID_ARGUMENT and len(error.message) < 300
    # failed uploads and unloaded ones leave no trace; the repository's models stay listed
    for i in range(50):
        load = functools.partial(serving.load_model, f"up{i}", files={"1/model.neff": b"no"})
        assert failure(load).status is Status.INVALID_ARGUMENT
        load = functools.partial(serving.load_model, f"cfg{i}", config="{", files={"1/x": b""})
        assert failure(load).status is Status.INTERNAL  # the model unread, as Triton answers
    serving.load_model("sent", files={"1/model.neff": MLP.neff})
    assert serving.model_ready("sent")
    serving.unload_model("sent")
    serving.unload_model("m")
    assert [(r.name, r.state) for r in serving.repository_index()] == [("m", "UNAVAILABLE")]
    assert not serving._models.keys() - {"m"} and not len(serving._name_locks)
    serving.load_model("m")
    np.testing.assert_allclose(
        serving.infer(InferRequest("m", x)).outputs["probs"], MLP.reference(x)["probs"], rtol=1e-5
    )
    serving.close()


def test_a_name_lock_lives_while_it_is_held(local: LocalRuntime, tmp_path: Path) -> None:
    """Loads of one name wait for each other; the lock goes with the last of them."""
    serving = serve(local, None, control_mode="explicit")
    locks = serving._name_locks
    entered, release = threading.Event(), threading.Event()
    done: list[str] = []

    def first() -> None:
        with locks.hold("m"):
            entered.set()
            release.wait(10)
            done.append("first")

    def second() -> None:
        with locks.hold("m"):
            done.append("second")

    one = threading.Thread(target=first)
    one.start()
    assert entered.wait(10) and len(locks) == 1
    two = threading.Thread(target=second)
    two.start()
    release.set()
    one.join(10)
    two.join(10)
    assert done == ["first", "second"] and len(locks) == 0
    serving.close()


# --- the daemon as the unit starts it --------------------------------------------------------
PRELUDE = """
import base64, json, sys, threading, time, urllib.error, urllib.parse, urllib.request
import grpc
from neuron_rtd.proto import kserve_pb, kserve_pb_grpc, pb, pb_grpc
grpc_address, http = sys.argv[1], "http://127.0.0.1:" + sys.argv[2]
channel = grpc.insecure_channel(grpc_address)
kserve = kserve_pb_grpc.GRPCInferenceServiceStub(channel)
nmgr = pb_grpc.nmgr_v1Stub(channel)

def post(path, body, timeout=30):
    request = urllib.request.Request(
        http + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return [answer.status, answer.read().decode()]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.read().decode()]

def http_load(name, config=None, files=None):
    parameters = {}
    if config is not None:
        parameters["config"] = json.dumps(config)
    for key, data in (files or {}).items():
        parameters["file:" + key] = base64.b64encode(data).decode()
    path = "/v2/repository/models/" + urllib.parse.quote(name, safe="") + "/load"
    return post(path, {"parameters": parameters})

def grpc_load(name, config=None, files=None):
    request = kserve_pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = json.dumps(config)
    for key, data in (files or {}).items():
        request.parameters["file:" + key].bytes_param = data
    try:
        kserve.RepositoryModelLoad(request, timeout=30)
        return ["OK", ""]
    except grpc.RpcError as exc:
        return [exc.code().name, exc.details()]

def at_once(calls):
    answers = [None] * len(calls)
    def run(i):
        began = time.monotonic()
        answers[i] = calls[i]() + [time.monotonic() - began]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
"""


# Who probes. On the unix socket a member is any uid the kernel says is in the socket's
# group (OTHER_UID, by setpriv's --groups); over HTTP, where only the uid is known, a member
# is one the user database puts in the group: on a test machine only the daemon's stand-in
# user is (test_hostile_http.py). A stranger has no group.
CALLERS = {
    "member": as_user(OTHER_UID, OTHER_UID, STAND_IN_GID),
    "http member": as_user(STAND_IN_UID, STAND_IN_GID),
    "stranger": as_user(STRANGER, STRANGER),
}


@dataclass
class Daemon:
    service: Service
    repo: Path
    port: int

    @property
    def address(self) -> str:
        return f"unix:{self.service.path('/run/neuron.sock')}"

    def run_as(self, who: str, code: str, *args: str, timeout: float = 300) -> Any:
        """Run `code` as `who` (see CALLERS): what it printed last, as JSON."""
        done = subprocess.run(
            [
                *CALLERS[who],
                sys.executable,
                "-c",
                PRELUDE + textwrap.dedent(code),
                self.address,
                str(self.port),
                *args,
            ],
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def http(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            data = b"" if body is None else json.dumps(body).encode()
            connection.request(method, path, body=data)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def index(self) -> dict[str, dict[str, str]]:
        status, body = self.http("POST", "/v2/repository/index", {})
        assert status == 200, body
        return {row["name"]: row for row in json.loads(body)}

    def legit(self, model: str = "mlp") -> None:
        """health/ready and an inference of `model` over HTTP, each answered (within the
        connection's timeout, 5 s: a frozen daemon fails it)."""
        assert self.http("GET", "/v2/health/ready")[0] == 200
        x = MLP.random_inputs()["x"]
        document = {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        }
        status, body = self.http("POST", f"/v2/models/{model}/infer", document)
        assert status == 200, body[:2000]
        (output,) = json.loads(body)["outputs"]
        probs = np.asarray(output["data"], np.float32).reshape(output["shape"])
        np.testing.assert_allclose(probs, MLP.reference({"x": x})["probs"], rtol=1e-5)

    def rss(self) -> int:
        return int(psutil.Process(self.service.proc.pid).memory_info().rss)

    def log(self) -> str:
        return self.service.log.read_text(errors="replace")

    def stop_within(self, seconds: float) -> None:
        self.service.proc.send_signal(signal.SIGTERM)
        code = self.service.proc.wait(seconds)
        assert code == 0, f"exit code {code}; the daemon's log ends:\n{self.log()[-4000:]}"


def http_port(service: Service) -> int:
    (line,) = [x for x in service.log.read_text().splitlines() if "KServe v2 HTTP listening" in x]
    return int(line.rpartition(":")[2])


def version_folder(root: Path, name: str) -> Path:
    folder = root / name / "1"
    folder.mkdir(parents=True)
    for made in (root / name, folder):
        made.chmod(0o755)
    return folder


def readable(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def repository(root: Path) -> Path:
    """The repository the attacks aim at, and the secret beside it (readable to the
    daemon's group, as the issue's root:neuron 0640 NEFF)."""
    root.mkdir(mode=0o755)
    readable(root.parent / "secret.neff", MLP.neff, 0o640)
    os.chown(root.parent / "secret.neff", 0, STAND_IN_GID)
    readable(version_folder(root, "mlp") / "model.neff", MLP.neff)
    named = version_folder(root, "named")
    readable(named / "net.neff", MLP.neff)
    os.mkfifo(named / "pipe", 0o666)
    readable(root / "named" / "config.pbtxt", b'default_model_filename: "net.neff"')
    os.mkfifo(version_folder(root, "fifo") / "model.neff", 0o666)
    os.mknod(version_folder(root, "zero") / "model.neff", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    (version_folder(root, "devlink") / "model.neff").symlink_to("/dev/zero")
    (version_folder(root, "escape") / "model.neff").symlink_to(root.parent / "secret.neff")
    readable(version_folder(root, "private") / "model.neff", MLP.neff, 0o600)
    version_folder(root, "missing")
    return root


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    top = Path(tempfile.mkdtemp(prefix="nrtd-files-"))
    try:
        top.chmod(0o755)
        root = repository(top / "repo")
        args = ["--model-repository", str(root), "--model-control-mode", "explicit"]
        args += ["--load-model", "mlp", "--http-address", "127.0.0.1:0"]
        with unit_service(*args) as service:
            yield Daemon(service, root, http_port(service))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def no_tracebacks(daemon: Daemon) -> None:
    log = daemon.log()
    assert "Traceback" not in log, log[-4000:]
    longest = max(map(len, log.splitlines()))
    assert longest < 2000, f"a log line of {longest} characters"


@pytest.mark.daemon
def test_default_model_filename_names_no_file_outside_the_version(daemon: Daemon) -> None:
    """Point 3: a load's config with an absolute path or '..' made the daemon read any file
    it could (a root:neuron 0640 NEFF), and told missing, unreadable and not-a-NEFF apart.
    Now only a plain file name in the version's folder, one answer for missing and
    unreadable, and a link out of the folder refused."""
    secret = daemon.repo.parent / "secret.neff"
    bad = [str(secret), os.path.relpath(secret, daemon.repo / "mlp" / "1"), "..", ".", "1/x"]
    bad += ["n" * 300, "a\0b"]
    grpc_member = daemon.run_as(
        "member",
        """
        bad = json.loads(sys.argv[3])
        answers = {}
        answers["bad"] = [grpc_load("mlp", {"default_model_filename": f}) for f in bad]
        for name in ("escape", "devlink", "private", "missing"):
            answers[name] = grpc_load(name)
        answers["own"] = grpc_load("mlp", {"default_model_filename": "model.neff"})
        print(json.dumps(answers))
        """,
        json.dumps(bad),
    )
    http_member = daemon.run_as(
        "http member",
        """
        bad = json.loads(sys.argv[3])
        answers = {}
        answers["bad"] = [http_load("mlp", {"default_model_filename": f}) for f in bad]
        for name in ("escape", "devlink", "private", "missing"):
            answers[name] = http_load(name)
        answers["named"] = http_load("named")
        print(json.dumps(answers))
        """,
        json.dumps(bad),
    )
    stranger = daemon.run_as(
        "stranger",
        """
        bad = json.loads(sys.argv[3])
        print(json.dumps([http_load("mlp", {"default_model_filename": f}) for f in bad]))
        """,
        json.dumps(bad),
    )
    # a load whose config is refused: Triton's INTERNAL "failed to load ..., failed to poll"
    for code, body in http_member["bad"]:
        assert code == 500 and "is not a plain file name" in body, body
        assert body.startswith('{"error":"failed to load \'mlp\', failed to poll'), body
    for code, details in grpc_member["bad"]:
        assert code == "INTERNAL" and "is not a plain file name" in details, details
    for code, body in stranger:
        assert code in (500, 403), body  # refused: as any caller's, or as a stranger's
    for name in ("escape", "devlink"):
        code, body = http_member[name]
        assert code == 400 and "leads outside its version folder" in body, body
        code, body = grpc_member[name]
        assert code == "INVALID_ARGUMENT" and "leads outside its version folder" in body, body
    for answers in (http_member, grpc_member):
        (code, private), (code2, missing) = answers["private"], answers["missing"]
        assert code == code2 and code in (503, "UNAVAILABLE")
        assert "no such file, or the daemon may not read it" in private
        assert private.replace("private", "NAME") == missing.replace("missing", "NAME")
    assert http_member["named"][0] == 200  # a file name inside its folder loads
    assert grpc_member["own"][0] == "OK"
    index = daemon.index()
    assert index["named"]["state"] == index["mlp"]["state"] == "READY"
    daemon.legit("named")
    daemon.legit()
    no_tracebacks(daemon)


@pytest.mark.daemon
def test_a_fifo_as_a_model_file_is_refused_at_once(daemon: Daemon) -> None:
    """Point 4: 16 loads of a FIFO hung HTTP for everyone, 16 over gRPC the whole gRPC
    API, for good. Now each is refused at once, over HTTP, KServe gRPC and nmgr's
    neff_file alike, and everyone is served meanwhile."""
    models = daemon.service.path("/var/lib/neuron-rtd/models")
    pipe = models / f"pipe-{secrets.token_hex(4)}.neff"
    os.mkfifo(pipe, 0o666)
    over_grpc = """
    neff_file = sys.argv[3]
    def nmgr_load():
        answer = nmgr.load(iter([pb.load_request(neff_file=neff_file)]), timeout=30)
        return [answer.status.code, answer.status.details.decode()]
    calls = [lambda: grpc_load("fifo")] * 16
    calls += [lambda: grpc_load("named", {"default_model_filename": "pipe"})] * 16
    print(json.dumps(at_once(calls + [nmgr_load] * 16)))
    """
    over_http = """
    calls = [lambda: http_load("fifo")] * 16
    calls += [lambda: http_load("named", {"default_model_filename": "pipe"})] * 16
    print(json.dumps(at_once(calls)))
    """
    answers: list[Any] = []

    def attack(who: str, code: str, *args: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.extend(daemon.run_as(who, code, *args)))
        thread.start()
        return thread

    try:
        runners = [attack("member", over_grpc, str(pipe)), attack("http member", over_http)]
        daemon.legit()  # while the attacks run (or after them: they are quick now)
        for runner in runners:
            runner.join(300)
            assert not runner.is_alive()
    finally:
        pipe.unlink()
    assert len(answers) == 80
    for code_, message, _ in answers:  # a call held on the FIFO: its timeout, not this
        assert code_ in (400, 503, "UNAVAILABLE", "INVALID_ARGUMENT", Nerr.INVALID), message
        assert "it is a FIFO, not a regular file" in message, message
    daemon.legit()
    assert daemon.index()["named"]["state"] == "READY"  # the version before still serves
    daemon.legit("named")
    no_tracebacks(daemon)


@pytest.mark.daemon
def test_dev_zero_as_a_model_file_costs_nothing(daemon: Daemon) -> None:
    """Point 5: /dev/zero as a model file grew the daemon ~650 MB/s to its OOM kill. Now a
    device in the version folder is refused unopened, a link to one leads outside it, and
    a path to one is no file name."""
    rss = daemon.rss()
    answers = daemon.run_as(
        "http member",
        """
        calls = [lambda: http_load("zero"), lambda: grpc_load("zero")]
        calls += [lambda: http_load("devlink"), lambda: grpc_load("devlink")]
        calls += [lambda: http_load("mlp", {"default_model_filename": "/dev/zero"})] * 4
        print(json.dumps(at_once(calls)))
        """,
    )
    assert answers[0][0] == 503 and "it is a character device, not a regular file" in answers[0][1]
    assert answers[1][0] == "UNAVAILABLE" and "a character device" in answers[1][1]
    for code, message, _ in answers[2:4]:
        assert code in (400, "INVALID_ARGUMENT") and "leads outside" in message, message
    for code, message, _ in answers[4:]:
        assert code == 500 and "plain file name" in message, message  # Triton's INTERNAL
    assert daemon.rss() - rss < 64 << 20
    daemon.legit()
    no_tracebacks(daemon)


@pytest.mark.daemon
def test_long_names_get_a_400_and_leave_nothing_behind(daemon: Daemon) -> None:
    """Point 8: 1000 loads of unique 100 KB names kept a lock each for good, failed
    uploads stayed in the index, and names over 255 bytes ended in ENAMETOOLONG, a 500
    and a traceback holding the name. Now a clear 400, nothing kept, short log lines."""
    over_http = """
    import os
    def unique(size):
        return os.urandom(4).hex() + "n" * (size - 8)
    answers = {"http": [], "bounds": [], "uploads": []}
    for _ in range(int(sys.argv[3])):
        code, body = http_load(unique(100_000))
        answers["http"].append([code, len(body), body[:300]])
    for size in (255, 256, 300, 4096):
        answers["bounds"].append(http_load(unique(size)))
    for i in range(50):
        name = "upload-" + os.urandom(4).hex()
        answers["uploads"].append([name] + http_load(name, files={"1/model.neff": b"no"}))
    print(json.dumps(answers))
    """
    over_grpc = """
    import os
    def unique(size):
        return os.urandom(4).hex() + "n" * (size - 8)
    answers = {"grpc": [], "grpc bounds": [], "grpc uploads": []}
    for _ in range(int(sys.argv[3])):
        code, details = grpc_load(unique(100_000), files={"1/model.neff": b"x"})
        answers["grpc"].append([code, len(details), details[:300]])
    for size in (255, 256, 300, 4096):
        answers["grpc bounds"].append(grpc_load(unique(size)))
    for i in range(50):
        name = "upload-" + os.urandom(4).hex()
        answers["grpc uploads"].append([name] + grpc_load(name, files={"1/model.neff": b"no"}))
    print(json.dumps(answers))
    """

    def flood(count: int) -> dict[str, Any]:
        answers: dict[str, Any] = daemon.run_as("http member", over_http, str(count))
        answers.update(daemon.run_as("member", over_grpc, str(count)))
        return answers

    flood(200)  # the fronts' buffers and the allocator's arenas grown to what such calls take
    rss = daemon.rss()
    answers = flood(1000)
    grown = daemon.rss() - rss
    for code, size, body in answers["http"]:
        assert code in (400, 414, 431) and size < 1000, body  # the front or the core refuses
        assert code != 400 or "at most 255 bytes" in body, body
    for code, size, details in answers["grpc"]:
        assert code == "INVALID_ARGUMENT" and size < 1000 and "at most 255 bytes" in details
    (h255, b255), *over = answers["bounds"]
    # a name like another, not in the repository (Triton's INTERNAL "failed to load"): no
    # ENAMETOOLONG
    assert h255 == 500 and "is not found" in b255 and "too long" not in b255, b255
    for code, body in over:
        assert code == 400 and "at most 255 bytes" in body, body
    (g255, d255), *over = answers["grpc bounds"]
    assert g255 == "INTERNAL" and "is not found" in d255 and "too long" not in d255, d255
    for code, details in over:
        assert code == "INVALID_ARGUMENT" and "at most 255 bytes" in details, details
    for _, code, body in answers["uploads"]:
        assert code == 400 and "is not a NEFF" in body, body
    for _, code, details in answers["grpc uploads"]:
        assert code == "INVALID_ARGUMENT" and "is not a NEFF" in details, details
    index = daemon.index()
    uploads = [name for name, *_ in answers["uploads"] + answers["grpc uploads"]]
    assert len(uploads) == 100 and not set(uploads) & set(index)
    assert not [name for name in index if len(name) > 255]
    assert grown < 16 << 20, f"the daemon grew {grown >> 20} MiB"  # a name kept: 200 MB
    # what a member may do still works: a load of its own files, served, then unloaded
    sent = daemon.run_as(
        "http member",
        """
        neff = open(sys.argv[3], "rb").read()
        loaded = http_load("sent", files={"1/model.neff": neff})
        unloaded = post("/v2/repository/models/sent/unload", {})
        print(json.dumps([loaded, unloaded]))
        """,
        str(daemon.repo / "mlp" / "1" / "model.neff"),
    )
    assert sent == [[200, ""], [200, ""]]
    assert "sent" not in daemon.index()
    daemon.legit()
    no_tracebacks(daemon)


@pytest.mark.daemon
def test_sigterm_ends_the_daemon_after_the_attacks(daemon: Daemon) -> None:
    """Last of the module: after every attack above, the daemon still stops on SIGTERM
    within 15 s (it did not, after a FIFO load)."""
    daemon.legit()
    daemon.stop_within(15)


@pytest.mark.daemon
def test_poll_mode_is_stopped_by_no_model(tmp_path: Path) -> None:
    """Point 4 in poll mode: a FIFO as a version's model.neff stopped the poll thread (and
    the start): later models never loaded. Now it is UNAVAILABLE, saying why, and the
    models put in later are served."""
    top = Path(tempfile.mkdtemp(prefix="nrtd-poll-"))
    try:
        top.chmod(0o755)
        root = top / "repo"
        root.mkdir(mode=0o755)
        os.mkfifo(version_folder(root, "a-fifo") / "model.neff", 0o666)
        os.mknod(
            version_folder(root, "b-zero") / "model.neff", stat.S_IFCHR | 0o666, os.makedev(1, 5)
        )
        readable(version_folder(root, "mlp") / "model.neff", MLP.neff)
        args = ["--model-repository", str(root), "--model-control-mode", "poll"]
        args += ["--repository-poll-secs", "1", "--http-address", "127.0.0.1:0"]
        with unit_service(*args) as service:
            daemon = Daemon(service, root, http_port(service))
            index = daemon.index()
            assert "it is a FIFO, not a regular file" in index["a-fifo"]["reason"]
            assert "a character device" in index["b-zero"]["reason"]
            assert index["mlp"]["state"] == "READY"
            daemon.legit()
            staged = version_folder(root, ".later")  # hidden: not a model until renamed
            readable(staged / "model.neff", MLP.neff)
            (root / ".later").rename(root / "later")
            wait_until(
                lambda: daemon.index().get("later", {}).get("state") == "READY",
                60,
                "the renamed model READY",
            )
            daemon.legit("later")
            daemon.legit()
            assert "FIFO" in daemon.index()["a-fifo"]["reason"]
            no_tracebacks(daemon)
            daemon.stop_within(15)
    finally:
        shutil.rmtree(top, ignore_errors=True)
