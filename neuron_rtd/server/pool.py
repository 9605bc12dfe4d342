"""The gRPC server's call threads (`CallPool`): a call starts on a turn of the runtime's
compute gate (`neuron_rtd/runtime/compute.py`: one computing call per usable core, for
every front, and why), more run only while some wait.

grpcio's synchronous server runs each call on a thread of the pool it is given. A pool
starts a queued call only when the gate has a turn free: a call computing for
BLOCKED_AFTER_S, or waiting (`ComputeGate.waiting()`: an `infer_wait` waiting for its
inference, a run waiting its turn at a busy NC), no longer holds one. The waiting call
then starts, on a thread the pool adds (up to its most). Threads beyond what runs end
after IDLE_EXIT_S with nothing to take (the newest idle thread takes a call, so under
steady traffic the others do idle). The daemon's pools (unary calls, stream requests,
loads) share the one gate, and its lock guards their queues: a turn given back by any of
them, or by the HTTP front or a peer lane, starts the next call of whichever pool waits.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, cast

from neuron_rtd.runtime import ComputeGate

IDLE_EXIT_S = 5.0  # a thread beyond the calls that may run at once, idle this long, ends


def server_pool(gate: ComputeGate, threads: int, name: str = "call") -> futures.ThreadPoolExecutor:
    """The pool of a gRPC server of at most `threads` call threads, starting calls on
    `gate`'s turns. Typed as grpcio's stubs name a server's pool; grpcio only submits
    calls to it."""
    return cast(futures.ThreadPoolExecutor, CallPool(gate, threads, name=name))


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
    """Runs submitted calls on up to `most` threads, each started on a turn of `gate`
    (see the module doc)."""

    def __init__(self, gate: ComputeGate, most: int, *, name: str = "call") -> None:
        if most < 1:
            raise ValueError(f"a pool needs a thread at least, got {most}")
        self.gate = gate
        self.most = most
        self._name = name
        self._queue: collections.deque[tuple[futures.Future[Any], Callable[[], Any]]] = (
            collections.deque()
        )
        self._lock = gate.lock  # the gate's: its turns and this queue together
        self._sleepers = _Sleepers(self._lock)  # the idle threads
        self._threads = 0
        self._idle = 0
        self._watching = False  # an idle thread waits for a computing call to block
        self._closed = False
        gate.listen(self._turn_freed)

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
        self.gate.forget(self._turn_freed)

    def _turn_freed(self) -> None:
        """A turn of the gate's may be free (under the lock): the queue's first call to
        start, if any."""
        if self._queue:
            self._start_first()

    def _start_first(self) -> None:
        """Someone to start the queue's first call (under the lock): an idle thread woken
        now when it may start now, else as `_watch` says."""
        if self._idle and self.gate.free(time.monotonic()):
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

    def _next(self, me: int) -> tuple[futures.Future[Any], Callable[[], Any]] | None:
        """The next call this thread runs, once it may start (its turn taken), or None
        when the thread is to end. One idle thread watches a waiting queue: it wakes when
        the oldest computing call would count as blocked."""
        gate = self.gate
        with self._lock:
            gate.give_back(me, quiet=self._turn_freed)  # its last call has ended
            idle_since = time.monotonic()
            while True:
                now = time.monotonic()
                if self._queue and gate.free(now):
                    gate.take(me, now)
                    item = self._queue.popleft()
                    if self._queue:
                        self._watch()
                    return item
                if self._closed and not self._queue:
                    break
                watch = bool(self._queue) and not self._watching
                timeout: float | None = None
                if watch:
                    timeout = gate.next_free_s(now)
                elif self._threads > gate.cores:
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
