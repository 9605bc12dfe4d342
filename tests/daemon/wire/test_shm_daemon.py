"""shm_map / shm_unmap and shared-memory IFMAPs/OFMAPs through the real daemon, with
every bad case answered by a clean error while the daemon keeps serving."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from test_wire import assert_nerr, infer, load, outputs

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.runtime.shm import PROT_READ, PROT_WRITE

pytestmark = pytest.mark.daemon
RW = PROT_READ | PROT_WRITE


@pytest.fixture(scope="module")
def sample() -> SampleModel:
    return build_mlp((16, 32, 8), batch=2, seed=5)


class Shm:
    """A POSIX shm object the test owns, as a client makes one."""

    def __init__(self, size: int) -> None:
        self.path = f"/nrtd_test_{uuid.uuid4().hex}"
        self.file = Path("/dev/shm") / self.path[1:]
        fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)

    def write(self, data: bytes) -> None:
        with open(self.file, "r+b") as f:
            f.write(data)

    def read(self, size: int) -> bytes:
        with open(self.file, "rb") as f:
            return f.read(size)

    def unlink(self) -> None:
        self.file.unlink(missing_ok=True)


@pytest.fixture
def shm() -> Iterator[list[Shm]]:
    made: list[Shm] = []
    yield made
    for obj in made:
        obj.unlink()


def new(made: list[Shm], size: int) -> Shm:
    obj = Shm(size)
    made.append(obj)
    return obj


def shm_infer(stub: Any, model_id: int, ifmaps: dict[str, str], ofmaps: dict[str, str]) -> Any:
    io = pb.infer_io
    return stub.infer(
        pb.infer_request(
            h_nn=pb.h_nn(id=model_id),
            ifmap=[io(name=n, buf_shm=pb.shared_mem_buf(path=p)) for n, p in ifmaps.items()],
            shm_ofmap=[io(name=n, buf_shm=pb.shared_mem_buf(path=p)) for n, p in ofmaps.items()],
        )
    )


def test_inputs_and_outputs_through_shared_memory(
    stub: Any, sample: SampleModel, shm: list[Shm]
) -> None:
    model = load(stub, sample.neff).h_nn
    x = sample.random_inputs(seed=1)["x"]
    spec = sample.outputs[0]
    inp, out = new(shm, x.nbytes), new(shm, spec.nbytes)
    inp.write(x.tobytes())
    for obj in (inp, out):
        assert stub.shm_map(pb.shm_map_request(path=obj.path, mmap_prot=RW)).status.code == 0
    inp.unlink()  # the client may unlink the name right after shm_map
    response = shm_infer(stub, model.id, {"x": inp.path}, {spec.name: out.path})
    assert response.status.code == Nerr.OK and len(response.ofmap) == 0
    got = np.frombuffer(out.read(spec.nbytes), spec.dtype).reshape(spec.shape)
    inline = outputs(infer(stub, model.id, {"x": x}), sample)[spec.name]
    np.testing.assert_array_equal(got, inline)
    for obj in (inp, out):
        assert stub.shm_unmap(pb.shm_unmap_request(path=obj.path)).status.code == 0
    stub.unload(pb.unload_request(h_nn=model))


def test_bad_shared_memory_gets_clean_errors(
    stub: Any, sample: SampleModel, shm: list[Shm]
) -> None:
    model = load(stub, sample.neff).h_nn
    x = sample.random_inputs(seed=2)["x"]
    response = shm_infer(stub, model.id, {"x": "/never_mapped"}, {})
    assert_nerr(response.status, Nerr.INFER_BAD_INPUT, "'/never_mapped' is not mapped")

    missing = stub.shm_map(pb.shm_map_request(path="/nrtd_no_such_object", mmap_prot=RW))
    assert_nerr(missing.status, Nerr.INVALID, "no such object, or the daemon may not open it")
    for bad in ("../../etc/passwd", "/etc/passwd", "/a/../b"):
        status = stub.shm_map(pb.shm_map_request(path=bad, mmap_prot=RW)).status
        assert_nerr(status, Nerr.INVALID, "not a plain shared memory name")
    unknown = stub.shm_unmap(pb.shm_unmap_request(path="/nrtd_not_mapped"))
    assert_nerr(unknown.status, Nerr.INVALID, "is not mapped")

    small = new(shm, x.nbytes - 4)
    assert stub.shm_map(pb.shm_map_request(path=small.path, mmap_prot=RW)).status.code == 0
    response = shm_infer(stub, model.id, {"x": small.path}, {})
    assert_nerr(response.status, Nerr.INFER_BAD_INPUT, f"holds {x.nbytes - 4} bytes")

    shrinking = new(shm, x.nbytes)
    shrinking.write(x.tobytes())
    assert stub.shm_map(pb.shm_map_request(path=shrinking.path, mmap_prot=RW)).status.code == 0
    assert shm_infer(stub, model.id, {"x": shrinking.path}, {}).status.code == Nerr.OK
    os.truncate(shrinking.file, 8)  # the client shrinks it while mapped: no SIGBUS
    response = shm_infer(stub, model.id, {"x": shrinking.path}, {})
    assert_nerr(response.status, Nerr.INFER_BAD_INPUT, "holds 8 bytes")

    spec = sample.outputs[0]
    tiny_out = new(shm, 4)
    assert stub.shm_map(pb.shm_map_request(path=tiny_out.path, mmap_prot=RW)).status.code == 0
    response = shm_infer(stub, model.id, {}, {spec.name: tiny_out.path})
    assert_nerr(response.status, Nerr.INFER_BAD_INPUT, "missing input(s): 'x'")
    bad_out = pb.infer_request(
        h_nn=model,
        ifmap=[pb.infer_io(name="x", buf=x.tobytes())],
        shm_ofmap=[pb.infer_io(name=spec.name, buf_shm=pb.shared_mem_buf(path=tiny_out.path))],
    )
    assert_nerr(stub.infer(bad_out).status, Nerr.INFER_BAD_INPUT, "holds 4 bytes")
    assert tiny_out.file.stat().st_size == 4  # not grown

    assert infer(stub, model.id, {"x": x}).status.code == Nerr.OK  # still serving
    for obj in (small, shrinking, tiny_out):
        assert stub.shm_unmap(pb.shm_unmap_request(path=obj.path)).status.code == 0
    stub.unload(pb.unload_request(h_nn=model))


def test_shared_memory_disabled_in_the_config(work: Path, shm: list[Shm]) -> None:
    config = work / "neuron-rtd.json"
    config.write_text(json.dumps({"shmem_enabled": False}))
    obj = new(shm, 16)
    request = pb.shm_map_request(path=obj.path, mmap_prot=RW)
    daemon = DaemonProcess(sim_root=work / "sim", args=["-c", str(config)])
    with daemon as proc, grpc.insecure_channel(proc.address) as channel:
        status = pb_grpc.nmgr_v1Stub(channel).shm_map(request).status
    assert_nerr(status, Nerr.INVALID, "shmem_enabled false")


def test_the_peer_socket_answers_every_malformed_message_and_serves_on(
    daemon: DaemonProcess, sample: SampleModel
) -> None:
    """Garbage, an oversize message, an infer of garbage, two descriptors, a descriptor
    with a ticket request, a session that is not open, a pipe instead of shared memory:
    each answered with an nerr and a reason, no descriptor kept; then a real client still
    passes its objects."""
    import array
    import socket

    from neuron_rtd.client import Client
    from neuron_rtd.proto import ext_pb

    path = daemon.socket_path + ".peer"

    def answer(data: bytes, *fds: int) -> tuple[int, str]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(10)
            sock.connect(path)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            sock.sendmsg([data], rights)
            reply = ext_pb.peer_response.FromString(sock.recv(1 << 16))
        return reply.status_code, reply.details

    def share(session_id: int, name: str = "/x") -> bytes:
        request = ext_pb.shm_share_request(session_id=session_id, path=name, mmap_prot=RW)
        return ext_pb.peer_request(shm_share=request).SerializeToString()

    def lane_infer(data: bytes) -> bytes:
        infer = ext_pb.peer_infer_request(infer_request=data)
        return ext_pb.peer_request(infer=infer).SerializeToString()

    ticket = ext_pb.peer_request(ticket=ext_pb.peer_ticket_request()).SerializeToString()
    read_end, write_end = os.pipe()
    try:
        cases = [
            (answer(b"\xff\x00garbage"), "not a peer_request"),
            (answer(os.urandom(70000)), "at most 65536 bytes"),
            (answer(lane_infer(b"\xff\x00garbage")), "not an nrt.infer_request"),
            (answer(share(1), read_end, write_end), "carries 2"),
            (answer(ticket, read_end), "carries no file descriptor"),
            (answer(share(12345), read_end), "names no open session"),
            (answer(share(0), read_end), "needs a session"),
        ]
    finally:
        os.close(read_end)
        os.close(write_end)
    for (code, details), why in cases:
        assert code == Nerr.INVALID and why in details, (code, details)
    with Client(daemon.address, shm=True) as client:
        model = client.load(sample.neff)
        x = sample.random_inputs(0)["x"]
        model(x=x)
        assert client.shm_enabled  # its objects were passed


def test_lanes_are_capped_per_user_and_freed_when_their_clients_go(
    daemon: DaemonProcess,
) -> None:
    """Each connection that infers on the peer socket gets a thread of the daemon's (a
    lane): at most MAX_LANES_PER_UID per user. The next is refused with NERR_RESOURCE (the
    client then calls over gRPC), and a lane closed by its client is free again."""
    import socket

    from neuron_rtd.proto import ext_pb, pb
    from neuron_rtd.server.peer_socket import MAX_LANES_PER_UID

    infer = pb.infer_request(h_nn=pb.h_nn(id=999_999)).SerializeToString()
    message = ext_pb.peer_request(
        infer=ext_pb.peer_infer_request(infer_request=infer)
    ).SerializeToString()

    def ask(sock: socket.socket) -> ext_pb.peer_response:
        sock.send(message)
        return ext_pb.peer_response.FromString(sock.recv(1 << 16))

    lanes = []
    try:
        for _ in range(MAX_LANES_PER_UID):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(10)
            sock.connect(daemon.socket_path + ".peer")
            lanes.append(sock)
            answer = ask(sock)
            assert answer.status_code == Nerr.OK, answer.details
            response = pb.infer_response.FromString(answer.infer_response)
            assert response.status.code == Nerr.INVALID_HANDLE  # the model's own answer
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as extra:
            extra.settimeout(10)
            extra.connect(daemon.socket_path + ".peer")
            refused = ask(extra)
            assert refused.status_code == Nerr.RESOURCE
            assert "no lane free" in refused.details and "gRPC" in refused.details
    finally:
        for sock in lanes:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the lanes' threads see their clients gone, and end
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as again:
            again.settimeout(10)
            again.connect(daemon.socket_path + ".peer")
            if ask(again).status_code == Nerr.OK:
                break
        assert time.monotonic() < deadline, "no lane freed within 10 s"
        time.sleep(0.1)
