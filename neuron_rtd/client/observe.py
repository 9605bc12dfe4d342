"""Watching a daemon: its ext snapshots, and what two of them say about the time between.

A snapshot's counts only grow, so an observer diffs the one before against the one now:
NC utilization from busy time, inference rates from each model's tally, latency
percentiles from the histograms' buckets, the daemon's vCPU from its CPU time. Several
observers (neuron-monitor, neuron-top) watch one daemon at once without taking anything
from each other.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import grpc

from neuron_rtd.client.address import grpc_target
from neuron_rtd.client.errors import NrtClientError, check, transport_errors
from neuron_rtd.errors import Nerr
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc, pb, pb_grpc

# neuron-monitor's latency percentiles, by their names in its reports
PERCENTILES = (("p0", 0.0), ("p1", 1.0), ("p25", 25.0), ("p50", 50.0), ("p75", 75.0),
               ("p99", 99.0), ("p100", 100.0))  # fmt: skip
TALLY_FIELDS = tuple(f.name for f in ext_pb.ext_infer_tally.DESCRIPTOR.fields)


def percentiles(before: Any | None, after: Any) -> dict[str, float] | None:
    """The latency percentiles (microseconds) of the values added between two reads of an
    `ext_histogram` (`before` None: since the start); None when none were added.

    Each is read from its bucket by linear interpolation, so within a bucket's width (9%)."""
    counts = list(after.counts)
    if before is not None:
        counts = [a - b for a, b in zip(counts, before.counts, strict=True)]
    total = sum(counts)
    if total <= 0:
        return None
    bounds = list(after.bounds_us)
    cumulative: list[int] = []
    running = 0
    for count in counts:
        running += count
        cumulative.append(running)
    result = {}
    for name, q in PERCENTILES:
        rank = max(1.0, q / 100 * total)  # the rank-th smallest value, 1-based
        bucket = bisect.bisect_left(cumulative, rank)
        low = bounds[bucket - 1] if bucket > 0 else 0.0
        high = bounds[bucket] if bucket < len(bounds) else bounds[-1]
        below = cumulative[bucket - 1] if bucket > 0 else 0
        share = (rank - below) / counts[bucket]
        result[name] = low + (high - low) * share
    return result


def origin(start_time_ns: int, like: Any) -> Any:
    """The daemon as it was at its start (`start_time_ns`, from `describe`): nothing run,
    counted or spent yet, in histograms of the buckets of snapshot `like`. `interval(
    origin(...), now)` is the time since the daemon started."""
    empty = [0] * len(like.latency.counts)
    return ext_pb.snapshot_response(
        time_ns=start_time_ns,
        latency=ext_pb.ext_histogram(bounds_us=like.latency.bounds_us, counts=empty),
        nc_latency=ext_pb.ext_histogram(bounds_us=like.nc_latency.bounds_us, counts=empty),
    )


def tally_of(model: Any) -> dict[str, int]:
    return {name: getattr(model.tally, name) for name in TALLY_FIELDS}


@dataclass(frozen=True)
class Interval:
    """What happened between two snapshots of one daemon."""

    seconds: float
    nc_utilization: dict[int, float]  # virtual NC -> % of the interval it was busy
    model_tallies: dict[int, dict[str, int]]  # model id -> its tally's growth
    model_rates: dict[int, float]  # model id -> inferences completed per second
    latency_us: dict[str, float] | None  # percentiles, posted to answered
    nc_latency_us: dict[str, float] | None  # ... on the NCs
    vcpu_user: float  # % of one vCPU the daemon used in user mode
    vcpu_system: float


def interval(before: Any, after: Any) -> Interval:
    """The interval between snapshot responses `before` and `after` of one daemon. A model
    new since `before` counts from its load; NC busy time that went back (a reset) counts
    from zero."""
    seconds = max((after.time_ns - before.time_ns) / 1e9, 1e-9)
    busy_before = {nc.vnc: nc.busy_ns for nc in before.ncs}
    utilization = {}
    for nc in after.ncs:
        start = busy_before.get(nc.vnc, 0)
        busy_ns = nc.busy_ns - start if nc.busy_ns >= start else nc.busy_ns
        utilization[nc.vnc] = min(100.0, busy_ns / 1e9 / seconds * 100)
    tallies_before = {m.id: tally_of(m) for m in before.models}
    tallies = {}
    for model in after.models:
        now, then = tally_of(model), tallies_before.get(model.id)
        tallies[model.id] = now if then is None else {k: now[k] - then[k] for k in now}
    return Interval(
        seconds=seconds,
        nc_utilization=utilization,
        model_tallies=tallies,
        model_rates={m: t["completed"] / seconds for m, t in tallies.items()},
        latency_us=percentiles(before.latency, after.latency),
        nc_latency_us=percentiles(before.nc_latency, after.nc_latency),
        vcpu_user=max(0.0, after.cpu_user_s - before.cpu_user_s) / seconds * 100,
        vcpu_system=max(0.0, after.cpu_system_s - before.cpu_system_s) / seconds * 100,
    )


class Watch:
    """One daemon watched: `describe()`, `snapshot()` and `counters()` answer its messages,
    or raise NrtClientError (no daemon answers, or it answered an error)."""

    def __init__(self, address: str, *, timeout_s: float = 5.0) -> None:
        """`address`: as `Client` takes it (a socket path, `unix:/path`, `host:port`)."""
        self.address = grpc_target(address)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = ext_pb_grpc.nmgr_extStub(self._channel)
        self._nmgr = pb_grpc.nmgr_v1Stub(self._channel)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any, stub: Any = None) -> Any:
        with transport_errors(method, self.address, self.timeout_s):
            response = getattr(stub or self._stub, method)(request, timeout=self.timeout_s)
        if getattr(response, "status_code", Nerr.OK) != Nerr.OK:
            raise NrtClientError(response.status_code, response.details, method)
        return response

    def describe(self) -> Any:
        return self._call("describe", ext_pb.describe_request())

    def snapshot(self) -> Any:
        return self._call("snapshot", ext_pb.snapshot_request())

    def counters(self) -> Any:
        """The daemon's `nmgr_counters` (read_inference_counters): how its inferences
        ended and their error subtypes, counted since it started; reading takes nothing."""
        return self._call("read_inference_counters", pb.empty(), self._nmgr).nmgr_counters

    def ncgs(self) -> Any:
        """The daemon's NCGs, and its device and NC counts (nmgr's list_egs)."""
        with transport_errors("list_egs", self.address, self.timeout_s):
            response = self._nmgr.list_egs(pb.empty(), timeout=self.timeout_s)
        check("list_egs", response.status)
        return response

    def profile(self, model_id: int, last: int = 0) -> Any:
        """The per-op profiles of a model loaded with profiling (its last `last`
        inferences, 0: all the daemon kept)."""
        return self._call("profile", ext_pb.profile_request(model_id=model_id, last=last))
