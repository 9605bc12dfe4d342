"""Listening as Triton's users expect: the gRPC services on a TCP address beside the
daemon's socket (`--grpc-address`, tritonclient's `localhost:PORT`), and `GET /metrics`
in Triton's names (`--metrics-address`), read by prometheus-client's parser and scraped
by a real Prometheus; both loopback only unless allow_remote_clients, both a clear
startup error on an address in use."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from monitor_helpers import free_port, http_get, stop, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_kserve_grpc import (
    fp32_input,
    in_threads,
    settings,
    start_refused,
    stats_of,
    two_outputs_model,
)
from test_service_user import as_user
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.daemon.config import remote_warnings
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import kserve_pb
from neuron_rtd.server import CallerOf
from neuron_rtd.server.metrics import MEMORY, MODEL_METRICS, UTILIZATION, Metrics
from neuron_rtd.tools.monitor.exporter import Exporter
from neuron_rtd.typed_json import ConfigError

MLP = "mlp"  # x [1, 8] -> probs [1, 4]; no batching
TWO = "two"  # x [N, 16] -> y, z; batch 1..8, dynamic batching, 2 s queue delay (8 rows: at once)
SLOW = "slow"  # the same NEFF, its queue delay 60 s: a lone request waits in the queue
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass(frozen=True)
class Served:
    proc: DaemonProcess
    grpc_port: int  # tritonclient's localhost:PORT
    metrics_port: int
    mlp: SampleModel


def logged_port(proc: DaemonProcess, what: str) -> int:
    """The port the daemon's log says `what` listens on (it was given port 0)."""
    found = re.search(re.escape(what) + r" (?:http://)?127\.0\.0\.1:(\d+)", proc.log())
    assert found, proc.log()
    return int(found[1])


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[Served]:
    path = module_work / "models"
    mlp = build_mlp((8, 8, 4))
    w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    two = compile_model(two_outputs_model(w), dynamic_batch=bucket_ranges(1, 8), name=TWO).neff
    for name, neff, delay_us in (
        (MLP, mlp.neff, 0),
        (TWO, two, 2_000_000),
        (SLOW, two, 60_000_000),
    ):
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.neff").write_bytes(neff)
        if delay_us:
            (path / name / "config.pbtxt").write_text(
                f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
            )
    args = ["--model-repository", str(path)]
    args += ["--grpc-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0"]
    with DaemonProcess(sim_root=module_work / "sim", args=args) as proc:
        yield Served(
            proc,
            logged_port(proc, "gRPC also listening on"),
            logged_port(proc, "Metrics listening on"),
            mlp,
        )
        log = proc.log()
    assert "Traceback" not in log, log
    assert "did not answer its health check" not in log, log  # the fronts' watch: both answer


@pytest.fixture(scope="module")
def tcp(served: Served) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient as a Triton user makes it: on localhost:PORT."""
    triton = grpcclient.InferenceServerClient(f"localhost:{served.grpc_port}")
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def unix(served: Served) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(served.proc.address)
    yield triton
    triton.close()


def scrape_text(port: int) -> str:
    return http_get(f"http://127.0.0.1:{port}/metrics")


def parse(text: str) -> Samples:
    """Every sample, by its family's name (the parser names a counter's samples with a
    `_total` the text does not have) and labels."""
    return {
        (family.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(port: int) -> Samples:
    return parse(scrape_text(port))


def of(samples: Samples, name: str, model: str) -> float:
    return samples[(name, frozenset({("model", model), ("version", "1")}))]


def mlp_input(served: Served, seed: int = 0) -> list[grpcclient.InferInput]:
    return [fp32_input(served.mlp.random_inputs(seed)["x"])]


# --- gRPC on a TCP address ------------------------------------------------------------


@pytest.mark.daemon
def test_tritonclient_on_localhost_beside_the_socket(
    served: Served,
    tcp: grpcclient.InferenceServerClient,
    unix: grpcclient.InferenceServerClient,
) -> None:
    assert tcp.is_server_ready() and unix.is_server_ready()
    assert tcp.get_server_metadata().name == unix.get_server_metadata().name
    inputs = served.mlp.random_inputs(1)
    expected = served.mlp.reference(inputs)["probs"]
    before = stats_of(unix, MLP).inference_count
    for client in (tcp, unix, tcp):
        got = client.infer(MLP, [fp32_input(inputs["x"])]).as_numpy("probs")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # one server: what either address serves is counted once, seen from both
    assert stats_of(tcp, MLP).inference_count == stats_of(unix, MLP).inference_count == before + 3
    # the stream, too, on the TCP address
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append(error or result)
        done.set()

    tcp.start_stream(callback)
    try:
        tcp.async_stream_infer(MLP, [fp32_input(inputs["x"])])
        assert done.wait(30)
    finally:
        tcp.stop_stream()
    (answer,) = answers
    np.testing.assert_allclose(answer.as_numpy("probs"), expected, rtol=1e-5, atol=1e-6)


STRANGER_UID = 65532  # in no group
STRANGER = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
client = grpcclient.InferenceServerClient(sys.argv[1])
x = grpcclient.InferInput("x", [1, 8], "FP32")
x.set_data_from_numpy(np.ones((1, 8), np.float32))
try:
    client.infer("mlp", [x])
    refused = ["", ""]
except InferenceServerException as error:
    refused = [error.status(), error.message()]
print(json.dumps({"ready": client.is_model_ready("mlp"), "infer": refused}))
"""


@pytest.mark.daemon
def test_on_the_tcp_address_a_stranger_only_asks(
    served: Served, unix: grpcclient.InferenceServerClient
) -> None:
    """The TCP address is gated as a TCP server_address is: a user in no group may ask
    whether a model is ready, not infer; the socket's callers are not asked (root's
    inference over it, as every test's here)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to call as another user")
    done = subprocess.run(
        [
            *as_user(STRANGER_UID, STRANGER_UID),
            sys.executable,
            "-c",
            STRANGER,
            f"localhost:{served.grpc_port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["ready"] is True
    status, message = said["infer"]
    assert status == "StatusCode.PERMISSION_DENIED", said
    assert f"uid {STRANGER_UID} is neither" in message and "unix socket" in message
    assert unix.infer(MLP, mlp_input(served)).as_numpy("probs").shape == (1, 4)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0"])
def test_a_tcp_caller_is_named_whatever_the_host_was_given_as(host: str) -> None:
    """--grpc-address localhost:PORT (or a wildcard) names its callers as 127.0.0.1 does:
    the owner of the connection's other end, here this process's user."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listening.accept()
            with accepted:
                caller_of = CallerOf("unix:/nowhere.sock")
                caller_of.listening(f"{host}:{port}")
                peer = f"ipv4:127.0.0.1:{client.getsockname()[1]}"
                caller = caller_of(SimpleNamespace(peer=lambda: peer))  # type: ignore[arg-type]
    assert caller.named is not None and caller.named.uid == os.geteuid()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--grpc-address", "8001"], "grpc_address must be HOST:PORT"),
        (["--grpc-address", "0.0.0.0:8001"], "grpc_address 0.0.0.0:8001 is not a loopback"),
        (["--grpc-address", "[::]:8001"], "grpc_address [::]:8001 is not a loopback"),
        (["-g", "127.0.0.1:8001", "--grpc-address", "127.0.0.1:8001"], "is server_address already"),
        (["--metrics-address", "127.0.0.1:70000"], "metrics_address must be HOST:PORT"),
        (["--metrics-address", "10.1.2.3:8002"], "metrics_address 10.1.2.3:8002 is not a loop"),
    ],
)
def test_an_address_beyond_loopback_or_not_one_is_refused(
    tmp_path: Path, flags: list[str], words: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        settings(tmp_path, flags)


def test_beyond_loopback_takes_allow_remote_clients_and_warns(tmp_path: Path) -> None:
    flags = ["--grpc-address", "0.0.0.0:8001", "--metrics-address", "[::]:8002"]
    config = settings(tmp_path, flags, {"allow_remote_clients": True})
    assert (config.grpc_address, config.metrics_address) == ("0.0.0.0:8001", "[::]:8002")
    grpc_said, metrics_said = remote_warnings(config)
    assert "gRPC API on 0.0.0.0:8001" in grpc_said and "plaintext" in grpc_said
    assert "metrics on [::]:8002" in metrics_said and "names and counts" in metrics_said
    quiet = settings(tmp_path, [], {"grpc_address": "127.0.0.1:8001", "metrics_address": None})
    assert quiet.grpc_address == "127.0.0.1:8001" and remote_warnings(quiet) == []


@pytest.mark.daemon
@pytest.mark.parametrize(
    ("flag", "says"),
    [("--grpc-address", "cannot serve gRPC on"), ("--metrics-address", "cannot serve metrics on")],
)
def test_an_address_in_use_stops_the_start(work: Path, flag: str, says: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = start_refused(work, flag, f"127.0.0.1:{port}")
    assert f"{says} 127.0.0.1:{port}: port {port} on 127.0.0.1 is in use" in said, said
    assert "Traceback" not in said


@pytest.mark.daemon
def test_both_listeners_stop_with_the_daemon(module_work: Path) -> None:
    args = ["--grpc-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0"]
    with DaemonProcess(sim_root=module_work / "sim-stop", args=args) as proc:
        grpc_port = logged_port(proc, "gRPC also listening on")
        metrics_port = logged_port(proc, "Metrics listening on")
        triton = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            assert triton.is_server_live()  # no repository: the service answers still
        finally:
            triton.close()
        assert "nv_inference_count" in scrape_text(metrics_port)
        assert proc.stop() == 0, proc.log()[-4000:]
    for port in (grpc_port, metrics_port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()


# --- metrics ----------------------------------------------------------------------------


@pytest.mark.daemon
def test_metrics_are_the_statistics_in_tritons_names(
    served: Served,
    tcp: grpcclient.InferenceServerClient,
    unix: grpcclient.InferenceServerClient,
) -> None:
    before = scrape(served.metrics_port)
    for seed in range(3):
        tcp.infer(MLP, mlp_input(served, seed))
    wrong = grpcclient.InferInput("x", [1, 9], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 9), np.float32))
    with pytest.raises(InferenceServerException):
        unix.infer(MLP, [wrong])
    text = scrape_text(served.metrics_port)
    after = parse(text)

    def grew(name: str, model: str = MLP) -> float:
        return of(after, name, model) - of(before, name, model)

    assert grew("nv_inference_request_success") == 3
    assert grew("nv_inference_request_failure") == 1
    assert grew("nv_inference_count") == grew("nv_inference_exec_count") == 3
    assert grew("nv_inference_request_duration_us") > 0
    assert grew("nv_inference_compute_infer_duration_us") > 0
    # Triton's names as they are on the wire: counters without `_total`, each typed
    for name, kind, _, _ in MODEL_METRICS:
        assert (
            f"# TYPE {name} {kind}\n" in text and f'\n{name}{{model="{MLP}",version="1"}} ' in text
        )
    assert "_total" not in text
    # the same numbers as the statistics extension answers: one count, two views
    stats = stats_of(unix, MLP)
    infer = stats.inference_stats
    assert of(after, "nv_inference_request_success", MLP) == infer.success.count
    assert of(after, "nv_inference_request_failure", MLP) == infer.fail.count
    assert of(after, "nv_inference_request_duration_us", MLP) == infer.success.ns // 1000
    assert of(after, "nv_inference_queue_duration_us", MLP) == infer.queue.ns // 1000
    assert (
        of(after, "nv_inference_compute_output_duration_us", MLP) == infer.compute_output.ns // 1000
    )
    assert of(after, "nv_inference_exec_count", MLP) == stats.execution_count
    # every ready version has its series, and only those
    models = {dict(labels)["model"] for (name, labels) in after if name == "nv_inference_count"}
    assert models == {MLP, TWO, SLOW}


@pytest.mark.daemon
def test_dynamic_batching_counts_inferences_over_executions(
    served: Served, unix: grpcclient.InferenceServerClient
) -> None:
    before = scrape(served.metrics_port)
    x = np.ones((1, 16), np.float32)

    def send() -> None:
        own = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        try:
            own.infer(TWO, [fp32_input(x)])
        finally:
            own.close()

    errors = in_threads(8, send)
    assert not errors, [str(e) for e in errors[:3]]
    after = scrape(served.metrics_port)
    inferences = of(after, "nv_inference_count", TWO) - of(before, "nv_inference_count", TWO)
    executions = of(after, "nv_inference_exec_count", TWO) - of(
        before, "nv_inference_exec_count", TWO
    )
    assert inferences == 8 and 0 < executions < 8
    assert of(after, "nv_inference_exec_count", TWO) == stats_of(unix, TWO).execution_count
    assert of(after, "nv_inference_queue_duration_us", TWO) > 0  # each waited for the batch


@pytest.mark.daemon
def test_a_request_waiting_for_its_batch_is_pending(
    served: Served, unix: grpcclient.InferenceServerClient
) -> None:
    assert of(scrape(served.metrics_port), "nv_inference_pending_request_count", SLOW) == 0
    answered: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answered.append(error or result)
        done.set()

    x = np.ones((1, 16), np.float32)
    unix.async_infer(SLOW, [fp32_input(x)], callback)
    wait_for(
        lambda: of(scrape(served.metrics_port), "nv_inference_pending_request_count", SLOW) == 1,
        "the request counted as pending while it waits out the queue delay",
        timeout_s=30,
    )
    # a full batch runs at once, taking the waiting request along
    unix.infer(SLOW, [fp32_input(np.ones((7, 16), np.float32))])
    assert done.wait(30) and not isinstance(answered[0], Exception), answered
    assert of(scrape(served.metrics_port), "nv_inference_pending_request_count", SLOW) == 0


@pytest.mark.daemon
def test_the_neuroncores_own_metrics(served: Served, tcp: grpcclient.InferenceServerClient) -> None:
    running = threading.Event()
    running.set()

    def infer() -> None:  # the NC stays busy until a scrape has seen it
        seed = 0
        while running.is_set():
            tcp.infer(MLP, mlp_input(served, seed))
            seed += 1

    worker = threading.Thread(target=infer)
    worker.start()
    try:
        busy = wait_for(
            lambda: [
                value
                for (name, _), value in scrape(served.metrics_port).items()
                if name == UTILIZATION[0] and value > 0
            ],
            "a busy NeuronCore in a scrape",
            timeout_s=30,
        )
    finally:
        running.clear()
        worker.join(30)
    assert all(0 < value <= 1 for value in busy)
    samples = scrape(served.metrics_port)
    ncs = [labels for (name, labels) in samples if name == UTILIZATION[0]]
    assert sorted(int(dict(labels)["neuroncore"]) for labels in ncs) == list(range(16))
    memory = {
        dict(labels)["memory_location"]: v for (n, labels), v in samples.items() if n == MEMORY[0]
    }
    assert memory["host"] > 0 and memory["neuron_device"] > 0  # three models hold DRAM


def test_the_neuroncore_names_are_neuron_monitor_prometheus_ones() -> None:
    """One name per metric: the daemon's and the exporter's NeuronCore metrics agree."""
    exporter = Exporter()
    assert exporter.utilization._name == UTILIZATION[0]
    assert exporter.utilization._documentation == UTILIZATION[2]
    assert exporter.runtime_memory._name == MEMORY[0]
    assert exporter.runtime_memory._documentation == MEMORY[2]


def test_a_model_name_of_any_characters_is_escaped() -> None:
    name = 'quo"te\\back\nline'
    response = kserve_pb.ModelStatisticsResponse()
    stats = response.model_stats.add(name=name, version="1", inference_count=5)
    stats.inference_stats.success.count = 5
    serving = SimpleNamespace(
        model_statistics=lambda: response, pending_requests=lambda: {(name, "1"): 2}
    )
    nc = SimpleNamespace(vnc=0, busy_ns=0)
    runtime = SimpleNamespace(
        snapshot=lambda: SimpleNamespace(time_ns=1, ncs=[nc], rss_bytes=10),
        devices=lambda: [SimpleNamespace(memory_used=(3, 4))],
    )
    samples = parse(Metrics(serving, runtime).render().decode())  # type: ignore[arg-type]
    assert of(samples, "nv_inference_count", name) == 5
    assert of(samples, "nv_inference_pending_request_count", name) == 2
    assert samples[(MEMORY[0], frozenset({("memory_location", "neuron_device")}))] == 7


@pytest.mark.daemon
def test_the_metrics_route_answers_get_only(served: Served) -> None:
    def ask(method: str, path: str) -> tuple[int, bytes, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", served.metrics_port, timeout=10)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            return response.status, response.read(), response.headers
        finally:
            connection.close()

    status, body, headers = ask("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    status, body, _ = ask("HEAD", "/metrics")
    assert (status, body) == (200, b"")
    status, body, headers = ask("POST", "/metrics")
    assert status == 405 and headers["Allow"] == "GET, HEAD" and b"GET only" in body
    status, body, _ = ask("GET", "/v2/models")
    assert status == 404 and b"/metrics" in body


# --- a real Prometheus --------------------------------------------------------------------

PROMETHEUS = shutil.which("prometheus")


@pytest.mark.daemon
@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary (Debian's `prometheus` package; scripts/bootstrap.sh installs it)",
)
def test_a_real_prometheus_follows_the_counts(
    served: Served, unix: grpcclient.InferenceServerClient, work: Path
) -> None:
    """Prometheus scrapes /metrics each second; what its query API answers moves with the
    inferences, successes and failures, and agrees with the statistics."""
    assert PROMETHEUS is not None
    port = free_port()
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: triton\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{served.metrics_port}']\n"
    )

    def query(expression: str) -> float | None:
        url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expression)}"
        answer = json.loads(http_get(url))
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def seen(name: str, value: float) -> bool:
        return query(f'{name}{{job="triton",model="{MLP}",version="1"}}') == value

    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
        text=True,
    )
    try:
        for seed in range(4):
            unix.infer(MLP, mlp_input(served, seed))
        first = stats_of(unix, MLP).inference_stats
        wait_for(
            lambda: seen("nv_inference_request_success", first.success.count),
            "Prometheus's count of the successful requests",
            timeout_s=90,
        )
        for seed in range(5):
            unix.infer(MLP, mlp_input(served, seed))
        wrong = grpcclient.InferInput("x", [2, 8], "FP32")
        wrong.set_data_from_numpy(np.zeros((2, 8), np.float32))
        with pytest.raises(InferenceServerException):
            unix.infer(MLP, [wrong])
        then = stats_of(unix, MLP)
        assert then.inference_stats.success.count == first.success.count + 5
        wait_for(
            lambda: (
                seen("nv_inference_request_success", then.inference_stats.success.count)
                and seen("nv_inference_request_failure", then.inference_stats.fail.count)
                and seen("nv_inference_exec_count", then.execution_count)
            ),
            "Prometheus's counts after more requests and a failure",
            timeout_s=60,
        )
        rate = query(f'increase(nv_inference_request_success{{model="{MLP}"}}[1m])')
        assert rate is not None and rate > 0
    finally:
        stop(prometheus)
