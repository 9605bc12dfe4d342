"""The compute gate: one computing call per usable core, whichever front it came by.

Every front's handler threads share one GIL with grpcio's and waitress's own Python (a
call's receive, its status, the completion queue's thread that hands calls out). Every
call in progress is a thread wanting the GIL at each of those steps, so past a few calls
at once the threads spend the GIL handing it to each other. Measured on 2 cores, 8
clients calling a small model (MLP 784-128-10, `bench/data_plane.py --concurrency`):
1500-1970 calls/s on a plain pool of 16 threads, 2100-2250 with 4 computing at once,
2940-3440 with 2; the bare gRPC echo on the same pools 3080-3820, 3640-3760 and
3660-4820. So the runtime lets as many calls compute at once as the process has usable
cores (its CPU affinity), and no more.

A gate of few turns, though, would leave calls waiting behind calls that only wait. A
call says so where it is known (`waiting()`: an `infer_wait` waiting for its inference,
a request waiting for its dynamic batch, a run waiting its turn at a busy NC or a
shared-NC model, `take_turn`, which the driver port hands the simulated NCs); else a
call that has computed for BLOCKED_AFTER_S (a long inference, a stream) no longer counts
against the calls that may compute at once. Either way a call waiting for a turn then
starts. (A run waiting for a busy NC used to keep a call for another NC from starting: 3
clients of a big model on one NCG had pushed a small model's calls on another NCG from
0.8 to 6.3 ms p50; giving the turn back while it waits, 0.77-0.81 ms.)

Who passes through it: the gRPC server's call pools (`neuron_rtd/server/pool.py`: unary
calls, stream requests, loads), which start a call only on a free turn; the HTTP front's
workers and the peer socket's lanes, which take a turn (`turn()`) for each request. One
lock guards the turns and the pools' queues together (`lock`), so a turn given back
starts the next call of whichever pool or thread waits.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from neuron_rtd.runtime.driver import usable_cpus

# A call computing this long is taken to be waiting, not computing: another may start. Not
# much less: under load a computing call takes a few ms (8 clients of a small model: 3-4 ms
# a call at p50), and at 5 ms the pool took calls slowed by the GIL for blocked ones, ran
# more at once, slowed them further, and served fewer than a plain pool of 16 threads.
BLOCKED_AFTER_S = 0.05


class ComputeGate:
    """At most `cores` calls computing at once (0: the usable cores); see the module doc."""

    def __init__(self, cores: int = 0) -> None:
        self.cores = cores if cores > 0 else usable_cpus()
        self.blocked_after_s = BLOCKED_AFTER_S
        self.lock = threading.Lock()
        self._started: dict[int, float] = {}  # thread id -> when its computing started
        self._turn_free = threading.Condition(self.lock)  # threads in `turn()` waiting
        self._waiting_threads = 0
        self._listeners: list[Callable[[], None]] = []  # the pools, woken under the lock

    # --- under the lock ---------------------------------------------------------------
    def computing(self, now: float) -> list[float]:
        """When the calls that count as computing started (those under BLOCKED_AFTER_S)."""
        since = now - self.blocked_after_s
        return [started for started in self._started.values() if started > since]

    def free(self, now: float) -> bool:
        """Whether a call may start computing now."""
        return len(self.computing(now)) < self.cores

    def next_free_s(self, now: float) -> float:
        """Seconds until the oldest computing call counts as blocked (a turn frees then)."""
        return max(0.0, min(self.computing(now), default=now) + self.blocked_after_s - now)

    def take(self, me: int, now: float) -> None:
        """Thread `me` computes from `now` (its turn checked free by the caller)."""
        self._started[me] = now

    def give_back(self, me: int, *, quiet: Callable[[], None] | None = None) -> None:
        """Thread `me` computes no more: whoever waits for a turn is told (but `quiet`,
        the listener that gives it back itself)."""
        if self._started.pop(me, None) is not None:
            self._freed(quiet)

    def listen(self, woken: Callable[[], None]) -> None:
        """`woken()` runs (under the lock) whenever a turn may have become free."""
        with self.lock:
            self._listeners.append(woken)

    def forget(self, woken: Callable[[], None]) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self._listeners.remove(woken)

    def _freed(self, quiet: Callable[[], None] | None = None) -> None:
        if self._waiting_threads:
            self._turn_free.notify()
        for woken in self._listeners:
            if woken is not quiet:
                woken()

    # --- for any thread ---------------------------------------------------------------
    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Compute in the block on a turn of the gate's, waiting for one if none is free
        (a thread that holds one already keeps it)."""
        me = threading.get_ident()
        with self.lock:
            if me in self._started:
                held = True
            else:
                held = False
                self._waiting_threads += 1
                try:
                    while not self.free(now := time.monotonic()):
                        self._turn_free.wait(max(self.next_free_s(now), 0.001))
                finally:
                    self._waiting_threads -= 1
                self.take(me, now)
        try:
            yield
        finally:
            if not held:
                with self.lock:
                    self.give_back(me)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The call on this thread waits in the block (for its inference, say), computing
        nothing: meanwhile it does not count against the calls that may compute, and a
        call waiting for a turn starts. It computes again after the block, counted from
        then, without waiting. On a thread that holds no turn, a no-op."""
        me = threading.get_ident()
        with self.lock:
            held = self._started.pop(me, None) is not None
            if held:
                self._freed()
        try:
            yield
        finally:
            if held:
                with self.lock:
                    self._started[me] = time.monotonic()

    def take_turn(self, lock: threading.Lock) -> None:
        """Acquire `lock` (an NC's, a shared-NC model's: one run at a time): at once when
        it is free, else waiting for it as `waiting()` does."""
        if lock.acquire(blocking=False):
            return
        with self.waiting():
            lock.acquire()
