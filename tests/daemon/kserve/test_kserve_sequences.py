"""Sequence batching on the real daemon, driven by the unmodified tritonclient over gRPC
(unary calls and the stream) and HTTP: Triton's simple_sequence (direct) and
simple_dyna_sequence (oldest, CORRID) example models rebuilt as NEFFs with Triton's
names, dtypes, shapes and configs, answering as Triton's example programs expect; an
accumulator with implicit state under both strategies; idle sequences ended; the
refusals in Triton's words; perf_analyzer's --sequence-length over both protocols; and
the stream handing a sequence's requests on in the order they came."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kserve_daemon import kserve_daemon, perf_analyzer
from sequence_models import config, write_model
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS
from neuron_rtd.runtime import ComputeGate
from neuron_rtd.server.services import _KServeStream

SIMPLE, DYNA = "simple_sequence", "simple_dyna_sequence"
ACC, ACC_OLDEST, ACC_IDLE, MLP = "acc_direct", "acc_oldest", "acc_idle", "mlp"
IDLE_US = 300_000
VALUES = [11, 7, 5, 3, 2, 0, 1]  # Triton's example programs' values
INVALID = "StatusCode.INVALID_ARGUMENT"


@pytest.fixture(scope="module")
def repo(module_work: Path) -> Path:
    path = module_work / "models"
    write_model(path, SIMPLE, SIMPLE, config(SIMPLE))  # Triton's: direct, by default
    write_model(
        path,
        DYNA,
        DYNA,
        config(
            DYNA,
            "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }",
            idle_us=10_000_000,
            count=2,
        ),
    )
    write_model(path, ACC, "accumulator", config("accumulator", "direct { }", count=2))
    oldest = "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 20000 }"
    write_model(path, ACC_OLDEST, "accumulator", config("accumulator", oldest))
    write_model(path, ACC_IDLE, "accumulator", config("accumulator", idle_us=IDLE_US))
    (path / MLP / "1").mkdir(parents=True)
    (path / MLP / "1" / "model.neff").write_bytes(build_mlp((8, 8, 4)).neff)
    return path


@pytest.fixture(scope="module")
def served(module_work: Path, repo: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """The daemon over the repository, gRPC on its socket and HTTP on a port of its
    choice: (the daemon, HTTP's host:port)."""
    with kserve_daemon(module_work, repo) as (proc, port):
        yield proc, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(served: tuple[DaemonProcess, str]) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(url=served[0].address)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def http(served: tuple[DaemonProcess, str]) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(url=served[1])
    yield triton
    triton.close()


def value(client: Any, module: Any, model: str, x: int, **sequence: Any) -> int:
    """One request of INPUT [[x]] (INT32) to `model`; its OUTPUT's value."""
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[x]], np.int32))
    result = client.infer(model, [tensor], **sequence)
    return int(result.as_numpy("OUTPUT")[0][0])


def sequence(client: Any, module: Any, model: str, sid: int | str, xs: list[int]) -> list[int]:
    """A whole sequence, request by request (START on the first, END on the last)."""
    return [
        value(
            client,
            module,
            model,
            x,
            sequence_id=sid,
            sequence_start=i == 0,
            sequence_end=i == len(xs) - 1,
        )
        for i, x in enumerate(xs)
    ]


def refused(call: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    message = str(caught.value.message())
    assert "Traceback" not in message, message
    return f"{caught.value.status()} {message}"


def stats(client: grpcclient.InferenceServerClient, model: str) -> Any:
    (model_stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    return model_stats


# --- what a client sees of a sequence model ----------------------------------------------


@pytest.mark.daemon
def test_metadata_and_config_show_only_the_clients_tensors(
    client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    assert {"sequence", "sequence(string_id)"} <= set(client.get_server_metadata().extensions)
    for model, name in ((SIMPLE, SIMPLE), (DYNA, DYNA), (ACC, ACC)):
        meta = client.get_model_metadata(model)
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("INPUT", "INT32", [-1, 1])
        ]
        assert [t.name for t in meta.outputs] == ["OUTPUT"]  # no STATE_OUT
        config = client.get_model_config(model).config
        assert config.name == name and config.max_batch_size == 8
        assert [t.name for t in config.input] == ["INPUT"]
        assert [t.name for t in config.output] == ["OUTPUT"]
        assert config.HasField("sequence_batching")
    dyna = client.get_model_config(DYNA).config.sequence_batching
    assert [c.name for c in dyna.control_input] == ["START", "END", "READY", "CORRID"]
    assert dyna.WhichOneof("strategy_choice") == "oldest"
    assert list(dyna.oldest.preferred_batch_size) == [8]  # Triton's defaults, written in
    simple = client.get_model_config(SIMPLE).config.sequence_batching
    assert simple.max_sequence_idle_microseconds == 1_000_000
    assert [t["name"] for t in http.get_model_metadata(ACC)["inputs"]] == ["INPUT"]


# --- Triton's example programs' sequences ------------------------------------------------


def expected(first: int, signs: int, dyna_id: int = 0) -> list[int]:
    """What Triton's example programs expect of a sequence [first] + signs * VALUES:
    simple_sequence adds START; simple_dyna_sequence adds the CORRID at END."""
    out = [first + 1] + [signs * x for x in VALUES]
    out[-1] += dyna_id
    return out


@pytest.mark.daemon
def test_grpc_unary_sequences_as_triton_s_sync_example(
    client: grpcclient.InferenceServerClient,
) -> None:
    string_id = str(uuid.uuid4())
    assert sequence(client, grpcclient, SIMPLE, 1000, [0, *VALUES]) == expected(0, 1)
    negated = [-x for x in VALUES]
    assert sequence(client, grpcclient, SIMPLE, 1001, [100, *negated]) == expected(100, -1)
    assert sequence(client, grpcclient, SIMPLE, string_id, [20, *negated]) == expected(20, -1)
    assert sequence(client, grpcclient, DYNA, 1002, [0, *VALUES]) == expected(0, 1, 1002)


@pytest.mark.daemon
def test_http_sequences_as_triton_s_example(http: httpclient.InferenceServerClient) -> None:
    negated = [-x for x in VALUES]
    assert sequence(http, httpclient, SIMPLE, 2000, [0, *VALUES]) == expected(0, 1)
    assert sequence(http, httpclient, SIMPLE, "an-http-id", [20, *negated]) == expected(20, -1)
    assert sequence(http, httpclient, DYNA, 2001, [0, *VALUES]) == expected(0, 1, 2001)
    assert sequence(http, httpclient, ACC, 2002, [1, 2, 3]) == [1, 3, 6]


@pytest.mark.daemon
def test_interleaved_sequences_on_the_stream(client: grpcclient.InferenceServerClient) -> None:
    """Three sequences sent at once on one stream, their requests interleaved, to each
    model (as Triton's stream example does, and the accumulator's state): every request
    answered with its own sequence's value."""
    got: dict[str, int] = {}
    done = threading.Event()
    sequences: dict[object, list[int]] = {3000: [0, *VALUES], 3001: [100, *VALUES], "s": [5] * 8}
    count = 3 * sum(len(xs) for xs in sequences.values())

    def callback(result: Any, error: Any) -> None:
        if error is None:
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
        else:
            got[f"error {len(got)}"] = -1
            print(error)
        if len(got) == count:
            done.set()

    client.start_stream(callback=callback)
    try:
        for model in (SIMPLE, DYNA, ACC):
            for step in range(8):
                for sid, xs in sequences.items():
                    if model == DYNA and isinstance(sid, str):
                        sid = 3002
                    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                    tensor.set_data_from_numpy(np.array([[xs[step]]], np.int32))
                    client.async_stream_infer(
                        model,
                        [tensor],
                        request_id=f"{model}/{sid}/{step}",
                        sequence_id=sid,
                        sequence_start=step == 0,
                        sequence_end=step == 7,
                    )
        assert done.wait(60), f"{len(got)} of {count} answers"
    finally:
        client.stop_stream()
    assert not [k for k in got if k.startswith("error")], got
    for sid, xs in sequences.items():
        assert [got[f"{SIMPLE}/{sid}/{s}"] for s in range(8)] == [xs[0] + 1, *xs[1:]]
        dyna_id = 3002 if isinstance(sid, str) else int(str(sid))
        dyna = [got[f"{DYNA}/{dyna_id}/{s}"] for s in range(8)]
        assert dyna == [xs[0] + 1, *xs[1:7], xs[7] + dyna_id]
        assert [got[f"{ACC}/{sid}/{s}"] for s in range(8)] == list(np.cumsum(xs))


# --- implicit state and the strategies ---------------------------------------------------


@pytest.mark.daemon
@pytest.mark.parametrize("model", [ACC, ACC_OLDEST])
def test_implicit_state_is_kept_per_sequence(
    client: grpcclient.InferenceServerClient, model: str
) -> None:
    """Concurrent sequences, each on its own thread: each sums its own inputs (the state
    the server keeps for it), and the executions batched rows of several sequences."""
    before = int(stats(client, model).get("execution_count", 0))  # JSON leaves out a 0
    results: dict[int, list[int]] = {}

    def run(sid: int) -> None:
        results[sid] = sequence(client, grpcclient, model, sid, [sid * 10 + i for i in range(12)])

    threads = [threading.Thread(target=run, args=(sid,)) for sid in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sid in range(1, 7):
        assert results[sid] == list(np.cumsum([sid * 10 + i for i in range(12)])), sid
    after = stats(client, model)
    assert int(after["inference_stats"]["success"]["count"]) >= 72
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert max(sizes) > 1, sizes  # rows of several sequences in one execution
    assert int(after["execution_count"]) - before < 72


@pytest.mark.daemon
def test_start_again_starts_the_state_afresh(client: grpcclient.InferenceServerClient) -> None:
    assert sequence(client, grpcclient, ACC, 50, [4, 5])[-1] == 9
    assert value(client, grpcclient, ACC, 1, sequence_id=51, sequence_start=True) == 1
    assert value(client, grpcclient, ACC, 2, sequence_id=51) == 3
    assert value(client, grpcclient, ACC, 7, sequence_id=51, sequence_start=True) == 7
    assert value(client, grpcclient, ACC, 1, sequence_id=51, sequence_end=True) == 8


@pytest.mark.daemon
def test_direct_gives_an_idle_slot_a_row_with_ready_false(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Sequences in slots 0 and 1 of simple_sequence's one copy; requests of the second
    alone run in executions of 2 rows (slot 0's a filler, READY false), answered as
    simple_sequence answers a ready row."""
    first = value(client, grpcclient, SIMPLE, 1, sequence_id=60, sequence_start=True)
    second = value(client, grpcclient, SIMPLE, 1, sequence_id=61, sequence_start=True)
    assert (first, second) == (2, 2)
    before = {int(b["batch_size"]): b for b in stats(client, SIMPLE)["batch_stats"]}
    for x in (5, 6, 7):
        assert value(client, grpcclient, SIMPLE, x, sequence_id=61) == x
    after = {int(b["batch_size"]): b for b in stats(client, SIMPLE)["batch_stats"]}
    ran = int(after[2]["compute_infer"]["count"]) - int(
        before.get(2, {"compute_infer": {"count": 0}})["compute_infer"]["count"]
    )
    assert ran == 3
    for sid in (60, 61):
        value(client, grpcclient, SIMPLE, 0, sequence_id=sid, sequence_end=True)


@pytest.mark.daemon
def test_an_idle_sequence_is_ended(client: grpcclient.InferenceServerClient) -> None:
    assert value(client, grpcclient, ACC_IDLE, 3, sequence_id=70, sequence_start=True) == 3
    assert value(client, grpcclient, ACC_IDLE, 4, sequence_id=70) == 7  # within the idle time
    time.sleep(3 * IDLE_US / 1e6)
    said = refused(lambda: value(client, grpcclient, ACC_IDLE, 1, sequence_id=70))
    assert said.startswith(INVALID), said
    assert (
        "inference request for sequence 70 to model 'acc_idle' must specify the START flag on "
        "the first request of the sequence"
    ) in said
    assert value(client, grpcclient, ACC_IDLE, 5, sequence_id=70, sequence_start=True) == 5


# --- refusals, in Triton's words ---------------------------------------------------------


@pytest.mark.daemon
def test_refusals(
    client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    said = refused(lambda: value(client, grpcclient, SIMPLE, 1))
    assert "must specify a non-zero or non-empty correlation ID" in said and INVALID in said
    said = refused(lambda: value(client, grpcclient, SIMPLE, 1, sequence_id=99))
    assert "must specify the START flag on the first request of the sequence" in said
    said = refused(lambda: value(http, httpclient, SIMPLE, 1, sequence_id="never-started"))
    assert "sequence never-started to model 'simple_sequence' must specify the START" in said
    said = refused(lambda: value(client, grpcclient, DYNA, 1, sequence_id="x", sequence_start=True))
    assert "sequence batching control 'CORRID' data-type is 'BYTES'" in said and "UINT64" in said
    two = grpcclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.zeros((2, 1), np.int32))
    said = refused(lambda: client.infer(SIMPLE, [two], sequence_id=5, sequence_start=True))
    assert "must specify batch-size 1 due to requirements of sequence batcher" in said
    one = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    one.set_data_from_numpy(np.zeros((1, 1), np.int32))
    state = grpcclient.InferRequestedOutput("STATE_OUT")
    said = refused(lambda: client.infer(ACC, [one], outputs=[state], sequence_id=5))
    assert "no output named 'STATE_OUT'" in said
    # a sequence id to a model without sequence batching is ignored, as Triton ignores it
    x = grpcclient.InferInput("x", [1, 8], "FP32")
    x.set_data_from_numpy(np.ones((1, 8), np.float32))
    assert client.infer(MLP, [x], sequence_id=5, sequence_start=True).as_numpy("probs") is not None


@pytest.mark.daemon
def test_parameters_of_the_wrong_type_are_refused(served: tuple[DaemonProcess, str]) -> None:
    with grpc.insecure_channel(served[0].address, options=CHANNEL_OPTIONS) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, field, given in (
            ("sequence_id", "double_param", 1.5),
            ("sequence_start", "int64_param", 1),
        ):
            request = service_pb2.ModelInferRequest(model_name=SIMPLE)
            tensor = request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
            tensor.contents.int_contents.append(1)
            request.parameters["sequence_id"].int64_param = 80
            setattr(request.parameters[name], field, given)
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request)
            error: Any = caught.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"invalid value type for '{name}' parameter" in error.details()


# --- perf_analyzer -------------------------------------------------------------------------


@pytest.mark.daemon
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_runs_sequences_clean(
    served: tuple[DaemonProcess, str], protocol: str
) -> None:
    binary = perf_analyzer()
    url = f"unix://{served[0].socket_path}" if protocol == "grpc" else served[1]
    # -s 1000: any throughput counts as stable; this asks that it runs clean, not how fast
    done = subprocess.run(
        [
            str(binary), "-m", ACC_OLDEST, "-i", protocol, "-u", url, "--sequence-length", "6",
            "--concurrency-range", "4", "-p", "1000", "--max-trials", "5", "-s", "1000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Throughput" in done.stdout


# --- the stream's order --------------------------------------------------------------------


def test_the_stream_hands_a_sequences_requests_on_in_the_order_they_came() -> None:
    """The v2 stream's answers (`_KServeStream`), its requests read 1, 2, 3 and their
    answers started on the pool 3, 2, 1: the requests of sequence 7 reach the core in
    the order they were read; one without a sequence does not wait."""
    reached: list[str] = []

    class Core:
        def caller_of(self, context: object) -> None:
            return None

        def stream_answer(self, request: Any, caller: object) -> str:
            reached.append(request.id)
            return request.id

    stream = _KServeStream(Core(), None, ComputeGate(2))  # type: ignore[arg-type]
    requests = []
    for name in ("first", "second", "third"):
        request = service_pb2.ModelInferRequest(model_name="m", id=name)
        request.parameters["sequence_id"].int64_param = 7
        requests.append(request)
    alone = service_pb2.ModelInferRequest(model_name="m", id="alone")
    for request in (*requests, alone):
        stream.arrived(request)
    threads = [threading.Thread(target=stream.answer, args=(r,)) for r in reversed(requests)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # each starts before the one it follows: it must wait for it
    stream.answer(alone)
    for thread in threads:
        thread.join()
    assert [r for r in reached if r != "alone"] == ["first", "second", "third"]
    assert stream._last == {} and stream._order == {}
