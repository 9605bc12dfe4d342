"""Who owns the other end of a loopback TCP connection.

A unix socket names its peer (SO_PEERCRED); a TCP socket does not, but when the peer is on
this host the kernel still knows the socket at the other end, and whose it is: the uid of
the process that made it. The peer's socket is the one whose local address is the
connection's remote end and whose remote address is the connection's local end; no other
socket in the daemon's network namespace has that pair while the connection lives. It is
found by the kernel's socket diagnostics (`sock_diag`, netlink: one exact lookup, a few
microseconds however many sockets there are), else in `/proc/net/tcp` and
`/proc/net/tcp6` (every socket listed; IPv4 on an IPv6 socket as an IPv4-mapped address).

The uid is the socket's creator's: a socket passed to another process keeps it, as a file
keeps its owner. Only a live socket counts: one in TIME_WAIT is listed with uid 0, and is
no one's. A peer that is not on this host (or in another network namespace), or whose
socket is already gone, is not found: `tcp_caller` returns None, and a front counts such a
caller as a stranger.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import struct

from neuron_rtd.runtime import Caller, caller

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# A socket's states (include/net/tcp_states.h) in which it is a whole socket with its
# owner: not LISTEN, nor TIME_WAIT or a request (NEW_SYN_RECV), listed with uid 0.
_OWNED_STATES = frozenset({1, 2, 3, 4, 5, 7, 8, 9, 11})  # ESTABLISHED .. CLOSING
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_NLMSG_ERRNO = struct.Struct("=i")
# inet_diag_req_v2: family, protocol, extensions, pad, states; then inet_diag_sockid:
# source and destination ports (network order), addresses (16 bytes each), interface,
# cookie (INET_DIAG_NOCOOKIE: any)
_DIAG_REQUEST = struct.Struct("=BBBxI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
_NOCOOKIE = 0xFFFFFFFF
# inet_diag_msg: family, state, timer, retransmits, the sockid (48 bytes), expires,
# read queue, write queue, uid, inode
_DIAG_MESSAGE = struct.Struct("=BBBB48sIIIII")
_WORD = struct.Struct("=I")  # the kernel prints each 32-bit word of an address as it lies in memory
_GRPC_PEER = re.compile(
    r"ipv4:(?P<v4>[0-9.]+):(?P<p4>[0-9]{1,5})|ipv6:\[(?P<v6>[^\]]+)\]:(?P<p6>[0-9]{1,5})"
)

_Address = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def tcp_caller(local: tuple[str, int], remote: tuple[str, int]) -> Caller | None:
    """The user owning the peer's socket of the TCP connection from `remote` to `local`
    (each (host, port), as the accepting side sees them); None when this host has no such
    socket (the peer is elsewhere, or gone) or an address is not an IP address."""
    ours = _address(*local)
    theirs = _address(*remote)
    if ours is None or theirs is None:
        return None
    uid = _peer_uid(ours, theirs)
    return caller(uid) if uid is not None else None


def _peer_uid(ours: _Address, theirs: _Address) -> int | None:
    """The uid of the live socket whose local address is `theirs` and remote `ours`."""
    try:
        return _diag_uid(ours, theirs)
    except OSError:  # no sock_diag here (a kernel without inet_diag, a sandbox): /proc
        return _table_uid(ours, theirs)


def grpc_peer_address(peer: str) -> tuple[str, int] | None:
    """The (host, port) of a gRPC `context.peer()` string ("ipv4:127.0.0.1:5555",
    "ipv6:[::1]:5555"); None for any other transport ("unix:...") or a malformed one."""
    found = _GRPC_PEER.fullmatch(peer)
    if found is None:
        return None
    host = found["v4"] or found["v6"]
    port = int(found["p4"] or found["p6"])
    if _address(host, port) is None:
        return None
    return host, port


def _address(host: str, port: int) -> _Address | None:
    """An IP address and port, an IPv4-mapped IPv6 address as its IPv4 address, and a
    scope (`%eth0`) dropped; None when `host` is no IP address or `port` no TCP port."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if not 0 <= port <= 0xFFFF:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, port
    return ip, port


def _diag_uid(ours: _Address, theirs: _Address) -> int | None:
    """`_peer_uid` by sock_diag's exact lookup; OSError when sock_diag cannot answer."""
    if ours[0].version != theirs[0].version:
        return None
    family = socket.AF_INET if ours[0].version == 4 else socket.AF_INET6
    request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
    wanted = _SOCKID.pack(
        theirs[1], ours[1], theirs[0].packed.ljust(16, b"\0"), ours[0].packed.ljust(16, b"\0")
    )
    request += wanted + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
    header = _NLMSG_HEADER.pack(
        _NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(1.0)
        diag.send(header + request)
        answer = diag.recv(8192)
    if len(answer) < _NLMSG_HEADER.size:
        raise OSError(errno.EPROTO, "a short sock_diag answer")
    kind = _NLMSG_HEADER.unpack_from(answer)[1]
    if kind == _NLMSG_ERROR:
        (code,) = _NLMSG_ERRNO.unpack_from(answer, _NLMSG_HEADER.size)
        if -code == errno.ENOENT:
            return None
        raise OSError(-code, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(answer) < _NLMSG_HEADER.size + _DIAG_MESSAGE.size:
        raise OSError(errno.EPROTO, "an unexpected sock_diag answer")
    found, state, _, _, sockid, _, _, _, uid, _ = _DIAG_MESSAGE.unpack_from(
        answer, _NLMSG_HEADER.size
    )
    # the kernel's lookup falls back to a listener on the address: only the pair counts
    if _sockid_pair(found, sockid) != (theirs, ours) or state not in _OWNED_STATES:
        return None
    return int(uid)


def _sockid_pair(family: int, sockid: bytes) -> tuple[_Address, _Address] | None:
    """The (local, remote) addresses of an inet_diag_sockid of a socket of `family`."""
    local_port, remote_port, local, remote = _SOCKID.unpack_from(sockid)
    size = 4 if family == socket.AF_INET else 16
    local_address = _address(socket.inet_ntop(family, local[:size]), local_port)
    remote_address = _address(socket.inet_ntop(family, remote[:size]), remote_port)
    if local_address is None or remote_address is None:
        return None
    return local_address, remote_address


def _table_uid(ours: _Address, theirs: _Address) -> int | None:
    """`_peer_uid` from /proc/net/tcp and tcp6."""
    # A cheap test first: only a line holding both ports (as the kernel prints them) is
    # parsed; the tables list every socket of the namespace, thousands under load.
    their_port = f":{theirs[1]:04X} "
    our_port = f":{ours[1]:04X} "
    for table in _TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the header
                for line in lines:
                    if their_port not in line or our_port not in line:
                        continue
                    fields = line.split()
                    if len(fields) < 8:
                        continue
                    if _parse(fields[1]) == theirs and _parse(fields[2]) == ours:
                        try:
                            state, uid = int(fields[3], 16), int(fields[7])
                        except ValueError:
                            return None
                        return uid if state in _OWNED_STATES else None
        except OSError:  # a kernel without IPv6 has no tcp6; a /proc not mounted, neither
            continue
    return None


def _parse(field: str) -> _Address | None:
    """An address as /proc/net/tcp{,6} prints it: the address's 32-bit words in hex, each
    as the host stores it, a colon, the port in hex."""
    hex_address, _, hex_port = field.partition(":")
    try:
        words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
        raw = b"".join(_WORD.pack(w) for w in words)
        port = int(hex_port, 16)
    except ValueError:
        return None
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw), port
    if len(raw) == 16:
        ip = ipaddress.IPv6Address(raw)
        return (ip.ipv4_mapped, port) if ip.ipv4_mapped is not None else (ip, port)
    return None
