"""Triton configs whose dims leave a non-batch axis free (-1) beside max_batch_size > 0,
on the real daemon from ONNX files compiled on load, driven by the unmodified tritonclient
over gRPC and HTTP: Triton's `custom_identity_int32` (INT32 [-1], max_batch_size 1024) and
`simple_identity` (BYTES [-1], max_batch_size 8), and a dynamically batched identity.
Several widths along the free axis answer in one model; requests of different widths are
never merged into one batch; system shared memory both ways; a bad shape is
INVALID_ARGUMENT; a request past the daemon's request limits (max_message_mb,
http_max_body_mb) is refused clearly."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from kserve_daemon import kserve_daemon
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess

START_S = 180.0  # every model compiled before the daemon is ready, on a busy 2-core host
LIMIT_MB = 1  # max_message_mb and http_max_body_mb of the daemon under test

CONFIGS = {
    "custom_identity_int32": ("TYPE_INT32", 1024, ""),
    "simple_identity": ("TYPE_STRING", 8, ""),
    "batched_identity": (
        "TYPE_INT32",
        8,
        "dynamic_batching { preferred_batch_size: [2] max_queue_delay_microseconds: 3000000 }",
    ),
}


def identity(name: str, elem: int) -> onnx.ModelProto:
    io = [helper.make_tensor_value_info(n, elem, ["b", "n"]) for n in ("INPUT0", "OUTPUT0")]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name, io[:1], io[1:]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def config(name: str) -> str:
    kind, most, extra = CONFIGS[name]
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {most}\n'
        f'input [ {{ name: "INPUT0" data_type: {kind} dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {kind} dims: [ -1 ] }} ]\n{extra}\n'
    )


@dataclass(frozen=True)
class Served:
    proc: DaemonProcess
    http_port: int

    def clients(self) -> list[tuple[Any, Any]]:
        """Each front's module and a client of it (the caller closes it)."""
        return [
            (grpcclient, grpcclient.InferenceServerClient(url=self.proc.address)),
            (httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}")),
        ]


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[Served]:
    repo = module_work / "models"
    for name, (kind, _, _) in CONFIGS.items():
        elem = TensorProto.STRING if kind == "TYPE_STRING" else TensorProto.INT32
        (repo / name / "1").mkdir(parents=True)
        onnx.save(identity(name, elem), repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(config(name))
    settings = module_work / "neuron-rtd.json"
    settings.write_text(json.dumps({"max_message_mb": LIMIT_MB, "http_max_body_mb": LIMIT_MB}))
    args = ["-c", str(settings), "--compile-cache", str(module_work / "cache")]
    with kserve_daemon(module_work, repo, *args, ready_timeout_s=START_S) as (proc, port):
        yield Served(proc, port)


def infer(module: Any, client: Any, model: str, data: np.ndarray, kind: str) -> np.ndarray:
    given = module.InferInput("INPUT0", list(data.shape), kind)
    given.set_data_from_numpy(data)
    result = client.infer(model, [given], outputs=[module.InferRequestedOutput("OUTPUT0")])
    return result.as_numpy("OUTPUT0")


@pytest.mark.daemon
def test_metadata_says_the_free_axis(served: Served) -> None:
    for module, client in served.clients():
        with client:
            meta = client.get_model_metadata("custom_identity_int32")
            if module is grpcclient:
                shapes = [list(t.shape) for t in (*meta.inputs, *meta.outputs)]
            else:
                shapes = [t["shape"] for t in (*meta["inputs"], *meta["outputs"])]
            assert shapes == [[-1, -1], [-1, -1]]


@pytest.mark.daemon
def test_int32_of_several_widths_and_batches(served: Served) -> None:
    for module, client in served.clients():
        with client:
            for rows, width in ((1, 16), (1, 1), (4, 300), (1024, 3), (2, 20000), (3, 0)):
                data = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
                got = infer(module, client, "custom_identity_int32", data, "INT32")
                assert got.dtype == np.int32 and got.shape == (rows, width)
                np.testing.assert_array_equal(got, data)


@pytest.mark.daemon
def test_strings_of_several_widths(served: Served) -> None:
    for module, client in served.clients():
        with client:
            for rows, width in ((1, 16), (2, 1), (8, 50)):
                items = [f"{i}\x00{'x' * (i % 5)}".encode() for i in range(rows * width)]
                data = np.array(items, dtype=object).reshape(rows, width)
                got = infer(module, client, "simple_identity", data, "BYTES")
                assert got.shape == (rows, width)
                assert got.tolist() == data.tolist()


@pytest.mark.daemon
def test_a_bad_shape_is_invalid_argument(served: Served) -> None:
    for module, client in served.clients():
        with client:
            for shape, said in (
                ((9, 2), "batch size 9, more than the max_batch_size 8"),
                ((4,), "has shape [4]; model 'simple_identity' takes [-1, -1]"),
                ((1, 2, 2), "has shape [1, 2, 2]"),
            ):
                data = np.array([b"a"] * int(np.prod(shape)), dtype=object).reshape(shape)
                with pytest.raises(InferenceServerException) as caught:
                    infer(module, client, "simple_identity", data, "BYTES")
                assert str(caught.value.status()) in ("StatusCode.INVALID_ARGUMENT", "400")
                assert said in caught.value.message(), caught.value.message()


@pytest.mark.daemon
def test_a_request_past_the_request_limits_is_refused(served: Served) -> None:
    data = np.zeros((1, (LIMIT_MB << 20) // 4 + 1024), dtype=np.int32)  # past 1 MiB
    for module, client in served.clients():
        with client:
            with pytest.raises(InferenceServerException) as caught:
                infer(module, client, "custom_identity_int32", data, "INT32")
            status, message = str(caught.value.status()), caught.value.message()
            if module is grpcclient:
                assert status == "StatusCode.RESOURCE_EXHAUSTED", (status, message)
                assert "larger than max" in message, message
            else:
                assert status == "413", (status, message)
                assert "larger than 1048576 bytes, the most this server takes" in message
            smaller = data[:, : data.shape[1] // 2]  # within the limits: answered
            got = infer(module, client, "custom_identity_int32", smaller, "INT32")
            np.testing.assert_array_equal(got, smaller)


@pytest.mark.daemon
def test_different_widths_are_batched_apart(served: Served) -> None:
    """Four requests at once over gRPC, two of width 3 and two of width 5: each answered
    its own rows, in two executions of two rows (one per width)."""
    inputs = [np.full((1, 3 + 2 * (i % 2)), i, np.int32) for i in range(4)]
    answers: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            with grpcclient.InferenceServerClient(url=served.proc.address) as client:
                answers[i] = infer(grpcclient, client, "batched_identity", inputs[i], "INT32")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, given in enumerate(inputs):
        np.testing.assert_array_equal(answers[i], given)
    with grpcclient.InferenceServerClient(url=served.proc.address) as client:
        (stats,) = client.get_inference_statistics("batched_identity").model_stats
    assert (stats.inference_count, stats.execution_count) == (4, 2)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 2)]


@pytest.mark.daemon
def test_system_shared_memory_both_ways(served: Served) -> None:
    """A free-width input read from a region, its output written to another: the
    request's shape says the input's, the answer's the output's."""
    for module, client in served.clients():
        with client:
            for rows, width in ((3, 7), (1, 40)):
                data = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
                key = f"/free_axes_{module.__name__.rpartition('.')[2]}_{width}"
                regions = [shm.create_shared_memory_region(n, key + n, data.nbytes) for n in "io"]
                try:
                    shm.set_shared_memory_region(regions[0], [data])
                    for n in "io":
                        client.register_system_shared_memory(n, key + n, data.nbytes)
                    given = module.InferInput("INPUT0", [rows, width], "INT32")
                    given.set_shared_memory("i", data.nbytes)
                    back = module.InferRequestedOutput("OUTPUT0")
                    back.set_shared_memory("o", data.nbytes)
                    result = client.infer("custom_identity_int32", [given], outputs=[back])
                    out = result.get_output("OUTPUT0")
                    shape = list(out.shape) if module is grpcclient else out["shape"]
                    assert shape == [rows, width]
                    got = shm.get_contents_as_numpy(regions[1], np.int32, shape)
                    np.testing.assert_array_equal(got, data)
                finally:
                    client.unregister_system_shared_memory()
                    for region in regions:
                        shm.destroy_shared_memory_region(region)
