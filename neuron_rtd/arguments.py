"""Command-line argument types more than one command takes (`argparse` `type=` functions),
and the check of a file named on the command line.

Shared by every layer and importing none: `neuron-cc` (the compiler) and `neuron-cli
validate` (a tool) parse `--input-shape` here, `neuron-cc quantize` and `neuron-batch`
their counts (`positive`); `neuron-cli` and `neuron-batch` say why a file they were given
cannot be read (`unreadable`).
"""

from __future__ import annotations

import argparse
import os
import pwd
import stat


def positive(text: str) -> int:
    """A count of 1 or more (`type=positive`)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return value


def parse_shape(text: str, *, example: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` as (NAME, sizes); ArgumentTypeError, showing the command's
    `example` (`type=functools.partial(parse_shape, example=...)`), unless there is a name
    and every size is an integer of 0 or more."""
    name, sep, dims = text.rpartition("=")
    try:
        sizes = tuple(int(d) for d in dims.split(","))
    except ValueError:
        sizes = ()
    if not sep or not name or not sizes or any(d < 0 for d in sizes):
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... (e.g. {example}), got {text!r}")
    return name, sizes


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def unreadable(path: str | os.PathLike[str], what: str = "file") -> str | None:
    """Why a file named on the command line cannot be read as one, in a few words (`no
    such file`, `a directory, not a file`, `permission denied: nobody (uid 65534) may not
    read it`; `what` names the file: `NEFF file`); None when it can."""
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"no such {what}"
    except PermissionError:
        return f"permission denied: {_user()} may not look in its directory"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    for is_kind, kind in _KINDS:
        if is_kind(status.st_mode):
            return f"{kind}, not {'an' if what[0] in 'AEIOUaeiou' else 'a'} {what}"
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        return f"permission denied: {_user()} may not read it"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None


def _user() -> str:
    uid = os.geteuid()
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
