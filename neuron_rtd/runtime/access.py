"""Who a call comes from, and whether they could open an object themselves.

The daemon opens files and shared memory with its own rights, so before it uses an object
a caller names, it asks whether the *caller* could have opened it: the kernel's own rule
(owner, then the ACL's named users, then the owning and named groups under the ACL's mask,
then others; root may open anything), judged from the object's mode and POSIX ACL for the
caller's uid and groups (the user database's groups of that uid).

A front names its caller as well as its transport lets it (`Caller`):
- one user, when the kernel says who holds the other end: SO_PEERCRED on a unix socket
  the daemon reads itself (the peer socket), a loopback TCP socket's owner
  (`server/peers.py`);
- any of the users a unix socket admits, where gRPC cannot say which of them is calling
  (grpcio gives no peer credentials): the socket's owner, root, its group's members (those
  the user database lists, and one it may not list: a group can be given outside it), and
  everyone when it is open to others. A call from such a caller may use only what every
  one of those users could open. When the socket admits one user besides root (mode 0600,
  or the owner's private group, as a daemon a user runs for itself has), that user is
  named.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
import struct
import threading
import time
from dataclasses import dataclass

ROOT = 0
STRANGER = -1  # a uid that owns nothing and is in no group: "anyone" on a socket open to all
# What opening a caller's file or object may fail with that would tell whether it exists
# (and it is a link, or in a folder it may not search): worded alike, for nobody to tell
# apart (the model files' reader, the shm table).
HIDDEN_ERRNOS = frozenset((errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ELOOP))

_ACL_XATTR = "system.posix_acl_access"
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
READ, WRITE = 4, 2
_DATABASE_TTL_S = 30.0


@dataclass(frozen=True)
class User:
    """A user as the kernel checks its access: its uid and its groups."""

    uid: int
    gids: frozenset[int]

    @property
    def root(self) -> bool:
        return self.uid == ROOT

    def describe(self) -> str:
        if self.uid == STRANGER:
            if self.gids:
                return f"a member of group {group_name(min(self.gids))}"
            return "a caller the daemon cannot name"
        try:
            return f"uid {self.uid} ({pwd.getpwuid(self.uid).pw_name})"
        except KeyError:
            return f"uid {self.uid}"


@dataclass(frozen=True)
class Caller:
    """Who a call comes from: one of `users` (one: the kernel named it)."""

    users: tuple[User, ...]

    @property
    def named(self) -> User | None:
        """The one user calling, when the front could tell."""
        return self.users[0] if len(self.users) == 1 else None

    @property
    def key(self) -> str:
        """Whose a thing the caller registers is: its uid, or the socket's users'."""
        named = self.named
        return f"uid:{named.uid}" if named is not None else "socket"

    def in_group(self, gid: int) -> bool:
        """Whether every user the call may come from is root or in group `gid`."""
        return all(u.root or gid in u.gids for u in self.users)

    def describe(self) -> str:
        named = self.named
        if named is not None:
            return named.describe()
        return "a client of the daemon's socket (gRPC cannot say which of its users)"


def group_name(gid: int) -> str:
    """Group `gid`'s name, as a message says it (its number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def group_member(gid: int) -> User:
    """A member of group `gid` the daemon cannot name (one the user database does not
    list, a bearer of a token the group's members hold): it owns nothing."""
    return User(STRANGER, frozenset({gid}))


def user(uid: int) -> User:
    """User `uid` with its groups as the user database says (none: no such user)."""
    return _database.user(uid)


def caller(uid: int) -> Caller:
    return Caller((user(uid),))


def stranger() -> Caller:
    """A caller the front cannot name: one who owns nothing and is in no group."""
    return Caller((User(STRANGER, frozenset()),))


def socket_caller(path: str | os.PathLike[str]) -> Caller:
    """Any user the unix socket at `path` admits (connecting takes write access to it)."""
    info = os.stat(path)
    uids = {ROOT}
    if info.st_mode & stat.S_IWUSR:
        uids.add(info.st_uid)
    if info.st_mode & stat.S_IWGRP:
        uids |= _database.members(info.st_gid)
    users = [user(u) for u in sorted(uids)]
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, info.st_uid):
        users.append(group_member(info.st_gid))
    if info.st_mode & stat.S_IWOTH:
        users.append(User(STRANGER, frozenset()))
    return Caller(tuple(users))


def _private_group(gid: int, owner: int) -> bool:
    """Whether `gid` is the socket owner's private group (named as the user, its primary
    group, listing no one else), as a user's own daemon's socket has: only root could put
    another process in it. Any other group may hold members the user database does not
    list (given by a unit's SupplementaryGroups=, a container's settings, setpriv): a
    caller of its socket may be one of them."""
    try:
        name = pwd.getpwuid(owner).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == name and _database.members(gid) <= {owner}


def may_open(fd: int, who: Caller, *, write: bool) -> bool:
    """Whether every user `who` may be could open the object `fd` is open on (read, and
    write when `write`), by its mode and ACL now."""
    info = os.fstat(fd)
    try:
        acl = os.getxattr(fd, _ACL_XATTR)
    except OSError:  # no ACL (ENODATA), or a file system without them
        acl = b""
    wanted = READ | (WRITE if write else 0)
    entries = _entries(acl)
    return all(_allowed(info, entries, u, wanted) for u in who.users)


def _allowed(info: os.stat_result, acl: list[tuple[int, int, int]], who: User, want: int) -> bool:
    """Whether the kernel gives `who` the access `want` (rwx as 4|2|1) on the object."""
    if who.root:
        return True
    mode = info.st_mode
    if who.uid == info.st_uid:
        return (mode >> 6) & want == want
    if not acl:
        if info.st_gid in who.gids:
            return (mode >> 3) & want == want
        return mode & want == want
    mask = next((p for t, p, _ in acl if t == _MASK), 7)
    for tag, perm, qualifier in acl:
        if tag == _USER and qualifier == who.uid:
            return perm & mask & want == want
    groups = [
        perm
        for tag, perm, qualifier in acl
        if (tag == _GROUP_OBJ and info.st_gid in who.gids)
        or (tag == _GROUP and qualifier in who.gids)
    ]
    if groups:  # one matching group entry must grant it all; none falls through to others
        return any(perm & mask & want == want for perm in groups)
    other = next((p for t, p, _ in acl if t == _OTHER), mode & 7)
    return other & want == want


def _entries(acl: bytes) -> list[tuple[int, int, int]]:
    """A POSIX ACL xattr's (tag, perm, id) entries; none when it is not one."""
    if len(acl) < _ACL_HEADER.size or (len(acl) - _ACL_HEADER.size) % _ACL_ENTRY.size:
        return []
    body = acl[_ACL_HEADER.size :]
    return [_ACL_ENTRY.unpack_from(body, i) for i in range(0, len(body), _ACL_ENTRY.size)]


class _Database:
    """The user database's groups per uid and members per group, read at most every
    `_DATABASE_TTL_S` (a name service may be slow; a change shows within that time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[int, tuple[float, User]] = {}
        self._members: dict[int, tuple[float, frozenset[int]]] = {}

    def user(self, uid: int) -> User:
        now = time.monotonic()
        with self._lock:
            known = self._users.get(uid)
        if known is not None and now - known[0] < _DATABASE_TTL_S:
            return known[1]
        try:
            entry = pwd.getpwuid(uid)
            gids = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except (KeyError, OSError):
            gids = frozenset()
        found = User(uid, gids)
        with self._lock:
            if len(self._users) > 4096:
                self._users.clear()
            self._users[uid] = (now, found)
        return found

    def members(self, gid: int) -> set[int]:
        now = time.monotonic()
        with self._lock:
            known = self._members.get(gid)
        if known is not None and now - known[0] < _DATABASE_TTL_S:
            return set(known[1])
        uids: set[int] = set()
        try:
            names = set(grp.getgrgid(gid).gr_mem)
        except KeyError:
            names = set()
        for entry in pwd.getpwall():
            if entry.pw_gid == gid or entry.pw_name in names:
                uids.add(entry.pw_uid)
        with self._lock:
            self._members[gid] = (now, frozenset(uids))
        return uids


_database = _Database()
