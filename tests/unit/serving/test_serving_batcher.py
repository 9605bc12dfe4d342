"""The dynamic batcher (`neuron_rtd/serving/batcher.py`) in process, with a fake model.

No assertion here depends on timing: tests count executions and check results; the only
waits are generous deadlines for things that must happen, and the order of events is set
with events and barriers, not sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
from waiting import wait_until

from neuron_rtd.errors import Nerr
from neuron_rtd.runtime import InferResult
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.batcher import THREAD_PREFIX, Batched, Batcher

WAIT = 30.0  # seconds: a deadline for what must happen, never reached when all is well
FOREVER_US = 600_000_000  # a queue delay no test waits out


@dataclass
class Execution:
    copy: int
    rows: int
    signature: tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass
class FakeModel:
    """A model of two inputs and two outputs, computed row by row: y = x * 2 + 1 and
    s = the sum of each row of x plus w. Records every execution; an execution whose `x`
    holds `poison` raises; one holding `hold` waits for `release` first."""

    executions: list[Execution] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    barrier: threading.Barrier | None = None
    poison: float = -1.0
    hold: float = -2.0

    def __call__(self, copy: int, inputs: dict[str, np.ndarray]) -> InferResult:
        x = inputs["x"]
        signature = tuple(
            sorted((name, array.dtype.str, array.shape[1:]) for name, array in inputs.items())
        )
        with self.lock:
            self.executions.append(Execution(copy, x.shape[0], signature))
        if (x == self.hold).any():
            self.started.set()
            assert self.release.wait(WAIT)
        if self.barrier is not None:
            self.barrier.wait(WAIT)
        if (x == self.poison).any():
            raise ValueError("poisoned row")
        return InferResult(expected(inputs), Nerr.OK)

    def rows(self) -> list[int]:
        with self.lock:
            return [execution.rows for execution in self.executions]


def expected(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["x"]
    total = x.reshape(x.shape[0], -1).sum(axis=1)
    if "w" in inputs:
        total = total + inputs["w"].reshape(x.shape[0], -1).sum(axis=1)
    return {"y": x * 2 + 1, "s": total}


def request(value: float, rows: int = 1, width: int = 2) -> dict[str, np.ndarray]:
    x = np.full((rows, width), value, dtype=np.float32)
    x[:, 0] += np.arange(rows, dtype=np.float32) / 8  # rows of one request differ too
    return {"x": x, "w": np.full((rows, 1), value * 10, dtype=np.float32)}


def assert_answer(batched: Batched, inputs: Mapping[str, np.ndarray]) -> None:
    want = expected(inputs)
    assert batched.outputs.keys() == want.keys()
    for name, array in want.items():
        np.testing.assert_array_equal(batched.outputs[name], array)
    assert batched.queue_ns >= 0
    assert batched.batch_size >= inputs["x"].shape[0]


class Submitter:
    """Submits requests from threads of its own; collects answers and errors."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.threads: list[threading.Thread] = []
        self.answers: dict[int, Batched] = {}
        self.errors: dict[int, BaseException] = {}
        self.inputs: dict[int, dict[str, np.ndarray]] = {}

    def start(
        self, key: int, inputs: dict[str, np.ndarray], gate: threading.Barrier | None = None
    ) -> None:
        self.inputs[key] = inputs

        def run() -> None:
            if gate is not None:
                gate.wait(WAIT)
            try:
                self.answers[key] = self.batcher.submit(inputs)
            except BaseException as error:
                self.errors[key] = error

        thread = threading.Thread(target=run, name=f"test-submit-{key}")
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(WAIT)
            assert not thread.is_alive(), "a submit never returned"

    def check_answers(self) -> None:
        assert not self.errors
        for key, inputs in self.inputs.items():
            assert_answer(self.answers[key], inputs)


def wait_pending(batcher: Batcher, count: int) -> None:
    wait_until(lambda: batcher.pending == count, WAIT, f"{count} requests pending")


def batcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture
def model() -> Iterator[FakeModel]:
    model = FakeModel()
    yield model
    model.release.set()  # never leave a held execution behind


@pytest.fixture
def make(model: FakeModel) -> Iterator[Callable[..., Batcher]]:
    made: list[Batcher] = []

    def make(**options: object) -> Batcher:
        settings: dict = {"copies": 1, "max_batch_size": 8, "name": "fake"}
        settings.update(options)
        batcher = Batcher(model, **settings)
        made.append(batcher)
        return batcher

    yield make
    model.release.set()
    for batcher in made:
        batcher.close()
    assert not batcher_threads()


def hold_copy(batcher: Batcher, model: FakeModel, submitter: Submitter, rows: int = 1) -> None:
    """Occupy the (one) copy with an execution that waits for `model.release`."""
    submitter.start(-1, request(model.hold, rows))
    assert model.started.wait(WAIT)


def test_concurrent_requests_merge_and_get_their_own_rows(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=8, max_queue_delay_us=FOREVER_US)
    submitter = Submitter(batcher)
    gate = threading.Barrier(8)
    for key in range(8):
        submitter.start(key, request(float(key)), gate)
    submitter.join()  # 8 rows make max_batch_size: no waiting out the delay
    submitter.check_answers()
    assert model.rows() == [8]
    assert all(answer.batch_size == 8 for answer in submitter.answers.values())


def test_delay_merges_requests_arriving_apart(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=64, max_queue_delay_us=200_000)
    submitter = Submitter(batcher)
    gate = threading.Barrier(8)
    for key in range(8):
        submitter.start(key, request(float(key)), gate)
    submitter.join()
    submitter.check_answers()
    assert sum(model.rows()) == 8
    assert len(model.rows()) < 8


def test_max_batch_size_is_never_exceeded(make: Callable[..., Batcher], model: FakeModel) -> None:
    batcher = make(max_batch_size=3, max_queue_delay_us=20_000)
    submitter = Submitter(batcher)
    sizes = [1, 2, 1, 3, 2, 1, 1, 2, 1, 1]
    gate = threading.Barrier(len(sizes))
    for key, rows in enumerate(sizes):
        submitter.start(key, request(float(key), rows), gate)
    submitter.join()
    submitter.check_answers()
    assert sum(model.rows()) == sum(sizes)
    assert max(model.rows()) <= 3
    assert len(model.rows()) < len(sizes)


def test_queued_requests_merge_with_no_delay(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=4)
    submitter = Submitter(batcher)
    hold_copy(batcher, model, submitter)
    for key in range(6):
        submitter.start(key, request(float(key)))
    wait_pending(batcher, 6)
    model.release.set()
    submitter.join()
    submitter.check_answers()
    # the holder alone, then what was queued, in arrival order, 4 rows at most a time
    assert model.rows() == [1, 4, 2]


def test_a_preferred_batch_size_runs_at_once(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=8, preferred_batch_sizes=[4], max_queue_delay_us=FOREVER_US)
    submitter = Submitter(batcher)
    for key in range(4):
        submitter.start(key, request(float(key)))
    submitter.join()  # no waiting out the delay: 4 queued rows are a preferred size
    submitter.check_answers()
    assert model.rows() == [4]


def test_the_largest_preferred_size_reached_runs_first(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=8, preferred_batch_sizes=[2, 4], max_queue_delay_us=FOREVER_US)
    submitter = Submitter(batcher)
    hold_copy(batcher, model, submitter, rows=4)  # 4 rows: a preferred size, runs at once
    for key in range(5):
        submitter.start(key, request(float(key)))
        wait_pending(batcher, key + 1)  # in this order
    model.release.set()
    # of 5 queued rows, 4 (the largest preferred size reached: 2 is one too) run at once;
    # the fifth waits for more
    wait_until(
        lambda: len(model.rows()) == 2 and batcher.pending == 1, WAIT, "2 rows running, 1 pending"
    )
    submitter.start(5, request(5.0, rows=3))  # 1 + 3 rows: a preferred size again
    submitter.join()
    submitter.check_answers()
    assert model.rows() == [4, 4, 4]
    assert [submitter.answers[key].batch_size for key in range(6)] == [4] * 6


def test_different_signatures_never_merge(make: Callable[..., Batcher], model: FakeModel) -> None:
    batcher = make(max_batch_size=16)
    submitter = Submitter(batcher)
    hold_copy(batcher, model, submitter)
    wide = request(1.0, width=3)
    as_int = {"x": np.full((1, 2), 5, dtype=np.int64), "w": np.full((1, 1), 7, dtype=np.int64)}
    x_only = {"x": np.full((2, 2), 3.0, dtype=np.float32)}
    kinds = [request(0.0), wide, request(2.0, rows=2), as_int, x_only, request(4.0), wide]
    for key, inputs in enumerate(kinds):
        submitter.start(key, inputs)
        wait_pending(batcher, key + 1)
    model.release.set()
    submitter.join()
    submitter.check_answers()
    executions = model.executions[1:]
    # one execution per signature, everything of a signature merged: 4 + 2 + 1 + 2 rows
    assert sorted(execution.rows for execution in executions) == [1, 2, 2, 4]
    assert len({execution.signature for execution in executions}) == len(executions)
    assert submitter.answers[0].batch_size == 4
    assert submitter.answers[1].batch_size == 2


def test_an_error_reaches_every_request_of_its_batch(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=8)
    submitter = Submitter(batcher)
    hold_copy(batcher, model, submitter)
    for key, value in enumerate([1.0, model.poison, 3.0]):
        submitter.start(key, request(value))
    wait_pending(batcher, 3)
    model.release.set()
    submitter.join()
    assert model.rows() == [1, 3]
    errors = [submitter.errors[key] for key in range(3)]
    assert isinstance(errors[0], ValueError)
    assert all(error is errors[0] for error in errors)
    assert -1 in submitter.answers  # the holder ran apart, and fine
    # the worker goes on
    later = Submitter(batcher)
    hold_copy(batcher, model, later)  # model.release is set: it runs straight through
    for key in range(3):
        later.start(key, request(float(key)))
    later.join()
    later.check_answers()


def test_an_error_on_the_fast_path_reaches_its_request(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make()
    with pytest.raises(ValueError, match="poisoned"):
        batcher.submit(request(model.poison))
    assert_answer(batcher.submit(request(2.0)), request(2.0))


def test_a_lone_request_runs_alone(make: Callable[..., Batcher], model: FakeModel) -> None:
    batcher = make(max_batch_size=8)
    inputs = request(3.0, rows=3)
    answer = batcher.submit(inputs)
    assert_answer(answer, inputs)
    assert answer.batch_size == 3
    assert model.rows() == [3]


def test_close_fails_queued_requests_at_once(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    batcher = make(max_batch_size=8, max_queue_delay_us=FOREVER_US)
    submitter = Submitter(batcher)
    hold_copy(batcher, model, submitter, rows=8)  # a full batch: runs at once
    for key in range(3):
        submitter.start(key, request(float(key)))
    wait_pending(batcher, 3)
    closer = threading.Thread(target=batcher.close, name="test-close")
    closer.start()
    for thread in submitter.threads[1:]:  # the queued ones end while the holder still runs
        thread.join(WAIT)
        assert not thread.is_alive()
    assert not model.release.is_set()
    for key in range(3):
        error = submitter.errors[key]
        assert isinstance(error, ServingError)
        assert error.status is Status.UNAVAILABLE
        assert "model fake is being unloaded" in error.message
    model.release.set()  # close waits for the execution under way, which ends well
    closer.join(WAIT)
    assert not closer.is_alive()
    submitter.join()
    assert submitter.answers[-1].batch_size == 8
    assert model.rows() == [8]
    assert not batcher_threads()
    with pytest.raises(ServingError) as refused:
        batcher.submit(request(1.0))
    assert refused.value.status is Status.UNAVAILABLE
    batcher.close()  # again: nothing to do


def test_close_ends_idle_workers(make: Callable[..., Batcher]) -> None:
    batcher = make(copies=3, max_queue_delay_us=FOREVER_US)
    assert len(batcher_threads()) == 3
    batcher.close()
    assert not batcher_threads()
    batcher.close()


def test_copies_run_executions_in_parallel(make: Callable[..., Batcher], model: FakeModel) -> None:
    # each execution waits at a barrier of two: the test only passes if two run at once
    model.barrier = threading.Barrier(2)
    batcher = make(copies=2, max_batch_size=2, max_queue_delay_us=FOREVER_US)
    submitter = Submitter(batcher)
    for key in range(4):
        submitter.start(key, request(float(key)))
    submitter.join()
    submitter.check_answers()
    assert model.rows() == [2, 2]
    assert sorted(execution.copy for execution in model.executions) == [0, 1]


def test_copies_run_lone_requests_in_parallel(
    make: Callable[..., Batcher], model: FakeModel
) -> None:
    model.barrier = threading.Barrier(2)
    batcher = make(copies=2, max_batch_size=1)
    submitter = Submitter(batcher)
    for key in range(6):
        submitter.start(key, request(float(key)))
    submitter.join()
    submitter.check_answers()
    assert model.rows() == [1] * 6
    assert {execution.copy for execution in model.executions} == {0, 1}


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        (request(1.0, rows=9), ["batch size 9", "max_batch_size 8"]),
        ({"x": np.zeros((0, 2), dtype=np.float32)}, ["batch size 0", "'x'"]),
        ({"x": np.zeros((2, 2)), "w": np.zeros((3, 1))}, ["'w' has batch size 3", "'x' 2"]),
        ({"x": np.ones(())}, ["'x' is a scalar"]),
        ({}, ["no inputs"]),
    ],
)
def test_bad_requests_are_refused(
    make: Callable[..., Batcher], model: FakeModel, inputs: dict[str, np.ndarray], words: list[str]
) -> None:
    batcher = make(max_batch_size=8)
    with pytest.raises(ServingError) as refused:
        batcher.submit(inputs)
    assert refused.value.status is Status.INVALID_ARGUMENT
    for word in words:
        assert word in refused.value.message
    assert model.rows() == []


def test_outputs_of_the_wrong_rows_are_an_internal_error(make: Callable[..., Batcher]) -> None:
    def short(copy: int, inputs: dict[str, np.ndarray]) -> InferResult:
        return InferResult({"y": inputs["x"][:1]}, Nerr.OK)

    batcher = Batcher(short, copies=1, max_batch_size=4, name="short")
    try:
        with pytest.raises(ServingError) as refused:
            batcher.submit(request(1.0, rows=2))
        assert refused.value.status is Status.INTERNAL
        assert "'y'" in refused.value.message
    finally:
        batcher.close()


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"copies": 0}, "instance_group count"),
        ({"max_batch_size": 0}, "max_batch_size 0"),
        ({"preferred_batch_sizes": [16]}, "preferred_batch_size 16"),
        ({"preferred_batch_sizes": [0]}, "preferred_batch_size 0"),
        ({"max_queue_delay_us": -1}, "max_queue_delay_microseconds"),
    ],
)
def test_bad_settings_are_refused(model: FakeModel, options: dict, word: str) -> None:
    settings: dict = {"copies": 1, "max_batch_size": 8}
    settings.update(options)
    with pytest.raises(ServingError) as refused:
        Batcher(model, **settings)
    assert refused.value.status is Status.INVALID_ARGUMENT
    assert word in refused.value.message
    assert not batcher_threads()


def test_idle_workers_use_no_cpu(make: Callable[..., Batcher], model: FakeModel) -> None:
    batcher = make(copies=2, max_batch_size=8, max_queue_delay_us=1_000)
    batcher.submit(request(1.0))
    ids = {thread.native_id for thread in batcher_threads()}
    assert len(ids) == 2

    def cpu() -> float:
        return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)

    before = cpu()
    time.sleep(0.5)
    # a polling worker would burn a good share of the half second; sleeping ones none
    assert cpu() - before < 0.05
