"""A model's name as the repository takes it: bounded (a folder's name, NAME_MAX_BYTES),
never hidden, never a path; and its lock, held by the one load or unload of that name
in progress."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from neuron_rtd.errors import shown
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.config import NAME_MAX_BYTES


class NameLocks:
    """One lock per model name, which exists only while a thread holds or awaits it: the
    names asked for leave nothing behind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._held: dict[str, tuple[threading.Lock, list[int]]] = {}  # name: lock, [users]

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        with self.lock:
            lock, users = self._held.setdefault(name, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self.lock:
                users[0] -= 1
                if not users[0]:
                    del self._held[name]

    def __len__(self) -> int:
        with self.lock:
            return len(self._held)


def name_bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def check_bound(name: str) -> None:
    """INVALID_ARGUMENT for a name longer than any model's can be (a folder's name)."""
    if name_bytes(name) > NAME_MAX_BYTES:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"model name '{shown(name)}' is {name_bytes(name)} bytes long: a model's name "
            f"is its folder's in the model repository, at most {NAME_MAX_BYTES} bytes",
        )


def check_name(name: str) -> None:
    """A name a load or unload may be asked for: a model folder's (no '/', not hidden,
    at most NAME_MAX_BYTES); INVALID_ARGUMENT otherwise."""
    check_bound(name)
    if not name or "/" in name or name in (".", "..") or "\0" in name or name.startswith("."):
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"model name {shown(name)!r} is not a model directory's name (no '/', not "
            "hidden, no NUL)",
        )


def is_model_dir(root: Path, name: str) -> bool:
    if not name or "/" in name or "\0" in name or name.startswith("."):
        return False
    if name_bytes(name) > NAME_MAX_BYTES:
        return False
    try:
        return (root / name).is_dir()
    except (OSError, ValueError):  # a folder the daemon may not search: no model it serves
        return False
