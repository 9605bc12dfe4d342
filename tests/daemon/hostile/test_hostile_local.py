"""A hostile local user against the daemon as the unit runs it (issue 22's probes).

The daemon runs under its unit's settings as another user (test_service_user.py's
`service`); the hostile user is a third uid in the socket's group, its probes run as that
uid through `setpriv`; the victim is root, through our client library. Each finding of the
issue is a test here that asserts the refusal."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from test_service_user import OTHER_UID, STAND_IN_GID, Service, as_user, service
from waiting import wait_until

from neuron_rtd.client import Client
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import ext_pb

__all__ = ["service"]  # the module-scoped daemon of test_service_user.py, started afresh here

pytestmark = pytest.mark.daemon

PRELUDE = """
import json, os, sys, queue, grpc
from neuron_rtd.proto import pb, pb_grpc, ext_pb, ext_pb_grpc
address = sys.argv[1]
channel = grpc.insecure_channel(address)
stub = pb_grpc.nmgr_v1Stub(channel)
ext = ext_pb_grpc.nmgr_extStub(channel)

def session():
    requests = queue.Queue()
    requests.put(pb.session_monitor_request(framework_name="hostile"))
    stream = pb_grpc.nmgr_session_managerStub(channel).session_monitor(iter(requests.get, None))
    return next(stream).session_id, (requests, stream)

def status(response):
    return [response.status.code, response.status.details.decode()]

def shm_infer(model, inputs, outputs, metadata=()):
    request = pb.infer_request(h_nn=pb.h_nn(id=model))
    for name, path in inputs.items():
        request.ifmap.add(name=name, buf_shm=pb.shared_mem_buf(path=path))
    for name, path in outputs.items():
        request.shm_ofmap.add(name=name, buf_shm=pb.shared_mem_buf(path=path))
    return stub.infer(request, timeout=20, metadata=metadata)
"""


def probe(service: Service, code: str, *args: str, timeout: float = 120) -> Any:
    """Run `code` as the hostile user (a member of the socket's group); what it printed
    last, as JSON."""
    who = as_user(OTHER_UID, OTHER_UID, STAND_IN_GID)
    code = PRELUDE + textwrap.dedent(code)
    return printed([*who, sys.executable, "-c", code, address(service), *args], timeout)


def printed(command: list[str], timeout: float = 120) -> Any:
    """`command` run from / with a bare environment (no HOME); what it printed last, as
    JSON (it must succeed)."""
    done = subprocess.run(
        command,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def address(service: Service) -> str:
    return f"unix:{service.path('/run/neuron.sock')}"


@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    return build_mlp((32, 16, 4), name="victim")


@pytest.fixture
def victim(service: Service) -> Iterator[Client]:
    with Client(address(service), shm=True) as client:
        yield client


@pytest.fixture
def secret_object() -> Iterator[str]:
    """A root-owned shm object of mode 0600 holding a secret."""
    name = f"/nrt_victim_{secrets.token_hex(4)}"
    path = Path("/dev/shm") / name[1:]
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, b"SECRET!!" * 16)
    os.close(fd)
    yield name
    path.unlink(missing_ok=True)


def test_a_root_only_object_is_neither_mapped_nor_read(
    service: Service, victim: Client, mlp: SampleModel, secret_object: str
) -> None:
    """Finding 1: `shm_map` of root's 0600 object answered 0, and an inference read it.
    The daemon opens it with its own rights: refused, in a session or none, worded as for
    an object that does not exist."""
    model = victim.load(mlp.neff)
    got = probe(
        service,
        """
        victim_path, model = sys.argv[2], int(sys.argv[3])
        mine, _held = session()
        answers = {}
        for sid in (0, mine):
            request = pb.shm_map_request(path=victim_path, mmap_prot=3, session_id=sid)
            answers[f"map{sid and 1}"] = status(stub.shm_map(request))
        request = pb.shm_map_request(path="/nrt_nothing_here", mmap_prot=3, session_id=mine)
        answers["absent"] = status(stub.shm_map(request))
        answers["infer"] = status(shm_infer(model, {"x": victim_path}, {"probs": victim_path}))
        print(json.dumps(answers))
        """,
        secret_object,
        str(model.id),
    )
    for key in ("map0", "map1"):
        code, details = got[key]
        assert code == Nerr.INVALID and "no such object, or the daemon may not open it" in details
        assert details.replace(secret_object, "NAME") == got["absent"][1].replace(
            "/nrt_nothing_here", "NAME"
        )
    assert got["infer"][0] == Nerr.INFER_BAD_INPUT and "not mapped" in got["infer"][1]
    assert "SECRET" not in json.dumps(got)
    assert (Path("/dev/shm") / secret_object[1:]).read_bytes() == b"SECRET!!" * 16


def test_a_root_only_object_is_not_registered_over_kserve(
    service: Service, secret_object: str
) -> None:
    """The same through the KServe v2 service on the socket: SystemSharedMemoryRegister of
    root's 0600 object is refused as that of an object that does not exist."""
    got = probe(
        service,
        """
        from neuron_rtd.proto import kserve_pb, kserve_pb_grpc
        v2 = kserve_pb_grpc.GRPCInferenceServiceStub(channel)
        answers = {}
        for label, key in (("secret", sys.argv[2]), ("absent", "/nrt_nothing_here")):
            request = kserve_pb.SystemSharedMemoryRegisterRequest(
                name=label, key=key, offset=0, byte_size=8
            )
            try:
                v2.SystemSharedMemoryRegister(request, timeout=20)
                answers[label] = ["OK", ""]
            except grpc.RpcError as error:
                answers[label] = [error.code().name, error.details()]
        status = v2.SystemSharedMemoryStatus(kserve_pb.SystemSharedMemoryStatusRequest())
        answers["regions"] = sorted(status.regions)
        print(json.dumps(answers))
        """,
        secret_object,
    )
    assert got["secret"][0] == got["absent"][0] == "INVALID_ARGUMENT"
    assert got["secret"][1].replace(secret_object, "NAME") == got["absent"][1].replace(
        "/nrt_nothing_here", "NAME"
    )
    assert "may not open it" in got["secret"][1] and got["regions"] == []
    assert (Path("/dev/shm") / secret_object[1:]).read_bytes() == b"SECRET!!" * 16


def test_a_clients_tensors_cannot_be_taken_over(
    service: Service, victim: Client, mlp: SampleModel
) -> None:
    """Finding 2: after client A unlinked its objects, another user made objects of the
    same names, mapped them, and A's inferences went through them. Now A's objects are
    passed, never named on disk; the same names in another session are that session's;
    a call that does not present A's session cannot name A's."""
    model = victim.load(mlp.neff)
    x = mlp.random_inputs(1)["x"]
    want = model(x=x)["probs"]
    (slot,) = model._slots._idle  # the slot A's inference used, its objects passed and unlinked
    names = [buffer.path for buffer in slot.buffers()]
    assert not any((Path("/dev/shm") / n[1:]).exists() for n in names)
    got = probe(
        service,
        """
        model, names = int(sys.argv[2]), sys.argv[3].split(",")
        mine, _held = session()
        answers = {}
        for name in names:  # objects of A's names, its own, mapped in its own session
            fd = os.open("/dev/shm/" + name[1:], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
            os.fchmod(fd, 0o666)  # open to the daemon, by name
            os.write(fd, b"\\xff" * 4096)
            os.close(fd)
            request = pb.shm_map_request(path=name, mmap_prot=3, session_id=mine)
            answers.setdefault("maps", []).append(status(stub.shm_map(request))[0])
        inputs, outputs = {"x": names[0]}, {"probs": names[1]}
        answers["bare"] = status(shm_infer(model, inputs, outputs))
        forged = [("nrt-session-id", str(mine + 1))]
        answers["forged"] = status(shm_infer(model, inputs, outputs, forged))
        own = [("nrt-session-id", str(mine))]
        answers["own"] = status(shm_infer(model, inputs, outputs, own))
        print(json.dumps(answers))
        """,
        str(model.id),
        ",".join(names),
    )
    try:
        assert got["maps"] == [Nerr.OK, Nerr.OK]  # its own objects, in its own session
        code, details = got["bare"]
        assert code == Nerr.INFER_BAD_INPUT and "named only by calls that present it" in details
        assert got["forged"][0] == Nerr.INVALID and "names no open session" in got["forged"][1]
        # with its own session it reaches only its own objects (its garbage in, out to it)
        assert got["own"][0] in (Nerr.OK, Nerr.INFER_COMPLETED_WITH_NUM_ERR)
        np.testing.assert_array_equal(model(x=x)["probs"], want)  # A's objects are A's
    finally:
        for name in names:
            (Path("/dev/shm") / name[1:]).unlink(missing_ok=True)


def test_open_sessions_do_not_freeze_the_daemon(service: Service, mlp: SampleModel) -> None:
    """Finding 3: 16 open session streams froze every call. Another user holds 200 open
    while root loads and infers, and `describe` answers: each call within the client's
    timeout (30 s, seconds at most on a loaded CI machine), a freeze failing it."""
    ready = Path(f"/tmp/nrt-hostile-{secrets.token_hex(4)}")
    holder = subprocess.Popen(
        [
            *as_user(OTHER_UID, OTHER_UID, STAND_IN_GID),
            sys.executable,
            "-c",
            PRELUDE
            + textwrap.dedent(
                """
                held = [session()[1] for _ in range(200)]
                open(sys.argv[2], "w").close()
                sys.stdin.read()  # hold them until the test ends
                """
            ),
            address(service),
            str(ready),
        ],
        stdin=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        cwd="/",
    )
    try:
        wait_until(lambda: ready.exists() or holder.poll() is not None, 120, "the holder")
        assert holder.poll() is None, "the holder ended before it held its sessions"
        with Client(address(service), shm=True, timeout_s=30) as victim:
            model = victim.load(mlp.neff)
            x = mlp.random_inputs(2)["x"]
            for _ in range(10):
                model(x=x)
            assert victim.version()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(60)
        ready.unlink(missing_ok=True)


def test_session_ids_and_cookies_cannot_be_guessed_or_seen(
    service: Service, victim: Client, mlp: SampleModel
) -> None:
    """Finding 5: sequential session ids, shown by `snapshot`, let another client load
    under A's session, read A's profile and spend A's quota. Now ids and cookies are
    random, the snapshot shows a tag, and a session's profile is told only to it."""
    model = victim.load(mlp.neff, profile=True)
    x = mlp.random_inputs(3)["x"]
    model(x=x)
    session_id = victim.session_id
    got = probe(
        service,
        """
        model = int(sys.argv[2])
        snapshot = ext.snapshot(ext_pb.snapshot_request(), timeout=20)
        answers = {"snapshot": snapshot.SerializeToString().hex()}
        tags = [m.session for m in snapshot.models if m.id == model]
        answers["tag"] = tags[0] if tags else ""
        guesses = [int(answers["tag"], 16)] if answers["tag"] else []
        guesses += [1, 2, 10001, 2**63]
        answers["guesses"] = [
            status(stub.create_eg(pb.create_eg_request(nc_count=1, session_id=g)))[0]
            for g in guesses
        ]
        profile = ext.profile(ext_pb.profile_request(model_id=model), timeout=20)
        answers["profile"] = [profile.status_code, profile.details]
        waits = [stub.infer_wait(pb.infer_wait_request(cookie=c), timeout=20) for c in range(1, 50)]
        answers["cookies"] = sorted({w.status.code for w in waits})
        print(json.dumps(answers))
        """,
        str(model.id),
    )
    assert got["tag"] and len(got["tag"]) == 8
    snapshot = bytes.fromhex(got["snapshot"])
    assert session_id.to_bytes(8, "little") not in snapshot
    assert str(session_id).encode() not in snapshot
    assert set(got["guesses"]) == {Nerr.INVALID}
    assert got["profile"][0] == Nerr.INVALID and "belongs to session" in got["profile"][1]
    assert got["cookies"] == [Nerr.INVALID_HANDLE]
    connection = victim.connection  # the session itself still reads its profile
    request = ext_pb.profile_request(model_id=model.id)
    mine = connection.unary("profile", request, stub=connection.ext)
    assert mine.status_code == Nerr.OK and mine.inferences


def test_neff_file_reads_only_what_the_daemon_may(service: Service, mlp: SampleModel) -> None:
    """Finding 4: `neff_file` made the root daemon read any file for anyone, told whether
    a file existed, and read a 3 GiB sparse file whole. Now the daemon reads with its own
    rights from the package's folder only, one answer for missing and unreadable, the
    header first."""
    models = service.path("/var/lib/neuron-rtd/models")
    private = models / f"private-{secrets.token_hex(4)}"
    private.mkdir(mode=0o700)
    (private / "model.neff").write_bytes(mlp.neff)
    (private / "model.neff").chmod(0o600)
    shared = models / f"shared-{secrets.token_hex(4)}.neff"
    shared.write_bytes(mlp.neff)
    shared.chmod(0o644)
    sparse = models / f"sparse-{secrets.token_hex(4)}.neff"
    with open(sparse, "wb") as f:
        f.truncate(3 << 30)
    sparse.chmod(0o644)
    paths = [
        private / "model.neff",
        private / "absent.neff",
        models / "absent.neff",
        Path("/etc/shadow"),
        sparse,
        shared,
    ]
    try:
        rss = psutil.Process(service.proc.pid).memory_info().rss
        got = probe(
            service,
            """
            answers = []
            for path in sys.argv[2:]:
                request = pb.load_request(neff_file=path)
                response = stub.load(iter([request]), timeout=60)
                answers.append(status(response) + [response.h_nn.id])
                if response.h_nn.id:
                    stub.unload(pb.unload_request(h_nn=response.h_nn), timeout=60)
            print(json.dumps(answers))
            """,
            *map(str, paths),
        )
        grown = psutil.Process(service.proc.pid).memory_info().rss - rss
    finally:
        for path in (private / "model.neff", shared, sparse):
            path.unlink()
        private.rmdir()
    hidden = [
        details.replace(str(path), "PATH")
        for (code, details, _), path in zip(got[:3], paths, strict=False)
        if code == Nerr.INVALID
    ]
    assert len(hidden) == 3 and len(set(hidden)) == 1, got
    assert "no such file, or the daemon may not read it" in hidden[0]
    assert got[3][0] == Nerr.INVALID and "outside the folders" in got[3][1]
    assert got[4][0] == Nerr.INVALID and "not a NEFF" in got[4][1]
    assert got[5][0] == Nerr.OK and got[5][2] > 0  # what the daemon may read, it loads
    assert grown < 256 << 20  # the sparse file was not read
