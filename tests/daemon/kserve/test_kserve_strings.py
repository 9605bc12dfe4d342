"""String (BYTES) tensors and the classification extension on the real daemon, driven by
the unmodified `tritonclient` over gRPC (its own socket) and HTTP: Triton's `simple_string`
example model (INPUT0/INPUT1 BYTES [16] of decimal numbers, OUTPUT0/OUTPUT1 their sum and
difference as strings) and an identity model, both compiled by the project's compiler from
ONNX graphs whose string ops run in CPU nodes; raw and typed contents, JSON and binary
HTTP, system shared memory both ways; every malformed encoding refused clearly; and an
output answered as its top classes, with and without labels."""

from __future__ import annotations

import http.client
import json
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from kserve_daemon import kserve_daemon
from onnx import ModelProto, TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import BadInput
from neuron_rtd.neff.strings import decode, encode
from neuron_rtd.proto import CHANNEL_OPTIONS

STRING = "simple_string"  # INPUT0, INPUT1 BYTES [N, 16] -> OUTPUT0 sum, OUTPUT1 difference
IDENTITY = "simple_identity"  # INPUT0 BYTES [L] -> OUTPUT0, the same strings (L 1..64)
SCORES = "scores"  # x FP32 [N, 5] -> probs FP32 (labelled), ints INT32, halves FP16
LABELS = b"cat\ndog\n\nbird\n"  # class 2 has an empty line, class 4 none: no label there
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def simple_string_model() -> ModelProto:
    """Triton's simple_string as an ONNX graph: strings cast to int32, added and
    subtracted on the NC, cast back to strings."""
    strings = [
        helper.make_tensor_value_info(name, TensorProto.STRING, ["N", 16])
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    return _model(STRING, nodes, strings[:2], strings[2:])


def identity_model() -> ModelProto:
    given = helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["L"])
    back = helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["L"])
    return _model(
        IDENTITY, [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], [given], [back]
    )


def scores_model() -> ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])
    outputs = [
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 5]),
        helper.make_tensor_value_info("ints", TensorProto.INT32, ["N", 5]),
        helper.make_tensor_value_info("halves", TensorProto.FLOAT16, ["N", 5]),
    ]
    nodes = [
        helper.make_node("Identity", ["x"], ["probs"]),
        helper.make_node("Cast", ["x"], ["ints"], to=TensorProto.INT32),
        helper.make_node("Cast", ["x"], ["halves"], to=TensorProto.FLOAT16),
    ]
    return _model(SCORES, nodes, [x], outputs)


STRING_CONFIG = """
name: "simple_string"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
SCORES_CONFIG = """
max_batch_size: 4
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
"""


@dataclass(frozen=True)
class Served:
    proc: DaemonProcess
    http_port: int

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[Served]:
    repo = module_work / "models"
    neffs = {
        STRING: compile_model(simple_string_model(), dynamic_batch=bucket_ranges(1, 8)).neff,
        IDENTITY: compile_model(identity_model(), dynamic={"L": bucket_ranges(1, 64)}).neff,
        SCORES: compile_model(scores_model(), dynamic_batch=bucket_ranges(1, 4)).neff,
    }
    for name, neff in neffs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.neff").write_bytes(neff)
    (repo / STRING / "config.pbtxt").write_text(STRING_CONFIG)
    (repo / SCORES / "config.pbtxt").write_text(SCORES_CONFIG)
    (repo / SCORES / "labels.txt").write_bytes(LABELS)
    with kserve_daemon(module_work, repo) as (proc, port):
        yield Served(proc, port)


@pytest.fixture(scope="module")
def grpc_client(served: Served) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url=served.proc.address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(served: Served) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(served.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(served: Served) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(served.proc.address, options=CHANNEL_OPTIONS) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def numbers(values: np.ndarray) -> np.ndarray:
    """Integers as a BYTES tensor of their decimal strings (tritonclient's object arrays)."""
    return np.array([str(v).encode() for v in values.reshape(-1)], dtype=object).reshape(
        values.shape
    )


def string_inputs(rows: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(rows * 16, dtype=np.int64).reshape(rows, 16) - 7
    b = np.full((rows, 16), 3, dtype=np.int64) * np.arange(1, rows + 1)[:, None]
    return a, b


def check_sums(a: np.ndarray, b: np.ndarray, total: Any, difference: Any) -> None:
    assert total.dtype == object and difference.dtype == object
    np.testing.assert_array_equal(total, numbers(a + b))
    np.testing.assert_array_equal(difference, numbers(a - b))


def both(served: Served) -> list[tuple[Any, Any]]:
    """Each front's module and a client of it (the caller closes it)."""
    return [
        (grpcclient, grpcclient.InferenceServerClient(url=served.proc.address)),
        (httpclient, httpclient.InferenceServerClient(served.http_url)),
    ]


# --- the model's description -----------------------------------------------------------
@pytest.mark.daemon
def test_metadata_and_config_say_bytes(grpc_client: Any, http_client: Any) -> None:
    meta = grpc_client.get_model_metadata(STRING)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "BYTES", [-1, 16]),
        ("INPUT1", "BYTES", [-1, 16]),
    ]
    assert {t.datatype for t in meta.outputs} == {"BYTES"}
    config = http_client.get_model_config(IDENTITY)
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    # its one axis varies as a batch's would: served as the batch axis, as any NEFF's is
    assert config["input"][0]["dims"] == [] and config["max_batch_size"] == 64
    assert "classification" in grpc_client.get_server_metadata().extensions


# --- strings through both wires ------------------------------------------------------------
@pytest.mark.daemon
@pytest.mark.parametrize("rows", [1, 3])  # 3: padded to its bucket of 4 with copies of a row
def test_simple_string_over_grpc_raw(grpc_client: Any, rows: int) -> None:
    a, b = string_inputs(rows)
    inputs = [grpcclient.InferInput(n, [rows, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(numbers(a))
    inputs[1].set_data_from_numpy(numbers(b))
    result = grpc_client.infer(STRING, inputs)
    check_sums(a, b, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
    answer = result.get_response()
    assert [o.datatype for o in answer.outputs] == ["BYTES", "BYTES"]
    assert [list(o.shape) for o in answer.outputs] == [[rows, 16], [rows, 16]]


@pytest.mark.daemon
def test_simple_string_over_grpc_typed_bytes_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """As Triton's grpc_explicit_byte_content_client sends it: one entry per element."""
    request = service_pb2.ModelInferRequest(model_name=STRING)
    for name, values in (("INPUT0", range(16)), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(str(v).encode() for v in values)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    response = stub.ModelInfer(request)  # raw contents, in Triton's encoding
    total, difference = (
        [c.decode() for c in _elements(raw)] for raw in response.raw_output_contents
    )
    assert total == [str(i + 1) for i in range(16)]
    assert difference == [str(i - 1) for i in range(16)]


def _elements(raw: bytes) -> list[bytes]:
    """Triton's encoding read by hand: a little-endian length, then the bytes, each."""
    items, at = [], 0
    while at < len(raw):
        (length,) = struct.unpack_from("<I", raw, at)
        items.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    return items


@pytest.mark.daemon
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_string_over_http(http_client: Any, binary: bool) -> None:
    a, b = string_inputs(2)
    inputs = [httpclient.InferInput(n, [2, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(numbers(a), binary_data=binary)
    inputs[1].set_data_from_numpy(numbers(b), binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
    ]
    result = http_client.infer(STRING, inputs, outputs=outputs)
    total, difference = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    if not binary:  # JSON data comes back as text
        total = np.vectorize(str.encode, otypes=[object])(total)
        difference = np.vectorize(str.encode, otypes=[object])(difference)
        assert "data" in result.get_output("OUTPUT0")
    check_sums(a, b, total, difference)


@pytest.mark.daemon
def test_concurrent_string_requests_batch_and_each_gets_its_own(served: Served) -> None:
    """Dynamic batching merges string rows as it merges numbers: each answer its own. A
    request whose text is not UTF-8 is refused before it joins a batch: the requests it
    would have shared an execution with are served."""
    failures: list[str] = []
    refusals: list[str] = []

    def one(rows: int, broken: bool = False) -> None:
        client = grpcclient.InferenceServerClient(url=served.proc.address)
        try:
            a, b = string_inputs(rows)
            a = a * rows  # each request's values its own
            texts = numbers(a)
            if broken:
                texts[0, 0] = b"\xff1"
            inputs = [grpcclient.InferInput(n, [rows, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(texts)
            inputs[1].set_data_from_numpy(numbers(b))
            result = client.infer(STRING, inputs)
            check_sums(a, b, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
        except InferenceServerException as exc:
            (refusals if broken else failures).append(f"{rows} rows: {exc}")
        except Exception as exc:  # reported below, with the others
            failures.append(f"{rows} rows: {exc}")
        finally:
            client.close()

    cases = [(1, False), (2, False), (1, True), (3, False), (1, False), (2, False)]
    threads = [threading.Thread(target=one, args=case) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    (refusal,) = refusals
    assert "INVALID_ARGUMENT" in refusal and "element 0 is not UTF-8" in refusal, refusal
    stats = grpcclient.InferenceServerClient(url=served.proc.address)
    try:
        inference = stats.get_inference_statistics(STRING).model_stats[0]
        assert inference.execution_count < inference.inference_count
    finally:
        stats.close()


@pytest.mark.daemon
def test_identity_keeps_each_string(grpc_client: Any, http_client: Any) -> None:
    texts = np.array(
        ["", "a", "héllo wörld", "日本語", "x" * 1000, "tab\tand\nnewline"], dtype=object
    )
    given = np.array([t.encode() for t in texts], dtype=object)
    for module, client in ((grpcclient, grpc_client), (httpclient, http_client)):
        tensor = module.InferInput("INPUT0", [len(given)], "BYTES")
        tensor.set_data_from_numpy(given)
        got = client.infer(IDENTITY, [tensor]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(got, given)
    json_input = httpclient.InferInput("INPUT0", [len(given)], "BYTES")
    json_input.set_data_from_numpy(given, binary_data=False)
    json_output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    got = http_client.infer(IDENTITY, [json_input], outputs=[json_output]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(got, texts)


# --- shared memory -------------------------------------------------------------------------
@pytest.mark.daemon
def test_strings_in_and_out_of_system_shared_memory(served: Served) -> None:
    """As Triton's simple_*_shm_string_client: inputs and outputs in shm, encoded."""
    a, b = string_inputs(1)
    expected = [encoded(list(numbers(v).reshape(-1))) for v in (a + b, a - b)]
    sources = [encoded(list(numbers(v).reshape(-1))) for v in (a, b)]
    for module, client in both(served):
        tag = uuid.uuid4().hex[:8]
        handles = []
        try:
            client.unregister_system_shared_memory()
            names = []
            for role, data in (("in0", sources[0]), ("in1", sources[1])):
                name, key = f"{role}-{tag}", f"/nrtd-{role}-{tag}"
                handle = shm.create_shared_memory_region(name, key, len(data))
                handles.append(handle)
                shm.set_shared_memory_region(handle, [np.frombuffer(data, np.uint8)])
                client.register_system_shared_memory(name, key, len(data))
                names.append((name, len(data)))
            outs = []
            for role, data in (("out0", expected[0]), ("out1", expected[1])):
                name, key = f"{role}-{tag}", f"/nrtd-{role}-{tag}"
                handle = shm.create_shared_memory_region(name, key, len(data))
                handles.append(handle)
                client.register_system_shared_memory(name, key, len(data))
                outs.append((name, len(data), handle))
            inputs = [module.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
            for tensor, (name, size) in zip(inputs, names, strict=True):
                tensor.set_shared_memory(name, size)
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            for output, (name, size, _) in zip(outputs, outs, strict=True):
                output.set_shared_memory(name, size)
            result = client.infer(STRING, inputs, outputs=outputs)
            for n, (_, _, handle) in zip(("OUTPUT0", "OUTPUT1"), outs, strict=True):
                output = result.get_output(n)
                shape = list(output.shape) if module is grpcclient else output["shape"]
                assert shape == [1, 16]
                got = shm.get_contents_as_numpy(handle, np.object_, shape)
                np.testing.assert_array_equal(got, numbers(a + b if n == "OUTPUT0" else a - b))
            small = module.InferRequestedOutput("OUTPUT0")
            small.set_shared_memory(outs[0][0], outs[0][1] - 1)  # one byte short
            with pytest.raises(InferenceServerException) as caught:
                client.infer(STRING, inputs, outputs=[small])
            assert "more than" in str(caught.value.message())
        finally:
            client.unregister_system_shared_memory()
            for handle in handles:
                shm.destroy_shared_memory_region(handle)
            client.close()


# --- malformed encodings -------------------------------------------------------------------
def encoded(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


SIXTEEN = [str(i).encode() for i in range(16)]
MALFORMED: dict[str, tuple[bytes, list[str]]] = {
    "a length cut short": (encoded(SIXTEEN[:15]) + b"\x02\x00", ["cut short", "element 15"]),
    "a length past the end": (
        encoded(SIXTEEN[:15]) + struct.pack("<I", 100) + b"ab",
        ["element 15", "declares 100 bytes"],
    ),
    "too few elements": (encoded(SIXTEEN[:15]), ["holds 15 string elements", "takes 16"]),
    "too many elements": (encoded([*SIXTEEN, b"16"]), ["past its string element 15, the last"]),
    "bytes left over": (encoded(SIXTEEN) + b"\x00", ["1 byte past its string element 15"]),
    "a huge length": (struct.pack("<I", 0xFFFFFFFF) + bytes(60), ["declares 4294967295"]),
    "nothing": (b"", ["takes 16"]),
    "not UTF-8": (encoded([b"\xff\xfe", *SIXTEEN[1:]]), ["element 0 is not UTF-8"]),
}


@pytest.mark.daemon
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_encodings_are_refused_on_every_path(
    served: Served, stub: service_pb2_grpc.GRPCInferenceServiceStub, case: str
) -> None:
    bad, words = MALFORMED[case]
    good = encoded([b"1"] * 16)

    # gRPC raw contents
    request = service_pb2.ModelInferRequest(model_name=STRING, raw_input_contents=[bad, good])
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="BYTES", shape=[1, 16])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    error: Any = caught.value
    assert error.code() == INVALID, error.details()
    _says(error.details(), words)

    # HTTP's binary extension
    status, said = _post_binary(served, [("INPUT0", bad), ("INPUT1", good)])
    assert status == 400, said
    _says(said, words)

    # system shared memory
    client = grpcclient.InferenceServerClient(url=served.proc.address)
    tag = uuid.uuid4().hex[:8]
    key = f"/nrtd-bad-{tag}"
    handle = shm.create_shared_memory_region(f"bad-{tag}", key, max(len(bad), 1))
    try:
        if bad:
            shm.set_shared_memory_region(handle, [np.frombuffer(bad, np.uint8)])
        client.register_system_shared_memory(f"bad-{tag}", key, max(len(bad), 1))
        first = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
        first.set_shared_memory(f"bad-{tag}", len(bad))
        second = grpcclient.InferInput("INPUT1", [1, 16], "BYTES")
        second.set_data_from_numpy(np.array([[b"1"] * 16], dtype=object))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(STRING, [first, second])
        assert refused.value.status() == str(INVALID), refused.value.message()
        _says(str(refused.value.message()), words)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
        client.close()
    assert served.proc.proc is not None and served.proc.proc.poll() is None  # alive


def _says(message: str, words: list[str]) -> None:
    assert "INPUT0" in message, message
    assert all(word in message for word in words), (words, message)
    assert "Traceback" not in message, message


def _post_binary(served: Served, inputs: list[tuple[str, bytes]]) -> tuple[int, str]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": len(data)},
                }
                for name, data in inputs
            ]
        }
    ).encode()
    body = header + b"".join(data for _, data in inputs)
    connection = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=30)
    try:
        connection.request(
            "POST",
            f"/v2/models/{STRING}/infer",
            body,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())["error"]
    finally:
        connection.close()


@pytest.mark.daemon
def test_other_wrong_strings_are_refused(
    served: Served, stub: service_pb2_grpc.GRPCInferenceServiceStub, http_client: Any
) -> None:
    typed = service_pb2.ModelInferRequest(model_name=STRING)
    for name in ("INPUT0", "INPUT1"):
        tensor = typed.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend([b"1"] * 15)  # one short
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(typed)
    error: Any = caught.value
    assert error.code() == INVALID and "16 values, got 15" in error.details()

    numbers_as_json = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16]}]}
    numbers_as_json["inputs"][0]["data"] = list(range(16))
    connection = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{STRING}/infer", json.dumps(numbers_as_json))
        answer = connection.getresponse()
        said = json.loads(answer.read())["error"]
    finally:
        connection.close()
    assert answer.status == 400 and "must be strings" in said and "INPUT0" in said

    number = httpclient.InferInput("INPUT0", [1, 16], "INT32")  # a number where text goes
    number.set_data_from_numpy(np.zeros((1, 16), np.int32))
    text = httpclient.InferInput("INPUT1", [1, 16], "BYTES")
    text.set_data_from_numpy(np.array([[b"1"] * 16], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        http_client.infer(STRING, [number, text])
    assert "INT32" in str(refused.value.message()) and "BYTES" in str(refused.value.message())

    words = np.array([[b"one"] * 16], dtype=object)  # no number: the Cast refuses it
    inputs = [grpcclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(words)
    client = grpcclient.InferenceServerClient(url=served.proc.address)
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.infer(STRING, inputs)
        assert "Cast" in str(failed.value.message()), failed.value.message()
        a, b = string_inputs(1)  # the model still serves
        for tensor, values in zip(inputs, (a, b), strict=True):
            tensor.set_data_from_numpy(numbers(values))
        result = client.infer(STRING, inputs)
        check_sums(a, b, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
    finally:
        client.close()


# --- classification --------------------------------------------------------------------
SCORES_X = np.array([[0.5, 2.0, 2.0, -1.0, 0.25], [7.0, -3.5, 0.125, 9.0, 1e-7]], dtype=np.float32)


def classified(
    module: Any, client: Any, name: str, count: int, x: np.ndarray = SCORES_X
) -> tuple[np.ndarray, Any]:
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    output = module.InferRequestedOutput(name, class_count=count)
    result = client.infer(SCORES, [tensor], outputs=[output])
    return result.as_numpy(name), result.get_output(name)


@pytest.mark.daemon
def test_classification_with_labels_ties_and_batch_rows(served: Served) -> None:
    for module, client in both(served):
        try:
            top, meta = classified(module, client, "probs", 3)
            datatype = meta.datatype if module is grpcclient else meta["datatype"]
            assert datatype == "BYTES" and top.shape == (2, 3)
            assert top[0].tolist() == [b"2.000000:1:dog", b"2.000000:2", b"0.500000:0:cat"]
            assert top[1].tolist() == [b"9.000000:3:bird", b"7.000000:0:cat", b"0.125000:2"]
        finally:
            client.close()


@pytest.mark.daemon
def test_classification_without_labels_and_more_classes_than_there_are(
    grpc_client: Any, http_client: Any
) -> None:
    top, _ = classified(grpcclient, grpc_client, "ints", 10)  # 5 classes: all 5 come back
    assert top.shape == (2, 5)
    assert top[0].tolist() == [b"2:1", b"2:2", b"0:0", b"0:4", b"-1:3"]
    assert top[1].tolist() == [b"9:3", b"7:0", b"0:2", b"0:4", b"-3:1"]
    one = SCORES_X[1:]
    top, meta = classified(httpclient, http_client, "probs", 1, one)
    assert meta["shape"] == [1, 1] and top.tolist() == [[b"9.000000:3:bird"]]
    tensor = httpclient.InferInput("x", [1, 5], "FP32")  # as JSON: the classes as text
    tensor.set_data_from_numpy(one)
    output = httpclient.InferRequestedOutput("probs", binary_data=False, class_count=2)
    answer = http_client.infer(SCORES, [tensor], outputs=[output]).get_output("probs")
    assert answer["datatype"] == "BYTES" and answer["data"] == ["9.000000:3:bird", "7.000000:0:cat"]


@pytest.mark.daemon
def test_classification_refusals(
    served: Served, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    def refused(request: service_pb2.ModelInferRequest, *words: str) -> None:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        error: Any = caught.value
        assert error.code() == INVALID, error.details()
        assert all(w in error.details() for w in words), error.details()

    def request(output: str, value: Callable[[Any], None]) -> service_pb2.ModelInferRequest:
        made = service_pb2.ModelInferRequest(
            model_name=SCORES, raw_input_contents=[SCORES_X[:1].tobytes()]
        )
        made.inputs.add(name="x", datatype="FP32", shape=[1, 5])
        value(made.outputs.add(name=output).parameters)
        return made

    def count(n: int) -> Callable[[Any], None]:
        return lambda p: p["classification"].MergeFrom(service_pb2.InferParameter(int64_param=n))

    refused(request("halves", count(2)), "unsupported type 'FP16'")
    refused(request("probs", count(-1)), "'classification'", "-1")
    as_text = service_pb2.InferParameter(string_param="2")
    refused(request("probs", lambda p: p["classification"].MergeFrom(as_text)), "integer")

    def in_shm(p: Any) -> None:
        p["classification"].MergeFrom(service_pb2.InferParameter(int64_param=2))
        p["shared_memory_region"].MergeFrom(service_pb2.InferParameter(string_param="r"))
        p["shared_memory_byte_size"].MergeFrom(service_pb2.InferParameter(int64_param=64))

    refused(request("probs", in_shm), "can't set both 'shared_memory_region' and 'classification'")


# --- the nmgr wire -------------------------------------------------------------------------
@pytest.mark.daemon
def test_the_nmgr_client_carries_strings_raw_only(served: Served, module_work: Path) -> None:
    """The project's own client keeps to numbers in `infer` (refused clearly, before
    anything is sent); the nmgr wire itself carries a string tensor in Triton's encoding,
    as `infer_raw` sends and reads it."""
    neff = (module_work / "models" / STRING / "1" / "model.neff").read_bytes()
    with Client(served.proc.address) as client:
        model = client.load(neff)
        try:
            a, b = string_inputs(2)
            with pytest.raises(BadInput, match=r"string tensors .* infer_raw"):
                model.infer({"INPUT0": numbers(a), "INPUT1": numbers(b)})
            raw = model.infer_raw({"INPUT0": encode(numbers(a)), "INPUT1": encode(numbers(b))})
            total = decode(raw["OUTPUT0"], "OUTPUT0", count=32).reshape(2, 16)
            np.testing.assert_array_equal(total, numbers(a + b))
            bad = model.infer_raw  # a malformed encoding: the daemon's own clear refusal
            with pytest.raises(BadInput, match=r"input 'INPUT0': .*element 15 declares"):
                bad({"INPUT0": encode(numbers(a[:1]))[:-1], "INPUT1": encode(numbers(b[:1]))})
        finally:
            model.unload()
