"""A Triton repository of ONNX models, served by the real daemon with no file changed and
driven by the unmodified `tritonclient.grpc`: a fixed-shape model (max_batch_size 0), a
dynamic-batch one (max_batch_size 8, dynamic_batching), one of two versions, one with
reshape (as Triton's densenet_onnx config), an IR 3 file listing its weights as inputs, one
with no config at all (auto-complete), each answering as onnxruntime does on the same
inputs; a corrupt file and an unsupported op UNAVAILABLE with the compiler's reason; and a
second daemon on the same compile cache loading every model without compiling again."""

from __future__ import annotations

import concurrent.futures
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from neuron_rtd import onnxrt
from neuron_rtd.cli.spawn import DaemonProcess

RNG = np.random.default_rng(41)
START_S = 180.0  # every model compiled before the daemon is ready, on a busy 2-core host


def _linear(name: str, batch: str | int, weights: np.ndarray, act: str = "Relu") -> onnx.ModelProto:
    """y = act(x @ w + b): x (batch, 4) FP32, y (batch, 3)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node(act, ["hb"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(nodes, name, [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _weights() -> np.ndarray:
    return RNG.standard_normal((4, 3)).astype(np.float32)


def densenet_like() -> onnx.ModelProto:
    """Triton's densenet_onnx in small: data_0 [1, 3, 4, 4] -> Conv -> fc6_1 [1, 5, 1, 1]."""
    x = helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 5, 1, 1])
    w = RNG.standard_normal((5, 3, 4, 4)).astype(np.float32)
    node = helper.make_node("Conv", ["data_0", "w"], ["fc6_1"])
    graph = helper.make_graph([node], "dn", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def ir3_model() -> onnx.ModelProto:
    """An IR 3 file: its weight W an initializer listed among the graph inputs too."""
    w = _weights()
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    node = helper.make_node("MatMul", ["x", "W"], ["y"])
    graph = helper.make_graph([node], "ir3", inputs, [y], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


def unsupported_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "unsupported", [x], [y])
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)]
    return helper.make_model(graph, opset_imports=opsets)


CONFIGS = {
    "fixed": """platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
""",
    "dynamic": """name: "dynamic"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000 }
""",
    "versions": """backend: "onnxruntime"
version_policy: { all { } }
""",
    "densenet": """name: "densenet"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 4, 4 ]
    reshape { shape: [ 1, 3, 4, 4 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 5 ]
    reshape { shape: [ 1, 5, 1, 1 ] }
  }
]
""",
    "ir3": """platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
""",
    "unsupported": 'platform: "onnxruntime_onnx"\n',
}


def make_repository(root: Path) -> dict[tuple[str, int], onnx.ModelProto]:
    """The repository's models by (name, version); also a corrupt one, no model at all."""
    models = {
        ("fixed", 1): _linear("fixed", 2, _weights()),
        ("dynamic", 1): _linear("dynamic", "N", _weights(), act="Sigmoid"),
        ("versions", 1): _linear("v1", 2, _weights()),
        ("versions", 2): _linear("v2", 2, _weights(), act="Sigmoid"),
        ("densenet", 1): densenet_like(),
        ("ir3", 1): ir3_model(),
        ("auto", 1): _linear("auto", "batch", _weights()),
        ("unsupported", 1): unsupported_model(),
    }
    for (name, version), model in models.items():
        (root / name / str(version)).mkdir(parents=True, exist_ok=True)
        onnx.save(model, root / name / str(version) / "model.onnx")
    for name, text in CONFIGS.items():
        (root / name / "config.pbtxt").write_text(text)
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"\x08\x07 not an ONNX file \xff\xff")
    return models


@pytest.fixture(scope="module")
def repository(module_work: Path) -> tuple[Path, dict[tuple[str, int], onnx.ModelProto]]:
    root = module_work / "models"
    return root, make_repository(root)


@pytest.fixture(scope="module")
def cache(module_work: Path) -> Path:
    return module_work / "cache"


def _daemon(module_work: Path, root: Path, cache: Path, sim: str) -> DaemonProcess:
    args = ["--model-repository", str(root), "--compile-cache", str(cache)]
    return DaemonProcess(sim_root=module_work / sim, args=args, ready_timeout_s=START_S)


@pytest.fixture(scope="module")
def served(
    module_work: Path, repository: tuple[Path, object], cache: Path
) -> Iterator[DaemonProcess]:
    with _daemon(module_work, repository[0], cache, "sim") as proc:
        yield proc
        log = proc.log()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(served: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(url=served.address)
    yield triton
    triton.close()


def infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    feeds: dict[str, np.ndarray],
    outputs: list[str],
    version: str = "",
) -> dict[str, np.ndarray]:
    inputs = []
    for name, array in feeds.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    asked = [grpcclient.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, inputs, model_version=version, outputs=asked)
    return {name: result.as_numpy(name) for name in outputs}


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return onnxrt.run(onnxrt.session(model), feeds)


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_repository_is_served_as_it_is(client: grpcclient.InferenceServerClient) -> None:
    index = {
        (row["name"], row.get("version", "")): (row.get("state", ""), row.get("reason", ""))
        for row in client.get_model_repository_index(as_json=True)["models"]
    }
    ready = [
        ("fixed", "1"),
        ("dynamic", "1"),
        ("versions", "1"),
        ("versions", "2"),
        ("densenet", "1"),
        ("ir3", "1"),
        ("auto", "1"),
    ]
    for key in ready:
        assert index[key] == ("READY", ""), (key, index)
    assert index[("corrupt", "1")][0] == "UNAVAILABLE"
    assert index[("unsupported", "1")][0] == "UNAVAILABLE"


def test_compiling_at_start_tells_systemd_and_extends_its_start_timeout(
    served: DaemonProcess,
) -> None:
    assert served.notify is not None
    messages = served.notify.messages
    ready = next(i for i, m in enumerate(messages) if "READY=1" in m.split("\n"))
    steps = [m.split("\n") for m in messages[:ready] if "compiling model.onnx" in m]
    assert steps, messages
    for fields in steps:
        assert fields[0].startswith("STATUS=Loading the model repository: model '"), fields
        assert "EXTEND_TIMEOUT_USEC=300000000" in fields


def test_a_fixed_shape_model_answers_as_onnxruntime(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    models = repository[1]
    meta = client.get_model_metadata("fixed", as_json=True)
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["2", "4"]}]
    config = client.get_model_config("fixed", as_json=True)["config"]
    assert config["platform"] == "onnxruntime_onnx"
    assert config.get("max_batch_size", 0) == 0
    assert config["default_model_filename"] == "model.onnx"
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    close(
        infer(client, "fixed", {"x": x}, ["y"])["y"], reference(models["fixed", 1], {"x": x})["y"]
    )
    with pytest.raises(InferenceServerException, match=r"shape \[3, 4\]"):
        infer(client, "fixed", {"x": np.zeros((3, 4), np.float32)}, ["y"])


def test_a_dynamic_batch_model_batches_up_to_max_batch_size(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    model = repository[1]["dynamic", 1]
    meta = client.get_model_metadata("dynamic", as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", "4"]
    config = client.get_model_config("dynamic", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    for rows in (1, 3, 4, 8):
        x = RNG.standard_normal((rows, 4)).astype(np.float32)
        close(infer(client, "dynamic", {"x": x}, ["y"])["y"], reference(model, {"x": x})["y"])
    with pytest.raises(InferenceServerException, match="max_batch_size 8"):
        infer(client, "dynamic", {"x": np.zeros((9, 4), np.float32)}, ["y"])
    # requests at once, batched together by the dynamic batcher: each gets its own rows
    feeds = [RNG.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda x: infer(client, "dynamic", {"x": x}, ["y"]), feeds))
    for x, answer in zip(feeds, answers, strict=True):
        close(answer["y"], reference(model, {"x": x})["y"])
    stats = client.get_inference_statistics("dynamic", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 4 + 3 + 1 + 8 + sum(len(x) for x in feeds)


def test_each_version_answers_as_its_own_onnx_file(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    models = repository[1]
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    for version in (1, 2):
        got = infer(client, "versions", {"x": x}, ["y"], version=str(version))["y"]
        close(got, reference(models["versions", version], {"x": x})["y"])
    one = infer(client, "versions", {"x": x}, ["y"], version="1")["y"]
    two = infer(client, "versions", {"x": x}, ["y"], version="2")["y"]
    assert not np.allclose(one, two)  # two models, not one served twice
    assert client.get_model_metadata("versions", as_json=True)["versions"] == ["1", "2"]


def test_reshape_serves_the_config_dims_and_feeds_the_model_its_own(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    meta = client.get_model_metadata("densenet", as_json=True)
    assert meta["inputs"] == [{"name": "data_0", "datatype": "FP32", "shape": ["3", "4", "4"]}]
    assert meta["outputs"] == [{"name": "fc6_1", "datatype": "FP32", "shape": ["5"]}]
    config = client.get_model_config("densenet", as_json=True)["config"]
    assert config["input"][0]["reshape"]["shape"] == ["1", "3", "4", "4"]
    assert config["output"][0]["reshape"]["shape"] == ["1", "5", "1", "1"]
    x = RNG.standard_normal((3, 4, 4)).astype(np.float32)
    got = infer(client, "densenet", {"data_0": x}, ["fc6_1"])["fc6_1"]
    want = reference(repository[1]["densenet", 1], {"data_0": x[None]})["fc6_1"]
    assert got.shape == (5,)
    close(got, want.reshape(5))


def test_an_ir3_file_serves_its_inputs_not_its_weights(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    meta = client.get_model_metadata("ir3", as_json=True)
    assert [t["name"] for t in meta["inputs"]] == ["x"]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    close(
        infer(client, "ir3", {"x": x}, ["y"])["y"],
        reference(repository[1]["ir3", 1], {"x": x})["y"],
    )


def test_a_model_with_no_config_is_completed_as_triton_does(
    client: grpcclient.InferenceServerClient, repository: tuple[Path, dict]
) -> None:
    config = client.get_model_config("auto", as_json=True)["config"]
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert config["max_batch_size"] == 4  # every axis 0 free: it batches
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    close(
        infer(client, "auto", {"x": x}, ["y"])["y"],
        reference(repository[1]["auto", 1], {"x": x})["y"],
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("corrupt", r"model 'corrupt' version 1: \S+/corrupt/1/model.onnx is not an ONNX model"),
        (
            "unsupported",
            r"model 'unsupported' version 1: compiling \S+/model.onnx failed: node "
            r"'Frobnicate_0' \(Frobnicate\): unsupported",
        ),
    ],
)
def test_a_model_that_does_not_compile_is_unavailable_with_the_compilers_reason(
    client: grpcclient.InferenceServerClient, name: str, reason: str
) -> None:
    (row,) = [
        r for r in client.get_model_repository_index(as_json=True)["models"] if r["name"] == name
    ]
    assert row["state"] == "UNAVAILABLE"
    assert re.search(reason, row["reason"]), row
    with pytest.raises(InferenceServerException) as caught:
        infer(client, name, {"x": np.zeros((2, 4), np.float32)}, ["y"])
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert re.search(reason, caught.value.message()), caught.value.message()


def test_a_second_daemon_on_the_same_cache_compiles_nothing(
    module_work: Path,
    served: DaemonProcess,
    repository: tuple[Path, dict],
    cache: Path,
) -> None:
    first = served.log()
    compiled = len(re.findall(r"version \d+: compiled model\.onnx in", first))
    assert compiled == 7, first  # every model that compiles, each version once
    entries = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.neff")}
    assert len(entries) == 7
    assert all(p.stat().st_mode & 0o077 == 0 for p in cache.glob("*.neff"))
    with _daemon(module_work, repository[0], cache, "sim2") as second:
        log = second.log()
        triton = grpcclient.InferenceServerClient(url=second.address)
        try:
            x = RNG.standard_normal((2, 4)).astype(np.float32)
            got = infer(triton, "fixed", {"x": x}, ["y"])["y"]
            close(got, reference(repository[1]["fixed", 1], {"x": x})["y"])
        finally:
            triton.close()
    found = re.findall(r"version \d+: compiled before: its NEFF found in the compile cache", log)
    assert len(found) == 7, log
    assert "compiled model.onnx in" not in log
    compiling = [
        line
        for line in log.splitlines()
        if "compiling model.onnx" in line and "'unsupported'" not in line  # (not cached)
    ]
    assert not compiling, compiling
    assert {p.name: p.stat().st_mtime_ns for p in cache.glob("*.neff")} == entries
    assert os.listdir(cache)  # (the lock files stay; no temporary file is left)
    assert not [n for n in os.listdir(cache) if n.startswith(".tmp-")]
