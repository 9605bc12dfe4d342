"""Shared memory against a hostile local user (issue 38, points 1, 2, 6 and 10), with the
daemon as the unit runs it (test_service_user.py's `unit_service`, uid 65534 standing in
for neuron-rtd) serving a model repository: a member of the socket's group (OTHER_UID)
probes the KServe v2 service on the socket, and the peer socket. What every one of the
socket's users could open is served; what the daemon's rights alone reach is not."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from test_hostile_local import probe
from test_service_user import (
    STAND_IN_GID,
    STAND_IN_UID,
    Service,
    as_user,
    model_repository,
    unit_service,
)

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import SampleModel, build_mlp

pytestmark = pytest.mark.daemon

VICTIM_UID = 65530  # another member, whose object the prober must not reach


@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    return build_mlp((32, 16, 4), name="victim")


@pytest.fixture(scope="module")
def served(mlp: SampleModel) -> Iterator[Service]:
    top = Path(tempfile.mkdtemp(prefix="nrtd-shm-repo-"))
    try:
        repository = model_repository(top, {"mlp": mlp.neff})
        with unit_service("--model-repository", str(repository)) as service:
            yield service
    finally:
        shutil.rmtree(top, ignore_errors=True)


def shm_object(owner: int, group: int, mode: int, data: bytes) -> Path:
    path = Path("/dev/shm") / f"nrt_hostile_{secrets.token_hex(4)}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, data)
    os.fchown(fd, owner, group)
    os.fchmod(fd, mode)
    os.close(fd)
    return path


V2 = """
from neuron_rtd.proto import kserve_pb, kserve_pb_grpc
v2 = kserve_pb_grpc.GRPCInferenceServiceStub(channel)

def register(name, key, size):
    request = kserve_pb.SystemSharedMemoryRegisterRequest(
        name=name, key=key, offset=0, byte_size=size
    )
    try:
        v2.SystemSharedMemoryRegister(request, timeout=20)
        return ["OK", ""]
    except grpc.RpcError as error:
        return [error.code().name, error.details()]

def infer(inputs, outputs):
    request = kserve_pb.ModelInferRequest(model_name="mlp")
    for name, (shape, region, offset, size) in inputs.items():
        tensor = request.inputs.add(name=name, datatype="FP32", shape=shape)
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = size
    for name, (region, offset, size) in outputs.items():
        tensor = request.outputs.add(name=name)
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = size
    try:
        v2.ModelInfer(request, timeout=20)
        return ["OK", ""]
    except grpc.RpcError as error:
        return [error.code().name, error.details()]
"""


def v2_probe(service: Service, code: str, *args: str, timeout: float = 120) -> Any:
    """`probe`, with the v2 service's helpers above."""
    return probe(service, V2 + textwrap.dedent(code), *args, timeout=timeout)


def test_a_member_registers_only_what_every_user_of_the_socket_could_open(
    served: Service, mlp: SampleModel
) -> None:
    """Point 1 on the socket: the daemon's own 0600 object and another member's 0600
    object shared with the daemon's user by ACL (as docs/wire-api.md tells users to do for
    `shm_map`) are refused, worded as an object that does not exist; an object open to the
    socket's group is served, and an inference reads and writes it."""
    secret = b"SECRET!!" * 64
    daemons = shm_object(STAND_IN_UID, STAND_IN_GID, 0o600, secret)
    victims = shm_object(VICTIM_UID, VICTIM_UID, 0o600, secret)
    subprocess.run(["setfacl", "-m", f"u:{STAND_IN_UID}:rw", str(victims)], check=True)
    x = mlp.random_inputs(1)["x"]
    shared = shm_object(VICTIM_UID, STAND_IN_GID, 0o660, x.tobytes() + bytes(64))
    try:
        got = v2_probe(
            served,
            """
            answers = {}
            for label, key in zip(("daemons", "victims", "absent", "shared"), sys.argv[2:]):
                answers[label] = register(label, key, 192)
            answers["regions"] = [
                r for r in v2.SystemSharedMemoryStatus(
                    kserve_pb.SystemSharedMemoryStatusRequest()).regions
            ]
            answers["infer"] = infer(
                {"x": ([1, 32], "shared", 0, 128)}, {"probs": ("shared", 128, 16)}
            )
            answers["steal"] = infer(
                {"x": ([1, 32], "daemons", 0, 128)}, {"probs": ("victims", 0, 16)}
            )
            print(json.dumps(answers))
            """,
            *(f"/{p.name}" for p in (daemons, victims)),
            "/nrt_nothing_here",
            f"/{shared.name}",
        )
        for label, path in (("daemons", daemons), ("victims", victims)):
            code, details = got[label]
            assert code == "INVALID_ARGUMENT"
            assert details.replace(path.name, "NAME") == got["absent"][1].replace(
                "nrt_nothing_here", "NAME"
            )
            assert "could not open it itself" in details
        assert got["shared"] == ["OK", ""] and got["regions"] == ["shared"]
        assert got["infer"] == ["OK", ""]
        want = mlp.reference({"x": x})["probs"]
        probs = np.frombuffer(shared.read_bytes()[128:144], np.float32).reshape(1, 4)
        np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-6)
        assert got["steal"][0] == "NOT_FOUND"
        assert daemons.read_bytes() == secret and victims.read_bytes() == secret
    finally:
        for path in (daemons, victims, shared):
            path.unlink(missing_ok=True)


def test_a_tensor_claiming_gigabytes_costs_nothing(served: Service) -> None:
    """Point 6: an input of 3.5e9 bytes in shared memory, its region missing: refused
    before any buffer is made, whether its shape says so or not; the daemon stays small
    and answers."""
    process = psutil.Process(served.proc.pid)
    rss = process.memory_info().rss
    got = v2_probe(
        served,
        """
        answers = {}
        answers["shape"] = infer({"x": ([1, 32], "nowhere", 0, 3_500_000_000)}, {})
        answers["claimed"] = infer({"x": ([875_000_000], "nowhere", 0, 3_500_000_000)}, {})
        print(json.dumps(answers))
        """,
        timeout=30,  # a 3.5 GB buffer made and filled would not end in time
    )
    code, details = got["shape"]
    assert code == "INVALID_ARGUMENT" and "takes 128 bytes, got 3500000000" in details
    code, details = got["claimed"]
    assert code == "NOT_FOUND" and "no shared memory region named 'nowhere'" in details
    assert process.memory_info().rss - rss < 64 << 20
    assert served.proc.poll() is None


def test_huge_passed_objects_do_not_take_the_address_space(served: Service) -> None:
    """Point 10: 63 sealed sparse memfds of 64 TiB each, passed over the peer socket,
    were each mapped whole; the next large gRPC message then failed in grpc's serve
    thread for good. Now each is mapped only as far as tensors use (at most 256 MiB), and
    a 60 MB message and an inference are served after them."""
    process = psutil.Process(served.proc.pid)
    vms = process.memory_info().vms
    peer = os.path.realpath(served.path("/run/neuron.sock")) + ".peer"
    got = probe(
        served,
        """
        import fcntl
        from neuron_rtd.client._peer import _ask, ticket
        from neuron_rtd.proto import ext_pb
        peer = sys.argv[2]
        requests = queue.Queue()
        requests.put(pb.session_monitor_request(framework_name="hostile"))
        stream = pb_grpc.nmgr_session_managerStub(channel).session_monitor(
            iter(requests.get, None), metadata=[("nrt-peer-ticket", str(ticket(peer)))]
        )
        sid = next(stream).session_id
        passed = []
        for i in range(63):
            fd = os.memfd_create(f"huge{i}", os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, 64 << 40)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            share = ext_pb.shm_share_request(session_id=sid, path=f"/huge{i}", mmap_prot=3)
            for answer in _ask(peer, [(ext_pb.peer_request(shm_share=share), fd)], "shm_share"):
                passed.append(answer.status_code)
            os.close(fd)
        big = pb.load_request(neff_chunk=pb.file_chunk(chunk=bytes(60 << 20)))
        response = stub.load(iter([big]), timeout=120)
        print(json.dumps({"passed": passed, "load": status(response)}))
        """,
        peer,
    )
    assert got["passed"] == [0] * 63
    # the 60 MB message reached its handler (which refuses a chunk sent before the size)
    assert got["load"][0] != 0 and "neff_chunk before neff_size" in got["load"][1]
    assert process.memory_info().vms - vms < 20 << 30  # 63 x 256 MiB at most, not 4 PiB
    with Client(f"unix:{served.path('/run/neuron.sock')}") as client:
        assert client.version()


STRANGER_UID = 65532  # in no group


def test_on_tcp_the_caller_is_the_owner_of_its_socket(tmp_path: Path) -> None:
    """gRPC on a loopback TCP address names its caller: the user owning the client's
    socket. Only root and members of the socket's group (here nogroup, whose member by the
    user database is nobody) may do more than ask after health and the models; a member
    registers a region of its own 0600 object and not root's (worded as one that does not
    exist); a stranger is refused saying why, and may still ask whether the server is
    ready and its version."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to call as another user")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    roots = shm_object(0, 0, 0o600, bytes(64))
    members = shm_object(STAND_IN_UID, STAND_IN_GID, 0o600, bytes(64))
    config = tmp_path / "neuron-rtd.json"
    config.write_text(json.dumps({"socket_group": "nogroup"}))
    config.chmod(0o644)
    daemon = DaemonProcess(
        sim_root=tmp_path / "sim",
        args=["-c", str(config), "--model-repository", str(tmp_path)],
    )
    daemon.address = f"127.0.0.1:{port}"
    code = textwrap.dedent(
        """
        import json, sys, grpc
        from neuron_rtd.proto import kserve_pb, kserve_pb_grpc, pb, pb_grpc
        channel = grpc.insecure_channel(sys.argv[1])
        v2 = kserve_pb_grpc.GRPCInferenceServiceStub(channel)
        nmgr = pb_grpc.nmgr_v1Stub(channel)

        def answer(call, request):
            try:
                call(request, timeout=20)
                return ["OK", ""]
            except grpc.RpcError as error:
                return [error.code().name, error.details()]

        answers = {}
        for label, key in zip(("roots", "own"), sys.argv[2:]):
            request = kserve_pb.SystemSharedMemoryRegisterRequest(
                name=label, key=key, offset=0, byte_size=64
            )
            answers[label] = answer(v2.SystemSharedMemoryRegister, request)
        answers["ready"] = answer(v2.ServerReady, kserve_pb.ServerReadyRequest())
        answers["version"] = answer(nmgr.get_version, pb.get_version_request())
        answers["list"] = answer(nmgr.list_egs, pb.empty())
        from neuron_rtd.client import Client
        from neuron_rtd.neff.samples import build_mlp
        mlp = build_mlp((8, 8, 4))
        x = mlp.random_inputs(1)["x"]
        try:  # a session (a stream answered without a thread), a load (a stream), infers
            with Client(sys.argv[1], shm=False) as client:
                got = client.load(mlp.neff)(x=x)["probs"]
            close = abs(got - mlp.reference({"x": x})["probs"]).max() < 1e-5
            answers["client"] = ["OK" if close else "WRONG", ""]
        except Exception as error:
            answers["client"] = [type(error).__name__, str(error)]
        print(json.dumps(answers))
        """
    )

    def call_as(uid: int, gid: int) -> dict[str, list[str]]:
        done = subprocess.run(
            [
                *as_user(uid, gid),
                sys.executable,
                "-c",
                code,
                daemon.address,
                f"/{roots.name}",
                f"/{members.name}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    try:
        with daemon:
            member = call_as(STAND_IN_UID, STAND_IN_GID)
            stranger = call_as(STRANGER_UID, STRANGER_UID)
        assert member["own"] == ["OK", ""] and member["list"] == ["OK", ""]
        assert member["client"] == ["OK", ""]
        code_name, details = member["roots"]
        assert code_name == "INVALID_ARGUMENT"
        assert f"uid {STAND_IN_UID} (nobody) could not open it itself" in details
        assert stranger["ready"] == ["OK", ""] and stranger["version"] == ["OK", ""]
        assert "PERMISSION_DENIED" in stranger["client"][1], stranger
        for key in ("roots", "own", "list"):
            code_name, details = stranger[key]
            assert code_name == "PERMISSION_DENIED", stranger
            assert "for root and members of group nogroup" in details
            assert f"uid {STRANGER_UID} is neither" in details
    finally:
        roots.unlink(missing_ok=True)
        members.unlink(missing_ok=True)
