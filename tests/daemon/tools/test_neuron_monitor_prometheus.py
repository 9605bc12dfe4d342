"""neuron-monitor-prometheus: real reports in on stdin, /metrics out over HTTP, read by
prometheus-client's parser and by a real Prometheus server when one is installed."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_helpers import command, config, free_port, http_get, stop, wait_for
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from neuron_rtd.cli.neuron_monitor_prometheus import parse_args
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.client.observe import Watch
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.tools.monitor.config import everything
from neuron_rtd.tools.monitor.exporter import DEFAULT_LISTEN_ADDRESS, MAX_CONNECTIONS, serve
from neuron_rtd.tools.monitor.monitor import Monitor

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of /metrics: (name, labels) -> value."""
    text = http_get(f"http://127.0.0.1:{port}/metrics")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (None: none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} samples"
    return found[0] if found else None


@pytest.fixture
def exporter() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen(
        command("neuron_monitor_prometheus", "--port", str(port), "--listen-address", "127.0.0.1"),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc, port
    stop(proc)


def test_no_metrics_before_the_first_report(exporter: tuple[subprocess.Popen[str], int]) -> None:
    """Before any report a scrape shows no samples, not zeros no report said."""
    proc, port = exporter
    assert proc.stdin is not None
    assert wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics") == "", "a scrape") is True
    proc.stdin.write(json.dumps({"neuron_runtime_data": []}) + "\n")
    proc.stdin.flush()
    got = wait_for(lambda: scrape(port), "the first report's metrics")
    assert value(got, "system_vcpu_count") == 0  # what that report said (nothing): served


def test_alone_on_a_terminal_it_says_what_it_waits_for() -> None:
    port = free_port()
    terminal, stdin = os.openpty()
    proc = subprocess.Popen(
        command("neuron_monitor_prometheus", "--port", str(port)),
        stdin=stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(stdin)
    assert proc.stderr is not None
    try:
        told, _, _ = select.select([proc.stderr], [], [], 60)
        line = proc.stderr.readline() if told else "(nothing)"
    finally:
        code = stop(proc)
        os.close(terminal)
    assert line == (
        f"neuron-monitor-prometheus: serving http://127.0.0.1:{port}/metrics from the reports "
        "read on stdin (none yet): run it as neuron-monitor | neuron-monitor-prometheus\n"
    )
    assert code == 0  # SIGTERM: its normal stop


def test_reports_in_metrics_out(
    daemon: DaemonProcess, exporter: tuple[subprocess.Popen[str], int]
) -> None:
    proc, port = exporter
    assert proc.stdin is not None and proc.stderr is not None
    sample = build_mlp((64, 32, 10), name="exported")
    monitor = Monitor(everything([daemon.address]))
    try:
        with Client(daemon.address) as client:
            model = client.load(sample.neff)
            for seed in range(5):
                model.infer(sample.random_inputs(seed))
            report = monitor.collect()
    finally:
        monitor.close()
    (entry,) = report["neuron_runtime_data"]
    (vnc,) = [
        nc
        for nc, c in entry["report"]["neuroncore_counters"]["neuroncores_in_use"].items()
        if c["loaded_models"]
    ]
    proc.stdin.write(json.dumps(report) + "\n")
    proc.stdin.write("not json\n")  # told and skipped
    proc.stdin.flush()
    runtime = {"runtime_index": "0", "runtime_address": daemon.address}

    got = wait_for(
        lambda: (s := scrape(port)) and value(s, "neuron_runtime_up", **runtime) == 1 and s,
        "the report's metrics",
    )
    utilization = value(got, "neuroncore_utilization_ratio", neuroncore=vnc, **runtime)
    assert utilization is not None and 0 < utilization <= 1
    assert value(got, "neuroncore_utilization_ratio", neuroncore="15", **runtime) == 0
    completed = value(got, "inference_status_total", status_type="completed", **runtime)
    assert completed is not None and completed >= 5
    assert value(got, "inference_errors_total", error_type="hardware", **runtime) == 0
    p50 = value(got, "inference_latency_seconds", percentile="p50", **runtime)
    p99 = value(got, "inference_latency_seconds", percentile="p99", **runtime)
    assert p50 is not None and p99 is not None and 0 < p50 <= p99 < 1
    assert value(got, "inference_device_latency_seconds", percentile="p50", **runtime) is not None
    device_bytes = value(
        got, "neuron_runtime_memory_used_bytes", memory_location="neuron_device", **runtime
    )
    assert (
        device_bytes
        == entry["report"]["memory_used"]["neuron_runtime_used_bytes"]["neuron_device"]
        > 0
    )
    assert (
        value(
            got,
            "hardware_ecc_events_total",
            neuron_device_index="3",
            event_type="mem_ecc_uncorrected",
            **runtime,
        )
        == 0
    )
    assert value(got, "system_vcpu_count") == len(report["system_data"]["vcpu_usage"]["usage_data"])
    assert (
        value(got, "system_memory_total_bytes")
        == report["system_data"]["memory_info"]["memory_total_bytes"]
    )
    assert value(got, "instance_info", instance_type="inf1.6xlarge") == 1
    assert value(got, "neuron_hardware_info", neuron_device_count="4") == 1

    # counters add up the periods; a runtime gone takes its gauges with it
    later = json.loads(json.dumps(report))
    stats = later["neuron_runtime_data"][0]["report"]["inference_stats"]
    stats["inference_summary"]["completed"] = 7
    gone = {
        **later,
        "neuron_runtime_data": [{**entry, "error": "no runtime answers", "report": {}}],
    }
    proc.stdin.write(json.dumps(later) + "\n" + json.dumps(gone) + "\n")
    proc.stdin.flush()
    after = wait_for(
        lambda: (s := scrape(port)) and value(s, "neuron_runtime_up", **runtime) == 0 and s,
        "the runtime's error",
    )
    assert (
        value(after, "inference_status_total", status_type="completed", **runtime) == completed + 7
    )
    assert value(after, "neuroncore_utilization_ratio", neuroncore=vnc, **runtime) is None

    proc.stdin.close()  # the end of the input ends it
    assert proc.wait(20) == 0
    err = proc.stderr.read()
    assert "line 2 skipped" in err and "no runtime answers" in err and "Traceback" not in err


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary (Debian's `prometheus` package; scripts/bootstrap.sh installs it)",
)
def test_a_real_prometheus_scrapes_the_neuroncores(daemon: DaemonProcess, work: Path) -> None:
    """neuron-monitor | neuron-monitor-prometheus, scraped by Prometheus, asked by its API."""
    assert PROMETHEUS is not None
    exporter_port, prometheus_port = free_port(), free_port()
    conf = config(work / "monitor.conf", [daemon.address])
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: neuron\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    sample = build_mlp((256, 256, 10), batch=8, name="scraped")
    running = threading.Event()
    running.set()
    procs: list[subprocess.Popen[str]] = []
    with Client(daemon.address) as client:
        model = client.load(sample.neff)
        with Watch(daemon.address) as watch:
            (vnc,) = [m.vncs[0] for m in watch.snapshot().models if m.id == model.id]

        def infer() -> None:  # the NC stays busy until Prometheus has seen it
            seed = 0
            while running.is_set():
                model.infer(sample.random_inputs(seed))
                seed += 1

        worker = threading.Thread(target=infer)
        worker.start()
        try:
            monitor = subprocess.Popen(
                command("neuron_monitor", "-c", str(conf)), stdout=subprocess.PIPE, text=True
            )
            procs.append(monitor)
            procs.append(
                subprocess.Popen(
                    command(
                        "neuron_monitor_prometheus",
                        "--port",
                        str(exporter_port),
                        "--listen-address",
                        "127.0.0.1",
                    ),
                    stdin=monitor.stdout,
                    text=True,
                )
            )
            assert monitor.stdout is not None
            monitor.stdout.close()  # the exporter's now
            procs.append(
                subprocess.Popen(
                    [
                        PROMETHEUS,
                        f"--config.file={work / 'prometheus.yml'}",
                        f"--storage.tsdb.path={work / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prometheus_port}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(work / "prometheus.log").open("w"),
                    text=True,
                )
            )
            query = urllib.parse.quote('neuroncore_utilization_ratio{job="neuron"} > 0')
            url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?query={query}"

            def busy_ncs() -> list[dict]:
                answer = json.loads(http_get(url))
                assert answer["status"] == "success", answer
                return list(answer["data"]["result"])

            found = wait_for(
                busy_ncs, "a busy NeuronCore through Prometheus's query API", timeout_s=90
            )
        finally:
            running.clear()
            worker.join(30)
            for proc in reversed(procs):  # Prometheus, the exporter, the monitor
                stop(proc)
    (series,) = found
    assert series["metric"]["runtime_address"] == daemon.address
    assert series["metric"]["neuroncore"] == str(vnc)
    assert 0 < float(series["value"][1]) <= 1


# --- the HTTP side: where it listens, and what idle connections cost ------------------


def test_listens_on_loopback_unless_told() -> None:
    assert parse_args([]).listen_address == DEFAULT_LISTEN_ADDRESS == "127.0.0.1"
    assert parse_args(["--listen-address", "0.0.0.0"]).listen_address == "0.0.0.0"
    server, _thread = serve(CollectorRegistry(), 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_idle_connections_hold_no_thread_past_the_cap() -> None:
    """500 connections that never send a request (half-open scrapes, a flood): at most
    MAX_CONNECTIONS of them hold a thread, the rest are answered 503 at once, the held
    ones are dropped after the read timeout, and a real scrape answers again."""
    registry = CollectorRegistry()
    Gauge("probe_value", "a probe", registry=registry).set(7)
    before = threading.active_count()
    # The timeout must outlast opening the 500 connections on a loaded machine: were the
    # first ones dropped meanwhile, later ones would take their slots and be held.
    read_timeout_s = 4.0
    server, _thread = serve(registry, 0, read_timeout_s=read_timeout_s)
    port = server.server_address[1]
    idle: list[socket.socket] = []
    try:
        opened = time.monotonic()
        for _ in range(500):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=15))
        assert time.monotonic() - opened < read_timeout_s, "too slow to open: the test is void"
        last = idle[-1]  # past the cap: refused at once
        assert last.recv(64).startswith(b"HTTP/1.0 503"), "the 500th connection was served"
        assert threading.active_count() <= before + 1 + MAX_CONNECTIONS
        first = idle[0]  # held, silent: dropped after the read timeout (not the socket's 15 s)
        assert first.recv(64) == b""
        samples = wait_for(
            lambda: scrape(port), "a scrape once the idle connections are dropped", timeout_s=10
        )
        assert samples[("probe_value", frozenset())] == 7
        assert threading.active_count() <= before + 1 + MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()
