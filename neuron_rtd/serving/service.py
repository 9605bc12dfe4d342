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

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from neuron_rtd.serving.classification import check_classification, classify
from neuron_rtd.serving.config import PLATFORM
from neuron_rtd.serving.ensemble import STEP_THREADS
from neuron_rtd.serving.loading import (
    Loader,
    Served,
    ServedModel,
    not_polled,
)
from neuron_rtd.serving.names import check_bound, check_name, is_model_dir
from neuron_rtd.serving.repository import CONTROL_MODES, model_names
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
    "sequence",  # sequence_batching (neuron_rtd/serving/sequence.py)
    "sequence(string_id)",  # its sequence ids may be strings
    "classification",
)
READY, UNAVAILABLE, LOADING = "READY", "UNAVAILABLE", "LOADING"

ModelConfig = model_config_pb.ModelConfig


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
        compile_cache: Path | None = None,
        step_threads: int = STEP_THREADS,
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
        # compile_cache: where ONNX models' NEFFs are kept (None: a temporary folder);
        # step_threads: ensembles' steps run at once beside their requests' own
        self._loader = Loader(runtime, repository, self._unknown_model, compile_cache, step_threads)
        self._models = self._loader.models  # under self._lock
        self._lock = self._loader.lock
        self._name_locks = self._loader.name_locks
        self._started = False
        self._closed = self._loader.closed
        self._poller: threading.Thread | None = None

    # --- life ------------------------------------------------------------------------
    def start(self, progress: Callable[[str], None] | None = None) -> None:
        """Load the models the control mode loads at start, then (poll) start polling.
        `progress` is told what a long load (an ONNX compile) is doing as it goes."""
        if self.repository is not None:
            self._loader.told = progress
            try:
                for name in self._initial_models():
                    self._loader.load_logged(name)
            finally:
                self._loader.told = None
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
            self._loader.unload(name, "the daemon is stopping")
        self._loader.steps.close()
        self.regions.close()
        self._loader.cache.close()

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
        platform = served.config.platform or PLATFORM  # an ONNX model's, an ensemble's
        return ModelMetadata(name, versions, platform, inputs, outputs)

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

    def pending_requests(self) -> dict[tuple[str, str], int]:
        with self._lock:
            served = [v for model in self._models.values() for v in model.versions.values()]
        return {(s.name, s.version_text): s.pending() for s in served}

    # --- inference -----------------------------------------------------------------------
    def infer(self, request: InferRequest) -> InferResponse:
        began_ns = time.perf_counter_ns()
        served = self._version(request.model, request.version)
        if request.classification:  # outputs answered as their top classes
            check_classification(served.config, request.classification)
            return classify(
                served.infer(request, began_ns),
                request.classification,
                served.max_batch_size > 0,
                served.labels,
            )
        return served.infer(request, began_ns)

    def _version(self, name: str, version: str) -> Served:
        """The READY version `version` of model `name` ("" its newest). A name the core
        holds is within bounds: only one it does not is measured (`check_bound`). Read
        without the loader's lock: a model's entry is one dict read (atomic), and its
        versions never change once it is in the table (a change puts a new `ServedModel`
        there), so what is read is one whole state of the model, as under the lock."""
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
        check_bound(name)
        raise self._not_served(name, version, model)

    def _not_served(self, name: str, version: str, model: ServedModel | None) -> ServingError:
        if version and _number(version) is None:  # Triton's words, then ours
            return ServingError(
                Status.INVALID_ARGUMENT,
                f"failed to get model version from specified version string "
                f"'{shown(version)}': version should be an integral value > 0 (a model's "
                "versions are the numbered folders of its repository folder)",
            )
        if model is None:
            return ServingError(Status.NOT_FOUND, self._unknown_model(name))
        if version:
            why = model.failed.get(int(version))
            if why:
                return ServingError(
                    Status.UNAVAILABLE,
                    f"Request for unknown model: '{name}' version {version} is not at ready "
                    f"state: {why}",
                )
            ready = ", ".join(str(v) for v in sorted(model.versions)) or "none"
            return ServingError(
                Status.NOT_FOUND,
                f"Request for unknown model: '{name}' version {version} is not found "
                f"(ready versions: {ready})",
            )
        reasons = [model.reason] if model.reason else []
        reasons += [why for _, why in sorted(model.failed.items())]
        return ServingError(
            Status.UNAVAILABLE,
            f"Request for unknown model: '{name}' has no available versions: "
            + ("; ".join(reasons) or "not loaded"),
        )

    def _unknown_model(self, name: str) -> str:
        """Why no model `name` is served: Triton's words (which clients match), then ours."""
        name = shown(name)
        if self.repository is None:
            return (
                f"Request for unknown model: '{name}' is not found: this daemon serves no "
                "model repository; serve models by starting it with --model-repository DIR "
                "(DIR/NAME/1/model.neff, optionally DIR/NAME/config.pbtxt)"
            )
        if self.control_mode == "explicit" and is_model_dir(self.repository, name):
            return (
                f"Request for unknown model: '{name}' is not found: it is in the model "
                f"repository {self.repository} but not loaded; load it (RepositoryModelLoad, "
                f"POST /v2/repository/models/{name}/load)"
            )
        return (
            f"Request for unknown model: '{name}' is not found (model repository {self.repository})"
        )

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
                loading = self._loader.progress.get(name, {})  # an ONNX version compiling
                if model is None and not loading:
                    rows.append(RepositoryModel(name, "", ""))
                    continue
                if model is None:
                    model = ServedModel(name=name)
                states = {v: RepositoryModel(name, str(v), READY) for v in model.versions}
                for v, doing in loading.items():
                    states.setdefault(v, RepositoryModel(name, str(v), LOADING, doing))
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
        check_name(name)
        if self.repository is None and not files:
            raise not_polled(
                name,
                ServingError(
                    Status.NOT_FOUND,
                    "this daemon serves no model repository (start it with "
                    "--model-repository DIR), and the request brings no files",
                ),
            )
        self._loader.load(name, config=config, files=files or {}, request=True)

    def unload_model(self, name: str) -> None:
        self._check_explicit("unload")
        check_name(name)
        with self._lock:
            known = name in self._models
        if not known:
            if self._loader.in_repository(name):
                return  # in the repository, not loaded: nothing to unload
            raise ServingError(Status.NOT_FOUND, self._unknown_model(name))
        # a model of the repository stays in its index, UNAVAILABLE; one of a load's files
        # (not in the repository) is forgotten
        self._loader.unload(name, "unloaded", keep=self._loader.in_repository(name))

    def _check_explicit(self, what: str) -> None:
        if self.control_mode != "explicit":
            raise ServingError(
                Status.UNAVAILABLE,
                f"explicit model load / unload is not allowed unless the daemon runs with "
                f"--model-control-mode explicit (it runs with {self.control_mode}); "
                f"the {what} was not done",
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
        self._loader.poll_once()


def _number(version: str) -> int | None:
    """A request's version as a number, None when it is none (or past any version's size)."""
    if version.isdigit() and version.isascii() and len(version) <= 19:
        return int(version)
    return None
