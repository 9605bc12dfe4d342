"""The daemon's peer socket, from the client's side (the daemon's: server/peer_socket.py):
a SOCK_SEQPACKET unix socket where the kernel tells the daemon who this process is, and
where it passes its shared memory objects themselves. `describe` names its path."""

from __future__ import annotations

import array
import socket
from collections.abc import Iterator, Sequence

from neuron_rtd.client._shm import ShmBuffer
from neuron_rtd.client.errors import NrtClientError
from neuron_rtd.errors import Nerr
from neuron_rtd.proto import ext_pb

TIMEOUT_S = 10.0
MAX_ANSWER = 4096


def ticket(socket_path: str) -> int:
    """A ticket naming this process's user to one session_monitor call (metadata
    nrt-peer-ticket), so that the session counts as this user's."""
    request = ext_pb.peer_request(ticket=ext_pb.peer_ticket_request())
    (answer,) = _ask(socket_path, [(request, None)], "ticket")
    return int(answer.ticket)


def pass_objects(
    socket_path: str, session_id: int, buffers: Sequence[ShmBuffer], prot: int
) -> None:
    """Pass the buffers' objects to the daemon, as shm objects of the session; an
    NrtClientError when it cannot take one."""
    requests: list[tuple[ext_pb.peer_request, int | None]] = [
        (
            ext_pb.peer_request(
                shm_share=ext_pb.shm_share_request(
                    session_id=session_id, path=buffer.path, mmap_prot=prot
                )
            ),
            buffer.fileno(),
        )
        for buffer in buffers
    ]
    for _ in _ask(socket_path, requests, "shm_share"):
        pass


def _ask(
    socket_path: str, requests: list[tuple[ext_pb.peer_request, int | None]], method: str
) -> Iterator[ext_pb.peer_response]:
    """Each request (with a file descriptor to pass, or None) answered in turn, on one
    connection; NrtClientError at the first refusal, or when the socket cannot be used."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(TIMEOUT_S)
        try:
            sock.connect(socket_path)
            for request, fd in requests:
                rights = (
                    []
                    if fd is None
                    else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                )
                sock.sendmsg([request.SerializeToString()], rights)
                data = sock.recv(MAX_ANSWER)
                if not data:
                    raise ConnectionResetError("the daemon closed it without an answer")
                answer = ext_pb.peer_response.FromString(data)
                if answer.status_code != Nerr.OK:
                    raise NrtClientError(answer.status_code, answer.details, method)
                yield answer
        except OSError as exc:
            raise NrtClientError(
                Nerr.FAIL,
                f"cannot reach the daemon's peer socket {socket_path}: {exc.strerror or exc}",
                method,
            ) from None
