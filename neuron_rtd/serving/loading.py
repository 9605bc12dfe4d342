"""Loading a served model, as the serving core (`neuron_rtd/serving/service.py`) does it
at start, on a load or unload request and while polling: the models it holds
(`ServedModel`: its ready versions and why others are not), each (re)loaded under its
name's lock from its repository folder or a request's files, version by version (a
version whose files and config did not change stays; one that fails to reload leaves
the one before it serving), and what names a load may take.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neuron_rtd.errors import shown
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import Runtime
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.config import (
    CONFIG_FILE,
    NAME_MAX_BYTES,
    check_own_fields,
    parse_json_config,
    read_config,
    select_versions,
)
from neuron_rtd.serving.ensemble import EnsembleVersion, StepPool, load_ensemble
from neuron_rtd.serving.ensemble_config import is_ensemble
from neuron_rtd.serving.ensemble_loading import load_composing, recheck_ensembles
from neuron_rtd.serving.repository import ModelDir, model_names, scan_model, write_files
from neuron_rtd.serving.served import ServedVersion, load_version

log = logging.getLogger("nrtd.KSERVE")

ModelConfig = model_config_pb.ModelConfig
Served = ServedVersion | EnsembleVersion  # a version served: of a NEFF, or an ensemble


@dataclass
class ServedModel:
    """A model as served: its ready versions, and why others (or all) are not. Its
    `versions` are not changed once it is in the loader's table (a reload or an unload
    puts a new one there): `Serving._version` reads them without the lock."""

    name: str
    scanned: ModelDir | None = None  # the directory loaded from (None: files of a load)
    user: ModelConfig = field(default_factory=ModelConfig)  # as the user gave it
    forced: bool = False  # a load request's config or files: poll leaves it be
    versions: dict[int, Served] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> why not READY
    reason: str = ""  # why no version is served (the model as a whole failed, unloaded)

    def newest(self) -> Served | None:
        return self.versions[max(self.versions)] if self.versions else None


class Loader:
    """The models a serving core holds (`models`, under `lock`), and their loads: from the
    repository `repository` or a request's files, each under its name's lock."""

    def __init__(
        self,
        runtime: Runtime,
        repository: Path | None,
        unknown_model: Callable[[str], str],
    ) -> None:
        self.runtime = runtime
        self.repository = repository
        self.unknown_model = unknown_model  # why a name is served by none, in words
        self.models: dict[str, ServedModel] = {}
        self.lock = threading.Lock()  # guards models
        self.name_locks = NameLocks()
        self.closed = threading.Event()
        self.steps = StepPool()  # the threads of ensembles' steps

    def in_repository(self, name: str) -> bool:
        return self.repository is not None and is_model_dir(self.repository, name)

    def load_logged(self, name: str) -> None:
        """Load repository model `name` (at start, or polling): whatever goes wrong is
        logged and kept as the model's reason, never raised."""
        try:
            self.load(name)
        except ServingError as exc:
            log.error("Model '%s' not served: %s", name, exc.message, extra={"fn": "load"})
        except Exception as exc:
            log.exception("Model '%s' not served: unexpected error", name, extra={"fn": "load"})
            reason = f"loading it failed unexpectedly: {type(exc).__name__}: {shown(str(exc))}"
            with self.lock:
                model = self.models.get(name)
                if model is None or not model.versions:
                    self.models[name] = ServedModel(name=name, reason=reason)

    def load(
        self,
        name: str,
        *,
        config: str = "",
        files: Mapping[str, bytes] | None = None,
        request: bool = False,
        chain: tuple[str, ...] = (),
    ) -> None:
        """(Re)load model `name`: from the repository, or from `files`; `config` (JSON)
        overriding its config.pbtxt. Versions whose files and config did not change stay
        as they are unless the config or files are given. ServingError when the model
        or any version failed (each failure also kept for the index). The ensembles
        are checked again after (`chain`: the ensembles whose load loads it, outermost
        first; the outermost load checks them once all are loaded)."""
        try:
            self._load(name, config, files, request, chain)
        finally:
            if not chain:  # (a nested load's caller checks them once it is done)
                recheck_ensembles(self)

    def _load(
        self,
        name: str,
        config: str,
        files: Mapping[str, bytes] | None,
        request: bool,
        chain: tuple[str, ...],
    ) -> None:
        with self.name_locks.hold(name):
            holder: tempfile.TemporaryDirectory[str] | None = None
            try:
                # state is kept for the models of the repository, and for a load's files
                # only while they serve
                keep = self.in_repository(name)
                if files:
                    holder = write_files(files, name)
                    directory = Path(holder.name)
                else:
                    assert self.repository is not None
                    directory = self.repository / name
                    if not keep:
                        raise ServingError(Status.NOT_FOUND, self.unknown_model(name))
                forced = bool(files) or bool(config)
                self._load_from(name, directory, config, forced, request, keep, chain)
            finally:
                if holder is not None:
                    holder.cleanup()

    def _load_from(
        self,
        name: str,
        directory: Path,
        config: str,
        forced: bool,
        request: bool,
        keep: bool,
        chain: tuple[str, ...] = (),
    ) -> None:
        with self.lock:
            before = self.models.get(name)
        scanned: ModelDir | None = None
        try:
            scanned = scan_model(directory, name)
            if config:
                user = parse_json_config(config, name)
                source = f"the config given to load model '{name}'"
            else:
                user = read_config(directory, name)
                source = f"{CONFIG_FILE} of model '{name}'"
            check_own_fields(user, name, source)
            wanted = select_versions(user, sorted(scanned.versions))
            if not wanted:
                holds = "an ensemble's is empty" if is_ensemble(user) else "holds its model file"
                raise ServingError(
                    Status.UNAVAILABLE,
                    f"model '{name}' has no version to serve: no numeric version directory "
                    f"(like {directory}/1/, {holds})",
                )
            if is_ensemble(user):
                load_composing(self, name, user, chain)
        except ServingError as exc:
            self._fail_model(name, before, exc.message, None if forced else scanned, keep)
            raise
        same_config = (
            before is not None
            and not forced
            and not before.forced
            and _same(before.user, user)
            and before.scanned is not None
            and before.scanned.config_stamp == scanned.config_stamp
        )
        kept: dict[int, Served] = {}
        loaded: dict[int, Served] = {}
        failed: dict[int, str] = {}
        errors: list[ServingError] = []
        for version in wanted:
            old = before.versions.get(version) if before is not None else None
            was = before.scanned if before is not None and same_config else None
            stamp = scanned.version_stamps.get(version)
            unchanged = was is not None and was.version_stamps.get(version) == stamp
            # (an ensemble is checked again: its composing models may have changed)
            if old is not None and unchanged and not isinstance(old, EnsembleVersion):
                kept[version] = old
                continue
            try:
                loaded[version] = self._load_version(scanned, version, user, source)
                continue
            except ServingError as exc:
                error = exc
            except Exception as exc:  # one version's surprise is its reason, no more
                log.exception(
                    "Model '%s' version %d: unexpected error", name, version, extra={"fn": "load"}
                )
                error = ServingError(
                    Status.INTERNAL,
                    f"model '{name}' version {version}: loading it failed unexpectedly: "
                    f"{type(exc).__name__}: {shown(str(exc))}",
                )
            errors.append(error)
            if old is None or isinstance(old, EnsembleVersion):
                failed[version] = error.message
                continue
            kept[version] = old  # the version before keeps serving
            log.warning(
                "Model '%s' version %d not reloaded, the one loaded before still serves: %s",
                name,
                version,
                error.message,
                extra={"fn": "load"},
            )
        served = {**kept, **loaded}
        model = ServedModel(
            name=name,
            scanned=None if forced and directory != self._repo_dir(name) else scanned,
            user=user,
            forced=forced,
            versions=dict(sorted(served.items())),
            failed=failed,
        )
        with self.lock:
            if self.closed.is_set():
                model.versions, gone = {}, list(served.values())
            elif served or keep:
                self.models[name] = model
                gone = []
            else:  # a load's files, none serving: nothing kept of the name
                self.models.pop(name, None)
                gone = []
            if before is not None:
                gone += [v for n, v in before.versions.items() if n not in kept or kept[n] is not v]
        for old_version in gone:
            self._close_version(old_version)
        for number, new in sorted(loaded.items()):
            if isinstance(new, EnsembleVersion):
                log.info(
                    "Serving ensemble '%s' version %d: steps %s",
                    name,
                    number,
                    ", ".join(s.model for s in new.plan.steps),
                    extra={"fn": "load"},
                )
                continue
            log.info(
                "Serving model '%s' version %d: %d copy(ies) as runtime model(s) %s%s",
                name,
                number,
                len(new.model_ids),
                ", ".join(map(str, new.model_ids)),
                ", dynamic batching" if new.batcher is not None else "",
                extra={"fn": "load"},
            )
        if errors:
            first = errors[0]
            message = "; ".join(e.message for e in errors)
            if not request:
                log.error("Model '%s': %s", name, message, extra={"fn": "load"})
            raise ServingError(first.status, message)

    def _load_version(
        self, scanned: ModelDir, version: int, user: ModelConfig, source: str
    ) -> Served:
        directory = scanned.versions.get(version)
        if directory is None:
            raise ServingError(
                Status.UNAVAILABLE,
                f"model '{scanned.name}' version {version}: named by version_policy, but "
                f"{scanned.path}/{version}/ does not exist",
            )
        if is_ensemble(user):
            gate = self.runtime.compute_gate
            return load_ensemble(scanned.name, version, user, source, self.models, self.steps, gate)
        return load_version(self.runtime, scanned.name, version, directory, user, source)

    def _repo_dir(self, name: str) -> Path | None:
        return self.repository / name if self.repository is not None else None

    def _fail_model(
        self,
        name: str,
        before: ServedModel | None,
        reason: str,
        scanned: ModelDir | None,
        keep: bool = True,
    ) -> None:
        """The model as a whole could not be (re)loaded: a model not serving is recorded
        UNAVAILABLE with `reason` (and what was scanned: polling retries it once that
        changes), or forgotten unless `keep` (a load's files, for a name not in the
        repository); one serving keeps serving."""
        if before is not None and before.versions:
            with self.lock:
                if scanned is not None and before.scanned is not None:
                    before.scanned = scanned  # polling retries it once it changes again
            log.warning(
                "Model '%s' not reloaded, the versions loaded before still serve: %s",
                name,
                reason,
                extra={"fn": "load"},
            )
            return
        with self.lock:
            if keep:
                self.models[name] = ServedModel(name=name, scanned=scanned, reason=reason)
            else:
                self.models.pop(name, None)

    def unload(self, name: str, reason: str, keep: bool = True) -> None:
        """Unload model `name`: kept in the index, UNAVAILABLE with `reason`, if `keep`
        (the ensembles composed of it are checked again after)."""
        try:
            self._unload(name, reason, keep)
        finally:
            recheck_ensembles(self)

    def _unload(self, name: str, reason: str, keep: bool) -> None:
        with self.name_locks.hold(name):
            with self.lock:
                model = self.models.get(name)
                if model is None:
                    return
                if keep:
                    self.models[name] = ServedModel(name=name, reason=reason)
                else:
                    del self.models[name]
            for version in model.versions.values():
                self._close_version(version)
            if model.versions:
                log.info(
                    "Unloaded model '%s' (%s)",
                    name,
                    ", ".join(f"version {v}" for v in sorted(model.versions)),
                    extra={"fn": "unload"},
                )

    def _close_version(self, version: Served) -> None:
        problems = version.close()
        for problem in problems:
            log.warning(
                "Model '%s' version %d: unloading a copy: %s",
                version.name,
                version.version,
                problem,
                extra={"fn": "unload"},
            )

    def poll_once(self) -> None:
        """One rescan of the repository (what the poll thread does every poll_s)."""
        assert self.repository is not None
        try:
            names = set(model_names(self.repository))
        except ServingError as exc:
            log.warning("%s", exc.message, extra={"fn": "poll"})
            return
        with self.lock:
            models = dict(self.models)
        for name in sorted(names):
            if self.closed.is_set():
                return
            model = models.get(name)
            if model is None or self._changed(model, name):
                self.load_logged(name)  # never raises: one model cannot stop the others
        for name, model in sorted(models.items()):
            if name not in names and (model.versions or model.failed or model.scanned):
                try:
                    self.unload(name, "removed from the model repository")
                except Exception:
                    log.exception("Unloading model '%s' failed", name, extra={"fn": "poll"})

    def _changed(self, model: ServedModel, name: str) -> bool:
        if model.scanned is None:
            return True
        try:
            now = scan_model(model.scanned.path, name)
        except ServingError:
            return True
        before = model.scanned
        return (
            now.config_stamp != before.config_stamp or now.version_stamps != before.version_stamps
        )


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


def _same(a: ModelConfig, b: ModelConfig) -> bool:
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
