"""Ensembles on the real daemon, driven by the unmodified `tritonclient` over gRPC (its own
socket) and HTTP: composing NEFF models compiled from ONNX graphs, a chain and a
fan-out/fan-in answering as their steps computed by hand, the statistics of the steps and
of the ensemble, explicit-mode loads that bring the composing models with them, and the
ensembles refused at load (a missing composing model, a tensor no step writes, a cycle)
or whose step fails, each saying why."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kserve_daemon import http_port, perf_analyzer
from test_serving_ensemble import CHAIN, FAN, PRE, W_PRE, by_hand, ensemble, repository, step
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess

RNG = np.random.default_rng(5)
BROKEN = {
    "lonely": (
        ensemble(PRE, step("nowhere", {"x": "h"}, {"y": "OUT"})),
        "ensemble lonely contains models that are not available or ambiguous: nowhere",
    ),
    "ghost": (
        ensemble(PRE, step("join", {"a": "h", "b": "ghost"}, {"s": "OUT"})),
        "in ensemble 'ghost', ensemble tensor 'ghost' is not connected: step 2 (model 'join') "
        "reads it",
    ),
    "loop": (
        ensemble(
            PRE,
            step("join", {"a": "h", "b": "t2"}, {"s": "t1"}),
            step("left", {"x": "t1"}, {"y": "t2"}),
            step("right", {"x": "t2"}, {"y": "OUT"}),
        ),
        "its steps form a cycle (step 2 (model 'join') -> 't1' -> step 3 (model 'left') -> "
        "'t2' -> step 2 (model 'join'))",
    ),
}
STRICT = ensemble(PRE, step("fixed", {"x": "h"}, {"y": "OUT"}))  # its step takes 1 row


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[DaemonProcess]:
    """Explicit mode, only the ensemble "fan" loaded at start; HTTP on a free port."""
    configs = {name: config for name, (config, _) in BROKEN.items()}
    root = repository(module_work / "models", chain=CHAIN, fan=FAN, strict=STRICT, **configs)
    args = ["--model-repository", str(root), "--model-control-mode", "explicit"]
    args += ["--load-model", "fan", "--http-address", "127.0.0.1:0"]
    with DaemonProcess(sim_root=module_work / "sim", args=args) as proc:
        yield proc
        log = proc.log()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(served: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(url=served.address)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def http(served: DaemonProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{http_port(served)}")
    yield triton
    triton.close()


def x_of(rows: int) -> np.ndarray:
    return RNG.standard_normal((rows, 4)).astype(np.float32)


def grpc_infer(
    client: grpcclient.InferenceServerClient, model: str, x: np.ndarray, *outputs: str
) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("IN", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    asked = [grpcclient.InferRequestedOutput(name) for name in outputs] or None
    return client.infer(model, [tensor], outputs=asked)


def close(got: np.ndarray | None, want: np.ndarray) -> None:
    assert got is not None
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.daemon
def test_loading_the_ensemble_at_start_loaded_its_composing_models(
    client: grpcclient.InferenceServerClient,
) -> None:
    ready = {m.name for m in client.get_model_repository_index().models if m.state == "READY"}
    assert ready == {"fan", "pre", "left", "right", "join"}
    metadata = client.get_model_metadata("fan", as_json=True)
    assert (metadata["platform"], metadata["versions"]) == ("ensemble", ["1"])
    assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [("IN", ["-1", "4"])]
    config = client.get_model_config("fan").config
    assert [s.model_name for s in config.ensemble_scheduling.step] == [
        "pre",
        "left",
        "right",
        "join",
    ]


@pytest.mark.daemon
def test_a_fan_out_and_fan_in_answers_as_by_hand_over_grpc_and_http(
    client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    x = x_of(3)
    expected = by_hand(x)
    answer = grpc_infer(client, "fan", x)
    close(answer.as_numpy("OUT"), expected["sum"])
    close(answer.as_numpy("H"), expected["h"])
    only = grpc_infer(client, "fan", x, "H")
    assert only.as_numpy("OUT") is None
    close(only.as_numpy("H"), expected["h"])
    for binary in (True, False):
        tensor = httpclient.InferInput("IN", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("OUT", binary_data=binary)]
        close(http.infer("fan", [tensor], outputs=outputs).as_numpy("OUT"), expected["sum"])


@pytest.mark.daemon
def test_statistics_count_each_step_in_its_model_and_the_request_once_in_the_ensemble(
    client: grpcclient.InferenceServerClient,
) -> None:
    names = ("fan", "pre", "left", "right", "join")

    def stats() -> dict[str, Any]:
        return {n: client.get_inference_statistics(n).model_stats[0] for n in names}

    before = stats()
    for rows in (1, 2, 4):
        grpc_infer(client, "fan", x_of(rows))
    after = stats()
    for name in names:
        was, now = before[name], after[name]
        assert now.inference_count - was.inference_count == 7, name
        assert now.execution_count - was.execution_count == 3, name
    fan = after["fan"].inference_stats
    summed = sum(after[n].inference_stats.compute_infer.ns for n in names[1:])
    assert fan.compute_infer.count == fan.success.count
    assert 0 < fan.compute_infer.ns <= summed  # (the steps may also be called alone)


@pytest.mark.daemon
def test_an_explicit_load_of_an_ensemble_serves_it(
    client: grpcclient.InferenceServerClient,
) -> None:
    client.load_model("chain")
    assert client.is_model_ready("chain")
    x = x_of(2)
    close(grpc_infer(client, "chain", x).as_numpy("OUT"), by_hand(x)["left"])


@pytest.mark.daemon
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_an_ensemble_that_cannot_run_is_refused_at_load_saying_why(
    client: grpcclient.InferenceServerClient, name: str
) -> None:
    words = BROKEN[name][1]
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name)
    assert words in str(caught.value.message()), caught.value.message()
    (row,) = [m for m in client.get_model_repository_index().models if m.name == name]
    assert row.state == "UNAVAILABLE" and words in row.reason, row
    with pytest.raises(InferenceServerException) as refused:
        grpc_infer(client, name, x_of(1))
    assert refused.value.status() == str(grpc.StatusCode.UNAVAILABLE)


@pytest.mark.daemon
def test_a_steps_error_comes_back_on_the_ensembles_request_naming_its_model(
    client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    client.load_model("strict")
    x = x_of(1)
    close(grpc_infer(client, "strict", x).as_numpy("OUT"), np.maximum(by_hand(x)["h"] @ W_PRE, 0))
    with pytest.raises(InferenceServerException) as caught:
        grpc_infer(client, "strict", x_of(2))
    said = str(caught.value.message())
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert said.startswith("in ensemble 'strict', step 2 (model 'fixed'): "), said
    assert "input 'x' has shape [2, 4]; model 'fixed' takes [1, 4]" in said
    tensor = httpclient.InferInput("IN", [2, 4], "FP32")
    tensor.set_data_from_numpy(x_of(2))
    with pytest.raises(InferenceServerException) as over_http:
        http.infer("strict", [tensor])
    assert over_http.value.status() == "400"
    assert "step 2 (model 'fixed')" in str(over_http.value.message())


@pytest.mark.daemon
def test_perf_analyzer_drives_the_ensemble_and_reports_its_composing_models(
    served: DaemonProcess,
) -> None:
    """Triton's load generator reads the ensemble's config and asks each composing
    model's statistics, as it does of Triton (`make perf-analyzer` installs it)."""
    tool = perf_analyzer()
    url = served.address.replace("unix:", "unix://", 1)
    args = ["-m", "fan", "-i", "grpc", "-u", url, "-b", "2", "--concurrency-range", "2"]
    # -s 1000: any throughput counts as stable (this asks that it runs and reports, not how
    # fast: on a busy host perf_analyzer's own stability check fails with exit 2)
    args += ["--measurement-interval", "1000", "-s", "1000", "--max-trials", "3"]
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert "Composing models:" in said, said
    counts = [int(n) for n in re.findall(r"Inference count: (\d+)", said)]
    assert len(counts) == 5, said  # the ensemble's, and each step's
    # each model's statistics are read apart, while the 2 requests (4 rows) in flight run
    assert min(counts) > 0 and max(counts) - min(counts) <= 4, said
    for name in ("join", "left", "pre", "right"):
        assert f"{name}, version: 1" in said, said
