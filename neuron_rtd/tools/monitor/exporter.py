"""neuron-monitor's reports as Prometheus metrics, with the names the original's companion
script (neuron-monitor-prometheus.py, neuron-rtd era) gave them:

    neuroncore_utilization_ratio          gauge    neuroncore
    neuron_runtime_memory_used_bytes      gauge    memory_location (host, neuron_device)
    neuron_runtime_vcpu_usage_ratio       gauge    usage_type (user, system)
    inference_errors_total                counter  error_type (error_summary's fields)
    inference_status_total                counter  status_type (inference_summary's fields)
    inference_latency_seconds             gauge    percentile (total_latency)
    hardware_ecc_events_total             counter  neuron_device_index, event_type
    system_vcpu_count                     gauge
    system_vcpu_usage_ratio               gauge    usage_type (user: user+nice; system:
                                                   system+io_wait+irq+soft_irq)
    system_memory_{total,used}_bytes      gauge
    system_swap_{total,used}_bytes        gauge
    instance_info                         info     the report's instance_data
    neuron_hardware_info                  info     neuron_hardware_info (a later companion's)

and ours, where the original has none: `inference_device_latency_seconds` (device_latency),
`hardware_error_events_total` (nc_errors, nc_hangs, dma_timeouts, init_failures) and
`neuron_runtime_up` (1 while the runtime answers). Every runtime metric is labelled by the
runtime's `runtime_index` (its place in the configuration) and `runtime_address`.

Counters add up each report's counts of its period, as the original's did. The gauges of
a runtime that stops answering are removed, so no stale utilization stays behind.

`serve` answers scrapes over HTTP: on loopback unless told otherwise (a scrape shows
socket paths, the host's name and counts), a thread per connection for at most
`max_connections` at once (past them, 503 at once), and a connection silent for
`read_timeout_s` dropped, so idle or half-open connections cannot pile up threads.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, make_wsgi_app

RUNTIME = ("runtime_index", "runtime_address")
OWN_HW_EVENTS = ("nc_errors", "nc_hangs", "dma_timeouts", "init_failures")
ECC_EVENTS = (
    "mem_ecc_corrected",
    "mem_ecc_uncorrected",
    "sram_ecc_corrected",
    "sram_ecc_uncorrected",
)
VCPU_USAGE = {"user": ("user", "nice"), "system": ("system", "io_wait", "irq", "soft_irq")}


DEFAULT_LISTEN_ADDRESS = "127.0.0.1"
MAX_CONNECTIONS = 64  # connections served at once; Prometheus itself needs one
READ_TIMEOUT_S = 5.0  # a connection that sends nothing this long is dropped
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class ReportError(ValueError):
    """A line that is not a neuron-monitor report."""


class Exporter:
    """The metrics of the reports given to `update`, in `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        self.utilization = gauge(
            "neuroncore_utilization_ratio", "NeuronCore utilization ratio", *RUNTIME, "neuroncore"
        )
        self.runtime_memory = gauge(
            "neuron_runtime_memory_used_bytes",
            "Runtime memory used bytes",
            *RUNTIME,
            "memory_location",
        )
        self.runtime_vcpu = gauge(
            "neuron_runtime_vcpu_usage_ratio",
            "Runtime vCPU utilization ratio",
            *RUNTIME,
            "usage_type",
        )
        self.errors = counter(
            "inference_errors_total", "Inference errors total", *RUNTIME, "error_type"
        )
        self.status = counter(
            "inference_status_total", "Inference status total", *RUNTIME, "status_type"
        )
        self.latency = gauge(
            "inference_latency_seconds", "Inference latency in seconds", *RUNTIME, "percentile"
        )
        self.device_latency = gauge(
            "inference_device_latency_seconds",
            "Time of an inference on the Neuron device, in seconds",
            *RUNTIME,
            "percentile",
        )
        self.ecc = counter(
            "hardware_ecc_events_total",
            "Hardware ecc events total",
            *RUNTIME,
            "neuron_device_index",
            "event_type",
        )
        self.hw_errors = counter(
            "hardware_error_events_total",
            "NeuronCore errors, hangs, DMA timeouts and failed device initializations",
            *RUNTIME,
            "neuron_device_index",
            "event_type",
        )
        self.up = gauge("neuron_runtime_up", "1 while the runtime answers, else 0", *RUNTIME)
        self.vcpu_count = gauge("system_vcpu_count", "System vCPU count")
        self.vcpu_usage = gauge(
            "system_vcpu_usage_ratio", "System CPU utilization ratio", "usage_type"
        )
        self.memory = {
            f"{kind}_{stat}": gauge(
                f"system_{kind}_{stat}", f"System {kind} {stat.replace('_', ' ')}"
            )
            for kind in ("memory", "swap")
            for stat in ("total_bytes", "used_bytes")
        }
        self.instance = Info("instance", "Instance information", registry=r)
        self.hardware = Info("neuron_hardware", "Neuron devices and NeuronCores", registry=r)
        self._handlers: dict[str, Callable[[tuple[str, str], dict], None]] = {
            "neuroncore_counters": self._neuroncore_counters,
            "memory_used": self._memory_used,
            "neuron_runtime_vcpu_usage": self._runtime_vcpu,
            "inference_stats": self._inference_stats,
            "hw_counters": self._hw_counters,
        }
        self._gauges_of: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    # --- one report -----------------------------------------------------------------
    def update(self, report: object) -> list[str]:
        """Take one report; returns the errors it tells (one line each)."""
        if not isinstance(report, Mapping) or "neuron_runtime_data" not in report:
            raise ReportError("not a neuron-monitor report (no neuron_runtime_data)")
        told: list[str] = []
        try:
            for entry in report.get("neuron_runtime_data") or []:
                told += self._runtime(entry)
            system = report.get("system_data") or {}
            vcpu, memory = system.get("vcpu_usage"), system.get("memory_info")
            if vcpu and not vcpu["error"]:
                self._vcpu(vcpu)
            if memory and not memory["error"]:
                for key, metric in self.memory.items():
                    metric.set(memory[key])
            for info, key in (
                (self.instance, "instance_data"),
                (self.hardware, "neuron_hardware_info"),
            ):
                found = report.get(key)
                if isinstance(found, Mapping) and not found.get("error"):
                    info.info({k: str(v) for k, v in found.items() if k != "error"})
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ReportError(f"a report not as neuron-monitor writes it: {exc!r}") from None
        return told

    def _runtime(self, entry: Mapping[str, Any]) -> list[str]:
        runtime = (str(entry["neuron_runtime_index"]), str(entry.get("address", "")))
        if entry.get("error"):
            self.up.labels(*runtime).set(0)
            for gauge, labels in self._gauges_of.pop(runtime, set()):
                gauge.remove(*labels)
            return [f"runtime {runtime[0]} ({runtime[1]}): {entry['error']}"]
        self.up.labels(*runtime).set(1)
        told = []
        for group, data in entry.get("report", {}).items():
            if data.get("error"):
                told.append(f"runtime {runtime[0]} ({runtime[1]}): {group}: {data['error']}")
            elif group in self._handlers:
                self._handlers[group](runtime, data)
        return told

    def _set(
        self, gauge: Gauge, runtime: tuple[str, str], labels: tuple[str, ...], value: float
    ) -> None:
        full = (*runtime, *labels)
        gauge.labels(*full).set(value)
        self._gauges_of.setdefault(runtime, set()).add((gauge, full))

    # --- the groups -----------------------------------------------------------------
    def _neuroncore_counters(self, runtime: tuple[str, str], data: dict) -> None:
        for nc, counters in data["neuroncores_in_use"].items():
            self._set(self.utilization, runtime, (nc,), counters["neuroncore_utilization"] / 100)

    def _memory_used(self, runtime: tuple[str, str], data: dict) -> None:
        for location, used in data["neuron_runtime_used_bytes"].items():
            self._set(self.runtime_memory, runtime, (location,), used)

    def _runtime_vcpu(self, runtime: tuple[str, str], data: dict) -> None:
        for usage_type in ("user", "system"):
            self._set(
                self.runtime_vcpu, runtime, (usage_type,), data["vcpu_usage"][usage_type] / 100
            )

    def _inference_stats(self, runtime: tuple[str, str], data: dict) -> None:
        for error_type, count in data["error_summary"].items():
            self.errors.labels(*runtime, error_type).inc(count)
        for status_type, count in data["inference_summary"].items():
            self.status.labels(*runtime, status_type).inc(count)
        latency = data["latency_stats"]
        for gauge, key in (
            (self.latency, "total_latency"),
            (self.device_latency, "device_latency"),
        ):
            for percentile, seconds in (latency.get(key) or {}).items():
                self._set(gauge, runtime, (percentile,), seconds)

    def _hw_counters(self, runtime: tuple[str, str], data: dict) -> None:
        for device in data["neuron_devices"]:
            index = str(device["neuron_device_index"])
            for counter, events in ((self.ecc, ECC_EVENTS), (self.hw_errors, OWN_HW_EVENTS)):
                for event in events:
                    if event in device:
                        counter.labels(*runtime, index, event).inc(device[event])

    def _vcpu(self, data: dict) -> None:
        self.vcpu_count.set(len(data["usage_data"]))
        average = data["average_usage"]
        for usage_type, fields in VCPU_USAGE.items():
            self.vcpu_usage.labels(usage_type).set(
                min(100.0, sum(average[f] for f in fields)) / 100
            )


class _Handler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        assert isinstance(self.server, MetricsServer)
        self.connection.settimeout(self.server.read_timeout_s)  # each read and write

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """An HTTP server of a thread per connection, at most `max_connections` at once."""

    daemon_threads = True
    request_queue_size = 128  # a burst of connections waits to be accepted (or refused)

    def __init__(
        self,
        address: tuple[str, int],
        *,
        family: socket.AddressFamily,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.address_family = family
        self.read_timeout_s = read_timeout_s
        super().__init__(address, _Handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):  # a fresh socket's buffer takes it, or not
                request.setblocking(False)
                request.sendall(BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that times out or goes away is not an error worth a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def serve(
    registry: CollectorRegistry,
    port: int,
    host: str = DEFAULT_LISTEN_ADDRESS,
    *,
    max_connections: int = MAX_CONNECTIONS,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> tuple[MetricsServer, threading.Thread]:
    """Serve `registry` on http://host:port/metrics from a daemon thread; OSError when the
    address cannot be served. `server.shutdown()` and `server.server_close()` stop it."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server = MetricsServer(
        (str(address[0]), port),
        family=family,
        max_connections=max_connections,
        read_timeout_s=read_timeout_s,
    )
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
