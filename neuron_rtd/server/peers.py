"""Who owns the other end of a loopback TCP connection.

A unix socket names its peer (SO_PEERCRED); a TCP socket does not, but when the peer is on
this host the kernel still knows the socket at the other end, and whose it is: the uid of
the process that made it, listed beside its addresses in `/proc/net/tcp` (IPv4) and
`/proc/net/tcp6` (IPv6, and IPv4 on an IPv6 socket as an IPv4-mapped address). The peer's
socket is the one whose local address is the connection's remote end and whose remote
address is the connection's local end; no other socket in the daemon's network namespace
has that pair while the connection lives.

The uid is the socket's creator's: a socket passed to another process keeps it, as a file
keeps its owner. A peer that is not on this host (or in another network namespace), or
whose socket is already gone, is not found: `tcp_caller` returns None, and a front counts
such a caller as a stranger.
"""

from __future__ import annotations

import ipaddress
import re
import struct

from neuron_rtd.runtime.access import Caller, caller

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
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


def _peer_uid(ours: _Address, theirs: _Address) -> int | None:
    """The uid of the socket whose local address is `theirs` and remote address `ours`."""
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
                            return int(fields[7])
                        except ValueError:
                            return None
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
