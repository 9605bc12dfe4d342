"""The gRPC server's call pool (`neuron_rtd/server/pool.py`) over the runtime's compute
gate (`neuron_rtd/runtime/compute.py`): calls run and answer, at most the gate's `cores`
compute at once, in every pool and thread on the gate together, calls that block (or say
they wait, or wait their turn at a busy NC: `ComputeGate.take_turn`) let waiting ones
start, threads beyond that end when idle (also while calls keep coming), and shutdown
refuses new calls."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import pytest

from neuron_rtd.runtime import ComputeGate
from neuron_rtd.server import pool as pool_module
from neuron_rtd.server.pool import CallPool, server_pool

WAIT_S = 10.0  # a bound on what must happen at once, on a loaded machine


def _gate(cores: int, blocked_after_s: float | None = None) -> ComputeGate:
    """A gate of `cores` turns (`blocked_after_s` 60: no call counts as blocked)."""
    gate = ComputeGate(cores)
    if blocked_after_s is not None:
        gate.blocked_after_s = blocked_after_s
    return gate


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
    pool = CallPool(_gate(2), 4, name="answers")
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(WAIT_S) == 5

    def fail() -> None:
        raise KeyError("no such model")

    with pytest.raises(KeyError, match="no such model"):
        pool.submit(fail).result(WAIT_S)
    assert pool.submit(str, 7).result(WAIT_S) == "7"  # the pool goes on after a failure
    pool.shutdown()


def test_at_most_the_gates_cores_compute_at_once() -> None:
    pool = CallPool(_gate(2, 60.0), 8, name="bounded")
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
    pool = CallPool(_gate(1), 4, name="blocking")
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
    pool = CallPool(_gate(1), 4, name="idlers")
    _grown(pool, "idlers_")
    assert _threads_become("idlers_", 1) == 1  # the one that may always run stays
    assert pool.submit(lambda: 1).result(WAIT_S) == 1
    pool.shutdown()


def test_threads_beyond_the_running_calls_end_under_steady_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "IDLE_EXIT_S", 0.3)
    pool = CallPool(_gate(1), 4, name="steady")
    _grown(pool, "steady_")

    def call_and_pause() -> None:  # a call every 20 ms
        assert pool.submit(lambda: "served").result(WAIT_S) == "served"
        time.sleep(0.02)

    # the newest idle thread takes each call, the others end when idle
    assert _threads_become("steady_", 1, call_and_pause) == 1
    pool.shutdown()


def test_shutdown_refuses_new_calls_and_can_cancel_waiting_ones() -> None:
    pool = CallPool(_gate(1, 60.0), 2, name="closing")
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


def test_a_call_that_says_it_waits_lets_a_waiting_call_start_at_once() -> None:
    gate = _gate(1, 60.0)
    pool = CallPool(gate, 4, name="waits")
    release, waits, computes = threading.Event(), threading.Event(), threading.Event()

    def call() -> str:
        with gate.waiting():
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


def test_a_call_waiting_its_turn_at_a_busy_nc_lets_a_waiting_call_start() -> None:
    gate = _gate(1, 60.0)
    pool = CallPool(gate, 4, name="turns")
    nc = threading.Lock()  # an NC's lock, held by a run in progress
    nc.acquire()
    queued = threading.Event()

    def run_on_the_nc() -> str:
        queued.set()
        gate.take_turn(nc)  # waits: the run in progress holds the NC
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


def test_a_free_turn_is_taken_without_waiting() -> None:
    gate = _gate(1, 60.0)
    spent: list[str] = []

    @contextlib.contextmanager
    def noted() -> Iterator[None]:
        spent.append("waited")
        yield

    gate.waiting = noted  # type: ignore[method-assign]
    lock = threading.Lock()
    gate.take_turn(lock)  # free: taken at once
    assert lock.locked() and spent == []
    releaser = threading.Timer(0.05, lock.release)
    releaser.start()
    gate.take_turn(lock)  # busy: waited for, as the gate waits
    assert lock.locked() and spent == ["waited"]
    lock.release()
    releaser.join()


def test_waiting_off_a_turn_changes_nothing() -> None:
    gate = _gate(1, 60.0)
    with gate.waiting():
        pass  # the main thread holds no turn: nothing to count
    with gate.turn():
        assert not gate.free(time.monotonic())


def test_the_server_pool_starts_calls_on_the_gates_turns() -> None:
    gate = ComputeGate()
    assert gate.cores == len(os.sched_getaffinity(0))  # one per usable core
    pool = server_pool(gate, 3, "sized")
    assert isinstance(pool, CallPool)
    assert (pool.gate, pool.most) == (gate, 3)
    with pytest.raises(ValueError, match="a thread at least"):
        CallPool(gate, 0)
    pool.shutdown()


def test_pools_and_threads_on_one_gate_compute_one_per_turn_together() -> None:
    """Two pools (unary calls, stream requests) and a thread taking turns (an HTTP
    worker, a peer lane) on a gate of 2: at most 2 compute at once across all of them,
    and a turn given back by one starts the next of another."""
    gate = _gate(2, 60.0)
    unary, streams = CallPool(gate, 8, name="unary"), CallPool(gate, 8, name="streams")
    lock = threading.Lock()
    now, most = [0], [0]

    def call() -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.005)
        with lock:
            now[0] -= 1

    def worker() -> None:
        for _ in range(6):
            with gate.turn():
                call()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    done = [pool.submit(call) for _ in range(6) for pool in (unary, streams)]
    futures.wait(done, timeout=WAIT_S)
    for thread in threads:
        thread.join(WAIT_S)
    assert all(f.done() and f.exception() is None for f in done)
    assert most[0] == 2
    # a turn held off a pool (a lane computing) keeps a pool's call from starting ...
    gate1 = _gate(1, 60.0)
    pool = CallPool(gate1, 2, name="behind")
    held, release = threading.Event(), threading.Event()

    def lane() -> None:
        with gate1.turn():
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=lane)
    holder.start()
    assert held.wait(WAIT_S)
    queued = pool.submit(lambda: "after")
    with pytest.raises(futures.TimeoutError):
        queued.result(0.2)
    release.set()  # ... until it gives the turn back
    assert queued.result(WAIT_S) == "after"
    holder.join(WAIT_S)
    for each in (unary, streams, pool):
        each.shutdown()


def test_the_http_front_runs_each_request_on_a_turn() -> None:
    """The HTTP front's WSGI application, as the daemon serves it, computes each request on
    a turn of the runtime's gate: while a request holds the one turn, none is free."""
    from neuron_rtd.server.http_server import _gated

    gate = _gate(1, 60.0)
    seen: list[bool] = []

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        seen.append(gate.free(time.monotonic()))
        return [b"{}"]

    assert _gated(app, gate)({}, lambda *a: None) == [b"{}"]  # type: ignore[arg-type]
    assert seen == [False] and gate.free(time.monotonic())
