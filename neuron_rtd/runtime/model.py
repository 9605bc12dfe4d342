"""A loaded model: its placement on NCs, its DRAM, its I/O slots, and one inference.

A model owns `ninfer` I/O slots. A slot holds one buffer per tensor that crosses a node or
stage boundary (model inputs and outputs included), in device DRAM next to the NC that
produces it (or host memory for tensors only CPU nodes touch). An inference (`Job`) takes
a free slot (none free: NERR_QUEUE_FULL) and copies its inputs in (`submit`), runs its
steps (`run`), and is answered from the slot (`outputs`, then `answered`, which gives the
slot back; `runtime/dataplane.py` holds that path): a slot
is held from the post until the answer, so `ninfer` bounds what is posted and not yet
waited for.

The pipeline: each Neuron node runs under its NC's lock and each CPU node under the host
pool's semaphore, so inferences of one model in different threads overlap stage by stage
(request 2 on NC 0 while request 1 is on NC 1), and copies in and out (in the callers'
threads) overlap with compute. Shared-NC mode runs one inference at a time. Stop and
unload cancel what has not ended at its next step boundary (NERR_INFER_CANCELLED).

A bucketed NEFF loads one `Variant` per bucket (each with its own steps and slots; slot i
of every variant belongs to the same reservation). An inference finds the sizes of its
dynamic dimensions from the input byte counts, takes the first bucket that holds them,
pads the inputs with zeros up to the bucket's sizes and cuts the outputs back down
(`runtime/shapes.py`, which also fills a slot with an inference's inputs).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from neuron_rtd.errors import (
    BadInput,
    FailedState,
    HwError,
    InferCancelled,
    InferError,
    InferTimeout,
    InvalidHandle,
    ModelNotRunning,
    Nerr,
    NrtError,
    QueueFull,
)
from neuron_rtd.neff import Neff
from neuron_rtd.runtime.compute import ComputeGate
from neuron_rtd.runtime.driver import (
    DeviceApi,
    DramBufferApi,
    driver_errors,
)
from neuron_rtd.runtime.finite import all_finite, checked_form
from neuron_rtd.runtime.host import HostPool
from neuron_rtd.runtime.job import BUSY_STATES, Job, JobState
from neuron_rtd.runtime.profile import Profiler
from neuron_rtd.runtime.sessions import NO_SESSION, SessionId
from neuron_rtd.runtime.shapes import InputShapes, cut, fill_slot, plain_outputs, variant_for
from neuron_rtd.runtime.variant import StageRun, Variant

log = logging.getLogger("nrtd.NMGR")


class ModelState(enum.Enum):
    STANDBY = "STANDBY"  # loaded, not running
    READY = "READY"  # running: takes inferences
    FAILED = "FAILED"  # stopped after an unrecoverable error
    UNLOADING = "UNLOADING"


class LoadMode(enum.Enum):
    NORMAL = "normal"
    SHARED = "shared"


@dataclass(frozen=True, kw_only=True)
class ModelParams:
    timeout_s: float
    ninfer: int
    profile: bool = False  # enable_node_profiling: record each inference's ops


class Observer(Protocol):
    """Told of each inference's end (the runtime's counters and metrics)."""

    def inference_done(self, model: LoadedModel, job: Job) -> None: ...

    def queue_drop(self, model: LoadedModel) -> None: ...

    def rejected(self, model: LoadedModel, error: NrtError) -> None: ...


# The states and codes every inference passes through, looked up once (an enum member
# named through its class costs a lookup each time).
_READY = ModelState.READY
_SHARED = LoadMode.SHARED
_QUEUED, _RUNNING, _DONE = JobState.QUEUED, JobState.RUNNING, JobState.DONE
_OK, _NUM_ERR = Nerr.OK, Nerr.INFER_COMPLETED_WITH_NUM_ERR


@dataclass
class LoadedModel:
    id: int
    name: str
    neff: Neff
    ncg_id: int
    mode: LoadMode
    params: ModelParams
    variants: list[Variant]
    dram: list[tuple[DeviceApi, DramBufferApi]]  # (device, buffer) to free on unload
    vncs: tuple[int, ...]
    session_id: SessionId = NO_SESSION
    state: ModelState = ModelState.STANDBY
    failure: str = ""
    host_pool: HostPool = field(default_factory=HostPool)
    compute_gate: ComputeGate = field(default_factory=ComputeGate)  # the runtime's
    observer: Observer | None = None
    _free: list[int] = field(default_factory=list)
    _jobs: set[Job] = field(default_factory=set)
    # Guards the slots and the jobs' states. Taken as it is (a C call each way) where no
    # one waits; `_cond` over it is for stop/unload, which wait for jobs to leave.
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _cond: threading.Condition = field(init=False, repr=False)
    _serial: threading.Lock = field(default_factory=threading.Lock)
    _workers: futures.ThreadPoolExecutor | None = None
    _draining: int = 0  # stop/unload calls waiting on `_cond`

    def __post_init__(self) -> None:
        self._cond = threading.Condition(self._lock)
        self._free = list(range(self.params.ninfer))
        self._shapes = InputShapes(self.neff.inputs, self.id, self.name)
        self._inputs = self.input_specs = self._shapes.specs
        self._float_outputs = tuple(
            t for t in self.neff.outputs if np.issubdtype(t.dtype, np.floating)
        )
        # What every inference needs, worked out once: the variant when there is only
        # one of fixed shapes, and how driver errors are named.
        fixed = len(self.variants) == 1 and not self.variants[0].bucket.symbols
        self._only = self.variants[0] if fixed else None
        # Its outputs per slot, when they are plain arrays: what `outputs` answers and
        # `_numerical_code` reads (its float ones, see `checked_form`), with no cut to
        # this inference's sizes.
        self._plain_outputs = (
            None
            if self._only is None
            else plain_outputs(self._only, [t.name for t in self.neff.outputs])
        )
        self._plain_floats = None
        if self._plain_outputs is not None:
            self._plain_floats = [
                tuple(checked_form(outputs[t.name]) for t in self._float_outputs)
                for outputs in self._plain_outputs
            ]
        self._driver_errors = driver_errors(f"model {self.id} ({self.name})")
        # Profiling is chosen once, here: a profiled model's inferences hand a recorder down
        # their steps, an unprofiled model's none (a test per step is all it costs).
        self.profiler = Profiler() if self.params.profile else None

    @property
    def dram_bytes(self) -> int:
        return sum(buf.nbytes for _, buf in self.dram)

    @property
    def host_bytes(self) -> int:
        """Host memory it holds: its NEFF and its slots' fixed-shape arrays."""
        header = self.neff.header
        arrays = sum(
            array.nbytes
            for variant in self.variants
            for slot in variant.slots
            for array in slot.values()
            if isinstance(array, np.ndarray)
        )
        return header.header_size + header.data_size + arrays

    @property
    def in_flight(self) -> int:
        """Inferences holding a slot: submitted and not yet answered."""
        return self.params.ninfer - len(self._free)

    def set_state(self, state: ModelState, failure: str = "") -> None:
        with self._lock:
            self.state = state
            self.failure = failure

    # --- inference -----------------------------------------------------------------
    def submit(self, inputs: Mapping[str, Any]) -> Job:
        """Check the inputs, take a slot (NERR_QUEUE_FULL when `ninfer` are in flight)
        and copy the inputs into it: what an inference does before it is queued.

        `inputs` maps names to bytes-like objects or `Source`s."""
        job = self._filled(inputs)
        with self._lock:
            job.state = _QUEUED
            self._wake()
        return job

    def infer(self, inputs: Mapping[str, Any]) -> Job:
        """Submit an inference and run it in this thread, to its end (the outcome in the
        job, to be answered). Nobody else takes it, so it goes from its inputs straight to
        running, never queued."""
        job = self._filled(inputs)
        self.run(job)
        return job

    def _filled(self, inputs: Mapping[str, Any]) -> Job:
        """A job with the inputs checked and copied into its slot (still SUBMITTING)."""
        if self.state is not _READY:
            self._check_runnable()
        try:
            shapes, sizes = self._shapes.check(inputs)
            variant = self._only or variant_for(
                self.variants, sizes, f"model {self.id} ({self.name})"
            )
        except BadInput as exc:
            if self.observer is not None:
                self.observer.rejected(self, exc)
            raise
        with self._lock:
            if self.state is not _READY:  # again, now that stop/unload cannot slip in
                self._check_runnable()
            if not self._free:
                if self.observer is not None:
                    self.observer.queue_drop(self)
                raise QueueFull(
                    f"model {self.id} already has {self.params.ninfer} inferences in flight "
                    f"(ninfer {self.params.ninfer})"
                )
            job = Job(variant, self._free.pop(), sizes)
            self._jobs.add(job)
        try:
            slot, raw = variant.slots[job.slot], variant.bytes[job.slot]
            fill_slot(slot, raw, self._inputs, inputs, shapes, variant.bucket.tensors)
        except BaseException:
            self.release(job)
            raise
        return job

    def post(self, inputs: Mapping[str, Any]) -> Job:
        """Submit an inference and queue it on this model's own workers (`ninfer` of
        them, so every slot can be in the pipeline at once), started in order of posting."""
        job = self.submit(inputs)
        with self._lock:
            if self._workers is None:
                self._workers = futures.ThreadPoolExecutor(
                    self.params.ninfer, thread_name_prefix=f"model-{self.id}"
                )
            workers = self._workers
        try:
            queued = workers.submit(self.run, job)
        except RuntimeError:  # shut down: the model was unloaded in the meantime
            self.release(job)
            raise InferCancelled(f"model {self.id} was unloaded") from None

        def ended(future: futures.Future[None]) -> None:
            if future.cancelled():
                self._never_ran(job)

        queued.add_done_callback(ended)
        return job

    def _never_ran(self, job: Job) -> None:
        """A queued job dropped by unload before a worker took it: it ends here, so that
        a caller waiting for it is answered now."""
        job.error = job.error or InferCancelled(f"model {self.id} was unloaded")
        self._end(job)
        job._running.release()

    def _end(self, job: Job) -> None:
        """The job has ended (its outcome set): its slot goes back now if nobody will
        answer it."""
        with self._lock:
            job.state = _DONE
            job.ended = time.monotonic()
            if job.abandoned:
                self._release_locked(job)
            self._wake()

    def run(self, job: Job) -> None:
        """Run a submitted inference to its end; the outcome is in the job (never raises)."""
        try:
            if self.mode is _SHARED:
                # shared-NC mode runs one request at a time
                self.compute_gate.take_turn(self._serial)
                try:
                    self._execute(job)
                finally:
                    self._serial.release()
            else:
                self._execute(job)
        except NrtError as exc:
            job.error = exc
        except Exception as exc:  # a bug, not the client's fault: still answer
            log.exception("inference on model %d failed", self.id, extra={"fn": "infer"})
            job.error = InferError(f"model {self.id}: internal error: {exc}")
        if isinstance(job.error, HwError):
            self._fail(job.error)
        self._end(job)
        if self.observer is not None:
            self.observer.inference_done(self, job)
        job._running.release()

    def _begin(self, job: Job) -> float:
        """The job is running from now; its deadline (monotonic seconds)."""
        with self._lock:  # stop/unload read the state under it
            job.state = _RUNNING
        job.started = time.monotonic()
        return job.started + self.params.timeout_s

    def _check_step(self, job: Job, deadline: float) -> None:
        """Before each step: a stop or unload ends the job, and so does its timeout."""
        if job.cancel is not None:
            raise job.cancel
        if time.monotonic() > deadline:
            raise InferTimeout(
                f"inference on model {self.id} ran past its timeout of {self.params.timeout_s:g} s"
            )

    def _finish(self, job: Job) -> None:
        """After the last step: its timeout checked, its numerical code set."""
        elapsed = time.monotonic() - job.started
        if elapsed > self.params.timeout_s:
            raise InferTimeout(
                f"inference on model {self.id} took {elapsed:.3f} s, past its timeout "
                f"of {self.params.timeout_s:g} s"
            )
        job.code = self._numerical_code(job)

    def _execute(self, job: Job) -> None:
        """Run the job's steps. A profiled model's inference records them: its recorder,
        handed down to the NCs, records each instruction, and the profiler keeps it if the
        inference ends well (see `runtime/profile.py`)."""
        deadline = self._begin(job)
        recorder = None if self.profiler is None else self.profiler.start()
        clock = time.perf_counter_ns
        with self._driver_errors:
            bound = job.variant.bound[job.slot]
            for step, (run, ins, outs) in zip(job.variant.steps, bound, strict=True):
                self._check_step(job, deadline)
                if type(step) is StageRun:
                    begin = clock()
                    cycles = step.run(ins, outs, recorder) or 0  # `run`, as a stage's
                    took = clock() - begin
                    job.cycles += cycles
                    job.nc_ns += took
                    if recorder is not None:
                        recorder.stage(step.node, step.stage, step.vnc, begin, took, cycles)
                elif recorder is None:
                    with self.host_pool:  # CPU nodes: at most the host pool's width at once
                        run(ins, outs)
                else:
                    with self.host_pool:
                        begin = clock()
                        run(ins, outs)
                        took = clock() - begin
                    recorder.host(
                        step.node,
                        begin,
                        took,
                        tuple(np.shape(ins[n]) for n in step.inputs),
                        tuple(np.shape(outs[n]) for n in step.outputs),
                    )
        if recorder is not None:
            recorder.end()
        self._finish(job)
        if recorder is not None:
            recorder.keep()  # it ended well: its profiler keeps what it recorded

    def _fail(self, error: NrtError) -> None:
        """An unrecoverable error: the model stops until it is started again."""
        with self._lock:
            if self.state is not ModelState.READY:
                return
            self.state = ModelState.FAILED
            self.failure = str(error)
        log.error("Model %d stopped after an unrecoverable error", self.id, extra={"fn": "infer"})

    def outputs(self, job: Job) -> dict[str, np.ndarray]:
        """Begin answering an ended job: its outputs, as views of its slot, for the
        caller to send and then call `answered(job)`. Raises the job's error instead (its
        slot given back)."""
        with self._lock:
            if job.released:
                raise job.error or InferCancelled(f"model {self.id}: the inference was dropped")
            job.answering = True
        try:
            if job.error is not None:
                raise job.error
            if job.variant is self._only and self._plain_outputs is not None:
                return dict(self._plain_outputs[job.slot])
            slot = job.variant.slots[job.slot]
            return {t.name: cut(np.asarray(slot[t.name]), t, job.sizes) for t in self.neff.outputs}
        except BaseException:
            self.answered(job)
            raise

    def answered(self, job: Job) -> None:
        """The job's outputs are sent: its slot is given back."""
        with self._lock:
            job.answering = False
            self._release_locked(job)
            self._wake()

    def release(self, job: Job) -> None:
        """Give the job's slot back now (it must not be running)."""
        with self._lock:
            self._release_locked(job)
            self._wake()

    def abandon(self, job: Job) -> None:
        """Nobody will answer `job`: give its slot back, now or when it ends."""
        with self._lock:
            if job.state is JobState.DONE:
                self._release_locked(job)
                self._wake()
            else:
                job.abandoned = True

    def _release_locked(self, job: Job) -> None:
        if not job.released:
            job.released = True
            self._jobs.discard(job)
            for buffer, empty in job.variant.dynamic[job.slot]:  # its arrays let go: a
                buffer.value = empty  # free input's may be as large as a request
            self._free.append(job.slot)

    def _wake(self) -> None:
        """Wake stop/unload waiting for jobs to leave the slots (called under `_lock`);
        nobody else waits on it, so an inference with no stop pending skips the call."""
        if self._draining:
            self._cond.notify_all()

    def cancel(self, why: str) -> int:
        """End every inference not yet ended with NERR_INFER_CANCELLED (at its next step
        boundary) and wait until none is running; the number cancelled."""
        with self._cond:
            self._draining += 1
            pending = [j for j in self._jobs if j.state is not JobState.DONE]
            for job in pending:
                job.cancel = InferCancelled(f"model {self.id}: inference cancelled: {why}")
            self._cond.wait_for(
                lambda: all(j.state is not JobState.RUNNING for j in pending),
                timeout=self.params.timeout_s + 1,
            )
            self._draining -= 1
        return len(pending)

    def drop_all(self, why: str, timeout_s: float) -> bool:
        """Cancel what runs, wait until nothing runs or is being answered, and give every
        slot back (unload). False if something was still busy at `timeout_s`."""
        self.cancel(why)
        with self._cond:
            self._draining += 1
            idle = self._cond.wait_for(
                lambda: not any(j.answering or j.state in BUSY_STATES for j in self._jobs),
                timeout=timeout_s,
            )
            self._draining -= 1
            for job in list(self._jobs):
                if job.state is JobState.DONE or job.cancel is not None:
                    job.error = job.error or InferCancelled(
                        f"model {self.id}: inference cancelled: {why}"
                    )
                self._release_locked(job)
            workers, self._workers = self._workers, None
        if workers is not None:  # what is still queued there ends at once, cancelled
            workers.shutdown(wait=False, cancel_futures=True)
        return idle

    # --- inputs and outputs ----------------------------------------------------------
    def _numerical_code(self, job: Job) -> Nerr:
        values: Sequence[np.ndarray | memoryview[float]]
        if job.variant is self._only and self._plain_floats is not None:
            values = self._plain_floats[job.slot]
        else:
            slot = job.variant.slots[job.slot]
            values = [cut(np.asarray(slot[t.name]), t, job.sizes) for t in self._float_outputs]
        return _OK if all_finite(*values) else _NUM_ERR

    def _check_runnable(self) -> None:
        if self.state is ModelState.READY:
            return
        if self.state is ModelState.FAILED:
            raise FailedState(f"model {self.id} was stopped after an error: {self.failure}")
        if self.state is ModelState.UNLOADING:
            raise InvalidHandle(f"model {self.id} is being unloaded")
        raise ModelNotRunning(
            f"model {self.id} ({self.name}) is not running (state {self.state.value}): "
            "start it first"
        )
