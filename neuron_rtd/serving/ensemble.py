"""An ensemble served (`platform: "ensemble"`): a model with no file of its own, whose
request runs its steps, each a request to a composing model of the serving core through
that model's own infer path (`ServedVersion.infer`: its checks, its copies, its dynamic
batcher, its statistics), as Triton's ensemble scheduler does.

A step runs as soon as every tensor it reads is there: the request's inputs, or the
outputs of the steps before it. Steps ready together run at once: all but one are handed
to the step pool's threads, the last runs on the request's own thread (a chain of steps
runs wholly there, no thread between them). A request's thread waiting for its steps runs
any of them no pool thread has taken yet, so nested ensembles never wait on a full pool.
The tensors between steps are the arrays a step answered, handed to the next as its
inputs: they never leave the process. The request is answered with the ensemble outputs
it asked for; a step's error ends it, its model named.

Each composing model is looked up when its step runs (-1: its newest ready version), so
a composing model reloaded serves the next request. An ensemble is checked against its
composing models when it is loaded, and again whenever one of them is (un)loaded
(`neuron_rtd/serving/loading.py`): READY only while they are there and fit.

Statistics (`neuron_rtd/serving/stats.py`): each step is a request of its composing
model, counted there; the ensemble counts each request once, as one execution whose
compute times are its steps' summed, as Triton reports them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Protocol

import numpy as np

from neuron_rtd.errors import Nerr
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import ComputeGate
from neuron_rtd.serving.api import InferRequest, InferResponse, ServingError, Status, TensorMeta
from neuron_rtd.serving.batcher import batch_rows, same_batch
from neuron_rtd.serving.classification import Labels
from neuron_rtd.serving.datatypes import datatype_of, datatype_of_config, dtype_of
from neuron_rtd.serving.ensemble_config import (
    EnsembleStep,
    Plan,
    check_ensemble_fields,
    check_steps,
    complete_ensemble,
)
from neuron_rtd.serving.served import check_shape, wanted_outputs
from neuron_rtd.serving.stats import STEPS, VersionStats

log = logging.getLogger("nrtd.KSERVE")

ModelConfig = model_config_pb.ModelConfig

STEP_THREADS = 16  # the step pool's threads, at most (each started when first needed)
THREAD_PREFIX = "neuron-ensemble"


class Version(Protocol):
    """A served version as an ensemble's step calls it (`ServedVersion`, or an ensemble)."""

    @property
    def config(self) -> ModelConfig: ...

    def infer(self, request: InferRequest, began_ns: int) -> InferResponse: ...


class Held(Protocol):
    """A model as the serving core holds it (`loading.ServedModel`)."""

    @property
    def versions(self) -> Mapping[int, Version]: ...

    @property
    def failed(self) -> Mapping[int, str]: ...

    @property
    def reason(self) -> str: ...


def composing(models: Mapping[str, Held], name: str, version: int, ensemble: str) -> Version:
    """Version `version` (-1: the newest ready) of model `name`, a step of `ensemble`, or
    UNAVAILABLE saying, in Triton's words, why it is not there."""
    model = models.get(name)
    if model is not None and model.versions:
        versions = model.versions
        served = versions[max(versions)] if version < 0 else versions.get(version)
        if served is not None:
            return served
        ready = ", ".join(str(v) for v in sorted(versions))
        raise ServingError(
            Status.UNAVAILABLE,
            f"ensemble '{ensemble}' depends on '{name}' whose required version {version} is "
            f"not loaded (ready versions: {ready})",
        )
    if model is None:
        raise ServingError(
            Status.UNAVAILABLE,
            f"ensemble {ensemble} contains models that are not available or ambiguous: "
            f"{name} (no model '{name}' is served: put it in the model repository, or load "
            "it before the ensemble)",
        )
    said = f"ensemble '{ensemble}' depends on '{name}' which has no loaded version"
    if model.failed:
        errors = "; ".join(why for _, why in sorted(model.failed.items()))
        said += f". Model '{name}' loading failed with error: {errors}"
    else:
        said += f" ({model.reason or 'not loaded'})"
    raise ServingError(Status.UNAVAILABLE, said)


class StepPool:
    """The threads steps run on besides their request's own (`STEP_THREADS` at most,
    started as needed, shared by every ensemble of a serving core)."""

    def __init__(self, workers: int = STEP_THREADS) -> None:
        self._workers = workers
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def submit(self, work: Callable[[], None]) -> bool:
        """Run `work` on a pool thread; False once the pool is closed."""
        with self._lock:
            if self._closed:
                return False
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, THREAD_PREFIX)
            self._executor.submit(work)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


class _StepRun:
    """One step of one request: run once, by whichever thread claims it first (a pool
    thread, or the request's own while it waits), then put on its request's `done`."""

    __slots__ = ("_call", "_claim", "_done", "code", "compute", "error", "outputs", "sent", "step")

    def __init__(
        self,
        step: EnsembleStep,
        sent: InferRequest,
        call: Callable[[EnsembleStep, InferRequest], InferResponse],
        done: SimpleQueue[_StepRun],
    ) -> None:
        self.step = step
        self.sent = sent  # its request to its composing model, made when it was ready
        self._call = call
        self._done = done
        self._claim = threading.Lock()
        self.compute = [0] * 6  # the step's compute times (`STEPS.tally`)
        self.outputs: Mapping[str, np.ndarray] = {}
        self.code = Nerr.OK
        self.error: ServingError | None = None

    def claim(self) -> bool:
        return self._claim.acquire(blocking=False)

    def skip(self) -> None:
        """Not run: its request failed before it started (claimed first)."""
        self.error = ServingError(Status.UNAVAILABLE, "not run: another step failed")
        self._done.put(self)

    def run(self) -> None:
        previous = STEPS.tally
        STEPS.tally = self.compute
        try:
            response = self._call(self.step, self.sent)
            self.outputs, self.code = response.outputs, response.code
        except ServingError as exc:
            self.error = exc
        except Exception as exc:  # one step's surprise is its request's error, no more
            log.exception("Ensemble %s failed unexpectedly", self.step.what, extra={"fn": "infer"})
            self.error = ServingError(Status.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            STEPS.tally = previous
            self._done.put(self)


class EnsembleVersion:
    """A version of an ensemble: `config` (completed), its `plan`, and the models it
    composes looked up in `models` (the serving core's table) as its steps run."""

    model_ids: tuple[int, ...] = ()  # it loads nothing on the runtime
    batcher = None

    def __init__(
        self,
        name: str,
        version: int,
        config: ModelConfig,
        plan: Plan,
        models: Mapping[str, Held],
        pool: StepPool,
        gate: ComputeGate,
    ) -> None:
        self.name = name
        self.version = version
        self.version_text = str(version)
        self.config = config
        self.plan = plan
        self.stats = VersionStats(name, self.version_text)
        self.max_batch_size = config.max_batch_size
        self.labels: Labels = {}  # classification labels: its composing models' own
        self.model = f"ensemble '{name}'"
        self._models = models
        self._pool = pool
        self._gate = gate
        self._inputs, self._outputs = self.tensors()
        self._dtypes = {t.name: dtype_of(t.datatype) for t in self._inputs}
        self._output_names = tuple(t.name for t in self._outputs)

    def check(self) -> None:
        """Check it against its composing models as they are now (ServingError if not)."""
        models, name = self._models, self.name

        def lookup(model: str, version: int) -> ModelConfig:
            return composing(models, model, version, name).config

        check_steps(self.config, self.plan, name, lookup)

    def pending(self) -> int:
        """None of its own: an ensemble's requests wait in its steps' models, counted
        there (Triton's pending count of an ensemble is its steps')."""
        return 0

    def tensors(self) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...]]:
        batch = (-1,) if self.config.max_batch_size > 0 else ()
        inputs = tuple(
            TensorMeta(e.name, datatype_of_config(e.data_type), (*batch, *e.dims))
            for e in self.config.input
        )
        outputs = tuple(
            TensorMeta(e.name, datatype_of_config(e.data_type), (*batch, *e.dims))
            for e in self.config.output
        )
        return inputs, outputs

    def close(self) -> list[str]:
        return []  # nothing of its own on the runtime

    # --- a request ------------------------------------------------------------------------
    def infer(self, request: InferRequest, began_ns: int) -> InferResponse:
        """Check `request` against the ensemble's inputs, run its steps, and answer with
        the outputs it asked for; counted in the ensemble's statistics."""
        try:
            batch = self._check(request)
            wanted = self._wanted(request.outputs)
            steps = [0] * 6
            queue_ns = time.perf_counter_ns() - began_ns
            tensors, code = self._run(request, steps)
        except ServingError:
            self.stats.request_failed(time.perf_counter_ns() - began_ns)
            raise
        outputs = {name: tensors[name] for name in wanted}
        self.stats.ensemble_ran(time.perf_counter_ns() - began_ns, batch, queue_ns, steps)
        return InferResponse(self.name, self.version_text, request.id, outputs, code)

    def _run(self, request: InferRequest, steps: list[int]) -> tuple[dict[str, np.ndarray], Nerr]:
        """Every step, each once the tensors it reads are there; the ensemble's tensors
        then, and the first step code that is not OK. Its steps' compute times are added
        to `steps`. A step's error is raised once the steps under way have ended."""
        plan = self.plan
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        waits = list(plan.waits)
        ready = list(reversed(plan.first))  # pop() takes the first step first
        done: SimpleQueue[_StepRun] = SimpleQueue()
        handed: list[_StepRun] = []  # to the pool
        pending = 0
        error: ServingError | None = None
        code = Nerr.OK

        def ready_step() -> _StepRun:
            step = plan.steps[ready.pop()]
            return _StepRun(step, self._request(step, tensors, request), self._call, done)

        while True:
            if error is None and ready:
                while len(ready) > 1:
                    task = ready_step()
                    pending += 1
                    if self._pool.submit(functools.partial(self._from_pool, task)):
                        handed.append(task)
                    elif task.claim():
                        task.run()
                task = ready_step()
                pending += 1
                task.claim()
                task.run()
            if not pending:
                break
            finished = self._next_done(done, handed, failed=error is not None)
            pending -= 1
            if finished.error is not None:
                error = error or self._step_error(finished.step, finished.error)
                continue
            for at in range(6):
                steps[at] += finished.compute[at]
            if code == Nerr.OK:
                code = finished.code
            for key, tensor in finished.step.outputs:
                tensors[tensor] = finished.outputs[key]
                for reader in plan.readers.get(tensor, ()):
                    waits[reader] -= 1
                    if not waits[reader]:
                        ready.append(reader)
        if error is not None:
            raise error
        return tensors, code

    @staticmethod
    def _request(
        step: EnsembleStep, tensors: Mapping[str, np.ndarray], request: InferRequest
    ) -> InferRequest:
        """Step `step`'s request to its composing model, of the tensors it reads."""
        return InferRequest(
            step.model,
            {key: tensors[tensor] for key, tensor in step.inputs},
            version=step.version_text,
            outputs=[key for key, _ in step.outputs],
            id=request.id,
            parameters=request.parameters,
        )

    def _call(self, step: EnsembleStep, sent: InferRequest) -> InferResponse:
        """Step `step`'s request `sent`, through its composing model's own infer path."""
        served = composing(self._models, step.model, step.version, self.name)
        return served.infer(sent, time.perf_counter_ns())

    def _from_pool(self, task: _StepRun) -> None:
        if task.claim():  # else the request's own thread took it meanwhile
            with self._gate.turn():
                task.run()

    def _next_done(
        self, done: SimpleQueue[_StepRun], handed: Sequence[_StepRun], failed: bool
    ) -> _StepRun:
        """A finished step: one already done, else one of those handed to the pool that
        no pool thread has taken yet, run here (or, once a step `failed`, not run at
        all), else the next to finish, awaited."""
        try:
            return done.get_nowait()
        except Empty:
            pass
        for task in handed:
            if task.claim():
                if failed:
                    task.skip()
                else:
                    task.run()
                return done.get()
        with self._gate.waiting():
            return done.get()

    def _step_error(self, step: EnsembleStep, error: ServingError) -> ServingError:
        status = Status.UNAVAILABLE if error.status == Status.NOT_FOUND else error.status
        return ServingError(status, f"in ensemble '{self.name}', {step.what}: {error.message}")

    # --- the request's checks --------------------------------------------------------------
    def _check(self, request: InferRequest) -> int:
        """The request's batch size (1 for an ensemble that does not batch), once its
        inputs are the ensemble's, of its datatypes and shapes."""
        given = request.inputs
        if given.keys() != self._dtypes.keys():
            unknown = [name for name in given if name not in self._dtypes]
            missing = [t.name for t in self._inputs if t.name not in given]
            said = (
                f"has no input named '{unknown[0]}'"
                if unknown
                else "needs input(s) the request lacks: " + ", ".join(f"'{n}'" for n in missing)
            )
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"{self.model} {said}; its inputs: "
                + ", ".join(f"'{t.name}' ({t.datatype} {_shape(t.shape)})" for t in self._inputs),
            )
        batched = self.config.max_batch_size > 0
        batch, first = 1, ""
        for spec in self._inputs:
            name, expected = spec.name, spec.shape
            array = given[name]
            if array.dtype != self._dtypes[name] and datatype_of(array.dtype) != spec.datatype:
                raise ServingError(
                    Status.INVALID_ARGUMENT,
                    f"input '{name}' has datatype {datatype_of(array.dtype)}; {self.model} "
                    f"takes {spec.datatype}",
                )
            shape = array.shape
            check_shape(name, shape, expected, self.model, self.config.max_batch_size)
            if batched:
                rows = batch_rows(name, shape, self.model, self.config.max_batch_size)
                batch, first = same_batch(name, rows, first, batch)
        return batch

    def _wanted(self, outputs: Sequence[str] | None) -> Sequence[str]:
        names = self._output_names
        return wanted_outputs(outputs, names, frozenset(names), self.model)


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def load_ensemble(
    name: str,
    version: int,
    user: ModelConfig,
    source: str,
    models: Mapping[str, Held],
    pool: StepPool,
    gate: ComputeGate,
) -> EnsembleVersion:
    """Version `version` of ensemble `name` from its config `user` (checked, then
    completed), checked against its composing models in `models`; ServingError saying
    why not."""
    plan = check_ensemble_fields(user, name, source)
    config = complete_ensemble(user, name)
    ensemble = EnsembleVersion(name, version, config, plan, models, pool, gate)
    ensemble.check()
    return ensemble
