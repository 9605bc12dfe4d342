"""The KServe v2 / Triton HTTP/REST front end (`neuron_rtd/server/kserve_http.py`) over the
real serving core in process, on a real loopback socket, driven by the unmodified
`tritonclient.http`, and by raw requests for what that client never sends: health and
metadata, the config as Triton renders it, inference with JSON and binary tensors
(compressed or not, outputs chosen one by one), system shared memory, the repository in
explicit mode, statistics, every error path with its status, and the server's life."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from test_kserve_grpc import TWO, two_outputs_model
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.neff.samples import SampleModel, build_mlp, build_relu
from neuron_rtd.proto import kserve_pb, model_config_pb
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.server.http_server import HttpServer
from neuron_rtd.server.kserve_http import HTTP_STATUS
from neuron_rtd.server.kserve_json import load_parameters, message_json, statistics_json
from neuron_rtd.serving import InferRequest, InferResponse, Serving, ServingApi, Status

MLP = "mlp"  # build_mlp((8, 8, 4)): x [1, 8] FP32 -> probs [1, 4]; no batch axis
EXTRA = "extra"  # in the repository, not loaded at start
BIG = "big"  # y = relu(x), x [1, 300000] FP32: 1.2 MB each way, past waitress's own buffers
HALF = "half"  # y = relu(x), x [2, 4] FP16
INT = "int"  # y = relu(x), x [2, 4] INT32
BIG_SHAPE = (1, 300_000)
INFER = f"/v2/models/{MLP}/infer"


@dataclass(frozen=True)
class Served:
    serving: Serving
    server: HttpServer
    root: Path
    mlp: SampleModel
    two_w: np.ndarray

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def two_reference(self, x: np.ndarray) -> dict[str, np.ndarray]:
        h = x @ self.two_w
        return {"y": np.maximum(h, 0), "z": 1 / (1 + np.exp(-h))}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("kserve-http") / "repo"
    mlp = build_mlp((8, 8, 4))
    w = np.random.default_rng(7).standard_normal((16, 8)).astype(np.float32)
    two = compile_model(two_outputs_model(w), dynamic_batch=bucket_ranges(1, 8), name=TWO).neff
    relus = {
        BIG: build_relu(BIG_SHAPE, name=BIG),
        HALF: build_relu((2, 4), name=HALF, dtype="float16"),
        INT: build_relu((2, 4), name=INT, dtype="int32"),
    }
    for name, neff in ((MLP, mlp.neff), (TWO, two), (EXTRA, mlp.neff), *relus.items()):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.neff").write_bytes(neff)
    (root / TWO / "config.pbtxt").write_text(
        "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    )
    with LocalRuntime() as local:
        serving = Serving(
            local.runtime, repository=root, control_mode="explicit", load_models=(MLP, TWO, *relus)
        )
        serving.start()
        server = HttpServer(serving, "127.0.0.1:0")
        server.start()
        try:
            yield Served(serving, server, root, mlp, w)
        finally:
            server.stop()
            serving.close()


@pytest.fixture
def client(served: Served) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(served.url)
    yield triton
    triton.close()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        message = self.json()["error"]
        assert isinstance(message, str)
        assert "Traceback" not in message and 'File "' not in message, message
        return message


def raw(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def raw_infer(port: int, document: object, binary: bytes = b"", **headers: str) -> Answer:
    head = json.dumps(document).encode()
    sent = {"Inference-Header-Content-Length": str(len(head))} if binary else {}
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    return raw(port, "POST", INFER, head + binary, sent)


def read_to_end(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (as it does after an error
    in the HTTP itself)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def x_input(x: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def refused(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    message = caught.value.message()
    assert "Traceback" not in message and 'File "' not in message, message
    return caught.value


# --- health and metadata ----------------------------------------------------------------
def test_health_as_triton_answers_it(served: Served, client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    for path in ("/v2/health/live", "/v2/health/ready"):
        answer = raw(served.server.port, "GET", path)
        assert (answer.status, answer.body) == (200, b"")


def test_not_ready_is_400_with_an_empty_body(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served.serving, "ready", lambda: False)
    answer = raw(served.server.port, "GET", "/v2/health/ready")
    assert (answer.status, answer.body) == (400, b"")


def test_server_metadata(client: Any) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "neuron-rtd" and meta["version"]
    assert {"binary_tensor_data", "system_shared_memory", "statistics"} <= set(meta["extensions"])


def test_model_metadata_and_readiness(served: Served, client: Any) -> None:
    meta = client.get_model_metadata(MLP)
    assert meta["name"] == MLP and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 8]}]
    assert meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [1, 4]}]
    two = client.get_model_metadata(TWO, "1")
    assert [o["name"] for o in two["outputs"]] == ["y", "z"]
    assert two["inputs"][0]["shape"] == [-1, 16]
    assert client.is_model_ready(MLP) and client.is_model_ready(TWO, "1")
    assert not client.is_model_ready(EXTRA) and not client.is_model_ready(MLP, "7")
    answer = raw(served.server.port, "GET", f"/v2/models/{EXTRA}/ready")
    assert (answer.status, answer.body) == (400, b"")


def test_config_as_triton_renders_it(served: Served, client: Any) -> None:
    config = client.get_model_config(TWO)
    assert config["name"] == TWO and config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["x"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"  # field names as in the .proto
    assert config["input"][0]["dims"] == [16]  # int64: JSON numbers, not strings
    delay = config["dynamic_batching"]["max_queue_delay_microseconds"]  # uint64
    assert delay == 2000 and isinstance(delay, int)
    answer = raw(served.server.port, "GET", f"/v2/models/{MLP}/versions/1/config")
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    assert answer.json()["input"][0]["dims"] == [1, 8]


# --- inference --------------------------------------------------------------------------
def test_infer_binary_equals_the_reference(served: Served, client: Any) -> None:
    x = served.mlp.random_inputs()
    result = client.infer(MLP, [x_input(x["x"])], request_id="r-1")
    np.testing.assert_allclose(result.as_numpy("probs"), served.mlp.reference(x)["probs"], 1e-5)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        MLP,
        "1",
        "r-1",
    )
    assert response["outputs"][0]["parameters"] == {"binary_data_size": 16}


def test_infer_json_equals_the_reference(served: Served, client: Any) -> None:
    x = served.mlp.random_inputs()
    out = httpclient.InferRequestedOutput("probs", binary_data=False)
    result = client.infer(MLP, [x_input(x["x"], binary=False)], model_version="1", outputs=[out])
    assert "data" in result.get_output("probs")
    np.testing.assert_allclose(result.as_numpy("probs"), served.mlp.reference(x)["probs"], 1e-5)


def test_nested_json_data_and_a_plain_json_answer(served: Served) -> None:
    x = served.mlp.random_inputs()["x"]
    document = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": x.tolist()}]}
    answer = raw_infer(served.server.port, document)
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    (output,) = answer.json()["outputs"]
    assert output["shape"] == [1, 4] and "id" not in answer.json()
    expected = served.mlp.reference({"x": x})["probs"]
    np.testing.assert_allclose(np.array(output["data"]).reshape(1, 4), expected, 1e-5)


def test_outputs_chosen_and_binary_per_output(served: Served, client: Any) -> None:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    expected = served.two_reference(x)
    only_z = client.infer(TWO, [x_input(x)], outputs=[httpclient.InferRequestedOutput("z")])
    assert [o["name"] for o in only_z.get_response()["outputs"]] == ["z"]
    np.testing.assert_allclose(only_z.as_numpy("z"), expected["z"], 1e-5)
    outputs = [
        httpclient.InferRequestedOutput("y", binary_data=False),
        httpclient.InferRequestedOutput("z", binary_data=True),
    ]
    mixed = client.infer(TWO, [x_input(x)], outputs=outputs)
    assert "data" in mixed.get_output("y") and "parameters" in mixed.get_output("z")
    for name in ("y", "z"):
        np.testing.assert_allclose(mixed.as_numpy(name), expected[name], 1e-5, 1e-6)
    every = client.infer(TWO, [x_input(x)])  # no outputs named: all, binary
    assert {o["name"] for o in every.get_response()["outputs"]} == {"y", "z"}
    assert all("binary_data_size" in o["parameters"] for o in every.get_response()["outputs"])


def test_binary_answer_layout(served: Served) -> None:
    x = served.mlp.random_inputs()["x"]
    document = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 8],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 32},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    answer = raw_infer(served.server.port, document, x.tobytes())
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/octet-stream"
    length = int(answer.headers["Inference-Header-Content-Length"])
    header = json.loads(answer.body[:length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    probs = np.frombuffer(answer.body[length:], dtype=np.float32).reshape(1, 4)
    np.testing.assert_allclose(probs, served.mlp.reference({"x": x})["probs"], 1e-5)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_answers(served: Served, client: Any, algorithm: str) -> None:
    x = served.mlp.random_inputs()
    result = client.infer(
        MLP,
        [x_input(x["x"])],
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_allclose(result.as_numpy("probs"), served.mlp.reference(x)["probs"], 1e-5)


def test_a_compressed_answer_is_marked(served: Served) -> None:
    x = served.mlp.random_inputs()["x"]
    document = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": x.tolist()}]}
    answer = raw_infer(served.server.port, document, Accept_Encoding="gzip;q=1.0, identity")
    assert answer.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(answer.body))["outputs"][0]["name"] == "probs"


def test_concurrent_requests_batch_and_each_gets_its_own(served: Served) -> None:
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(12)]
    results: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        triton = httpclient.InferenceServerClient(served.url)
        try:
            results[i] = triton.infer(TWO, [x_input(inputs[i])]).as_numpy("y")
        finally:
            triton.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(results[i], served.two_reference(x)["y"], 1e-5, 1e-6)


def test_a_large_body_each_way(client: Any) -> None:
    x = np.random.default_rng(2).standard_normal(BIG_SHAPE).astype(np.float32)
    tensor = httpclient.InferInput("x", list(BIG_SHAPE), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(BIG, [tensor])
    np.testing.assert_array_equal(result.as_numpy("y"), np.maximum(x, 0))


@pytest.mark.parametrize(
    ("model", "datatype", "dtype"), [(HALF, "FP16", np.float16), (INT, "INT32", np.int32)]
)
def test_other_datatypes_binary_and_json(
    served: Served, client: Any, model: str, datatype: str, dtype: type
) -> None:
    x: np.ndarray = np.array([[-3, -1, 0, 1], [2, -4, 5, 7]], dtype=dtype)
    for binary in (True, False):
        tensor = httpclient.InferInput("x", [2, 4], datatype)
        tensor.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("y", binary_data=binary)
        result = client.infer(model, [tensor], outputs=[out])
        assert result.get_output("y")["datatype"] == datatype
        np.testing.assert_array_equal(result.as_numpy("y"), np.maximum(x, 0))
    document = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": datatype, "data": [1.5] * 8}]}
    path = f"/v2/models/{model}/infer"
    answer = raw(served.server.port, "POST", path, json.dumps(document).encode())
    if datatype == "FP16":
        assert answer.json()["outputs"][0]["data"] == [1.5] * 8
    else:  # a float for an integer tensor is refused, not truncated
        assert answer.status == 400 and "INT32 takes integers" in answer.error
        document["inputs"][0]["data"] = [[2**40] * 4] * 2
        answer = raw(served.server.port, "POST", path, json.dumps(document).encode())
        assert answer.status == 400 and "'x'" in answer.error


# --- system shared memory -----------------------------------------------------------------
def test_system_shared_memory_in_and_out(served: Served, client: Any) -> None:
    key = f"/nrtd-http-{time.monotonic_ns()}"
    x = served.mlp.random_inputs()["x"]
    handle = shm.create_shared_memory_region("io", key, 256)
    try:
        shm.set_shared_memory_region(handle, [x], offset=64)
        client.register_system_shared_memory("io", key, 256)
        status = client.get_system_shared_memory_status()
        assert status == [{"name": "io", "key": key, "offset": 0, "byte_size": 256}]
        assert client.get_system_shared_memory_status("io") == status
        tensor = httpclient.InferInput("x", [1, 8], "FP32")
        tensor.set_shared_memory("io", 32, offset=64)
        out = httpclient.InferRequestedOutput("probs", binary_data=False)
        out.set_shared_memory("io", 16, offset=128)
        result = client.infer(MLP, [tensor], outputs=[out])
        # as Triton writes it: no data and no parameters (Triton's C++ client reads any
        # output parameters as binary data's)
        assert result.get_output("probs") == {"name": "probs", "datatype": "FP32", "shape": [1, 4]}
        probs = shm.get_contents_as_numpy(handle, np.float32, [1, 4], offset=128)
        np.testing.assert_allclose(probs, served.mlp.reference({"x": x})["probs"], 1e-5)
        again = refused(client.register_system_shared_memory, "io", key, 256)
        assert again.status() == "409"
        outside = httpclient.InferInput("x", [1, 8], "FP32")
        outside.set_shared_memory("io", 32, offset=240)
        assert refused(client.infer, MLP, [outside]).status() == "400"
        client.unregister_system_shared_memory("io")
        assert client.get_system_shared_memory_status() == []
        gone = refused(client.get_system_shared_memory_status, "io")
        assert gone.status() == "404"
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def test_a_tensor_claiming_gigabytes_in_shared_memory_costs_nothing(served: Served) -> None:
    """Issue 38, point 6, over HTTP: 3.5e9 bytes in a region that does not exist are
    refused before any buffer is made, whether the shape says so or not."""
    path = f"/v2/models/{MLP}/infer"
    for shape, said in (([1, 8], "takes 32 bytes, got 3500000000"), ([875_000_000], "nowhere")):
        place = {"shared_memory_region": "nowhere", "shared_memory_byte_size": 3_500_000_000}
        tensor = {"name": "x", "shape": shape, "datatype": "FP32", "parameters": place}
        answer = raw(served.server.port, "POST", path, json.dumps({"inputs": [tensor]}).encode())
        assert answer.status in (400, 404) and said in answer.error, answer.error


def test_register_needs_its_fields(served: Served) -> None:
    path = "/v2/systemsharedmemory/region/r/register"
    answer = raw(served.server.port, "POST", path, b'{"offset": 0, "byte_size": 8}')
    assert answer.status == 400 and "'key'" in answer.error
    answer = raw(served.server.port, "POST", path, b'{"key": "/k", "byte_size": -1}')
    assert answer.status == 400 and "byte_size" in answer.error


def test_cuda_shared_memory_as_triton_without_gpus(served: Served, client: Any) -> None:
    """Status lists no region and unregister succeeds, with and without a region's name;
    register is refused (400), in Triton's words, then ours."""
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("r")
    gone = refused(client.get_cuda_shared_memory_status, "r")
    assert gone.status() == "404"
    assert gone.message().startswith("Unable to find cuda shared memory region: 'r'")
    answer = raw(served.server.port, "POST", "/v2/cudasharedmemory/region/r/register", b"{}")
    assert answer.status == 400, answer.error
    assert answer.error.startswith(
        "failed to register CUDA shared memory region: 'r', GPUs not supported"
    )
    assert "/v2/systemsharedmemory" in answer.error
    answer = raw(served.server.port, "POST", "/v2/cudasharedmemory/status", b"")
    assert answer.status == 405


# --- the repository and statistics --------------------------------------------------------
def test_repository_load_unload_index(served: Served, client: Any) -> None:
    def state(name: str) -> str:
        (row,) = [r for r in client.get_model_repository_index() if r["name"] == name]
        return str(row.get("state", ""))

    assert state(MLP) == "READY" and state(EXTRA) != "READY"
    error = refused(client.infer, EXTRA, [x_input(served.mlp.random_inputs()["x"])])
    assert error.status() == "404" and "load it" in error.message()
    client.load_model(EXTRA)
    try:
        assert client.is_model_ready(EXTRA) and state(EXTRA) == "READY"
        x = served.mlp.random_inputs()
        np.testing.assert_allclose(
            client.infer(EXTRA, [x_input(x["x"])]).as_numpy("probs"),
            served.mlp.reference(x)["probs"],
            1e-5,
        )
    finally:
        client.unload_model(EXTRA)
    assert not client.is_model_ready(EXTRA) and state(EXTRA) == "UNAVAILABLE"
    ready = raw(served.server.port, "POST", "/v2/repository/index", b'{"ready": true}').json()
    assert {r["name"] for r in ready} == {MLP, TWO, BIG, HALF, INT}
    error = refused(client.infer, EXTRA, [x_input(served.mlp.random_inputs()["x"])])
    assert error.status() == "503"


def test_load_with_a_config_and_files(served: Served, client: Any) -> None:
    config = json.dumps({"name": "sent", "max_batch_size": 0})
    client.load_model("sent", config=config, files={"file:1/model.neff": served.mlp.neff})
    try:
        assert client.is_model_ready("sent")
        x = served.mlp.random_inputs()
        probs = client.infer("sent", [x_input(x["x"])]).as_numpy("probs")
        np.testing.assert_allclose(probs, served.mlp.reference(x)["probs"], 1e-5)
    finally:
        client.unload_model("sent")
    path = "/v2/repository/models/sent/load"
    body = json.dumps({"parameters": {"file:1/model.neff": "not base64!"}}).encode()
    answer = raw(served.server.port, "POST", path, body)
    assert answer.status == 400 and "base64" in answer.error
    body = json.dumps({"parameters": {"colour": "blue"}}).encode()
    answer = raw(served.server.port, "POST", path, body)
    assert answer.status == 400 and "'colour'" in answer.error


def test_statistics(served: Served, client: Any) -> None:
    x = served.mlp.random_inputs()["x"]
    for _ in range(3):
        client.infer(MLP, [x_input(x)])
    (mine,) = client.get_inference_statistics(MLP)["model_stats"]
    assert (mine["name"], mine["version"]) == (MLP, "1")
    success = mine["inference_stats"]["success"]
    assert isinstance(success["count"], int) and success["count"] >= 3 and success["ns"] > 0
    assert mine["inference_stats"]["compute_infer"]["count"] >= 3
    assert mine["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}  # as Triton's: all
    every = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} >= {MLP, TWO}
    versioned = client.get_inference_statistics(MLP, "1")["model_stats"]
    assert versioned[0]["version"] == "1"
    assert refused(client.get_inference_statistics, "nobody").status() == "404"


# --- errors -------------------------------------------------------------------------------
def test_every_status_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(Status)
    assert HTTP_STATUS[Status.INVALID_ARGUMENT] == 400 and HTTP_STATUS[Status.UNAVAILABLE] == 503


def test_protocol_errors_name_what_is_wrong(served: Served, client: Any) -> None:
    x = served.mlp.random_inputs()["x"]
    unknown = refused(client.infer, "nobody", [x_input(x)])
    assert unknown.status() == "404" and "nobody" in unknown.message()
    wrong = refused(client.infer, MLP, [x_input(np.zeros((2, 8), np.float32))])
    assert wrong.status() == "400" and "'x'" in wrong.message()
    missing = refused(client.get_model_metadata, MLP, "9")
    assert missing.status() == "404"
    subset = [httpclient.InferRequestedOutput("nothing")]
    assert refused(client.infer, MLP, [x_input(x)], outputs=subset).status() == "400"


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (b"{not json", {}, ["not valid JSON"]),
        (b"[1, 2]", {}, ["JSON object"]),
        (b'{"inputs": []}', {}, ["no 'inputs'"]),
        (b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32"}]}', {}, ["no data"]),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP99", "data": []}]}',
            {},
            ["'x'", "FP99"],
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [1, 2]}]}',
            {},
            ["'x'", "8 values, got 2"],
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", '
            b'"data": ["a", "b", "c", "d", "e", "f", "g", "h"]}]}',
            {},
            ["'x'", "FP32 values"],
        ),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, ["999"]),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "many"}, ["'many'"]),
    ],
)
def test_malformed_infer_bodies_are_400(
    served: Served, body: bytes, headers: dict[str, str], words: list[str]
) -> None:
    answer = raw(served.server.port, "POST", INFER, body, headers)
    assert answer.status == 400, answer.body
    assert all(w in answer.error for w in words), answer.error


def test_a_binary_section_shorter_or_longer_than_declared(served: Served) -> None:
    def document(size: int) -> dict[str, object]:
        x = {"name": "x", "shape": [1, 8], "datatype": "FP32"}
        return {"inputs": [{**x, "parameters": {"binary_data_size": size}}]}

    short = raw_infer(served.server.port, document(32), bytes(20))
    assert short.status == 400 and "shorter than its inputs declare" in short.error
    extra = raw_infer(served.server.port, document(32), bytes(40))
    assert extra.status == 400 and "8 bytes of binary data beyond" in extra.error
    sized = raw_infer(served.server.port, document(20), bytes(20))
    assert sized.status == 400 and "takes 32 bytes, got 20" in sized.error


def test_unknown_paths_and_methods(served: Served) -> None:
    port = served.server.port
    nowhere = raw(port, "GET", "/v3/models")
    assert nowhere.status == 404 and "no such endpoint: /v3/models" in nowhere.error
    assert raw(port, "GET", f"/v2/models/{MLP}/colour").status == 404
    wrong = raw(port, "GET", INFER)
    assert wrong.status == 405 and wrong.headers["Allow"] == "POST" and "use POST" in wrong.error
    assert raw(port, "POST", "/v2/health/live").headers["Allow"] == "GET, HEAD"
    assert raw(port, "DELETE", "/v2/health/live").status == 405
    head = raw(port, "HEAD", "/v2")
    assert (head.status, head.body) == (200, b"") and int(head.headers["Content-Length"]) > 0


def test_http_level_errors_are_json(served: Served) -> None:
    port = served.server.port
    encoded = raw(port, "POST", INFER, b"{}", {"Content-Encoding": "br"})
    assert encoded.status == 415 and "'br'" in encoded.error
    broken = raw(port, "POST", INFER, b"not gzip", {"Content-Encoding": "gzip"})
    assert broken.status == 400 and "gzip" in broken.error
    bomb = gzip.compress(bytes(64 << 20))  # 64 KB that inflate to 64 MB
    small = HttpServer(served.serving, "127.0.0.1:0", max_body_bytes=1 << 20)
    small.start()
    try:
        inflated = raw(small.port, "POST", INFER, bomb, {"Content-Encoding": "gzip"})
        assert inflated.status == 413 and "decompresses to more than" in inflated.error
    finally:
        small.stop()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: x1\r\n\r\n"
        )
        reply = read_to_end(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert "Content-Length" in json.loads(body)["error"]


def test_a_huge_declared_length_is_refused_before_it_is_read(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=10) as sock:
        declared = 1 << 40  # a terabyte, never sent
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n".encode()
        )
        reply = read_to_end(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert "shared memory" in json.loads(body)["error"]


def test_an_unexpected_error_is_500_with_one_line_logged_in_full(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(name: str, version: str = "") -> object:
        raise KeyError("the core tripped\nover this")

    monkeypatch.setattr(served.serving, "model_metadata", broken)
    with caplog.at_level(logging.ERROR, logger="nrtd.KSERVE"):
        answer = raw(served.server.port, "GET", f"/v2/models/{MLP}")
    assert answer.status == 500
    assert "internal error (KeyError" in answer.error and "\n" not in answer.error
    assert "daemon's log" in answer.error
    assert any(r.exc_info for r in caplog.records if r.name == "nrtd.KSERVE")


# --- the server's life --------------------------------------------------------------------
def test_a_port_in_use_says_so(served: Served) -> None:
    taken = HttpServer(served.serving, f"127.0.0.1:{served.server.port}")
    with pytest.raises(OSError, match="in use: stop what listens there, or choose another port"):
        taken.start()
    taken.stop()  # never started: nothing to do


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("localhost", "is not HOST:PORT"),
        ("127.0.0.1:99999", "is not HOST:PORT"),
        ("no-such-host.invalid:8000", "does not resolve"),
        ("192.0.2.1:8000", "not an address of this machine"),
    ],
)
def test_a_bad_address_says_so(served: Served, address: str, words: str) -> None:
    with pytest.raises(OSError, match=words):
        HttpServer(served.serving, address).start()


def test_ipv6_loopback(served: Served) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    server = HttpServer(served.serving, "[::1]:0")
    try:
        server.start()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        connection = http.client.HTTPConnection("::1", server.port, timeout=10)
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        server.stop()


class _SlowServing:
    """The real core, its `infer` held until released."""

    def __init__(self, serving: Serving) -> None:
        self._serving = serving
        self.shm = serving.shm
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._serving, name)

    def infer(self, request: InferRequest) -> InferResponse:
        self.entered.set()
        self.release.wait(10)
        return self._serving.infer(request)


def test_stop_lets_a_request_under_way_finish_then_refuses(served: Served) -> None:
    slow = _SlowServing(served.serving)
    server = HttpServer(cast(ServingApi, slow), "127.0.0.1:0")
    server.start()
    port = server.port
    x = served.mlp.random_inputs()["x"]
    document = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": x.tolist()}]}
    answers: list[Answer] = []
    running = threading.Thread(target=lambda: answers.append(raw_infer(port, document)))
    running.start()
    assert slow.entered.wait(10)
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    wait_until(lambda: refuses_connections(port), 10, "the stop has closed the listener")
    slow.release.set()
    running.join(10)
    stopping.join(10)
    assert not stopping.is_alive()
    assert answers and answers[0].status == 200, answers
    with pytest.raises(OSError):
        raw(port, "GET", "/v2/health/live")
    server.stop()  # idempotent


def test_stop_after_waitress_closed_its_listener_itself(served: Served) -> None:
    """waitress closes a listener that fails (`handle_close`): the stop after it still
    wakes the I/O thread, closes what is open and ends it, with no exception."""
    server = HttpServer(served.serving, "127.0.0.1:0")
    server.start()
    port = server.port
    assert raw(port, "GET", "/v2/health/live").status == 200
    listener, loop = server._listener, server._loop
    assert listener is not None and loop is not None
    closed = threading.Event()

    def fail() -> None:  # in the I/O thread, as an error in the listener closes it
        listener.handle_close()
        closed.set()

    listener.call_in_loop(fail)
    assert closed.wait(5)
    server.stop()  # raised EBADF here when waitress's close had closed the trigger too
    assert not loop.is_alive()  # woken, not left to its join's 5 s
    with pytest.raises(OSError):
        raw(port, "GET", "/v2/health/live")


def test_keep_alive_connections_are_reused(served: Served) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", served.server.port, timeout=10)
    try:
        for _ in range(3):
            connection.request("GET", "/v2/health/live")
            response = connection.getresponse()
            response.read()
            assert response.status == 200
        local = connection.sock.getsockname()
        connection.request("GET", "/v2")
        response = connection.getresponse()
        assert json.loads(response.read())["name"] == "neuron-rtd"
        assert connection.sock.getsockname() == local  # the same connection throughout
    finally:
        connection.close()


def test_deflate_raw_and_zlib_bodies(served: Served) -> None:
    x = served.mlp.random_inputs()["x"]
    document = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": x.tolist()}]}
    body = json.dumps(document).encode()
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    packed = raw_deflate.compress(body) + raw_deflate.flush()
    for data in (zlib.compress(body), packed):
        answer = raw(served.server.port, "POST", INFER, data, {"Content-Encoding": "deflate"})
        assert answer.status == 200, answer.body


def test_64_bit_integers_are_numbers_at_any_depth() -> None:
    big = 2**60  # beyond a double's exact integers: still a number, exactly
    config = model_config_pb.ModelConfig(name="m")
    config.input.add(name="x", dims=[-1, big])
    queue = config.dynamic_batching
    queue.default_queue_policy.default_timeout_microseconds = big
    queue.priority_queue_policy[3].default_timeout_microseconds = 5
    document = json.loads(json.dumps(message_json(config)))
    assert document["input"][0]["dims"] == [-1, big]
    assert (
        document["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == big
    )
    policy = document["dynamic_batching"]["priority_queue_policy"]["3"]
    assert policy["default_timeout_microseconds"] == 5
    stats = kserve_pb.ModelStatisticsResponse()
    stats.model_stats.add(name="m", inference_count=big).inference_stats.success.ns = big
    stats.model_stats[0].batch_stats.add(batch_size=1)
    (row,) = statistics_json(stats)["model_stats"]
    assert row["inference_count"] == big and row["inference_stats"]["success"]["ns"] == big
    assert row["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}  # all there
    assert row["batch_stats"][0]["compute_infer"] == {"count": 0, "ns": 0}


def test_base64_files_round_trip_in_the_load_body() -> None:
    # tritonclient sends base64 bytes through rapidjson: a plain JSON string
    data = bytes(range(256))
    config, files = load_parameters(
        {"parameters": {"config": "{}", "file:1/model.neff": base64.b64encode(data).decode()}}
    )
    assert (config, files) == ("{}", {"1/model.neff": data})


def refuses_connections(port: int) -> bool:
    """Whether nothing listens on `port` (on loopback) any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False
