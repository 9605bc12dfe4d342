"""The folder a run writes in, kept the run's own: whoever else could write there could
plant a link at a name the run writes, and have it write through the link (as root,
anywhere).

- `prepare(folder)`: made if it is not there (mode 0755 at most, narrowed by the umask);
  if it is, refused (UnsafeOutput) when another user owns it or others than its owner
  may write in it (group- or world-writable), as ssh's StrictModes refuses a home.
- `Temporary(folder, name)`: a file written under a name no one could have planted
  (`.NAME.RANDOM.partial`, made with O_CREAT|O_EXCL|O_NOFOLLOW), renamed to NAME when
  whole (a rename replaces a link there, never follows it); `write_whole` for bytes at once.
- `remove_leftovers(folder)`: the temporaries a killed run left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import IO

PARTIAL = ".partial"  # the suffix of a temporary
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeOutput(ValueError):
    """An output folder a run will not write in: what is wrong, and what to do."""


def prepare(folder: Path) -> None:
    """`folder` made, or checked if it is there (UnsafeOutput: another user's, or writable
    by others than its owner; NotADirectoryError: a file)."""
    _make(folder)
    status = os.stat(folder)
    if not stat.S_ISDIR(status.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    if status.st_uid != os.geteuid():
        raise UnsafeOutput(
            f"{folder}: owned by {_user(status.st_uid)}, not by the user running "
            f"({_user(os.geteuid())}), who could plant links where the run writes: "
            "give a folder of your own"
        )
    writers = [
        who
        for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
        if status.st_mode & bit
    ]
    if writers:
        raise UnsafeOutput(
            f"{folder}: writable by its {' and '.join(writers)} (mode "
            f"{stat.S_IMODE(status.st_mode):04o}), who could plant links where the run "
            f"writes: chmod go-w it, or give another folder"
        )


def _make(folder: Path) -> None:
    """`folder` and its missing parents made, each 0755 at most (the umask narrows it, never
    widens it: pathlib would make the parents 0777 under a umask of 0)."""
    if not folder.parent.exists():
        _make(folder.parent)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o755)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


class Temporary:
    """A file of `folder` written under a name of its own, renamed to `name` by `commit`
    (or removed by `discard`). Its mode is what the umask makes of 0666, as `open` gives."""

    def __init__(self, folder: Path, name: str) -> None:
        self.final = folder / name
        while True:
            self.path = folder / f".{name}.{secrets.token_hex(6)}{PARTIAL}"
            try:
                descriptor = os.open(self.path, _CREATE, 0o666)
            except FileExistsError:  # taken (or planted): another name
                continue
            break
        self.file: IO[bytes] = os.fdopen(descriptor, "wb")

    def commit(self) -> None:
        self.file.close()
        os.replace(self.path, self.final)

    def discard(self) -> None:
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def write_whole(folder: Path, name: str, data: bytes) -> None:
    """`folder/name` replaced by `data` at once: readers see the old file or the new one."""
    temporary = Temporary(folder, name)
    try:
        temporary.file.write(data)
    except BaseException:
        temporary.discard()
        raise
    temporary.commit()


def remove_leftovers(folder: Path) -> None:
    """The temporaries a run killed (SIGKILL, a power cut) left in `folder`, removed."""
    for path in folder.glob(f".*{PARTIAL}"):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
