"""Loading a served model, as the serving core (`neuron_rtd/serving/service.py`) does it
at start, on a load or unload request and while polling: the models it holds
(`ServedModel`: its ready versions and why others are not), each (re)loaded under its
name's lock from its repository folder or a request's files, version by version (a
version whose files and config did not change stays; one that fails to reload leaves
the one before it serving), and what names a load may take. An ONNX version is compiled
first (`neuron_rtd/serving/onnx_models.py`, its NEFF kept in the compile cache), what the
compile is doing shown meanwhile as the version's LOADING state in the repository index
(`Loader.progress`) and in the log; it runs in the loading thread, holding only its
model's name lock, so requests to other models (and the index) go on.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neuron_rtd.errors import shown
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import Runtime
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.compile_cache import CompileCache
from neuron_rtd.serving.config import (
    CONFIG_FILE,
    check_own_fields,
    is_onnx,
    parse_json_config,
    read_config,
    select_versions,
)
from neuron_rtd.serving.ensemble import STEP_THREADS, EnsembleVersion, StepPool, load_ensemble
from neuron_rtd.serving.ensemble_config import is_ensemble
from neuron_rtd.serving.ensemble_loading import load_composing, recheck_ensembles
from neuron_rtd.serving.names import NameLocks, is_model_dir
from neuron_rtd.serving.onnx_models import compile_version, served_config
from neuron_rtd.serving.repository import ModelDir, model_names, scan_model, write_files
from neuron_rtd.serving.served import ServedVersion
from neuron_rtd.serving.versions import load_version

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


def not_polled(name: str, exc: ServingError) -> ServingError:
    """A load request whose model could not be read (not in the repository, its files or
    config refused): INTERNAL in Triton's words, which clients match, then why."""
    return ServingError(
        Status.INTERNAL,
        f"failed to load '{shown(name)}', failed to poll from model repository: {exc.message}",
    )


class Loader:
    """The models a serving core holds (`models`, under `lock`), and their loads: from the
    repository `repository` or a request's files, each under its name's lock."""

    def __init__(
        self,
        runtime: Runtime,
        repository: Path | None,
        unknown_model: Callable[[str], str],
        compile_cache: Path | None = None,
        step_threads: int = STEP_THREADS,
    ) -> None:
        self.runtime = runtime
        self.repository = repository
        self.unknown_model = unknown_model  # why a name is served by none, in words
        self.models: dict[str, ServedModel] = {}
        # what the loads in progress are doing, by name and version (an ONNX compile)
        self.progress: dict[str, dict[int, str]] = {}
        self.cache = CompileCache(compile_cache)
        self.told: Callable[[str], None] | None = None  # told of progress too (at start)
        self.lock = threading.Lock()  # guards models and progress
        self.name_locks = NameLocks()
        self.closed = threading.Event()
        self.steps = StepPool(step_threads)  # the threads of ensembles' steps

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
        or any version failed (each failure also kept for the index); for a load
        `request`, in Triton's words: the model unread `not_polled`, a version failed
        "load failed for model 'NAME': ..." (its status ours). The ensembles are checked
        again after (`chain`: the ensembles whose load loads it, outermost first; the
        outermost load checks them once all are loaded)."""
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
                try:
                    if files:
                        holder = write_files(files, name)
                        directory = Path(holder.name)
                    else:
                        assert self.repository is not None
                        directory = self.repository / name
                        if not keep:
                            raise ServingError(Status.NOT_FOUND, self.unknown_model(name))
                except ServingError as exc:
                    raise not_polled(name, exc) if request else exc from None
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
            raise not_polled(name, exc) if request else exc from None
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
            raise ServingError(first.status, f"load failed for model '{name}': {message}")

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
        if is_onnx(user, directory):
            return self._load_onnx(scanned.name, version, directory, user, source)
        return load_version(self.runtime, scanned.name, version, directory, user, source)

    def _load_onnx(
        self, name: str, version: int, directory: Path, user: ModelConfig, source: str
    ) -> ServedVersion:
        """An ONNX version: compiled (or found in the compile cache), then loaded as its
        NEFF, answering with the config of the ONNX model."""

        def note(doing: str) -> None:
            with self.lock:
                self.progress.setdefault(name, {})[version] = doing
            log.info("Model '%s' version %d: %s", name, version, doing, extra={"fn": "load"})
            told = self.told
            if told is not None:
                told(f"model '{name}' version {version}: {doing}")

        try:
            compiled = compile_version(self.cache, name, version, directory, user, source, note)
            note("loading its NEFF")
            served = load_version(
                self.runtime,
                name,
                version,
                compiled.folder,
                compiled.neff_config,
                source,
                model_dir=directory.parent,  # its labels and initial state are there
            )
        finally:
            with self.lock:
                doing = self.progress.get(name, {})
                doing.pop(version, None)
                if not doing:
                    self.progress.pop(name, None)
        served.config = served_config(served.config, user)
        return served

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


def _same(a: ModelConfig, b: ModelConfig) -> bool:
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
