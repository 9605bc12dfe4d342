"""Why no daemon answers at a unix socket, told in one set of words by every tool and the
client library, and whether one more try is worth a wait.

gRPC says only UNAVAILABLE and the system's last word, and the clients used to wait out a
5 s retry whatever it was. Looking at the path ourselves takes a millisecond and tells the
cases apart: no socket file, a socket file nobody listens on (a daemon that stopped or
died), one we may not connect to (naming its group and ours), a file that is no socket;
or a daemon there after all (restarting, or a channel still in its reconnect backoff).
A wait is worth it only where a daemon is likely back soon: one listens now, one holds the
socket's lock (starting), or this client had a daemon answering and lost it (restarted
by systemd within its RestartSec). A daemon never there, or a door closed to us, is
said at once. A TCP address is looked at the same way, only less closely: a port that
accepts is worth the wait, a refused one only to a client that lost its daemon.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from neuron_rtd.client.address import AddressError, lock_path, parse_address

PROBE_TIMEOUT_S = 0.5  # a listening daemon accepts at once; a full backlog still counts
HOW_TO_START = "systemctl start neuron-rtd, or neuron-rtd -g {target}"
ANOTHER_ADDRESS = "name another address (-a ADDRESS, or NEURON_RTD_ADDRESS)"


class Found(Enum):
    """What connecting to a socket path finds there."""

    LISTENING = "a daemon listens (or its backlog is full)"
    MISSING = "no such file (ENOENT)"
    STALE = "a socket nobody listens on (ECONNREFUSED)"
    DENIED = "permission denied (EACCES), by the socket or a folder on its way"
    NOT_A_SOCKET = "a file of another kind"
    OTHER = "another error"


@dataclass(frozen=True)
class Probe:
    """What connecting to a socket path found; for DENIED, the file or folder that
    refused, for OTHER, the system's words."""

    found: Found
    refused_by: Path | None = None
    strerror: str = ""


def probe(path: Path) -> Probe:
    """Connect to the unix socket `path` (and close at once) to see what is there."""
    try:
        info = path.stat()
    except OSError as exc:
        return _failed(path, exc)
    if not stat.S_ISSOCK(info.st_mode):
        return Probe(Found.NOT_A_SOCKET)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PROBE_TIMEOUT_S)
    try:
        sock.connect(str(path))
    except (TimeoutError, BlockingIOError):
        return Probe(Found.LISTENING)  # its backlog is full: busy, but there
    except OSError as exc:
        return _failed(path, exc)
    finally:
        sock.close()
    return Probe(Found.LISTENING)


def _failed(path: Path, exc: OSError) -> Probe:
    if exc.errno == errno.ENOENT:
        return Probe(Found.MISSING)
    if exc.errno == errno.ECONNREFUSED:
        return Probe(Found.STALE)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Probe(Found.DENIED, refused_by=_closed_folder(path) or path)
    return Probe(Found.OTHER, strerror=exc.strerror or str(exc))


def _closed_folder(path: Path) -> Path | None:
    """The first folder on the way to `path` (its links followed) we may not pass."""
    for folder in reversed(Path(os.path.realpath(path)).parents):
        if not folder.is_dir():
            return None  # not there (a closed folder above it came first)
        if not os.access(folder, os.X_OK, effective_ids=True):
            return folder
    return None


def unix_socket(address: str) -> Path | None:
    """The socket path of a unix address (None for any other, or for no address)."""
    try:
        return parse_address(address).unix_path
    except AddressError:
        return None


def tcp_listening(address: str) -> bool | None:
    """Whether something accepts a connection at the TCP `host:port` address (None: not
    one, so nothing to look at)."""
    try:
        parsed = parse_address(address)
    except AddressError:
        return None
    if not parsed.host_port:
        return None
    host, _, port = parsed.target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


# --- whether to wait -----------------------------------------------------------------
def restart_likely(address: str, *, answered: bool) -> bool:
    """Whether a daemon at `address` is likely to answer soon (see the module's doc);
    `answered`: whether one answered this client before."""
    path = unix_socket(address)
    if path is None:  # TCP: a port that accepts, else only a daemon lost
        return bool(tcp_listening(address)) or answered
    found = probe(path).found
    if found == Found.LISTENING:
        return True
    if found not in (Found.MISSING, Found.STALE):
        return False  # a closed door, or a file that is no socket: a restart changes neither
    return answered or _locked(lock_path(path))  # lost a daemon, or one is starting


def _locked(path: Path) -> bool:
    """Whether some process holds a flock on `path` (a daemon's socket lock while it
    starts and serves). Read from /proc/locks: taking even a shared lock ourselves
    would turn away a daemon starting at that moment."""
    try:
        info = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    file = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" in fields and file in fields:
            return True
    return False


# --- the words -----------------------------------------------------------------------
def unreachable(address: str) -> str | None:
    """Why no daemon answers at the unix socket `address`, and what to do, as one
    sentence after "no runtime answers at ADDRESS: "; None when there is nothing to add
    (not a unix address, or a daemon listens there after all)."""
    path = unix_socket(address)
    if path is None:
        return None
    probed = probe(path)
    start = HOW_TO_START.format(target=address)
    if probed.found == Found.MISSING:
        return (
            f"no socket {_named(path)}, so no daemon listens there: start one ({start}), "
            f"or {ANOTHER_ADDRESS}"
        )
    if probed.found == Found.STALE:
        return (
            f"the socket {_named(path)} is there but no daemon listens on it (one stopped or "
            f"died without removing it): start one ({start}: it takes the socket over), or "
            f"{ANOTHER_ADDRESS}"
        )
    if probed.found == Found.DENIED:
        return denied(probed.refused_by or path)
    if probed.found == Found.NOT_A_SOCKET:
        return f"{_named(path)} is {_file_kind(path)}, not a socket: {ANOTHER_ADDRESS}"
    if probed.found == Found.OTHER:
        return f"{_named(path)}: {probed.strerror}: {ANOTHER_ADDRESS}"
    return None


def denied(refused_by: Path) -> str:
    """Permission denied by the socket, file or folder `refused_by`: whose it is, who we
    are, and what gives access (its group's membership, in a new login)."""
    try:
        info = refused_by.stat()
    except OSError:
        return f"permission denied by {refused_by}"
    what, opens = _what_opens(info.st_mode)
    mode = stat.S_IMODE(info.st_mode)
    group = _group_name(info.st_gid)
    if not mode & opens:
        return (
            f"permission denied: {what} {refused_by} (mode {mode:04o}) is open to its owner "
            f"{_user_name(info.st_uid)} only; ask whoever runs the daemon to give it a group "
            "(the config's socket_group and socket_mode)"
        )
    user = _user_name(os.geteuid())
    mine = " ".join(_group_name(gid) for gid in _my_groups())
    if info.st_gid in _my_groups():
        return (
            f"permission denied by {what} {refused_by} (mode {mode:04o}, group {group}), "
            f"though you ({user}) are in its group: an ACL or a security module refuses you"
        )
    head = (
        f"permission denied: {what} {refused_by} is for group {group} (mode {mode:04o}), and "
        f"you ({user}, in groups: {mine}) are not in it"
    )
    if _listed_in(user, info.st_gid):
        return f"{head} in this login: you were added since; log in again, or run newgrp {group}"
    return (
        f"{head}; add yourself to group {group} (sudo usermod -aG {group} {user}) and log in "
        f"again, or run newgrp {group}"
    )


def _what_opens(mode: int) -> tuple[str, int]:
    """What a file of `mode` is called, and the group permission a member needs of it."""
    if stat.S_ISDIR(mode):
        return "the folder", stat.S_IXGRP
    if stat.S_ISSOCK(mode):
        return "the socket", stat.S_IWGRP
    return "the file", stat.S_IRGRP


def _named(path: Path) -> str:
    """`path`, and where it leads when it is a link."""
    if path.is_symlink():
        return f"{path} (a link to {os.path.realpath(path)})"
    return str(path)


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def _my_groups() -> list[int]:
    """This process's groups, as `id -G` lists them (the primary group first)."""
    primary = os.getegid()
    return [primary, *(gid for gid in os.getgroups() if gid != primary)]


def _listed_in(user: str, gid: int) -> bool:
    """Whether the user database puts `user` in group `gid` (as of now: a login that
    began before they were added does not have the group yet)."""
    try:
        return user in grp.getgrgid(gid).gr_mem or pwd.getpwnam(user).pw_gid == gid
    except KeyError:
        return False


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
