"""`GET /metrics` (`--metrics-address`): the serving core's statistics in Prometheus's text
format under Triton's metric names, types and labels (`model`, `version`), so that a
Triton user's dashboards, alerts and autoscalers read the daemon as they read Triton; and
the NeuronCores' own, under the names neuron-monitor-prometheus gives them.

Each model version's counters are its `ModelStatistics` (`neuron_rtd/serving/stats.py`),
read once per scrape and rendered, never counted a second time; the pending requests
are the version's own count of those queued or waiting for a slot. Triton's names hold
no `_total` (prometheus_client's counters append one, which Triton's users' queries would
not find): hence the text is rendered here, not by prometheus_client.

    nv_inference_request_success              counter  requests answered
    nv_inference_request_failure              counter  requests refused or failed
    nv_inference_count                        counter  inferences (a request's batch size)
    nv_inference_exec_count                   counter  executions (several batched requests: one)
    nv_inference_request_duration_us          counter  answered requests' time, in microseconds
    nv_inference_queue_duration_us            counter  ... of it waiting (a batch, a slot)
    nv_inference_compute_{input,infer,output}_duration_us  counter  executions' times
    nv_inference_pending_request_count        gauge    requests not yet executing
    neuroncore_utilization_ratio              gauge    neuroncore: busy share of the window
    neuron_runtime_memory_used_bytes          gauge    memory_location: host, neuron_device

A NeuronCore's utilization is its busy time over the window between the two latest
samples of its counter, a sample taken by a scrape when the latest is at least
`WINDOW_S` old (scrapes closer together, of one Prometheus or several, see the same
value; the first window starts with the daemon and ends at the first scrape):
neuron-monitor's reading of the same counter over its period. Memory: the daemon's
resident memory and the devices' memory in use, as neuron-monitor's `memory_used`
reports them.

Anyone who reaches the address may scrape: it shows the ready models' names and counts,
which the v2 statistics answer anyone too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from neuron_rtd.errors import NrtError
from neuron_rtd.proto import kserve_pb
from neuron_rtd.runtime import Runtime
from neuron_rtd.serving import ServingApi

log = logging.getLogger("nrtd.KSERVE")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text format
WINDOW_S = 1.0  # a NeuronCore's utilization is over at least this much time
PATH = "/metrics"

Stats = kserve_pb.ModelStatistics


def _us(ns: int) -> int:
    return ns // 1000


# Triton's per model version metrics: name, type, help, value of a version's statistics
MODEL_METRICS: tuple[tuple[str, str, str, Callable[[Stats], int]], ...] = (
    (
        "nv_inference_request_success",
        "counter",
        "Inference requests answered successfully, all batch sizes",
        lambda s: s.inference_stats.success.count,
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Inference requests that failed or were refused, all batch sizes",
        lambda s: s.inference_stats.fail.count,
    ),
    (
        "nv_inference_count",
        "counter",
        "Inferences performed: each request counts its batch size",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Model executions performed: requests batched together count one",
        lambda s: s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative time of the successful requests, from arrival to answer, in microseconds",
        lambda s: _us(s.inference_stats.success.ns),
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative time the successful requests waited in the queue, in microseconds",
        lambda s: _us(s.inference_stats.queue.ns),
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative time executions spent preparing their inputs, in microseconds",
        lambda s: _us(s.inference_stats.compute_input.ns),
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative time executions spent running the model, in microseconds",
        lambda s: _us(s.inference_stats.compute_infer.ns),
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative time executions spent extracting their outputs, in microseconds",
        lambda s: _us(s.inference_stats.compute_output.ns),
    ),
)
PENDING = (
    "nv_inference_pending_request_count",
    "gauge",
    "Requests of the model version waiting to begin executing, at this instant",
)
# neuron-monitor-prometheus's names and help (neuron_rtd/tools/monitor/exporter.py)
UTILIZATION = ("neuroncore_utilization_ratio", "gauge", "NeuronCore utilization ratio")
MEMORY = ("neuron_runtime_memory_used_bytes", "gauge", "Runtime memory used bytes")


def label(value: str) -> str:
    """`value` as a label value of the text format: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    lines: list[str], head: tuple[str, str, str], samples: Iterable[tuple[str, float]]
) -> None:
    """One metric family: its HELP and TYPE, then each (labels, value) sample."""
    name, kind, text = head
    lines.append(f"# HELP {name} {text}")
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(f"{name}{{{labels}}} {value}" for labels, value in samples)


class Metrics:
    """The metrics of `serving`'s models and `runtime`'s NeuronCores, rendered on demand."""

    def __init__(self, serving: ServingApi, runtime: Runtime, *, window_s: float = WINDOW_S):
        self.serving = serving
        self.runtime = runtime
        self.window_ns = int(window_s * 1e9)
        self._lock = threading.Lock()
        first = runtime.snapshot()
        self._sample = (time.monotonic_ns(), {nc.vnc: nc.busy_ns for nc in first.ncs})
        self._utilization: dict[int, float] | None = None  # none yet: the first scrape's

    def render(self) -> bytes:
        """Every metric, as Prometheus's text format."""
        stats = list(self.serving.model_statistics().model_stats)
        pending = self.serving.pending_requests()
        snapshot = self.runtime.snapshot()
        devices = self.runtime.devices()
        lines: list[str] = []
        versions = [(f'model="{label(s.name)}",version="{label(s.version)}"', s) for s in stats]
        for name, kind, text, value in MODEL_METRICS:
            _family(lines, (name, kind, text), ((ls, value(s)) for ls, s in versions))
        _family(lines, PENDING, ((ls, pending.get((s.name, s.version), 0)) for ls, s in versions))
        utilization = self._utilization_of(snapshot)
        _family(
            lines,
            UTILIZATION,
            ((f'neuroncore="{vnc}"', round(u, 6)) for vnc, u in sorted(utilization.items())),
        )
        device_bytes = sum(sum(d.memory_used) for d in devices)
        _family(
            lines,
            MEMORY,
            (
                ('memory_location="host"', snapshot.rss_bytes),
                ('memory_location="neuron_device"', device_bytes),
            ),
        )
        return ("\n".join(lines) + "\n").encode()

    def _utilization_of(self, snapshot: Any) -> dict[int, float]:
        """Each NeuronCore's busy share of the latest window (see the module docstring),
        a new window begun when the latest is `window_ns` old. Busy time that went back
        (its device reset) counts from zero. Timed by the monotonic clock: a wall clock set
        back would hold the window."""
        now_ns = time.monotonic_ns()
        with self._lock:
            then_ns, busy_then = self._sample
            elapsed_ns = now_ns - then_ns
            if self._utilization is None or elapsed_ns >= self.window_ns:
                utilization = {}
                for nc in snapshot.ncs:
                    start = busy_then.get(nc.vnc, 0)
                    busy_ns = nc.busy_ns - start if nc.busy_ns >= start else nc.busy_ns
                    utilization[nc.vnc] = min(1.0, busy_ns / max(elapsed_ns, 1))
                self._utilization = utilization
                self._sample = (now_ns, {nc.vnc: nc.busy_ns for nc in snapshot.ncs})
            return self._utilization


def _plain(start_response: Callable[..., Any], status: str, text: str, *headers: Any) -> list:
    body = (text + "\n").encode()
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
         *headers],
    )  # fmt: skip
    return [body]


class MetricsApp:
    """`GET /metrics` as a WSGI application (served by `http_server.HttpServer`): anyone
    may scrape; any other path is 404, any other method 405. A scrape is a read: one cut
    short by the daemon's stop is only scraped again, so the stop waits for none."""

    max_body_bytes = 4096  # a scrape sends none
    stopping = False

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def wait_idle(self, timeout: float) -> bool:
        return True

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list:
        if environ.get("PATH_INFO") != PATH:
            return _plain(start_response, "404 Not Found", f"not found: metrics are at {PATH}")
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            return _plain(
                start_response,
                "405 Method Not Allowed",
                f"{PATH} answers GET only",
                ("Allow", "GET, HEAD"),
            )
        try:
            body = self.metrics.render()
        except NrtError as exc:  # the runtime stopping, a device gone
            return _plain(start_response, "503 Service Unavailable", f"no metrics now: {exc}")
        except Exception:
            log.exception("rendering the metrics failed")
            return _plain(start_response, "500 Internal Server Error", "rendering failed")
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
        )
        return [b"" if method == "HEAD" else body]
