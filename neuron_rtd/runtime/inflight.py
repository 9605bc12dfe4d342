"""Posted inferences: `infer_post` answers a cookie at once, the inference runs on a worker
pool, and `infer_wait` / `infer_poll` answer the cookie once.

The check of the inputs and the model's slot are taken at post time, so a bad input or a
full queue (`ninfer` in flight: NERR_QUEUE_FULL) is answered by the post itself.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from neuron_rtd.errors import InvalidHandle
from neuron_rtd.runtime.model import InferResult, Model


@dataclass
class Posted:
    cookie: int
    model: Model
    future: futures.Future[InferResult]
    shm_outputs: Mapping[str, str] = field(default_factory=dict)


class Inflight:
    def __init__(self, workers: int = 4) -> None:
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="infer")
        self._cookies = itertools.count(1)
        self._posted: dict[int, Posted] = {}
        self._lock = threading.Lock()

    def post(self, model: Model, inputs: Mapping[str, Any], shm_outputs: Mapping[str, str]) -> int:
        job = model.prepare(inputs)
        try:
            future = self._pool.submit(model.execute, job)
        except RuntimeError:  # the pool is shut down: the daemon is stopping
            model.execute_abandoned(job)
            raise
        with self._lock:
            cookie = next(self._cookies)
            self._posted[cookie] = Posted(cookie, model, future, dict(shm_outputs))
        return cookie

    def peek(self, cookie: int) -> Posted:
        with self._lock:
            posted = self._posted.get(cookie)
        if posted is None:
            raise InvalidHandle(f"cookie {cookie} is unknown or was answered already")
        return posted

    def take(self, cookie: int) -> Posted:
        """The posted inference, which this cookie no longer names afterwards."""
        with self._lock:
            posted = self._posted.pop(cookie, None)
        if posted is None:
            raise InvalidHandle(f"cookie {cookie} is unknown or was answered already")
        return posted

    def completed(self, cookies: Iterable[int]) -> list[int]:
        with self._lock:
            return [c for c in cookies if c in self._posted and self._posted[c].future.done()]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
