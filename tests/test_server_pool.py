"""The gRPC server's call pool (`neuron_rtd/server/pool.py`): calls run and answer, at
most `running` compute at once, calls that block (or say they wait, or wait their turn
at a busy NC: `driver_sim.turns`) let waiting ones start, threads beyond that end when
idle (also while calls keep coming), and shutdown refuses new calls."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import pytest

from driver_sim import turns
from neuron_rtd.server import pool as pool_module
from neuron_rtd.server.pool import CallPool, server_pool, waiting

WAIT_S = 10.0  # a bound on what must happen at once, on a loaded machine


def _threads(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


def _threads_become(
    prefix: str, count: int, tick: Callable[[], object] = lambda: time.sleep(0.01)
) -> int:
    """The count of threads named `prefix...` once it is `count`, else after WAIT_S;
    `tick()` runs between two looks."""
    deadline = time.monotonic() + WAIT_S
    while _threads(prefix) != count and time.monotonic() < deadline:
        tick()
    return _threads(prefix)


def test_calls_answer_their_results_and_exceptions() -> None:
    pool = CallPool(2, 4, name="answers")
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(WAIT_S) == 5

    def fail() -> None:
        raise KeyError("no such model")

    with pytest.raises(KeyError, match="no such model"):
        pool.submit(fail).result(WAIT_S)
    assert pool.submit(str, 7).result(WAIT_S) == "7"  # the pool goes on after a failure
    pool.shutdown()


def test_at_most_running_calls_compute_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "BLOCKED_AFTER_S", 60.0)  # no call counts as blocked
    pool = CallPool(2, 8, name="bounded")
    lock = threading.Lock()
    now = [0]
    most = [0]

    def call() -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.01)
        with lock:
            now[0] -= 1

    done = [pool.submit(call) for _ in range(12)]
    futures.wait(done, timeout=WAIT_S)
    assert all(f.done() and f.exception() is None for f in done)
    assert most[0] == 2
    pool.shutdown()


def test_calls_that_block_let_waiting_calls_start() -> None:
    pool = CallPool(1, 4, name="blocking")
    release = threading.Event()
    blocked = [pool.submit(release.wait, WAIT_S) for _ in range(2)]
    quick = pool.submit(lambda: "answered")
    # the blocked calls hold their threads; the third starts once they count as blocked
    assert quick.result(WAIT_S) == "answered"
    assert not any(f.done() for f in blocked)
    release.set()
    assert all(f.result(WAIT_S) for f in blocked)
    pool.shutdown()


def _grown(pool: CallPool, prefix: str) -> None:
    """`pool` (running 1) grown to 3 threads by 3 calls that block, and those calls ended."""
    release = threading.Event()
    blocked = [pool.submit(release.wait, WAIT_S) for _ in range(3)]
    assert _threads_become(prefix, 3) == 3
    release.set()
    assert all(f.result(WAIT_S) for f in blocked)


def test_threads_beyond_the_running_calls_end_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "IDLE_EXIT_S", 0.05)
    pool = CallPool(1, 4, name="idlers")
    _grown(pool, "idlers_")
    assert _threads_become("idlers_", 1) == 1  # the one that may always run stays
    assert pool.submit(lambda: 1).result(WAIT_S) == 1
    pool.shutdown()


def test_threads_beyond_the_running_calls_end_under_steady_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "IDLE_EXIT_S", 0.3)
    pool = CallPool(1, 4, name="steady")
    _grown(pool, "steady_")

    def call_and_pause() -> None:  # a call every 20 ms
        assert pool.submit(lambda: "served").result(WAIT_S) == "served"
        time.sleep(0.02)

    # the newest idle thread takes each call, the others end when idle
    assert _threads_become("steady_", 1, call_and_pause) == 1
    pool.shutdown()


def test_shutdown_refuses_new_calls_and_can_cancel_waiting_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "BLOCKED_AFTER_S", 60.0)
    pool = CallPool(1, 2, name="closing")
    release, started = threading.Event(), threading.Event()

    def call() -> bool:
        started.set()
        return release.wait(WAIT_S)

    running = pool.submit(call)
    assert started.wait(WAIT_S)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    release.set()
    assert running.result(WAIT_S) is True
    assert _threads_become("closing_", 0) == 0


def test_a_call_that_says_it_waits_lets_a_waiting_call_start_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "BLOCKED_AFTER_S", 60.0)  # no call counts as blocked
    pool = CallPool(1, 4, name="waits")
    release, waits, computes = threading.Event(), threading.Event(), threading.Event()

    def call() -> str:
        with waiting():
            waits.set()
            release.wait(3 * WAIT_S)  # longer than the next call is given to answer
        computes.set()
        return "waited"

    first = pool.submit(call)
    assert waits.wait(WAIT_S)
    # the only call that may compute is waiting: the next one starts
    try:
        assert pool.submit(lambda: "answered").result(WAIT_S) == "answered"
    finally:
        release.set()
    assert first.result(WAIT_S) == "waited" and computes.is_set()
    # and once it computes again it counts: a call it holds up waits for it
    hold = threading.Event()
    holding = pool.submit(hold.wait, WAIT_S)
    queued = pool.submit(lambda: "after")
    with pytest.raises(futures.TimeoutError):
        queued.result(0.2)
    hold.set()
    assert holding.result(WAIT_S) is True and queued.result(WAIT_S) == "after"
    pool.shutdown()


def test_a_call_waiting_its_turn_at_a_busy_nc_lets_a_waiting_call_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "BLOCKED_AFTER_S", 60.0)  # no call counts as blocked
    monkeypatch.setattr(turns, "_spent_in", None)  # put back afterwards
    turns.spend_waits_in(waiting)  # as the daemon does
    pool = CallPool(1, 4, name="turns")
    nc = threading.Lock()  # an NC's lock, held by a run in progress
    nc.acquire()
    queued = threading.Event()

    def run_on_the_nc() -> str:
        queued.set()
        turns.take_turn(nc)  # waits: the run in progress holds the NC
        nc.release()
        return "ran"

    first = pool.submit(run_on_the_nc)
    assert queued.wait(WAIT_S)
    try:  # the call waiting its turn computes nothing: another starts
        assert pool.submit(lambda: "answered").result(WAIT_S) == "answered"
    finally:
        nc.release()
    assert first.result(WAIT_S) == "ran"
    pool.shutdown()


def test_a_free_turn_is_taken_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    spent: list[str] = []

    @contextlib.contextmanager
    def noted() -> Iterator[None]:
        spent.append("waited")
        yield

    monkeypatch.setattr(turns, "_spent_in", None)
    turns.spend_waits_in(noted)
    lock = threading.Lock()
    turns.take_turn(lock)  # free: taken at once
    assert lock.locked() and spent == []
    releaser = threading.Timer(0.05, lock.release)
    releaser.start()
    turns.take_turn(lock)  # busy: waited for, in the way set
    assert lock.locked() and spent == ["waited"]
    lock.release()
    releaser.join()


def test_waiting_off_a_pool_thread_changes_nothing() -> None:
    with waiting():
        pass  # the main thread runs no pool's call: nothing to count


def test_the_server_pool_computes_one_call_per_core_within_its_threads() -> None:
    pool = server_pool(3, "sized")
    assert isinstance(pool, CallPool)
    assert (pool.running, pool.most) == (min(len(os.sched_getaffinity(0)), 3), 3)
    with pytest.raises(ValueError, match=r"must be 1\.\.most"):
        CallPool(0, 4)
    pool.shutdown()
