"""Files as trusted as the daemon: its config file and the HTTP front's bearer token.

Such a file decides what the daemon serves and to whom, so it must be owned by root or by
the daemon's own user, and writable by no one else (a group that is its owner's private
group, Debian's user groups, counts as the owner); the token file, which makes its reader
a member, is read by no one else either (but the socket's group).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from neuron_rtd.typed_json import ConfigError


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(info: os.stat_result) -> bool:
    """Whether the file's group is its owner's own: the owner's primary group, of the
    owner's name, with no other member (a user private group)."""
    try:
        owner, group = pwd.getpwuid(info.st_uid), grp.getgrgid(info.st_gid)
    except KeyError:
        return False
    return (
        owner.pw_gid == info.st_gid
        and group.gr_name == owner.pw_name
        and set(group.gr_mem) <= {owner.pw_name}
    )


def check_config_file(path: Path, info: os.stat_result) -> None:
    """ConfigError unless the file is as trusted as the daemon (see the module's doc)."""
    if info.st_uid not in (0, os.geteuid()):
        raise ConfigError(
            f"{path} belongs to {_owner(info.st_uid)}, who is neither root nor the daemon's "
            f"user {_owner(os.geteuid())}: it decides what the daemon serves to whom; "
            f"give it to root (chown root {path}) or use another file"
        )
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable & stat.S_IWOTH or (writable and not _private_group(info)):
        raise ConfigError(
            f"{path} is writable by others than its owner (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): it decides what the daemon serves to "
            f"whom; chmod go-w {path}"
        )


TOKEN_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
)  # RFC 6750's token68
MIN_TOKEN_CHARACTERS = 16


def read_http_token(path: str, gid: int) -> str:
    """The bearer token in file `path` (one line); ConfigError unless the file is as
    trusted as the config file and no one but its owner (and, read only, the socket's
    group `gid` or the owner's private group) may read it, and the token is RFC 6750's
    token68 of at least MIN_TOKEN_CHARACTERS characters."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"http_token_file {path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"http_token_file {path}: not a regular file")
        check_config_file(Path(path), info)
        mode = stat.S_IMODE(info.st_mode)
        group_may_read = info.st_gid == gid or _private_group(info)
        if mode & stat.S_IRWXO or (mode & stat.S_IRGRP and not group_may_read):
            raise ConfigError(
                f"http_token_file {path} may be read by others than its owner (mode "
                f"{mode:04o}, group {info.st_gid}): whoever reads it may load models and "
                f"read and write tensors; chmod 0600 {path} (or 0640 with the socket's group)"
            )
        data = file.read(4097)
    token = data.decode("ascii", "replace").strip()
    if len(data) > 4096 or not token or not set(token) <= TOKEN_CHARACTERS:
        raise ConfigError(
            f"http_token_file {path}: must hold one token of letters, digits and -._~+/= "
            "(at most 4096 bytes): make one with `openssl rand -base64 32`"
        )
    if len(token) < MIN_TOKEN_CHARACTERS:
        raise ConfigError(
            f"http_token_file {path}: the token has {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARACTERS}: make one with `openssl rand -base64 32`"
        )
    return token
