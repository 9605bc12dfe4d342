"""Where Triton's own clients depend on Triton's protocol and words (issue 41, point 6), on
the real daemon, driven by the unmodified `tritonclient` over gRPC and HTTP and by Triton's
perf_analyzer: CUDA shared memory as Triton built without GPUs serves it, the v2 rule
against raw and typed contents in one request, a decoupled model refused at load, outputs
written to system shared memory answered over HTTP as Triton writes them, and Triton's
wording for unknown models, bad version strings and failed loads (our detail after it).

The model is Triton's `simple`: INT32 INPUT0, INPUT1 [-1, 16] -> OUTPUT0 = their sum,
OUTPUT1 = their difference (max_batch_size 8, its NEFF's batch buckets 1..16)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from kserve_daemon import perf_analyzer
from onnx import ModelProto, TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.proto import CHANNEL_OPTIONS

ROOT = Path(__file__).resolve().parents[3]
SIMPLE = "simple"
DECOUPLED = "repeat_int32"  # Triton's decoupled example model's name
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def simple_model() -> ModelProto:
    def tensor(name: str) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16])

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    inputs, outputs = [tensor("INPUT0"), tensor("INPUT1")], [tensor("OUTPUT0"), tensor("OUTPUT1")]
    graph = helper.make_graph(nodes, SIMPLE, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[tuple[DaemonProcess, int]]:
    """The daemon in explicit mode over a repository of `simple` (loaded) and a decoupled
    model (not), with its HTTP front; and that front's port."""
    repo = module_work / "models"
    neff = compile_model(simple_model(), dynamic_batch=bucket_ranges(1, 16), name=SIMPLE).neff
    for name in (SIMPLE, DECOUPLED):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.neff").write_bytes(neff)
    (repo / SIMPLE / "config.pbtxt").write_text("max_batch_size: 8\n")
    (repo / DECOUPLED / "config.pbtxt").write_text(
        "max_batch_size: 8\nmodel_transaction_policy { decoupled: true }\n"
    )
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit"]
    args += ["--load-model", SIMPLE, "--http-address", "127.0.0.1:0"]
    with DaemonProcess(sim_root=module_work / "sim", args=args) as proc:
        (line,) = [x for x in proc.log().splitlines() if "KServe v2 HTTP listening" in x]
        yield proc, int(line.rpartition(":")[2])
        log = proc.log()
    assert "Traceback" not in log, log  # no unexpected error in any request


@pytest.fixture(scope="module")
def grpc_client(served: tuple[DaemonProcess, int]) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url=served[0].address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(served: tuple[DaemonProcess, int]) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{served[1]}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(served: tuple[DaemonProcess, int]) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(served[0].address, options=CHANNEL_OPTIONS) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def refused(status: str, call: Callable[[], object]) -> str:
    """`call`'s error message, after checking its status (gRPC's code, or HTTP's)."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    error = caught.value
    message = str(error.message())
    assert error.status() == status, (error.status(), message)
    assert "Traceback" not in message
    return message


def http_post(port: int, path: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]


# --- CUDA shared memory, as Triton built without GPUs -------------------------------------


@pytest.mark.daemon
def test_cuda_shared_memory_status_and_unregister_succeed_register_is_refused(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    served: tuple[DaemonProcess, int],
) -> None:
    # gRPC: what Triton's shm examples and perf_analyzer call first
    assert not grpc_client.get_cuda_shared_memory_status().regions
    grpc_client.unregister_cuda_shared_memory()
    grpc_client.unregister_cuda_shared_memory("gpu")
    words = refused(
        str(grpc.StatusCode.NOT_FOUND), lambda: grpc_client.get_cuda_shared_memory_status("gpu")
    )
    assert words.startswith("Unable to find cuda shared memory region: 'gpu'")
    words = refused(
        str(grpc.StatusCode.INVALID_ARGUMENT),
        lambda: grpc_client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64),
    )
    assert words.startswith("failed to register CUDA shared memory region: 'gpu', GPUs not")
    assert "SystemSharedMemoryRegister" in words  # what to use instead

    # HTTP: the same, with and without a region's name
    assert http_client.get_cuda_shared_memory_status() == []
    http_client.unregister_cuda_shared_memory()
    http_client.unregister_cuda_shared_memory("gpu")
    words = refused("404", lambda: http_client.get_cuda_shared_memory_status("gpu"))
    assert words.startswith("Unable to find cuda shared memory region: 'gpu'")
    register = "/v2/cudasharedmemory/region/gpu/register"
    status, words = http_post(served[1], register, b'{"raw_handle": {"b64": ""}}')
    assert status == 400
    assert words.startswith("failed to register CUDA shared memory region: 'gpu', GPUs not")
    assert "/v2/systemsharedmemory" in words


@pytest.mark.daemon
def test_a_system_region_is_not_cuda_shared_memory(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    key = f"/nrtd-cuda-{time.monotonic_ns()}"
    handle = shm.create_shared_memory_region("sysregion", key, 64)
    try:
        grpc_client.register_system_shared_memory("sysregion", key, 64)
        words = refused(
            str(grpc.StatusCode.NOT_FOUND),
            lambda: grpc_client.get_cuda_shared_memory_status("sysregion"),
        )
        assert words == (
            "The region named 'sysregion' is registered as system shared memory, not CUDA "
            "shared memory"
        )
        grpc_client.unregister_cuda_shared_memory()  # CUDA's only: the system region stays
        assert "sysregion" in grpc_client.get_system_shared_memory_status().regions
    finally:
        grpc_client.unregister_system_shared_memory("sysregion")
        shm.destroy_shared_memory_region(handle)


# --- raw and typed contents ----------------------------------------------------------------


def typed_request() -> service_pb2.ModelInferRequest:
    """Triton's `grpc_explicit_int_content_client` request: both inputs typed."""
    request = service_pb2.ModelInferRequest(model_name=SIMPLE)
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents[:] = values.reshape(-1).tolist()
    return request


@pytest.mark.daemon
def test_raw_input_contents_with_typed_contents_is_refused_naming_the_input(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    answer = stub.ModelInfer(typed_request())
    sums = np.frombuffer(answer.raw_output_contents[0], np.int32)
    np.testing.assert_array_equal(sums, (A + B).reshape(-1))

    for typed in ("INPUT0", "INPUT1"):  # one input raw, the other typed; then both given
        request = service_pb2.ModelInferRequest(model_name=SIMPLE)
        for name, values in (("INPUT0", A), ("INPUT1", B)):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            if name == typed:
                tensor.contents.int_contents[:] = values.reshape(-1).tolist()
            else:
                request.raw_input_contents.append(values.tobytes())
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        error: Any = caught.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith(
            f"contents field must not be specified when using raw_input_contents for "
            f"'{typed}' for model '{SIMPLE}'"
        ), error.details()
    mixed = typed_request()  # as Triton's example sends it: typed, and raw beside
    mixed.raw_input_contents.append(A[:, :8].tobytes())
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(mixed)
    error = caught.value
    assert "raw_input_contents for 'INPUT0' for model 'simple'" in error.details()


# --- decoupled models ------------------------------------------------------------------------


@pytest.mark.daemon
def test_a_decoupled_model_is_refused_at_load_with_its_reason(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    words = refused(str(grpc.StatusCode.INTERNAL), lambda: grpc_client.load_model(DECOUPLED))
    assert words.startswith(f"failed to load '{DECOUPLED}'"), words
    assert "decoupled" in words and "exactly once" in words
    words = refused("500", lambda: http_client.load_model(DECOUPLED))
    assert words.startswith(f"failed to load '{DECOUPLED}'") and "decoupled" in words
    assert not grpc_client.is_model_ready(DECOUPLED)
    (row,) = [m for m in grpc_client.get_model_repository_index().models if m.name == DECOUPLED]
    assert row.state == "UNAVAILABLE"
    assert "decoupled" in row.reason and "exactly once" in row.reason


# --- outputs in system shared memory, over HTTP --------------------------------------------


@pytest.mark.daemon
def test_http_outputs_in_shared_memory_come_back_as_triton_writes_them(
    http_client: httpclient.InferenceServerClient,
) -> None:
    key = f"/nrtd-out-{time.monotonic_ns()}"
    handle = shm.create_shared_memory_region("io", key, 256)
    try:
        shm.set_shared_memory_region(handle, [A, B])
        http_client.register_system_shared_memory("io", key, 256)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("io", 64, offset=0)
        inputs[1].set_shared_memory("io", 64, offset=64)
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("io", 64, offset=128)
        outputs[1].set_shared_memory("io", 64, offset=192)
        result = http_client.infer(SIMPLE, inputs, outputs=outputs)
        for name in ("OUTPUT0", "OUTPUT1"):  # no data, no parameters: as Triton writes it
            assert result.get_output(name) == {"name": name, "datatype": "INT32", "shape": [1, 16]}
        got = [shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=o) for o in (128, 192)]
        np.testing.assert_array_equal(got[0], A + B)
        np.testing.assert_array_equal(got[1], A - B)
    finally:
        http_client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


@pytest.mark.daemon
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(
    served: tuple[DaemonProcess, int], protocol: str
) -> None:
    """Triton's perf_analyzer (2.51, `make perf-analyzer`) with its inputs and outputs in
    system shared memory: over HTTP it read an output's parameters as binary data's and
    exited 99; over gRPC it could not unregister CUDA shared memory. A short run."""
    binary = perf_analyzer()
    url = f"127.0.0.1:{served[1]}" if protocol == "http" else f"unix://{served[0].socket_path}"
    command = [
        str(binary), "-m", SIMPLE, "-i", protocol, "-u", url, "--shared-memory", "system",
        "--measurement-mode", "count_windows", "--measurement-request-count", "20",
        "-s", "1000", "--max-trials", "3",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}: {said[-3000:]}"
    assert "Unable to unregister" not in said and "binary_data_size" not in said, said[-3000:]
    assert "Successful request count" in said


# --- Triton's wording ----------------------------------------------------------------------


@pytest.mark.daemon
def test_unknown_models_and_bad_versions_in_tritons_words(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    g_in = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    h_in = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in (*g_in, *h_in):
        tensor.set_data_from_numpy(A)
    not_found = str(grpc.StatusCode.NOT_FOUND)
    for call in (
        lambda: grpc_client.infer("wrong_model_name", g_in),
        lambda: grpc_client.get_model_metadata("wrong_model_name"),
    ):
        words = refused(not_found, call)
        assert words.startswith("Request for unknown model: 'wrong_model_name' is not found")
    for call in (
        lambda: http_client.infer("wrong_model_name", h_in),
        lambda: http_client.get_model_metadata("wrong_model_name"),
    ):
        words = refused("404", call)
        assert words.startswith("Request for unknown model: 'wrong_model_name' is not found")
    words = refused(not_found, lambda: grpc_client.infer(SIMPLE, g_in, model_version="7"))
    assert words.startswith(f"Request for unknown model: '{SIMPLE}' version 7 is not found")

    bad = "wrong_specification"
    said = "failed to get model version from specified version string 'wrong_specification'"
    invalid = str(grpc.StatusCode.INVALID_ARGUMENT)
    assert said in refused(invalid, lambda: grpc_client.infer(SIMPLE, g_in, model_version=bad))
    assert said in refused("400", lambda: http_client.infer(SIMPLE, h_in, model_version=bad))
    assert grpc_client.get_server_metadata().name == "neuron-rtd"  # ours, not "triton"


@pytest.mark.daemon
def test_failed_loads_in_tritons_words_and_a_config_override(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    """What Triton's model-control examples send: a malformed config, a model the
    repository does not hold, a file path too long (gRPC: INTERNAL, as Triton answers it,
    HTTP 500), and a good override whose max_batch_size is a string."""
    internal = str(grpc.StatusCode.INTERNAL)
    malformed = '"parameters": {"config": {{"max_batch_size": "16"}}}'
    poll = f"failed to load '{SIMPLE}', failed to poll from model repository: "
    assert refused(internal, lambda: grpc_client.load_model(SIMPLE, config=malformed)).startswith(
        poll
    )
    assert refused("500", lambda: http_client.load_model(SIMPLE, config=malformed)).startswith(poll)
    long_path = {"file:" + "A" * 256: b"a"}
    words = refused(internal, lambda: grpc_client.load_model(SIMPLE, config="{}", files=long_path))
    assert words.startswith(poll)
    for status, load in ((internal, grpc_client.load_model), ("500", http_client.load_model)):
        words = refused(status, lambda: load("wrong_model_name"))  # noqa: B023 (called here)
        assert words.startswith("failed to load 'wrong_model_name', failed to poll"), words
    assert grpc_client.is_model_ready(SIMPLE)  # each refusal left the model serving
    try:
        grpc_client.load_model(SIMPLE, config='{"max_batch_size":"16"}')
        assert grpc_client.get_model_config(SIMPLE).config.max_batch_size == 16
        assert http_client.get_model_config(SIMPLE)["max_batch_size"] == 16
    finally:
        grpc_client.load_model(SIMPLE)  # back to its repository's config
    assert grpc_client.get_model_config(SIMPLE).config.max_batch_size == 8
