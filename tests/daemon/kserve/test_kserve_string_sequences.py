"""A sequence model whose CORRID control input is TYPE_STRING, on the real daemon, driven by
the unmodified tritonclient over gRPC (unary calls and the stream) and HTTP: the
examples' `-d` model `simple_string_dyna_sequence` (an accumulator with implicit state
that adds its string correlation id, a decimal number, at END), under the `direct` and
`oldest` strategies, two sequences interleaved; the server fills CORRID with each
request's own string id, a direct filler row included; a uint64 id is refused in Triton's
words, and perf_analyzer, whose ids are uint64, is told so."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kserve_daemon import kserve_daemon, perf_analyzer
from sequence_models import config, write_model
from test_kserve_sequences import value
from tritonclient.utils import InferenceServerException

from neuron_rtd.cli.spawn import DaemonProcess

STRING_DYNA = "simple_string_dyna_sequence"
DIRECT, OLDEST = "string_direct", "string_oldest"
MODELS = [DIRECT, OLDEST]
VALUES = [20, -11, -7, -5, -3, -2, 0, -1]  # Triton's example's string sequence


@pytest.fixture(scope="module")
def served(module_work: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """The daemon over the two models, gRPC on its socket and HTTP on a port of its
    choice: (the daemon, HTTP's host:port)."""
    repo = module_work / "models"
    write_model(repo, DIRECT, STRING_DYNA, config(STRING_DYNA, "direct { }"))
    oldest = "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 20000 }"
    write_model(repo, OLDEST, STRING_DYNA, config(STRING_DYNA, oldest))
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


def expected(sid: str, xs: list[int]) -> list[int]:
    """The running sum of `xs`, the id (a decimal number) added at the end."""
    sums = [int(s) for s in np.cumsum(xs)]
    sums[-1] += int(sid)
    return sums


def interleaved(client: Any, module: Any, model: str, ids: tuple[str, str]) -> dict[str, list[int]]:
    """Two sequences, request by request in turn (START on the first, END on the last)."""
    got: dict[str, list[int]] = {sid: [] for sid in ids}
    for step, x in enumerate(VALUES):
        for n, sid in enumerate(ids):
            flags = {"sequence_start": step == 0, "sequence_end": step == len(VALUES) - 1}
            got[sid].append(value(client, module, model, x * (n + 1), sequence_id=sid, **flags))
    return got


def stats(client: grpcclient.InferenceServerClient, model: str) -> Any:
    (model_stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    return model_stats


@pytest.mark.daemon
def test_a_client_sees_no_corrid_and_the_config_its_string_type(
    client: grpcclient.InferenceServerClient,
) -> None:
    for model in MODELS:
        assert [t.name for t in client.get_model_metadata(model).inputs] == ["INPUT"]
        batching = client.get_model_config(model).config.sequence_batching
        (corrid,) = [c for c in batching.control_input if c.name == "CORRID"]
        assert corrid.control[0].data_type == grpcclient.model_config_pb2.TYPE_STRING


@pytest.mark.daemon
@pytest.mark.parametrize("model", MODELS)
def test_grpc_unary_interleaved_string_sequences(
    client: grpcclient.InferenceServerClient, model: str
) -> None:
    got = interleaved(client, grpcclient, model, ("1002", "77"))
    assert got == {"1002": expected("1002", VALUES), "77": expected("77", [2 * x for x in VALUES])}


@pytest.mark.daemon
@pytest.mark.parametrize("model", MODELS)
def test_http_interleaved_string_sequences(
    http: httpclient.InferenceServerClient, model: str
) -> None:
    got = interleaved(http, httpclient, model, ("2002", "5"))
    assert got == {"2002": expected("2002", VALUES), "5": expected("5", [2 * x for x in VALUES])}


@pytest.mark.daemon
@pytest.mark.parametrize("model", MODELS)
def test_stream_interleaved_string_sequences(
    client: grpcclient.InferenceServerClient, model: str
) -> None:
    """Both sequences sent at once on one stream, their requests interleaved, as Triton's
    stream example sends them: each answer its own sequence's running sum."""
    ids = ("3003", "31")
    got: dict[str, int] = {}
    count = len(ids) * len(VALUES)
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        got[result.get_response().id if error is None else f"error {error}"] = (
            int(result.as_numpy("OUTPUT")[0][0]) if error is None else 0
        )
        if len(got) == count:
            done.set()

    client.start_stream(callback=callback)
    try:
        for step, x in enumerate(VALUES):
            for n, sid in enumerate(ids):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[x * (n + 1)]], np.int32))
                client.async_stream_infer(
                    model,
                    [tensor],
                    request_id=f"{sid}/{step}",
                    sequence_id=sid,
                    sequence_start=step == 0,
                    sequence_end=step == len(VALUES) - 1,
                )
        assert done.wait(60), f"{len(got)} of {count} answers"
    finally:
        client.stop_stream()
    assert not [k for k in got if k.startswith("error")], got
    for n, sid in enumerate(ids):
        answers = [got[f"{sid}/{step}"] for step in range(len(VALUES))]
        assert answers == expected(sid, [x * (n + 1) for x in VALUES]), sid


@pytest.mark.daemon
def test_concurrent_string_sequences_batch_under_oldest(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Six sequences on threads of their own: the dynamic batcher merges rows of several
    (their string CORRIDs an object array of rows), each sequence its own sum."""
    results: dict[str, list[int]] = {}

    def run(sid: str) -> None:
        xs = [int(sid) % 100 + i for i in range(10)]
        results[sid] = [
            value(
                client,
                grpcclient,
                OLDEST,
                x,
                sequence_id=sid,
                sequence_start=i == 0,
                sequence_end=i == len(xs) - 1,
            )
            for i, x in enumerate(xs)
        ]

    ids = [str(4000 + n) for n in range(6)]
    threads = [threading.Thread(target=run, args=(sid,)) for sid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sid in ids:
        assert results[sid] == expected(sid, [int(sid) % 100 + i for i in range(10)]), sid
    sizes = {int(b["batch_size"]) for b in stats(client, OLDEST)["batch_stats"]}
    assert max(sizes) > 1, sizes  # rows of several sequences in one execution


@pytest.mark.daemon
def test_direct_runs_a_lone_string_row_beside_a_filler(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Sequences in slots 0 and 1: the second's requests alone run in executions of 2
    rows, slot 0's a filler (READY false) whose string CORRID the model still casts."""
    assert value(client, grpcclient, DIRECT, 1, sequence_id="60", sequence_start=True) == 1
    assert value(client, grpcclient, DIRECT, 2, sequence_id="61", sequence_start=True) == 2
    before = {int(b["batch_size"]): b for b in stats(client, DIRECT)["batch_stats"]}
    for total, x in ((7, 5), (13, 6)):
        assert value(client, grpcclient, DIRECT, x, sequence_id="61") == total
    after = {int(b["batch_size"]): b for b in stats(client, DIRECT)["batch_stats"]}
    ran = int(after[2]["compute_infer"]["count"]) - int(
        before.get(2, {"compute_infer": {"count": 0}})["compute_infer"]["count"]
    )
    assert ran == 2
    assert value(client, grpcclient, DIRECT, 1, sequence_id="61", sequence_end=True) == 14 + 61
    assert value(client, grpcclient, DIRECT, 1, sequence_id="60", sequence_end=True) == 2 + 60


@pytest.mark.daemon
def test_an_integer_id_is_refused_in_triton_s_words(
    client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    for triton, module in ((client, grpcclient), (http, httpclient)):
        with pytest.raises(InferenceServerException) as caught:
            value(triton, module, DIRECT, 1, sequence_id=1002, sequence_start=True)
        said = str(caught.value.message())
        assert (
            f"sequence batching control 'CORRID' data-type is 'UINT64', but model '{DIRECT}' "
            "expects 'BYTES'"
        ) in said
        assert caught.value.status() in ("StatusCode.INVALID_ARGUMENT", "400"), said


@pytest.mark.daemon
def test_perf_analyzer_s_integer_ids_are_refused_clearly(
    served: tuple[DaemonProcess, str],
) -> None:
    """perf_analyzer 2.51 sends uint64 sequence ids only (it has no option for string
    ids), so a string-CORRID model refuses them, as Triton does: it stops with that
    reason, no hang."""
    binary = perf_analyzer()
    url = f"unix://{served[0].socket_path}"
    done = subprocess.run(
        [
            str(binary), "-m", OLDEST, "-i", "grpc", "-u", url, "--sequence-length", "4",
            "--concurrency-range", "2", "-p", "500", "--max-trials", "2", "-s", "1000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    said = done.stdout + done.stderr
    assert "data-type is 'UINT64', but model 'string_oldest' expects 'BYTES'" in said
