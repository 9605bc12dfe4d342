"""The serving core (`ServingApi`): the models of a repository served as Triton serves
them, under one of its control modes:

- "none": every model of the repository loaded at start; load/unload requests refused;
- "explicit": only `load_models` at start ("*": all); load/unload requests honoured;
- "poll": as "none", and a thread rescans the repository every `poll_s` seconds: new
  models and versions are loaded, removed ones unloaded, changed ones (a model file or
  config.pbtxt whose mtime or size moved) reloaded.

A model that fails to load, whatever the reason, is logged and left UNAVAILABLE with its
reason (in the repository index); the daemon keeps serving the others, and the poll thread
goes on to the next model and the next poll. A version that fails to reload leaves the one
before it serving.

Names are bounded (a model's name is a folder's: at most NAME_MAX_BYTES), and the core
keeps state only for the models of the repository and those loaded from a request's
files: a load that fails for a name not in the repository, or an unload of one, leaves
nothing behind, and a name's lock lives only while a load or unload holds or awaits it.
Messages show a caller's name cut to 100 characters.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neuron_rtd import __version__
from neuron_rtd.errors import shown
from neuron_rtd.proto import kserve_pb, model_config_pb
from neuron_rtd.runtime import Caller, Runtime
from neuron_rtd.serving.api import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RepositoryModel,
    ServerMetadata,
    ServingError,
    SharedMemoryApi,
    Status,
)
from neuron_rtd.serving.config import (
    CONFIG_FILE,
    NAME_MAX_BYTES,
    PLATFORM,
    check_own_fields,
    parse_json_config,
    read_config,
    select_versions,
)
from neuron_rtd.serving.repository import (
    CONTROL_MODES,
    ModelDir,
    model_names,
    scan_model,
    write_files,
)
from neuron_rtd.serving.served import ServedVersion, load_version
from neuron_rtd.serving.shm import SystemSharedMemory

log = logging.getLogger("nrtd.KSERVE")

SERVER_NAME = "neuron-rtd"
# The protocol's extensions the daemon really supports ("binary_tensor_data": the HTTP
# front end's; request parameters are not honoured, so not "parameters").
EXTENSIONS: tuple[str, ...] = (
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    "statistics",
    "binary_tensor_data",
)
READY, UNAVAILABLE = "READY", "UNAVAILABLE"

ModelConfig = model_config_pb.ModelConfig


@dataclass
class _Model:
    """A model as served: its ready versions, and why others (or all) are not."""

    name: str
    scanned: ModelDir | None = None  # the directory loaded from (None: files of a load)
    user: ModelConfig = field(default_factory=ModelConfig)  # as the user gave it
    forced: bool = False  # a load request's config or files: poll leaves it be
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> why not READY
    reason: str = ""  # why no version is served (the model as a whole failed, unloaded)

    def newest(self) -> ServedVersion | None:
        return self.versions[max(self.versions)] if self.versions else None


class Serving:
    """The serving core over `runtime` (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        repository: Path | None = None,
        control_mode: str = "none",
        load_models: Sequence[str] = (),
        poll_s: float = 15.0,
    ) -> None:
        if control_mode not in CONTROL_MODES:
            raise ValueError(
                f"model control mode {control_mode!r}: expected one of {', '.join(CONTROL_MODES)}"
            )
        if poll_s <= 0:
            raise ValueError(f"poll interval {poll_s} s: expected more than 0")
        self.runtime = runtime
        self.repository = repository
        self.control_mode = control_mode
        self.load_models = tuple(load_models)
        self.poll_s = poll_s
        self.regions = SystemSharedMemory(runtime, limit=runtime.options.session_max_shm_maps)
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()  # guards _models
        self._name_locks = _NameLocks()
        self._started = False
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None

    # --- life ------------------------------------------------------------------------
    def start(self) -> None:
        """Load the models the control mode loads at start, then (poll) start polling."""
        if self.repository is not None:
            for name in self._initial_models():
                self._load_logged(name)
        self._started = True
        if self.control_mode == "poll" and self.repository is not None:
            self._poller = threading.Thread(
                target=self._poll, name="kserve-repository-poll", daemon=True
            )
            self._poller.start()

    def _initial_models(self) -> list[str]:
        assert self.repository is not None
        try:
            found = model_names(self.repository)
        except ServingError as exc:
            log.error("%s", exc.message, extra={"fn": "repository"})
            return []
        if self.control_mode != "explicit" or "*" in self.load_models:
            return found
        return list(dict.fromkeys(self.load_models))

    def close(self) -> None:
        """Stop polling, unload every model, and unmap every shared-memory region."""
        self._closed.set()
        if self._poller is not None:
            self._poller.join()
        with self._lock:
            names = list(self._models)
        for name in names:
            self._unload(name, "the daemon is stopping")
        self.regions.close()

    def shm(self, caller: Caller) -> SharedMemoryApi:
        """The system shared-memory regions `caller` registered, as it may use them."""
        return self.regions.of(caller)

    # --- health and metadata ---------------------------------------------------------------
    def live(self) -> bool:
        return not self._closed.is_set()

    def ready(self) -> bool:
        return self._started and not self._closed.is_set() and self.runtime.ready()

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, __version__, EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self._version(name, version)
        except ServingError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self._version(name, version)
        if version:
            versions: tuple[str, ...] = (served.version_text,)
        else:
            with self._lock:
                model = self._models.get(name)
                ready = sorted(model.versions) if model is not None else []
            versions = tuple(str(v) for v in ready) or (served.version_text,)
        inputs, outputs = served.tensors()
        return ModelMetadata(name, versions, PLATFORM, inputs, outputs)

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        config = ModelConfig()
        config.CopyFrom(self._version(name, version).config)
        return config

    def model_statistics(
        self, name: str = "", version: str = ""
    ) -> kserve_pb.ModelStatisticsResponse:
        response = kserve_pb.ModelStatisticsResponse()
        if name:
            if version:
                served = [self._version(name, version)]
            else:
                with self._lock:
                    model = self._models.get(name)
                    served = [model.versions[v] for v in sorted(model.versions)] if model else []
                if not served:
                    self._version(name, "")  # says why: NOT_FOUND or UNAVAILABLE
        else:
            with self._lock:
                served = [
                    model.versions[v]
                    for key in sorted(self._models)
                    for model in (self._models[key],)
                    for v in sorted(model.versions)
                ]
        response.model_stats.extend(s.stats.message() for s in served)
        return response

    # --- inference -----------------------------------------------------------------------
    def infer(self, request: InferRequest) -> InferResponse:
        began_ns = time.perf_counter_ns()
        return self._version(request.model, request.version).infer(request, began_ns)

    def _version(self, name: str, version: str) -> ServedVersion:
        """The READY version `version` of model `name` ("" its newest)."""
        _check_bound(name)
        with self._lock:
            model = self._models.get(name)
            if model is not None:
                if not version:
                    served = model.newest()
                    if served is not None:
                        return served
                elif _number(version) is not None:
                    served = model.versions.get(int(version))
                    if served is not None:
                        return served
        raise self._not_served(name, version, model)

    def _not_served(self, name: str, version: str, model: _Model | None) -> ServingError:
        if model is None:
            return ServingError(Status.NOT_FOUND, self._unknown_model(name))
        if version:
            if _number(version) is None:
                return ServingError(
                    Status.NOT_FOUND,
                    f"model '{name}' has no version '{shown(version)}': versions are numbers",
                )
            why = model.failed.get(int(version))
            if why:
                return ServingError(
                    Status.UNAVAILABLE, f"version {version} of model '{name}' is not ready: {why}"
                )
            ready = ", ".join(str(v) for v in sorted(model.versions)) or "none"
            return ServingError(
                Status.NOT_FOUND,
                f"model '{name}' has no version {version} served (ready versions: {ready})",
            )
        reasons = [model.reason] if model.reason else []
        reasons += [why for _, why in sorted(model.failed.items())]
        return ServingError(
            Status.UNAVAILABLE,
            f"model '{name}' has no version ready: " + ("; ".join(reasons) or "not loaded"),
        )

    def _unknown_model(self, name: str) -> str:
        name = shown(name)
        if self.repository is None:
            return (
                f"no model named '{name}' is served: this daemon serves no model repository; "
                "serve models by starting it with --model-repository DIR "
                "(DIR/NAME/1/model.neff, optionally DIR/NAME/config.pbtxt)"
            )
        if self.control_mode == "explicit" and _is_model_dir(self.repository, name):
            return (
                f"no model named '{name}' is served: it is in the model repository "
                f"{self.repository} but not loaded; load it (RepositoryModelLoad, "
                f"POST /v2/repository/models/{name}/load)"
            )
        return f"no model named '{name}' is served (model repository {self.repository})"

    # --- the repository ----------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[RepositoryModel]:
        names: list[str] = []
        if self.repository is not None:
            try:
                names = model_names(self.repository)
            except ServingError as exc:
                log.warning("%s", exc.message, extra={"fn": "repository_index"})
        rows: list[RepositoryModel] = []
        with self._lock:
            for name in sorted({*names, *self._models}):
                model = self._models.get(name)
                if model is None:
                    rows.append(RepositoryModel(name, "", ""))
                    continue
                states = {v: RepositoryModel(name, str(v), READY) for v in model.versions}
                for v, why in model.failed.items():
                    states.setdefault(v, RepositoryModel(name, str(v), UNAVAILABLE, why))
                if states:
                    rows.extend(states[v] for v in sorted(states))
                else:
                    rows.append(RepositoryModel(name, "", UNAVAILABLE, model.reason))
        if ready_only:
            rows = [row for row in rows if row.state == READY]
        return rows

    def load_model(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None:
        self._check_explicit("load")
        _check_name(name)
        if self.repository is None and not files:
            raise ServingError(
                Status.NOT_FOUND,
                f"cannot load model '{name}': this daemon serves no model repository (start "
                "it with --model-repository DIR), and the request brings no files",
            )
        self._load(name, config=config, files=files or {}, request=True)

    def unload_model(self, name: str) -> None:
        self._check_explicit("unload")
        _check_name(name)
        with self._lock:
            known = name in self._models
        if not known:
            if self._in_repository(name):
                return  # in the repository, not loaded: nothing to unload
            raise ServingError(Status.NOT_FOUND, self._unknown_model(name))
        # a model of the repository stays in its index, UNAVAILABLE; one of a load's files
        # (not in the repository) is forgotten
        self._unload(name, "unloaded", keep=self._in_repository(name))

    def _in_repository(self, name: str) -> bool:
        return self.repository is not None and _is_model_dir(self.repository, name)

    def _check_explicit(self, what: str) -> None:
        if self.control_mode != "explicit":
            raise ServingError(
                Status.UNAVAILABLE,
                f"explicit model load / unload is not allowed unless the daemon runs with "
                f"--model-control-mode explicit (it runs with {self.control_mode}); "
                f"the {what} was not done",
            )

    def _load_logged(self, name: str) -> None:
        """Load repository model `name` (at start, or polling): whatever goes wrong is
        logged and kept as the model's reason, never raised."""
        try:
            self._load(name)
        except ServingError as exc:
            log.error("Model '%s' not served: %s", name, exc.message, extra={"fn": "load"})
        except Exception as exc:
            log.exception("Model '%s' not served: unexpected error", name, extra={"fn": "load"})
            reason = f"loading it failed unexpectedly: {type(exc).__name__}: {shown(str(exc))}"
            with self._lock:
                model = self._models.get(name)
                if model is None or not model.versions:
                    self._models[name] = _Model(name=name, reason=reason)

    def _load(
        self,
        name: str,
        *,
        config: str = "",
        files: Mapping[str, bytes] | None = None,
        request: bool = False,
    ) -> None:
        """(Re)load model `name`: from the repository, or from `files`; `config` (JSON)
        overriding its config.pbtxt. Versions whose files and config did not change stay
        as they are unless the config or files are given. ServingError when the model
        or any version failed (each failure also kept for the index)."""
        with self._name_locks.hold(name):
            holder: tempfile.TemporaryDirectory[str] | None = None
            try:
                # state is kept for the models of the repository, and for a load's files
                # only while they serve
                keep = self._in_repository(name)
                if files:
                    holder = write_files(files, name)
                    directory = Path(holder.name)
                else:
                    assert self.repository is not None
                    directory = self.repository / name
                    if not keep:
                        raise ServingError(Status.NOT_FOUND, self._unknown_model(name))
                forced = bool(files) or bool(config)
                self._load_from(name, directory, config, forced, request, keep)
            finally:
                if holder is not None:
                    holder.cleanup()

    def _load_from(
        self, name: str, directory: Path, config: str, forced: bool, request: bool, keep: bool
    ) -> None:
        with self._lock:
            before = self._models.get(name)
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
                raise ServingError(
                    Status.UNAVAILABLE,
                    f"model '{name}' has no version to serve: no numeric version directory "
                    f"(like {directory}/1/) holds its model file",
                )
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
        kept: dict[int, ServedVersion] = {}
        loaded: dict[int, ServedVersion] = {}
        failed: dict[int, str] = {}
        errors: list[ServingError] = []
        for version in wanted:
            old = before.versions.get(version) if before is not None else None
            was = before.scanned if before is not None and same_config else None
            stamp = scanned.version_stamps.get(version)
            if old is not None and was is not None and was.version_stamps.get(version) == stamp:
                kept[version] = old  # unchanged
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
            if old is None:
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
        model = _Model(
            name=name,
            scanned=None if forced and directory != self._repo_dir(name) else scanned,
            user=user,
            forced=forced,
            versions=dict(sorted(served.items())),
            failed=failed,
        )
        with self._lock:
            if self._closed.is_set():
                model.versions, gone = {}, list(served.values())
            elif served or keep:
                self._models[name] = model
                gone = []
            else:  # a load's files, none serving: nothing kept of the name
                self._models.pop(name, None)
                gone = []
            if before is not None:
                gone += [v for n, v in before.versions.items() if n not in kept or kept[n] is not v]
        for old_version in gone:
            self._close_version(old_version)
        for number, new in sorted(loaded.items()):
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
    ) -> ServedVersion:
        directory = scanned.versions.get(version)
        if directory is None:
            raise ServingError(
                Status.UNAVAILABLE,
                f"model '{scanned.name}' version {version}: named by version_policy, but "
                f"{scanned.path}/{version}/ does not exist",
            )
        return load_version(self.runtime, scanned.name, version, directory, user, source)

    def _repo_dir(self, name: str) -> Path | None:
        return self.repository / name if self.repository is not None else None

    def _fail_model(
        self,
        name: str,
        before: _Model | None,
        reason: str,
        scanned: ModelDir | None,
        keep: bool = True,
    ) -> None:
        """The model as a whole could not be (re)loaded: a model not serving is recorded
        UNAVAILABLE with `reason` (and what was scanned: polling retries it once that
        changes), or forgotten unless `keep` (a load's files, for a name not in the
        repository); one serving keeps serving."""
        if before is not None and before.versions:
            with self._lock:
                if scanned is not None and before.scanned is not None:
                    before.scanned = scanned  # polling retries it once it changes again
            log.warning(
                "Model '%s' not reloaded, the versions loaded before still serve: %s",
                name,
                reason,
                extra={"fn": "load"},
            )
            return
        with self._lock:
            if keep:
                self._models[name] = _Model(name=name, scanned=scanned, reason=reason)
            else:
                self._models.pop(name, None)

    def _unload(self, name: str, reason: str, keep: bool = True) -> None:
        """Unload model `name`: kept in the index, UNAVAILABLE with `reason`, if `keep`."""
        with self._name_locks.hold(name):
            with self._lock:
                model = self._models.get(name)
                if model is None:
                    return
                if keep:
                    self._models[name] = _Model(name=name, reason=reason)
                else:
                    del self._models[name]
            for version in model.versions.values():
                self._close_version(version)
            if model.versions:
                log.info(
                    "Unloaded model '%s' (%s)",
                    name,
                    ", ".join(f"version {v}" for v in sorted(model.versions)),
                    extra={"fn": "unload"},
                )

    def _close_version(self, version: ServedVersion) -> None:
        problems = version.close()
        for problem in problems:
            log.warning(
                "Model '%s' version %d: unloading a copy: %s",
                version.name,
                version.version,
                problem,
                extra={"fn": "unload"},
            )

    # --- polling -------------------------------------------------------------------------
    def _poll(self) -> None:
        while not self._closed.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception:  # the poller must outlive any one bad scan
                log.exception("Polling the model repository failed", extra={"fn": "poll"})

    def poll_once(self) -> None:
        """One rescan of the repository (what the poll thread does every poll_s)."""
        assert self.repository is not None
        try:
            names = set(model_names(self.repository))
        except ServingError as exc:
            log.warning("%s", exc.message, extra={"fn": "poll"})
            return
        with self._lock:
            models = dict(self._models)
        for name in sorted(names):
            if self._closed.is_set():
                return
            model = models.get(name)
            if model is None or self._changed(model, name):
                self._load_logged(name)  # never raises: one model cannot stop the others
        for name, model in sorted(models.items()):
            if name not in names and (model.versions or model.failed or model.scanned):
                try:
                    self._unload(name, "removed from the model repository")
                except Exception:
                    log.exception("Unloading model '%s' failed", name, extra={"fn": "poll"})

    def _changed(self, model: _Model, name: str) -> bool:
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


class _NameLocks:
    """One lock per model name, which exists only while a thread holds or awaits it: the
    names asked for leave nothing behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[threading.Lock, list[int]]] = {}  # name: lock, [users]

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        with self._lock:
            lock, users = self._held.setdefault(name, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._lock:
                users[0] -= 1
                if not users[0]:
                    del self._held[name]

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def _number(version: str) -> int | None:
    """A request's version as a number, None when it is none (or past any version's size)."""
    if version.isdigit() and version.isascii() and len(version) <= 19:
        return int(version)
    return None


def _name_bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def _check_bound(name: str) -> None:
    """INVALID_ARGUMENT for a name longer than any model's can be (a folder's name)."""
    if _name_bytes(name) > NAME_MAX_BYTES:
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"model name '{shown(name)}' is {_name_bytes(name)} bytes long: a model's name "
            f"is its folder's in the model repository, at most {NAME_MAX_BYTES} bytes",
        )


def _check_name(name: str) -> None:
    """A name a load or unload may be asked for: a model folder's (no '/', not hidden,
    at most NAME_MAX_BYTES); INVALID_ARGUMENT otherwise."""
    _check_bound(name)
    if not name or "/" in name or name in (".", "..") or "\0" in name or name.startswith("."):
        raise ServingError(
            Status.INVALID_ARGUMENT,
            f"model name {shown(name)!r} is not a model directory's name (no '/', not "
            "hidden, no NUL)",
        )


def _is_model_dir(root: Path, name: str) -> bool:
    if not name or "/" in name or "\0" in name or name.startswith("."):
        return False
    if _name_bytes(name) > NAME_MAX_BYTES:
        return False
    try:
        return (root / name).is_dir()
    except (OSError, ValueError):  # a folder the daemon may not search: no model it serves
        return False


def _same(a: ModelConfig, b: ModelConfig) -> bool:
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
