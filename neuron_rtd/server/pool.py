"""The gRPC server's call threads (`CallPool`): one call computes per core, more run only
while some wait.

grpcio's synchronous server runs each call on a thread of the pool it is given, and its
own Python (the call's receive, its status, the completion queue's thread that hands
calls out) shares one GIL with them. Every call in progress is a thread wanting the GIL
at each of those steps, so past a few calls at once the threads spend the GIL handing it
to each other. Measured on 2 cores, 8 clients calling a small model (MLP 784-128-10,
`bench/data_plane.py --concurrency`): 1500-1970 calls/s on a plain pool of 16 threads,
2100-2250 with 4 computing at once, 2940-3440 with 2; the bare gRPC echo on the same
pools 3080-3820, 3640-3760 and 3660-4820.

A pool of few threads, though, would leave calls waiting behind calls that only wait. A
call says so where it is known (`waiting()`: an `infer_wait` waiting for its inference,
an inference waiting its turn at a busy NC, `driver_sim.turns`); else a call that has
run for BLOCKED_AFTER_S (a long inference, a stream) no longer counts against the calls
that may compute at once.
Either way a waiting call then starts, on a thread the pool adds (up to its most).
Threads beyond what runs end after IDLE_EXIT_S with nothing to take (the newest idle
thread takes a call, so under steady traffic the others do idle).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, cast

from neuron_rtd.runtime import usable_cpus

# A call running this long is taken to be waiting, not computing: another may start. Not
# much less: under load a computing call takes a few ms (8 clients of a small model: 3-4 ms
# a call at p50), and at 5 ms the pool took calls slowed by the GIL for blocked ones, ran
# more at once, slowed them further, and served fewer than a plain pool of 16 threads.
BLOCKED_AFTER_S = 0.05
IDLE_EXIT_S = 5.0  # a thread beyond the calls that may run at once, idle this long, ends

_on = threading.local()  # `pool`: the CallPool whose call this thread runs, if any


def server_pool(threads: int, name: str = "call") -> futures.ThreadPoolExecutor:
    """The pool of a gRPC server of at most `threads` call threads: one call computing at
    once per usable core (see the module doc). Typed as grpcio's stubs name a server's
    pool; grpcio only submits calls to it."""
    pool = CallPool(min(usable_cpus(), threads), threads, name=name)
    return cast(futures.ThreadPoolExecutor, pool)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """The call on this thread waits in the block (for its inference, say), computing
    nothing: meanwhile it does not count against the calls that may compute at once, and
    a call waiting to start starts. Anywhere else than a CallPool's thread, a no-op."""
    pool: CallPool | None = getattr(_on, "pool", None)
    if pool is None:
        yield
        return
    me = threading.get_ident()
    pool._waits(me)
    try:
        yield
    finally:
        pool._computes(me)


class _Sleepers:
    """The pool's idle threads, waiting for a call (the pool's `lock` released meanwhile),
    woken newest first: under steady traffic the same few threads take the calls, and
    the threads beyond them stay idle long enough to end. (`threading.Condition` wakes the
    oldest waiter: calls would go round every thread the pool ever grew, and none would be
    idle for IDLE_EXIT_S while any traffic comes.)"""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._waiting: list[threading.Lock] = []  # one held lock per thread, newest last

    def wait(self, timeout: float | None) -> None:
        """Wait (the pool's lock released, held again on return) until woken or `timeout`
        seconds have passed (None: no bound)."""
        waiter = threading.Lock()
        waiter.acquire()
        self._waiting.append(waiter)
        self._lock.release()
        try:
            woken = waiter.acquire(True, -1 if timeout is None else max(0.0, timeout))
        finally:
            self._lock.acquire()
        if not woken:
            with contextlib.suppress(ValueError):  # woken just as it timed out: awake anyway
                self._waiting.remove(waiter)

    def notify(self) -> None:
        """Wake the newest waiting thread, if any (the pool's lock held)."""
        if self._waiting:
            self._waiting.pop().release()

    def notify_all(self) -> None:
        while self._waiting:
            self._waiting.pop().release()


class CallPool(futures.Executor):
    """Runs submitted calls on up to `most` threads, at most `running` of them at once
    unless some have run for BLOCKED_AFTER_S (see the module doc)."""

    def __init__(self, running: int, most: int, *, name: str = "call") -> None:
        if not 1 <= running <= most:
            raise ValueError(f"running ({running}) must be 1..most ({most})")
        self.running = running
        self.most = most
        self._name = name
        self._queue: collections.deque[tuple[futures.Future[Any], Callable[[], Any]]] = (
            collections.deque()
        )
        self._started: dict[int, float] = {}  # thread id -> when its call started
        self._lock = threading.Lock()
        self._sleepers = _Sleepers(self._lock)  # the idle threads
        self._threads = 0
        self._idle = 0
        self._watching = False  # an idle thread waits for a computing call to block
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run new calls after shutdown")
            self._queue.append((future, lambda: fn(*args, **kwargs)))
            self._start_first()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._sleepers.notify_all()

    def _start_first(self) -> None:
        """Someone to start the queue's first call (under the lock): an idle thread woken
        now when it may start now, else as `_watch` says."""
        if self._idle and len(self._computing(time.monotonic())) < self.running:
            self._sleepers.notify()
        else:
            self._watch()

    def _watch(self) -> None:
        """Someone to start the queue's first call once it may (under the lock): an idle
        thread that watches, else one woken or made to (within `most`)."""
        if self._watching:
            return
        if self._idle:
            self._sleepers.notify()
        elif self._threads < self.most:
            self._threads += 1
            threading.Thread(
                target=self._work, name=f"{self._name}_{self._threads}", daemon=True
            ).start()

    def _waits(self, me: int) -> None:
        """The call of thread `me` waits from now (see `waiting`)."""
        with self._lock:
            self._started.pop(me, None)
            if self._queue:
                self._start_first()

    def _computes(self, me: int) -> None:
        """The call of thread `me` computes again, counted from now."""
        with self._lock:
            self._started[me] = time.monotonic()

    def _computing(self, now: float) -> list[float]:
        """When the calls running that started under BLOCKED_AFTER_S ago started (called
        under the lock)."""
        since = now - BLOCKED_AFTER_S
        return [started for started in self._started.values() if started > since]

    def _next(self, me: int) -> tuple[futures.Future[Any], Callable[[], Any]] | None:
        """The next call this thread runs, once it may start (its start noted), or None
        when the thread is to end. One idle thread watches a waiting queue: it wakes when
        the oldest computing call would count as blocked."""
        with self._lock:
            self._started.pop(me, None)  # its last call has ended
            idle_since = time.monotonic()
            while True:
                now = time.monotonic()
                computing = self._computing(now)
                if self._queue and len(computing) < self.running:
                    self._started[me] = now
                    item = self._queue.popleft()
                    if self._queue:
                        self._watch()
                    return item
                if self._closed and not self._queue:
                    break
                watch = bool(self._queue) and not self._watching
                timeout: float | None = None
                if watch:
                    timeout = min(computing) + BLOCKED_AFTER_S - now
                elif self._threads > self.running:
                    if now - idle_since >= IDLE_EXIT_S:
                        break
                    timeout = idle_since + IDLE_EXIT_S - now
                self._idle += 1
                self._watching |= watch
                self._sleepers.wait(timeout)
                self._idle -= 1
                if watch:
                    self._watching = False
            self._threads -= 1
            return None

    def _work(self) -> None:
        me = threading.get_ident()
        _on.pool = self
        while (item := self._next(me)) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, call
