"""session_monitor: what a client makes with its session id is released when its stream
ends, also when the client is killed with SIGKILL with inferences in flight; the daemon
keeps serving."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_wire import load, load_stream
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.runtime import session_tag

pytestmark = pytest.mark.daemon

CLIENT = textwrap.dedent(
    """
    import os, sys, time
    import grpc
    from neuron_rtd.proto import pb, pb_grpc
    from test_wire import load_stream

    address, neff_path, shm_path = sys.argv[1:4]
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.nmgr_v1Stub(channel)
    sessions = pb_grpc.nmgr_session_managerStub(channel)
    import queue
    requests = queue.Queue()
    requests.put(pb.session_monitor_request(framework_name="test"))
    stream = sessions.session_monitor(iter(requests.get, None))
    session = next(stream).session_id
    ncg = stub.create_eg(pb.create_eg_request(nc_count=2, session_id=session)).h_eg
    neff = open(neff_path, "rb").read()

    def stream_with_session():
        yield pb.load_request(h_eg=ncg)
        yield pb.load_request(session_id=session)
        yield from load_stream(neff)

    model = stub.load(stream_with_session()).h_nn
    stub.start(pb.start_request(h_nn=model))
    implicit = stub.load(iter([pb.load_request(session_id=session), *load_stream(neff)])).h_nn
    status = stub.shm_map(pb.shm_map_request(path=shm_path, mmap_prot=3, session_id=session))
    # Inferences in flight: posted, inputs read from the shm object, on slow NCs.
    x = pb.infer_io(name="x", buf_shm=pb.shared_mem_buf(path=shm_path))
    cookies = [
        stub.infer_post(pb.infer_request(h_nn=m, ifmap=[x])).cookie
        for m in (model, model, model, implicit, implicit)
    ]
    done = stub.infer_check_completion(pb.infer_check_completion_request(cookie=cookies))
    print(session, ncg.id, model.id, implicit.id, status.status.code, len(set(cookies)),
          len(done.cookie), flush=True)
    time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def neff_file(module_work: Path) -> Path:
    path = module_work / "mlp.neff"
    path.write_bytes(build_mlp((16, 32, 8), batch=2, seed=9).neff)
    return path


def open_fds(pid: int) -> int:
    """The daemon's open fds, the fewest of a few reads 20 ms apart: a leaked fd stays, one
    its own work holds a moment (the health check reading /proc, a session being built)
    does not, and one read can catch it (33, 34 once among 20 reads)."""
    counts = []
    for _ in range(5):
        counts.append(len(os.listdir(f"/proc/{pid}/fd")))
        time.sleep(0.02)
    return min(counts)


def test_killed_clients_leave_nothing_behind(
    daemon: DaemonProcess, neff_file: Path, tmp_path: Path
) -> None:
    tests_dir = str(Path(__file__).parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]),
    }
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.nmgr_v1Stub(channel)
        mine = load(stub, neff_file.read_bytes()).h_nn  # another client's model survives
        request = pb.infer_request(h_nn=mine, ifmap=[pb.infer_io(name="x", buf=bytes(2 * 16 * 4))])
        assert stub.infer(request).status.code == Nerr.OK
        # After one inference: what the process makes once (onnxruntime's environment of
        # the fast engine) is there before the clients come.
        baseline_fds = open_fds(daemon.pid)
        times: list[float] = []
        fds: list[int] = []
        # Every NC run on device 0 (where the clients' NCGs land) sleeps first, so the
        # clients' inferences are still in flight when they are killed.
        inject = Path(daemon.sim_root) / "neuron0" / "inject"
        inject.write_text("nc_delay_ms=200\n")
        for _ in range(20):
            shm = Path("/dev/shm") / f"nrtd_session_{uuid.uuid4().hex}"
            shm.write_bytes(bytes(2 * 16 * 4))
            child = subprocess.Popen(
                [sys.executable, "-c", CLIENT, daemon.address, str(neff_file), f"/{shm.name}"],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            try:
                assert child.stdout is not None
                line = child.stdout.readline().split()
                _session, _ncg, model, implicit, mapped, posted, ended = map(int, line)
                assert mapped == 0 and len(stub.list_egs(pb.empty()).eg_info) == 3
                assert posted == 5 and ended < 5  # in flight
                child.send_signal(signal.SIGKILL)
                child.wait()
            finally:
                shm.unlink(missing_ok=True)

            unmap = pb.shm_unmap_request(path=f"/{shm.name}")

            def released(unmap: Any = unmap) -> bool:
                ncgs = stub.list_egs(pb.empty()).eg_info
                return len(ncgs) == 1 and stub.shm_unmap(unmap).status.code == Nerr.INVALID

            began = time.monotonic()
            wait_until(released, 30, "the killed client's session released")
            times.append(time.monotonic() - began)
            for gone in (model, implicit):
                status = stub.start(pb.start_request(h_nn=pb.h_nn(id=gone))).status
                assert status.code == Nerr.INVALID_HANDLE
            fds.append(open_fds(daemon.pid))
        inject.write_text("nc_delay_ms=0\n")
        assert stub.infer(request).status.code == Nerr.OK  # the other client is still served
        stub.unload(pb.unload_request(h_nn=mine))
    # No fd is left from any of the 20: after the first client (gRPC keeps one more for
    # good) the daemon's count stays where it was.
    assert fds[0] <= baseline_fds + 1 and set(fds) == {fds[0]}, (baseline_fds, fds)
    print(f"released after {max(times):.3f} s at most; fds {baseline_fds} -> {fds}")


def test_unknown_session_ids_are_refused(daemon: DaemonProcess, neff_file: Path) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.nmgr_v1Stub(channel)
        made = stub.create_eg(pb.create_eg_request(nc_count=1, session_id=12345))
        assert made.status.code == Nerr.INVALID and made.h_eg.id == 0
        assert "this session id names no open session" in made.status.details.decode()
        mapped = stub.shm_map(pb.shm_map_request(path="/x", mmap_prot=3, session_id=12345))
        assert mapped.status.code == Nerr.INVALID
        requests = [pb.load_request(session_id=12345), *load_stream(neff_file.read_bytes())]
        loaded = stub.load(iter(requests))
        assert loaded.status.code == Nerr.INVALID and loaded.h_nn.id == 0
        assert stub.list_egs(pb.empty()).eg_info == []
        # a malformed session in the metadata is refused the same way, every call
        bad = (("nrt-session-id", "not-a-number"),)
        request = pb.infer_request(h_nn=pb.h_nn(id=1))
        for method in (stub.infer, stub.infer_post):
            answer = method(request, metadata=bad)
            assert answer.status.code == Nerr.INVALID, method
            assert "must be a session id" in answer.status.details.decode()


def test_stop_ends_open_sessions_without_waiting(module_work: Path) -> None:
    """SIGTERM with a client's session stream open: the daemon ends the stream instead of
    waiting out its drain grace for it (its log says the stop ended it: the grace's end,
    cancelling the stream, would not)."""
    with DaemonProcess(sim_root=module_work / "sim-stop") as proc:
        channel = grpc.insecure_channel(proc.address)
        sessions = pb_grpc.nmgr_session_managerStub(channel)
        requests: queue.Queue[Any] = queue.Queue()
        requests.put(pb.session_monitor_request(framework_name="test"))
        stream = sessions.session_monitor(iter(requests.get, None))
        session = next(stream).session_id
        assert proc.stop() == 0
        assert f"Session {session_tag(session)} ended: the daemon stops" in proc.log()
        with pytest.raises(grpc.RpcError):
            next(stream)
        channel.close()


def open_stream(channel: grpc.Channel, metadata: Any = ()) -> tuple[Any, Any]:
    """A session stream held open: (the stream, its request queue)."""
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(pb.session_monitor_request(framework_name="test"))
    stub = pb_grpc.nmgr_session_managerStub(channel)
    return stub.session_monitor(iter(requests.get, None), metadata=metadata), requests


def test_sessions_are_capped_per_peer_and_a_ticket_names_the_peer(work: Path) -> None:
    """session_max_per_peer: the clients that do not identify themselves share one cap;
    a client that does (a ticket from the peer socket, as our client asks) counts as its
    user; a ticket names one session, once."""
    from neuron_rtd.client import Client
    from neuron_rtd.client._peer import ticket

    config = work / "per-peer.json"
    config.write_text('{"session_max_per_peer": 3}\n')
    with DaemonProcess(sim_root=work / "sim", args=["-c", str(config)]) as proc:
        channel = grpc.insecure_channel(proc.address)
        held = [open_stream(channel) for _ in range(3)]
        for stream, _ in held:
            next(stream)
        refused, _ = open_stream(channel)
        with pytest.raises(grpc.RpcError) as info:
            next(refused)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session_max_per_peer 3" in str(info.value.details())
        assert "identifies itself" in str(info.value.details())
        with Client(proc.address) as client:  # identified: uid 0's first session
            assert client.session_id != 0
        peer_socket = proc.socket_path + ".peer"
        given = ticket(peer_socket)
        mine, _ = open_stream(channel, metadata=[("nrt-peer-ticket", str(given))])
        assert next(mine).session_id != 0
        again, _ = open_stream(channel, metadata=[("nrt-peer-ticket", str(given))])
        with pytest.raises(grpc.RpcError) as info:
            next(again)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "names no ticket" in str(info.value.details())
        assert "(uid 0)" in proc.log() and "(unidentified)" in proc.log()
        for _, requests in held:
            requests.put(None)
        channel.close()
