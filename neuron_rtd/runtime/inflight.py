"""Posted inferences: `infer_post` answers a cookie at once, the inference runs on its
model's workers, and `infer_wait` / `infer_poll` answer the cookie once.

The post checks the inputs, takes the model's slot and copies the inputs in before it
answers, so a bad input or a full queue (NERR_QUEUE_FULL) is the post's own answer, and the
client may reuse its input buffers as soon as it has the cookie. The slot stays taken until
the cookie is answered. A cookie nobody collects within `ttl_s` of its end (its client went
away) is dropped, and its slot given back. When a model is unloaded its cookies keep only
their answer (the error that ended them), not the model: an unloaded model's memory and
threads are not held up to `ttl_s` by cookies nobody will collect.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from neuron_rtd.errors import (
    InferCancelled,
    InferTimeout,
    InvalidHandle,
    NrtError,
    ResourceError,
)
from neuron_rtd.runtime.job import Job
from neuron_rtd.runtime.model import LoadedModel
from neuron_rtd.runtime.sessions import session_name

log = logging.getLogger("nrtd.NMGR")

DEFAULT_TTL_S = 60.0


@dataclass(eq=False)
class Posted:
    cookie: int
    model: LoadedModel
    job: Job
    extra: Any = None  # what the caller keeps with it (the runtime: shm OFMAP mappings)

    @property
    def done(self) -> bool:
        return self.job.done


class Inflight:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, session_limit: int = 0) -> None:
        self._posted: dict[int, Posted] = {}
        self._gone: dict[int, tuple[float, NrtError]] = {}  # an unloaded model's: its answer
        self._lock = threading.Lock()
        self.ttl_s = ttl_s
        self.session_limit = session_limit  # cookies held per session of the model (0: any)
        self._held: Counter[int] = Counter()  # by the models' session ids
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None

    def post(self, model: LoadedModel, inputs: Mapping[str, Any], extra: Any = None) -> int:
        """Submit an inference and queue it; its cookie."""
        if self._closed.is_set():
            raise InferCancelled("the runtime is shutting down")
        session = model.session_id
        with self._lock:
            held = self._held[session]
            if self.session_limit and held >= self.session_limit:
                raise ResourceError(
                    f"{session_name(session)}: {held} inferences posted and not yet waited "
                    f"for, the most one session may hold (session_max_inflight "
                    f"{self.session_limit}): wait for some first"
                )
            self._held[session] += 1  # taken now, so that posts at once cannot pass it
        try:
            job = model.post(inputs)
        except BaseException:
            self._drop_held(session)
            raise
        with self._lock:
            cookie = self._new_cookie()
            self._posted[cookie] = Posted(cookie, model, job, extra)
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep_loop, name="cookie-sweeper", daemon=True
                )
                self._sweeper.start()
        return cookie

    def _new_cookie(self) -> int:
        """A cookie no one can guess (random 64-bit, never 0), so that only the client
        that posted can wait for its answer (under the lock)."""
        while True:
            cookie = secrets.randbits(64)
            if cookie and cookie not in self._posted and cookie not in self._gone:
                return cookie

    def peek(self, cookie: int) -> Posted:
        with self._lock:
            posted = self._posted.get(cookie)
            gone = self._gone.get(cookie)
        if gone is not None:
            raise gone[1]
        if posted is None:
            raise InvalidHandle(f"cookie {cookie} is unknown or was answered already")
        return posted

    def _drop_held(self, session: int) -> None:
        with self._lock:
            self._release_locked(session)

    def _release_locked(self, session: int) -> None:
        self._held[session] -= 1
        if self._held[session] <= 0:
            del self._held[session]

    def take(self, cookie: int) -> Posted:
        """The posted inference, which this cookie no longer names afterwards."""
        with self._lock:
            posted = self._posted.pop(cookie, None)
            gone = self._gone.pop(cookie, None)
            if posted is not None:
                self._release_locked(posted.model.session_id)
        if gone is not None:
            raise gone[1]
        if posted is None:
            raise InvalidHandle(f"cookie {cookie} is unknown or was answered already")
        return posted

    def forget(self, model: LoadedModel) -> None:
        """`model` is unloaded (its jobs ended and released): its cookies keep only the
        error that ended each, to answer once."""
        now = time.monotonic()
        with self._lock:
            mine = [p for p in self._posted.values() if p.model is model]
            for posted in mine:
                del self._posted[posted.cookie]
                self._release_locked(model.session_id)
                error = posted.job.error or InferCancelled(
                    f"model {model.id}: inference cancelled: the model was unloaded"
                )
                # only the answer: not the traceback, whose frames hold the model
                error.__context__ = error.__cause__ = None
                self._gone[posted.cookie] = (now, error.with_traceback(None))

    def wait(self, cookie: int) -> Posted:
        """Take the cookie once its inference has ended. Waits at most as long as every
        inference the model may hold could take (NERR_TIMEOUT after that, the slot freed
        when the inference ends): a wait never hangs."""
        posted = self.take(cookie)
        params = posted.model.params
        bound = params.timeout_s * (params.ninfer + 1) + 1.0
        if not posted.job.wait_done(bound):
            posted.model.abandon(posted.job)
            raise InferTimeout(
                f"cookie {cookie}: inference on model {posted.model.id} has not ended after "
                f"{bound:g} s"
            )
        return posted

    def completed(self, cookies: Iterable[int]) -> list[int]:
        with self._lock:
            return [
                c
                for c in cookies
                if c in self._gone or (c in self._posted and self._posted[c].done)
            ]

    def sweep(self, now: float | None = None) -> list[int]:
        """Drop cookies that ended more than `ttl_s` ago and were never collected."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [
                p
                for p in self._posted.values()
                if p.done and p.job.ended and now - p.job.ended > self.ttl_s
            ]
            for posted in stale:
                del self._posted[posted.cookie]
                self._release_locked(posted.model.session_id)
            for cookie in [c for c, (t, _) in self._gone.items() if now - t > self.ttl_s]:
                del self._gone[cookie]
        for posted in stale:
            posted.model.abandon(posted.job)
            log.warning(
                "Dropped cookie %d of model %d: not collected %g s after it ended",
                posted.cookie,
                posted.model.id,
                self.ttl_s,
                extra={"fn": "infer_wait"},
            )
        return [p.cookie for p in stale]

    def _sweep_loop(self) -> None:
        while not self._closed.wait(max(self.ttl_s / 4, 0.05)):
            self.sweep()

    def close(self) -> None:
        self._closed.set()
