"""A model repository in Triton's layout, as files: `DIR/NAME/` per model, an optional
`DIR/NAME/config.pbtxt`, and its versions as numeric subdirectories holding the model file
(`DIR/NAME/1/model.neff`, an ONNX model's `model.onnx`, or `default_model_filename`).

What it tells: the models there, a model's versions, and a stamp per version (the model
files' and config.pbtxt's mtime and size) that changes when any of them does, which the
`poll` control mode compares. A load request may instead bring a model's files itself
(`files`, the protocol's "file:1/model.neff" parameters): they are written to a private
temporary directory laid out the same way. Every name there is bounded as a file's
(NAME_MAX_BYTES a part), and messages show a caller's key cut to 100 characters. The model
files themselves are read by the runtime's one reader (`read_model_file`, through
`versions.read_model`), from within their version's folder only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from neuron_rtd.errors import shown
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.config import CONFIG_FILE, NAME_MAX_BYTES

CONTROL_MODES = ("none", "explicit", "poll")

Stamp = tuple[tuple[str, int, int], ...]  # (file name, mtime_ns, size) per file


@dataclass(frozen=True)
class ModelDir:
    """One model's directory as it is when scanned."""

    name: str
    path: Path
    versions: Mapping[int, Path]  # version -> its directory
    config_stamp: Stamp  # config.pbtxt's (empty: none)
    version_stamps: Mapping[int, Stamp]  # per version, the files in its directory


def model_names(root: Path) -> list[str]:
    """The models of repository `root`: its subdirectories (hidden ones skipped)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise ServingError(
            Status.UNAVAILABLE, f"cannot read model repository {root}: {_why(exc)}"
        ) from None
    return [e.name for e in entries if not e.name.startswith(".") and _is_dir(e)]


def scan_model(path: Path, name: str) -> ModelDir:
    """Model `name`'s directory `path`: its numeric version subdirectories and stamps."""
    versions: dict[int, Path] = {}
    stamps: dict[int, Stamp] = {}
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        raise ServingError(
            Status.UNAVAILABLE, f"cannot read the directory {path} of model '{name}': {_why(exc)}"
        ) from None
    for entry in entries:
        if entry.name.isdigit() and entry.name.isascii() and _is_dir(entry):
            version = int(entry.name)
            if version > 0:
                versions[version] = Path(entry.path)
                stamps[version] = _stamp(Path(entry.path))
    return ModelDir(
        name=name,
        path=path,
        versions=versions,
        config_stamp=_file_stamp(path / CONFIG_FILE),
        version_stamps=stamps,
    )


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _stamp(directory: Path) -> Stamp:
    """Name, mtime and size of every file under `directory` (a version's)."""
    found: list[tuple[str, int, int]] = []
    for dirpath, _, filenames in os.walk(directory):
        for filename in filenames:
            found.extend(_file_stamp(Path(dirpath) / filename, directory))
    return tuple(sorted(found))


def _file_stamp(path: Path, base: Path | None = None) -> Stamp:
    try:
        info = path.stat()
    except OSError:
        return ()
    name = str(path.relative_to(base)) if base is not None else path.name
    return ((name, info.st_mtime_ns, info.st_size),)


def _why(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


# --- files a load request brings -------------------------------------------------------
def check_file_key(key: str, name: str) -> PurePosixPath:
    """A load request's file key ("1/model.neff", "config.pbtxt") as a path inside the
    model's directory; INVALID_ARGUMENT for one that would leave it."""
    path = PurePosixPath(key)
    parts = key.split("/")
    if not key or path.is_absolute() or any(part in ("..", ".", "") for part in parts):
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"file '{shown(key)}' of the load of model '{name}' is not a relative path inside "
            "the model's directory (no '..', '.', empty or absolute parts), like "
            "'1/model.neff'",
        )
    if "\0" in key:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"file {shown(key)!r} of the load of model '{name}' holds a NUL",
        )
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES for part in parts):
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"file '{shown(key)}' of the load of model '{name}' has a part longer than a "
            f"file's name may be ({NAME_MAX_BYTES} bytes), like '1/model.neff'",
        )
    return path


def write_files(files: Mapping[str, bytes], name: str) -> tempfile.TemporaryDirectory[str]:
    """A private temporary directory holding `files` (key: path within the model's
    directory), to load model `name` from."""
    paths = {check_file_key(key, name): data for key, data in files.items()}
    holder = tempfile.TemporaryDirectory(prefix=f"nrt-model-{_safe(name)}-")
    root = Path(holder.name)
    try:
        for relative, data in paths.items():
            target = root.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"file '{relative}' of the load of model '{name}' is also a directory of "
                    "another file",
                )
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
    except OSError as exc:
        holder.cleanup()
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"cannot lay out the files of the load of model '{name}': {_why(exc)}",
        ) from None
    except BaseException:
        holder.cleanup()
        raise
    return holder


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
