"""Turns at something one run uses at a time, and how a wait for one is spent.

A NeuronCore runs one program at a time (`NeuronCore.lock`), a model in shared-NC mode
one request at a time: a run that finds it busy waits its turn, computing nothing. The
process's server may count such a wait as a wait rather than work: its gRPC call threads
let only so many calls compute at once (neuron_rtd/server/pool.py), and a call queued on
a busy NC must not keep a call for another NC from starting. `spend_waits_in` says how
(a context manager each wait runs in); `take_turn` waits in it, and only when it must.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

_spent_in: Callable[[], AbstractContextManager[object]] | None = None


def spend_waits_in(how: Callable[[], AbstractContextManager[object]] | None) -> None:
    """Each wait for a turn from now on runs in `how()` (None: plainly)."""
    global _spent_in
    _spent_in = how


def take_turn(lock: threading.Lock) -> None:
    """Acquire `lock`: at once when it is free, else waiting as `spend_waits_in` said."""
    if lock.acquire(blocking=False):
        return
    how = _spent_in
    if how is None:
        lock.acquire()
        return
    with how():
        lock.acquire()
