"""A call a stopping daemon refused, made again on the daemon started next (issue 39,
point 3): the client's connection against two real gRPC servers on one socket path, the
first answering `create_eg` as a stopping daemon does, the second as a daemon that has
just started (as systemd's restart brings it)."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from neuron_rtd.client import _connection, errors
from neuron_rtd.client._connection import Connection
from neuron_rtd.errors import STOPPING, Nerr
from neuron_rtd.proto import pb, pb_grpc


class Daemon(pb_grpc.nmgr_v1Servicer):
    """`create_eg` answered stopping (`stopping`), else with NCG `ncg`."""

    def __init__(self, *, stopping: bool, ncg: int = 0) -> None:
        self.stopping = stopping
        self.ncg = ncg
        self.answered = threading.Event()

    def create_eg(self, request: pb.create_eg_request, context: grpc.ServicerContext) -> object:
        if self.stopping:
            if self.answered.is_set():  # its server stops: a call reaching it now is refused
                context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
            self.answered.set()
            status = pb.status(
                code=Nerr.FAIL, details=f"{STOPPING}: it takes no new calls".encode()
            )
            return pb.create_eg_response(status=status)
        self.answered.set()
        return pb.create_eg_response(status=pb.status(code=Nerr.OK), h_eg=pb.h_eg(id=self.ncg))


def serve(path: Path, daemon: Daemon) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_nmgr_v1Servicer_to_server(daemon, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def connect(path: Path) -> Connection:
    return Connection(f"unix:{path}", timeout_s=10, shm=False, async_workers=1, session=False)


def test_a_call_refused_as_stopping_is_made_on_the_next_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the client waits RECONNECT_S (5 s) for the next daemon; gRPC's reconnect backoff on
    # a loaded test machine may take longer: the same wait, with room
    # and the test stops the first daemon only once the client holds its answer and waits
    # (stopping it when its handler has answered may cancel the answer on its way)
    waiting = threading.Event()

    def wait_restarted(channel: grpc.Channel) -> bool:
        waiting.set()
        return errors.wait_restarted(channel, timeout_s=60)

    monkeypatch.setattr(_connection, "wait_restarted", wait_restarted)
    socket_path = tmp_path / "neuron.sock"
    first = Daemon(stopping=True)
    server = serve(socket_path, first)
    connection = connect(socket_path)
    answers: list[object] = []
    try:
        caller = threading.Thread(
            target=lambda: answers.append(
                connection.unary("create_eg", pb.create_eg_request(nc_count=1))
            )
        )
        caller.start()
        assert waiting.wait(10)
        server.stop(None).wait()  # the stopping daemon goes; the next one starts
        second = Daemon(stopping=False, ncg=7)
        server = serve(socket_path, second)
        caller.join(90)
        assert not caller.is_alive()
        assert second.answered.is_set()
        (answer,) = answers
        assert answer.status.code == Nerr.OK and answer.h_eg.id == 7  # type: ignore[attr-defined]
    finally:
        connection.close_channel()
        server.stop(None)


def test_no_next_daemon_leaves_the_stopping_answer(tmp_path: Path) -> None:
    """When the stopping daemon is not replaced (within the client's RECONNECT_S, 5 s),
    the caller gets its answer as it was (the client then raises DaemonStopping from it),
    not a hang."""
    socket_path = tmp_path / "neuron.sock"
    first = Daemon(stopping=True)
    server = serve(socket_path, first)
    connection = connect(socket_path)
    try:
        answer = connection.unary("create_eg", pb.create_eg_request(nc_count=1))
        assert answer.status.code == Nerr.FAIL
        assert answer.status.details.decode().startswith(STOPPING)
    finally:
        connection.close_channel()
        server.stop(None)
