"""The KServe v2 / Triton gRPC protocol, on the real daemon's own socket, driven by the
unmodified `tritonclient.grpc`: health and metadata, the model repository (explicit
mode), inference with raw and typed tensors and with system shared memory, the stream,
statistics with dynamic batching, and the protocol's errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from kserve_daemon import http_port
from onnx import ModelProto, TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.daemon.config import DaemonConfig, load_config, remote_http_warning
from neuron_rtd.daemon.main import DRAIN_GRACE_S, parse_args
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS
from neuron_rtd.typed_json import ConfigError

MLP = "mlp"  # build_mlp((8, 8, 4)): x [1, 8] FP32 -> probs [1, 4]; no batch axis
TWO = "two"  # x [N, 16] -> y = relu(x @ w), z = sigmoid(x @ w); batch 1..8, dynamic batching
EXTRA = "extra"  # in the repository, not loaded at start
DELAY_US = 20000
INVALID = grpc.StatusCode.INVALID_ARGUMENT
LoadRequest = service_pb2.RepositoryModelLoadRequest


@dataclass(frozen=True)
class Repo:
    path: Path
    mlp: SampleModel
    two_w: np.ndarray

    def two_reference(self, x: np.ndarray) -> dict[str, np.ndarray]:
        h = x @ self.two_w
        return {"y": np.maximum(h, 0), "z": 1 / (1 + np.exp(-h))}


def two_outputs_model(w: np.ndarray) -> ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("Sigmoid", ["h"], ["z"]),
    ]
    graph = helper.make_graph(nodes, TWO, [x], [y, z], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def repo(module_work: Path) -> Repo:
    path = module_work / "models"
    mlp = build_mlp((8, 8, 4))
    w = np.random.default_rng(7).standard_normal((16, 8)).astype(np.float32)
    two = compile_model(two_outputs_model(w), dynamic_batch=bucket_ranges(1, 8), name=TWO).neff
    for name, neff in ((MLP, mlp.neff), (TWO, two), (EXTRA, mlp.neff)):
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.neff").write_bytes(neff)
    (path / TWO / "config.pbtxt").write_text(
        f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}\n"
    )
    return Repo(path, mlp, w)


@pytest.fixture(scope="module")
def served(module_work: Path, repo: Repo) -> Iterator[DaemonProcess]:
    """The daemon serving the repository in explicit mode, two of its models loaded."""
    args = ["--model-repository", str(repo.path), "--model-control-mode", "explicit"]
    with DaemonProcess(
        sim_root=module_work / "sim", args=[*args, "--load-model", MLP, "--load-model", TWO]
    ) as proc:
        yield proc
        log = proc.log()
    assert "Traceback" not in log, log  # no unexpected error in any request


@pytest.fixture(scope="module")
def client(served: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(url=served.address)  # "unix:/path"
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def stub(served: DaemonProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's generated stub, for requests its helpers never make (typed contents,
    wrong sizes)."""
    with grpc.insecure_channel(served.address, options=CHANNEL_OPTIONS) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def messages() -> Iterator[list[str]]:
    """Every error message a test saw; none may carry a traceback."""
    seen: list[str] = []
    yield seen
    for message in seen:
        assert "Traceback" not in message and 'File "' not in message, message


def refused(
    messages: list[str], code: grpc.StatusCode, call: Callable[[], object]
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    error = caught.value
    messages.append(str(error.message()))
    assert error.status() == str(code), (error.status(), error.message())
    return error


def refused_raw(messages: list[str], code: grpc.StatusCode, call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    messages.append(error.details())
    assert error.code() == code, (error.code(), error.details())
    return str(error.details())


def fp32_input(x: np.ndarray) -> grpcclient.InferInput:
    """Input "x" (of both models) holding `x`."""
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- health and metadata --------------------------------------------------------------


@pytest.mark.daemon
def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name and meta.version
    extensions = set(meta.extensions)
    assert {"model_repository", "statistics", "system_shared_memory"} <= extensions
    assert "cuda_shared_memory" not in extensions


@pytest.mark.daemon
def test_model_metadata_and_config(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready(MLP) and client.is_model_ready(TWO)
    assert client.is_model_ready(TWO, "1") and not client.is_model_ready(EXTRA)
    meta = client.get_model_metadata(MLP)
    assert meta.name == MLP and list(meta.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [1, 8])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("probs", "FP32", [1, 4])
    ]
    meta = client.get_model_metadata(TWO, "1")
    assert [(t.name, list(t.shape)) for t in meta.inputs] == [("x", [-1, 16])]
    assert [(t.name, list(t.shape)) for t in meta.outputs] == [("y", [-1, 8]), ("z", [-1, 8])]

    config = client.get_model_config(TWO).config
    assert config.name == TWO and config.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [16])]
    assert [t.name for t in config.output] == ["y", "z"]
    assert config.dynamic_batching.max_queue_delay_microseconds == DELAY_US
    assert client.get_model_config(MLP).config.max_batch_size == 0


# --- inference ------------------------------------------------------------------------


@pytest.mark.daemon
def test_infer_raw(client: grpcclient.InferenceServerClient, repo: Repo) -> None:
    inputs = repo.mlp.random_inputs()
    result = client.infer(MLP, [fp32_input(inputs["x"])], request_id="r1")
    close(result.as_numpy("probs"), repo.mlp.reference(inputs)["probs"])
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MLP, "1", "r1")
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("probs", "FP32", [1, 4])


@pytest.mark.daemon
def test_infer_batched_and_a_subset_of_outputs(
    client: grpcclient.InferenceServerClient, repo: Repo
) -> None:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    expected = repo.two_reference(x)
    both = client.infer(TWO, [fp32_input(x)])
    assert [o.name for o in both.get_response().outputs] == ["y", "z"]
    close(both.as_numpy("y"), expected["y"])
    close(both.as_numpy("z"), expected["z"])
    only_z = client.infer(TWO, [fp32_input(x)], outputs=[grpcclient.InferRequestedOutput("z")])
    assert [o.name for o in only_z.get_response().outputs] == ["z"]
    assert only_z.as_numpy("y") is None
    close(only_z.as_numpy("z"), expected["z"])


@pytest.mark.daemon
def test_infer_typed_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, repo: Repo, messages: list[str]
) -> None:
    inputs = repo.mlp.random_inputs()
    request = service_pb2.ModelInferRequest(model_name=MLP, id="typed")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend(inputs["x"].reshape(-1).tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed" and len(response.raw_output_contents) == 1
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(1, 4)
    close(got, repo.mlp.reference(inputs)["probs"])

    del tensor.contents.fp32_contents[-1]
    words = refused_raw(
        messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: stub.ModelInfer(request)
    )
    assert "'x'" in words and "8" in words and "7" in words
    half = service_pb2.ModelInferRequest(model_name=MLP)
    half.inputs.add(name="x", datatype="FP16", shape=[1, 8]).contents.fp32_contents.extend([0] * 8)
    words = refused_raw(messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: stub.ModelInfer(half))
    assert "'x'" in words and "raw" in words


@pytest.mark.daemon
def test_the_stream_answers_in_order_and_goes_on_after_an_error(
    client: grpcclient.InferenceServerClient, repo: Repo
) -> None:
    answers: list[tuple[Any, Any]] = []
    done = threading.Event()
    count = 24  # more than run at once: the stream keeps their order

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if len(answers) == count:
            done.set()

    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(count)]
    client.start_stream(callback=callback)
    try:
        for i, x in enumerate(xs):
            if i == 2:  # a bad one: the wrong shape
                bad = grpcclient.InferInput("x", [1, 7], "FP32")
                bad.set_data_from_numpy(x[:, :7])
                client.async_stream_infer(MLP, [bad], request_id=str(i))
            else:
                client.async_stream_infer(MLP, [fp32_input(x)], request_id=str(i))
        assert done.wait(30), answers
    finally:
        client.stop_stream()
    for i, (result, error) in enumerate(answers):
        if i == 2:
            assert result is None and error is not None
            assert "'x'" in str(error.message()) and "Traceback" not in str(error.message())
            continue
        assert error is None, (i, error.message())
        assert result.get_response().id == str(i)
        close(result.as_numpy("probs"), repo.mlp.reference({"x": xs[i]})["probs"])


@pytest.mark.daemon
def test_system_shared_memory_in_and_out(
    client: grpcclient.InferenceServerClient, repo: Repo, messages: list[str]
) -> None:
    inputs = repo.mlp.random_inputs()
    expected = repo.mlp.reference(inputs)["probs"]
    key = f"/nrt-kserve-{uuid.uuid4().hex[:8]}"
    in_size, out_size, out_offset = 32, 16, 64
    handle = shm.create_shared_memory_region("both", key, 128)
    try:
        shm.set_shared_memory_region(handle, [inputs["x"]])
        client.register_system_shared_memory("both", key, 128)
        status = client.get_system_shared_memory_status()
        assert [(r.name, r.key, r.byte_size) for r in status.regions.values()] == [
            ("both", key, 128)
        ]
        x = grpcclient.InferInput("x", [1, 8], "FP32")
        x.set_shared_memory("both", in_size)
        out = grpcclient.InferRequestedOutput("probs")
        out.set_shared_memory("both", out_size, offset=out_offset)
        result = client.infer(MLP, [x], outputs=[out])
        (output,) = result.get_response().outputs
        assert (output.name, list(output.shape)) == ("probs", [1, 4])
        assert output.parameters["shared_memory_region"].string_param == "both"
        assert output.parameters["shared_memory_byte_size"].int64_param == out_size
        got = shm.get_contents_as_numpy(handle, np.float32, [1, 4], offset=out_offset)
        close(got, expected)

        small = grpcclient.InferRequestedOutput("probs")
        small.set_shared_memory("both", 8, offset=out_offset)
        words = refused(
            messages,
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.infer(MLP, [x], outputs=[small]),
        ).message()
        assert "'probs'" in words and "16" in words
        short = grpcclient.InferInput("x", [1, 8], "FP32")
        short.set_shared_memory("both", in_size - 4)
        words = refused(
            messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: client.infer(MLP, [short])
        ).message()
        assert "'x'" in words and "32" in words and "28" in words
        client.unregister_system_shared_memory("both")
        assert not client.get_system_shared_memory_status().regions
        refused(messages, grpc.StatusCode.NOT_FOUND, lambda: client.infer(MLP, [x]))
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


# --- the repository -------------------------------------------------------------------


@pytest.mark.daemon
def test_repository_index_load_and_unload(
    client: grpcclient.InferenceServerClient,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    repo: Repo,
    messages: list[str],
) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(index) == {MLP, TWO, EXTRA}
    assert index[MLP].state == "READY" and index[EXTRA].state != "READY"
    ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True)).models
    assert {m.name for m in ready} == {MLP, TWO}
    client.load_model(EXTRA)
    try:
        assert client.is_model_ready(EXTRA)
        inputs = repo.mlp.random_inputs()
        close(
            client.infer(EXTRA, [fp32_input(inputs["x"])]).as_numpy("probs"),
            repo.mlp.reference(inputs)["probs"],
        )
    finally:
        client.unload_model(EXTRA)
    assert not client.is_model_ready(EXTRA)
    words = refused(
        messages, grpc.StatusCode.INTERNAL, lambda: client.load_model("no-such-model")
    ).message()  # Triton's status and words for a model it cannot read, then why
    assert words.startswith("failed to load 'no-such-model', failed to poll from model")

    # a model given by its files and config, as the protocol allows
    config = json.dumps({"name": "given", "backend": "neuron"})
    client.load_model("given", config=config, files={"file:1/model.neff": repo.mlp.neff})
    try:
        assert client.is_model_ready("given")
    finally:
        client.unload_model("given")


@pytest.mark.daemon
def test_the_daemons_tools_see_the_repositorys_models(
    served: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    command = ["-m", "neuron_rtd.cli.neuron_cli", "-a", served.address, "list-model", "--json"]
    done = subprocess.run(
        [sys.executable, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed) >= 2, listed
    assert all(m["state"] == "READY" for m in listed)


@pytest.mark.daemon
def test_none_mode_serves_all_refuses_changes_and_survives_a_broken_model(
    module_work: Path, repo: Repo, messages: list[str]
) -> None:
    path = module_work / "models-none"
    for name, neff in ((MLP, repo.mlp.neff), ("broken", b"not a NEFF at all")):
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.neff").write_bytes(neff)
    with DaemonProcess(
        sim_root=module_work / "sim-none", args=["--model-repository", str(path)]
    ) as proc:
        triton = grpcclient.InferenceServerClient(url=proc.address)
        try:
            assert triton.is_model_ready(MLP) and not triton.is_model_ready("broken")
            index = {m.name: m for m in triton.get_model_repository_index().models}
            assert index["broken"].state == "UNAVAILABLE" and index["broken"].reason
            assert "Traceback" not in index["broken"].reason
            refused(messages, grpc.StatusCode.UNAVAILABLE, lambda: triton.load_model(MLP))
            refused(messages, grpc.StatusCode.UNAVAILABLE, lambda: triton.unload_model(MLP))
            assert triton.is_model_ready(MLP)
            assert "broken" in proc.log()  # its failure logged, the daemon serving the rest
        finally:
            triton.close()


@pytest.mark.daemon
def test_without_a_repository_the_service_still_answers(
    module_work: Path, messages: list[str]
) -> None:
    """And an idle stream left open does not hold the daemon's stop for the drain's grace."""
    with DaemonProcess(sim_root=module_work / "sim-bare") as proc:
        triton = grpcclient.InferenceServerClient(url=proc.address)
        try:
            assert triton.is_server_live() and triton.is_server_ready()
            assert triton.get_server_metadata().name
            assert not triton.get_model_repository_index().models
            refused(messages, grpc.StatusCode.NOT_FOUND, lambda: triton.get_model_metadata(MLP))
            triton.start_stream(callback=lambda result, error: None)
            began = time.monotonic()
            assert proc.stop() == 0
            assert time.monotonic() - began < DRAIN_GRACE_S - 1
        finally:
            triton.close()


def in_threads(count: int, work: Callable[[], None]) -> list[BaseException]:
    """`work` in `count` threads started together; what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run() -> None:
        try:
            barrier.wait()
            work()
        except BaseException as exc:  # reported by the caller, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


@pytest.mark.daemon
def test_more_clients_than_a_model_runs_at_once_wait_their_turn(
    served: DaemonProcess, repo: Repo
) -> None:
    """As Triton queues them: no client is refused because others are running."""
    inputs = repo.mlp.random_inputs()
    expected = repo.mlp.reference(inputs)["probs"]

    def work() -> None:
        own = grpcclient.InferenceServerClient(url=served.address)
        try:
            for _ in range(5):
                close(own.infer(MLP, [fp32_input(inputs["x"])]).as_numpy("probs"), expected)
        finally:
            own.close()

    errors = in_threads(16, work)
    assert not errors, [str(e) for e in errors[:3]]


# --- statistics and dynamic batching --------------------------------------------------


def stats_of(client: grpcclient.InferenceServerClient, name: str) -> Any:
    (stats,) = client.get_inference_statistics(name).model_stats
    return stats


@pytest.mark.daemon
def test_statistics_count_and_dynamic_batching_merges(
    client: grpcclient.InferenceServerClient, served: DaemonProcess, repo: Repo
) -> None:
    before = stats_of(client, MLP)
    inputs = repo.mlp.random_inputs()
    for _ in range(3):
        client.infer(MLP, [fp32_input(inputs["x"])])
    after = stats_of(client, MLP)
    assert (after.name, after.version) == (MLP, "1")
    assert after.inference_count - before.inference_count == 3
    assert after.execution_count - before.execution_count == 3
    success = after.inference_stats.success
    assert success.count - before.inference_stats.success.count == 3
    assert success.ns > before.inference_stats.success.ns
    assert after.inference_stats.compute_infer.count > before.inference_stats.compute_infer.count

    start = stats_of(client, TWO)
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    expected = repo.two_reference(x)["y"]
    threads, each = 8, 4

    def send() -> None:
        own = grpcclient.InferenceServerClient(url=served.address)
        try:
            for _ in range(each):
                close(own.infer(TWO, [fp32_input(x)]).as_numpy("y"), expected)
        finally:
            own.close()

    errors = in_threads(threads, send)
    assert not errors, [str(e) for e in errors[:3]]
    end = stats_of(client, TWO)
    inferences = end.inference_count - start.inference_count
    executions = end.execution_count - start.execution_count
    assert inferences == threads * each
    assert 0 < executions < inferences
    assert any(b.batch_size > 1 for b in end.batch_stats)
    everything = client.get_inference_statistics().model_stats
    assert {s.name for s in everything} >= {MLP, TWO}


# --- errors ---------------------------------------------------------------------------


@pytest.mark.daemon
def test_the_protocols_errors(
    client: grpcclient.InferenceServerClient,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    messages: list[str],
) -> None:
    x = np.zeros((1, 8), np.float32)
    words = refused(
        messages, grpc.StatusCode.NOT_FOUND, lambda: client.infer("nope", [fp32_input(x)])
    ).message()
    assert "nope" in words
    refused(messages, grpc.StatusCode.NOT_FOUND, lambda: client.get_model_metadata("nope"))
    refused(messages, grpc.StatusCode.NOT_FOUND, lambda: client.get_model_config("nope"))
    refused(messages, grpc.StatusCode.NOT_FOUND, lambda: client.infer(MLP, [fp32_input(x)], "9"))

    wrong_type = grpcclient.InferInput("x", [1, 8], "INT32")
    wrong_type.set_data_from_numpy(x.astype(np.int32))
    words = refused(
        messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: client.infer(MLP, [wrong_type])
    ).message()
    assert "'x'" in words and "INT32" in words
    wrong_shape = fp32_input(np.zeros((2, 8), np.float32))
    words = refused(
        messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: client.infer(MLP, [wrong_shape])
    ).message()
    assert "'x'" in words
    too_big = fp32_input(np.zeros((9, 16), np.float32))
    refused(messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: client.infer(TWO, [too_big]))

    short = service_pb2.ModelInferRequest(model_name=MLP, raw_input_contents=[bytes(28)])
    short.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    words = refused_raw(messages, grpc.StatusCode.INVALID_ARGUMENT, lambda: stub.ModelInfer(short))
    assert "'x'" in words and "32" in words and "28" in words
    strings = service_pb2.ModelInferRequest(model_name=MLP, raw_input_contents=[bytes(32)])
    strings.inputs.add(name="x", datatype="BYTES", shape=[1, 8])  # 8 empty strings
    words = refused_raw(messages, INVALID, lambda: stub.ModelInfer(strings))
    assert "'x' has datatype BYTES" in words and "FP32" in words

    refused(messages, grpc.StatusCode.UNIMPLEMENTED, lambda: client.update_log_settings({}))


# --- the daemon's settings ------------------------------------------------------------


def settings(tmp_path: Path, flags: list[str], file: dict[str, Any] | None = None) -> DaemonConfig:
    path = tmp_path / "neuron-rtd.json"
    path.write_text(json.dumps(file or {}))
    path.chmod(0o644)
    return load_config(path=str(path), overrides=vars(parse_args(flags)))


def test_the_serving_flags_and_config_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = settings(tmp_path, [])
    assert (default.model_repository, default.model_control_mode, default.http_address) == (
        None,
        "none",
        None,
    )
    assert (default.load_models, default.repository_poll_secs) == ((), 15)
    flags = ["--model-repository", "models", "--model-control-mode", "explicit"]
    config = settings(tmp_path, [*flags, "--load-model", "a", "--load-model", "b"])
    assert config.model_repository == str(tmp_path / "models")  # made absolute
    assert (config.model_control_mode, config.load_models) == ("explicit", ("a", "b"))
    config = settings(
        tmp_path,
        ["--repository-poll-secs", "3"],
        {
            "model_repository": "/srv/models",
            "model_control_mode": "poll",
            "http_address": "127.0.0.1:8000",
        },
    )
    assert (config.model_repository, config.model_control_mode) == ("/srv/models", "poll")
    assert (config.repository_poll_secs, config.http_address) == (3, "127.0.0.1:8000")
    assert remote_http_warning(config) is None
    from_file = settings(
        tmp_path,
        [],
        {"model_repository": "/m", "model_control_mode": "explicit", "load_models": ["x"]},
    )
    assert from_file.load_models == ("x",)


@pytest.mark.parametrize(
    ("flags", "file", "words"),
    [
        ([], {"model_control_mode": "lazy"}, "model_control_mode must be one of none, explicit"),
        (["--model-control-mode", "explicit"], {}, "needs a model_repository"),
        (["--model-repository", "/m", "--load-model", "a"], {}, "explicit, not none"),
        ([], {"model_repository": "/m", "load_models": "a"}, "load_models"),
        ([], {"model_repository": "/m", "load_models": [""]}, "list of model names"),
        (["--repository-poll-secs", "0"], {}, "repository_poll_secs must be at least 1"),
        (["--http-address", "8000"], {}, "http_address must be HOST:PORT"),
        (["--http-address", "127.0.0.1:99999"], {}, "http_address must be HOST:PORT"),
        (["--http-address", "0.0.0.0:8000"], {}, "not a loopback address"),
        ([], {"http_address": 8000}, "http_address"),
    ],
)
def test_wrong_serving_settings_are_refused(
    tmp_path: Path, flags: list[str], file: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        settings(tmp_path, flags, file)


def test_a_remote_http_address_takes_allow_remote_clients_and_warns(tmp_path: Path) -> None:
    config = settings(tmp_path, ["--http-address", "[::]:8000"], {"allow_remote_clients": True})
    warning = remote_http_warning(config)
    assert warning and "[::]:8000" in warning and "plaintext" in warning


def start_refused(work: Path, *args: str) -> str:
    """The daemon started with `args`, which it refuses: what it says (exit 1)."""
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.daemon.main", "-g", f"unix:{work}/s.sock", *args],
        env={**env, "NEURON_SIM_ROOT": str(work / "sim")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert not (work / "s.sock").exists()
    return done.stderr


@pytest.mark.daemon
def test_a_missing_repository_stops_the_start(work: Path) -> None:
    said = start_refused(work, "--model-repository", str(work / "nowhere"))
    assert f"model repository {work / 'nowhere'}: no such folder" in said


@pytest.mark.daemon
def test_the_http_front_end_listens_where_it_is_told(module_work: Path, repo: Repo) -> None:
    pytest.importorskip("neuron_rtd.server.kserve_http")
    args = ["--model-repository", str(repo.path), "--http-address", "127.0.0.1:0"]
    with DaemonProcess(sim_root=module_work / "sim-http", args=args) as proc:
        port = http_port(proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10) as r:
            assert r.status == 200
        triton = grpcclient.InferenceServerClient(url=proc.address)  # gRPC as well
        try:
            assert triton.is_model_ready(MLP)
        finally:
            triton.close()
        code = proc.stop()
        assert code == 0, f"exit code {code}; the daemon's log ends:\n{proc.log()[-4000:]}"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=5)


@pytest.mark.daemon
def test_an_http_address_in_use_stops_the_start(work: Path) -> None:
    pytest.importorskip("neuron_rtd.server.kserve_http")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        said = start_refused(work, "--http-address", address)
    assert f"cannot serve HTTP on {address}" in said and "Traceback" not in said


@pytest.mark.daemon
def test_malformed_requests_say_what_is_wrong(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, messages: list[str]
) -> None:
    def request(raw: int = 1, **shape: list[int]) -> service_pb2.ModelInferRequest:
        made = service_pb2.ModelInferRequest(model_name=MLP, raw_input_contents=[bytes(32)] * raw)
        made.inputs.add(name="x", datatype="FP32", shape=shape.get("shape", [1, 8]))
        return made

    def invalid(made: Any, *words: str, code: grpc.StatusCode = INVALID) -> None:
        call = stub.RepositoryModelLoad if isinstance(made, LoadRequest) else stub.ModelInfer
        said = refused_raw(messages, code, lambda: call(made))
        assert all(w in said for w in words), said

    invalid(request(raw=2), "2 raw_input_contents for 1 inputs")
    twice = request(raw=2)
    twice.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    invalid(twice, "input 'x' is given twice")
    invalid(request(shape=[1, -8]), "input 'x'", "negative")
    invalid(request(raw=0), "input 'x' has no data")
    offset_only = request(raw=0)
    offset_only.inputs[0].parameters["shared_memory_offset"].int64_param = 0
    invalid(offset_only, "input 'x'", "no 'shared_memory_region'")
    numbered = request(raw=0)
    numbered.inputs[0].parameters["shared_memory_region"].int64_param = 3
    invalid(numbered, "input 'x'", "shared_memory_region")
    no_size = request(raw=0)
    no_size.inputs[0].parameters["shared_memory_region"].string_param = "r"
    invalid(no_size, "input 'x'", "shared_memory_byte_size", "missing")
    outputs = request()
    outputs.outputs.add(name="probs")
    outputs.outputs.add(name="probs")
    invalid(outputs, "output 'probs' is asked for twice")
    classes = request()
    classes.outputs.add(name="probs").parameters["classification"].int64_param = -2
    invalid(classes, "output 'probs'", "'classification'", "-2")

    unknown = LoadRequest(model_name=EXTRA)
    unknown.parameters["colour"].string_param = "blue"
    invalid(unknown, "'colour'", "'config'")
    config_bytes = LoadRequest(model_name=EXTRA)
    config_bytes.parameters["config"].bytes_param = b"{}"
    invalid(config_bytes, "'config' must be a string")
    file_text = LoadRequest(model_name=EXTRA)
    file_text.parameters["file:1/model.neff"].string_param = "neff"
    invalid(file_text, "'file:1/model.neff' must be bytes")
