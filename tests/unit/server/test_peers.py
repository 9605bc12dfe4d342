"""Who owns the other end of a loopback TCP connection (`neuron_rtd.server.peers`), found
with real sockets: the peer's uid over IPv4, IPv6 and IPv4 on an IPv6 listener; nothing
for a peer that is gone; gRPC's peer strings."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from waiting import wait_until

from neuron_rtd.server import peers
from neuron_rtd.server.peers import grpc_peer_address, tcp_caller

OTHER_UID = 65533

CONNECT = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.connect((sys.argv[1], int(sys.argv[2])))
print('connected', flush=True)
sys.stdin.read()
"""


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def other_user() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to make a socket as another uid")
    yield


def connect_as(
    uid: int, listener: socket.socket, host: str
) -> tuple[socket.socket, subprocess.Popen[str]]:
    """A connection to `listener` from a process of `uid` connecting to `host`; the
    accepted end and the process (its socket lives while its stdin is open)."""
    port = listener.getsockname()[1]
    command = [sys.executable, "-c", CONNECT, host, str(port)]
    if uid != os.geteuid():
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *command]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "connected"
    conn, _ = listener.accept()
    return conn, proc


def listening(family: socket.AddressFamily, host: str) -> socket.socket:
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(4)
    return listener


def ends(conn: socket.socket) -> tuple[tuple[str, int], tuple[str, int]]:
    local, remote = conn.getsockname(), conn.getpeername()
    return (local[0], local[1]), (remote[0], remote[1])


def finish(conn: socket.socket, proc: subprocess.Popen[str]) -> None:
    conn.close()
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


@pytest.mark.parametrize(
    ("family", "listen_on", "connect_to"),
    [
        (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
        (socket.AF_INET6, "::1", "::1"),
        (socket.AF_INET6, "::", "127.0.0.1"),  # IPv4 on a dual-stack IPv6 listener
        (socket.AF_INET, "127.0.0.1", "::ffff:127.0.0.1"),  # IPv4 from an IPv6 socket
    ],
    ids=["ipv4", "ipv6", "ipv4-mapped-listener", "ipv4-mapped-peer"],
)
def test_the_peer_s_uid_is_found(
    other_user: None, family: socket.AddressFamily, listen_on: str, connect_to: str
) -> None:
    if family == socket.AF_INET6 and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with listening(family, listen_on) as listener:
        conn, proc = connect_as(OTHER_UID, listener, connect_to)
        try:
            local, remote = ends(conn)
            found = tcp_caller(local, remote)
            assert found is not None and found.named is not None
            assert found.named.uid == OTHER_UID
            # the pair is read one way: the reverse names the accepting side's own socket
            reverse = tcp_caller(remote, local)
            assert reverse is not None and reverse.named is not None
            assert reverse.named.uid == os.geteuid()
        finally:
            finish(conn, proc)


def test_a_peer_of_our_own_uid_is_named(other_user: None) -> None:
    with listening(socket.AF_INET, "127.0.0.1") as listener:
        conn, proc = connect_as(os.geteuid(), listener, "127.0.0.1")
        try:
            found = tcp_caller(*ends(conn))
            assert found is not None and found.named is not None
            assert found.named.uid == os.geteuid() and found.named.root == (os.geteuid() == 0)
        finally:
            finish(conn, proc)


@pytest.mark.parametrize("lookup", ["sock_diag", "proc"])
def test_both_lookups_find_the_peer(
    other_user: None, lookup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if lookup == "proc":  # as on a kernel without sock_diag
        monkeypatch.setattr(peers, "_diag_uid", unavailable)
    with listening(socket.AF_INET, "127.0.0.1") as listener:
        conn, proc = connect_as(OTHER_UID, listener, "::ffff:127.0.0.1")
        try:
            found = tcp_caller(*ends(conn))
            assert found is not None and found.named is not None
            assert found.named.uid == OTHER_UID
        finally:
            finish(conn, proc)


def time_wait(local: tuple[str, int], remote: tuple[str, int]) -> bool:
    """Whether the IPv4 socket from `local` to `remote` is in TIME_WAIT (/proc/net/tcp's
    state 06): its close is over, as the kernel tells."""
    ends = (f":{local[1]:04X}", f":{remote[1]:04X}")
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table:
            fields = line.split()
            if (fields[1][-5:], fields[2][-5:]) == ends:
                return fields[3] == "06"
    return False


def unavailable(*args: object) -> None:
    raise OSError(errno.EPROTONOSUPPORT, "no sock_diag")


def test_a_peer_that_is_gone_or_not_here_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    with listening(socket.AF_INET, "127.0.0.1") as listener:
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        local, remote = ends(conn)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # a reset: the peer's socket is gone at once, no TIME_WAIT entry
        conn.close()
    assert tcp_caller(local, remote) is None
    # closed first by the peer, its socket lingers in TIME_WAIT, listed as uid 0's: no one's
    with listening(socket.AF_INET, "127.0.0.1") as listener:
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        local, remote = ends(conn)
        client.close()
        assert conn.recv(1) == b""
        conn.close()
        wait_until(lambda: time_wait(remote, local), 10, "the peer's socket in TIME_WAIT")
    assert tcp_caller(local, remote) is None
    monkeypatch.setattr(peers, "_diag_uid", unavailable)
    assert tcp_caller(local, remote) is None
    assert tcp_caller(("127.0.0.1", 1), ("192.0.2.1", 40000)) is None  # no such socket
    assert tcp_caller(("127.0.0.1", 1), ("not-an-address", 40000)) is None
    assert tcp_caller(("127.0.0.1", 1), ("127.0.0.1", 70000)) is None


def test_grpc_peer_strings() -> None:
    assert grpc_peer_address("ipv4:127.0.0.1:5555") == ("127.0.0.1", 5555)
    assert grpc_peer_address("ipv6:[::1]:5555") == ("::1", 5555)
    assert grpc_peer_address("ipv6:[::ffff:127.0.0.1]:80") == ("::ffff:127.0.0.1", 80)
    assert grpc_peer_address("ipv6:[fe80::1%eth0]:80") == ("fe80::1%eth0", 80)
    for other in (
        "unix:/run/neuron.sock",
        "unix-abstract:x",
        "ipv4:127.0.0.1",
        "ipv4:999.0.0.1:80",
        "ipv4:127.0.0.1:99999",
        "ipv6:::1:80",
        "",
    ):
        assert grpc_peer_address(other) is None, other
