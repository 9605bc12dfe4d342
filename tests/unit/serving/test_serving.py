"""The serving core in process: inference (direct and dynamically batched) against the
references, every refusal's status and message, runtime errors as the protocol says them,
statistics, server metadata, datatypes, and system shared-memory regions."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_serving_repository import BUCKETS, MLP, W, serve, write_repo

import neuron_rtd
from neuron_rtd import errors
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import Caller, LocalRuntime, User, caller
from neuron_rtd.serving import EXTENSIONS, InferRequest, Serving, ServingError, ShmRegion, Status
from neuron_rtd.serving.api import SharedMemoryApi
from neuron_rtd.serving.datatypes import (
    config_type_of,
    datatype_of,
    datatype_of_config,
    dtype_of,
)
from neuron_rtd.serving.served import ServedVersion, serving_error
from neuron_rtd.serving.shm import SystemSharedMemory
from neuron_rtd.serving.stats import FOLD_AFTER, VersionStats


@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


@pytest.fixture
def serving(local: LocalRuntime, tmp_path: Path) -> Iterator[Serving]:
    """Model "m": the MLP (fixed shape (1, 8)); "b": y = x @ W in batch buckets 1..8."""
    root = write_repo(tmp_path, {"m": {1: MLP.neff}, "b": {1: BUCKETS}})
    serving = serve(local, root)
    yield serving
    serving.close()


def refused(serving: Serving, request: InferRequest) -> ServingError:
    with pytest.raises(ServingError) as caught:
        serving.infer(request)
    return caught.value


# --- answers ---------------------------------------------------------------------------
def test_infer_equals_the_reference(serving: Serving) -> None:
    x = MLP.random_inputs()
    response = serving.infer(InferRequest("m", x, id="req-1"))
    assert (response.model, response.version, response.id) == ("m", "1", "req-1")
    assert list(response.outputs) == ["probs"]
    np.testing.assert_allclose(response.outputs["probs"], MLP.reference(x)["probs"], rtol=1e-5)
    assert response.outputs["probs"].shape == (1, 4)


def test_an_array_over_a_requests_whole_bytes_goes_to_the_runtime_as_those_bytes(
    serving: Serving,
) -> None:
    """The direct path hands the runtime a raw input's own bytes (its inline-bytes copy,
    as nmgr's); any other array as it is, and the answer is the same either way."""
    version = serving._version("m", "")
    assert isinstance(version, ServedVersion)  # (not an ensemble)
    x = MLP.random_inputs()["x"].astype(np.float32)
    raw = x.tobytes()
    over = np.ndarray(x.shape, x.dtype, raw)
    assert version._as_sent({"x": over})["x"] is raw
    for other in (x, over.astype(">f4"), np.ndarray((8, 1), x.dtype, raw).T):
        assert version._as_sent({"x": other})["x"] is other
    answers = [serving.infer(InferRequest("m", {"x": a})).outputs["probs"] for a in (over, x)]
    np.testing.assert_array_equal(answers[0], answers[1])
    np.testing.assert_allclose(answers[0], MLP.reference({"x": x})["probs"], rtol=1e-5)


def test_a_request_run_on_its_own_counts_as_a_request_and_its_execution() -> None:
    alone, apart = VersionStats("m", "1"), VersionStats("m", "1")
    alone.request_ran(50, 2, 5, 30, 4)
    apart.execution(2, 0, 30, 4)
    apart.request_done(50, 2, 5)
    one, other = alone.message(), apart.message()
    one.last_inference = other.last_inference = 0
    assert one == other
    assert (one.inference_count, one.execution_count, one.batch_stats[0].batch_size) == (2, 1, 2)


def test_requests_of_several_batch_sizes_folded_together_count_as_each_alone() -> None:
    """A fold sums the requests noted column by column: each batch size's compute
    counters get its own requests only, as when each is counted apart."""
    folded, apart = VersionStats("m", "1"), VersionStats("m", "1")
    for size, ns in ((1, 50), (4, 70), (1, 60), (2, 90), (4, 30)):
        folded.request_ran(ns, size, 5, ns // 2, 3)
        apart.execution(size, 0, ns // 2, 3)
        apart.request_done(ns, size, 5)
    one, other = folded.message(), apart.message()
    one.last_inference = other.last_inference = 0
    assert one == other
    assert [b.batch_size for b in one.batch_stats] == [1, 2, 4]
    assert one.batch_stats[2].compute_infer.ns == 35 + 15


def test_requests_run_on_their_own_in_many_threads_are_each_counted() -> None:
    """They are noted without the lock and counted when read (or every FOLD_AFTER)."""
    stats = VersionStats("m", "1")

    def run() -> None:
        for _ in range(FOLD_AFTER + 7):
            stats.request_ran(10, 1, 1, 5, 1)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    message = stats.message()
    count = 4 * (FOLD_AFTER + 7)
    assert (message.inference_count, message.execution_count) == (count, count)
    assert message.inference_stats.success.ns == 10 * count
    assert message.batch_stats[0].compute_infer.ns == 5 * count
    assert message.last_inference > 0


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_batch_bucket_model_answers_each_batch_size(serving: Serving, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    out = serving.infer(InferRequest("b", {"x": x}, version="1")).outputs["y"]
    assert out.shape == (batch, 3)
    np.testing.assert_allclose(out, x @ W, rtol=1e-5, atol=1e-6)


def test_more_requests_at_once_than_a_copy_takes_wait_their_turn(serving: Serving) -> None:
    """Without dynamic batching, requests beyond a copy's ninfer (4) queue, as Triton's
    do, instead of failing NERR_QUEUE_FULL; each gets its own answer."""
    inputs = [
        {"x": np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32)}
        for i in range(24)
    ]
    answers: dict[int, np.ndarray] = {}
    failures: list[BaseException] = []
    start = threading.Barrier(12)

    def client(first: int) -> None:
        start.wait()
        for i in range(first, 24, 12):
            try:
                answers[i] = serving.infer(InferRequest("m", inputs[i])).outputs["probs"]
            except BaseException as exc:
                failures.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(answers[i], MLP.reference(x)["probs"], rtol=1e-5)


def test_outputs_asked_for(serving: Serving) -> None:
    x = MLP.random_inputs()
    assert list(serving.infer(InferRequest("m", x, outputs=["probs"])).outputs) == ["probs"]
    assert serving.infer(InferRequest("m", x, outputs=[])).outputs == {}
    error = refused(serving, InferRequest("m", x, outputs=["logits"]))
    assert error.status is Status.INVALID_ARGUMENT
    assert error.message == "model 'm' has no output named 'logits'; its outputs: 'probs'"


def test_a_big_endian_input_of_the_right_datatype_is_taken(serving: Serving) -> None:
    x = MLP.random_inputs()["x"]
    out = serving.infer(InferRequest("m", {"x": x.astype(">f4")})).outputs["probs"]
    np.testing.assert_allclose(out, MLP.reference({"x": x})["probs"], rtol=1e-5)


# --- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("inputs", "status", "message"),
    [
        (
            {},
            Status.INVALID_ARGUMENT,
            "model 'm' needs input(s) the request lacks: 'x' (FP32 [1, 8])",
        ),
        (
            {"x": np.zeros((1, 8), np.float32), "y": np.zeros(1, np.float32)},
            Status.INVALID_ARGUMENT,
            "model 'm' has no input named 'y'; its inputs: 'x' (FP32 [1, 8])",
        ),
        (
            {"x": np.zeros((1, 8), np.int32)},
            Status.INVALID_ARGUMENT,
            "input 'x' has datatype INT32; model 'm' takes FP32",
        ),
        (
            {"x": np.zeros((2, 8), np.float32)},
            Status.INVALID_ARGUMENT,
            "input 'x' has shape [2, 8]; model 'm' takes [1, 8]",
        ),
        (
            {"x": np.zeros(8, np.float32)},
            Status.INVALID_ARGUMENT,
            "input 'x' has shape [8]; model 'm' takes [1, 8]",
        ),
    ],
)
def test_bad_inputs_are_refused_naming_the_input(
    serving: Serving, inputs: dict[str, np.ndarray], status: Status, message: str
) -> None:
    error = refused(serving, InferRequest("m", inputs))
    assert (error.status, error.message) == (status, message)


def test_batch_limits(serving: Serving) -> None:
    error = refused(serving, InferRequest("b", {"x": np.zeros((9, 4), np.float32)}))
    assert error.status is Status.INVALID_ARGUMENT
    assert error.message == (
        "input 'x' has batch size 9, more than the max_batch_size 8 of model 'b': split the request"
    )
    error = refused(serving, InferRequest("b", {"x": np.zeros((0, 4), np.float32)}))
    assert error.message == "input 'x' has shape [0, 4]; model 'b' takes [-1, 4] (max_batch_size 8)"
    error = refused(serving, InferRequest("b", {"x": np.zeros((2, 5), np.float32)}))
    assert error.message == "input 'x' has shape [2, 5]; model 'b' takes [-1, 4] (max_batch_size 8)"


def test_unknown_models_and_versions(serving: Serving) -> None:
    x = MLP.random_inputs()
    error = refused(serving, InferRequest("nope", x))
    assert error.status is Status.NOT_FOUND
    assert error.message.startswith("Request for unknown model: 'nope' is not found")
    error = refused(serving, InferRequest("m", x, version="2"))
    assert (error.status, error.message) == (
        Status.NOT_FOUND,
        "Request for unknown model: 'm' version 2 is not found (ready versions: 1)",
    )
    error = refused(serving, InferRequest("m", x, version="one"))
    assert error.status is Status.INVALID_ARGUMENT
    assert error.message.startswith(
        "failed to get model version from specified version string 'one'"
    )
    assert not serving.model_ready("nope")
    assert not serving.model_ready("m", "2")
    assert serving.model_ready("m") and serving.model_ready("m", "1")
    for call in (serving.model_metadata, serving.model_config, serving.model_statistics):
        with pytest.raises(ServingError) as caught:
            call("nope")
        assert caught.value.status is Status.NOT_FOUND


def test_a_stopped_copy_is_unavailable_with_the_nerr_kept(
    serving: Serving, local: LocalRuntime
) -> None:
    (copy,) = [m for m in local.runtime.models() if m.name == "m"]  # its repository name
    local.runtime.stop(copy.id)
    error = refused(serving, InferRequest("m", MLP.random_inputs()))
    assert error.status is Status.UNAVAILABLE
    assert error.message.startswith("model 'm' version 1: NERR_"), error.message
    local.runtime.unload(copy.id)
    error = refused(serving, InferRequest("m", MLP.random_inputs()))
    assert error.status is Status.UNAVAILABLE
    assert "NERR_INVALID_HANDLE" in error.message


def test_every_runtime_error_has_a_status() -> None:
    expected = {
        errors.BadInput: Status.INVALID_ARGUMENT,
        errors.InvalidError: Status.INVALID_ARGUMENT,
        errors.NeffInvalid: Status.INVALID_ARGUMENT,
        errors.ModelFileRefused: Status.INVALID_ARGUMENT,
        errors.InferTimeout: Status.UNAVAILABLE,
        errors.QueueFull: Status.UNAVAILABLE,
        errors.FailedState: Status.UNAVAILABLE,
        errors.InferCancelled: Status.UNAVAILABLE,
        errors.ModelNotRunning: Status.UNAVAILABLE,
        errors.InvalidHandle: Status.UNAVAILABLE,
        errors.HwError: Status.UNAVAILABLE,
        errors.ResourceError: Status.UNAVAILABLE,
        errors.ResourceNcError: Status.UNAVAILABLE,
        errors.Stopping: Status.UNAVAILABLE,  # the restarted daemon may take it
    }
    for cls in errors.all_error_classes():
        error = serving_error(cls("what happened"), "model 'm' version 1")
        assert error.status is expected.get(cls, Status.INTERNAL), cls
        assert error.message == f"model 'm' version 1: NERR_{cls.code.name}: what happened"


# --- dynamic batching ----------------------------------------------------------------------
def test_dynamic_batching_merges_concurrent_requests(local: LocalRuntime, tmp_path: Path) -> None:
    text = "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 2000000 }"
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}, b=text))
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1 + i % 2, 4)).astype(np.float32) for i in range(4)]
    answers: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        answers[i] = serving.infer(InferRequest("b", {"x": inputs[i]})).outputs["y"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(answers[i], x @ W, rtol=1e-5, atol=1e-6)
    (stats,) = serving.model_statistics("b").model_stats
    assert stats.inference_count == 6  # rows: 1 + 2 + 1 + 2
    assert stats.inference_stats.success.count == 4
    assert stats.execution_count < 4
    assert sum(b.compute_infer.count for b in stats.batch_stats) == stats.execution_count
    assert max(b.batch_size for b in stats.batch_stats) > 2
    assert stats.inference_stats.queue.ns > 0
    error = refused(serving, InferRequest("b", {"x": np.zeros((9, 4), np.float32)}))
    assert error.status is Status.INVALID_ARGUMENT
    serving.close()
    assert local.runtime.models() == []


# --- statistics ----------------------------------------------------------------------------
def test_statistics_count_requests_and_executions(serving: Serving) -> None:
    serving.infer(InferRequest("b", {"x": np.ones((3, 4), np.float32)}))
    serving.infer(InferRequest("b", {"x": np.ones((1, 4), np.float32)}))
    refused(serving, InferRequest("b", {"x": np.ones((1, 5), np.float32)}))
    (stats,) = serving.model_statistics("b", "1").model_stats
    assert (stats.name, stats.version) == ("b", "1")
    assert stats.inference_count == 4
    assert stats.execution_count == 2
    infer = stats.inference_stats
    assert (infer.success.count, infer.fail.count, infer.queue.count) == (2, 1, 2)
    assert infer.compute_infer.count == infer.compute_input.count == 2
    assert infer.success.ns >= infer.compute_infer.ns > 0
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 1), (3, 1)]
    assert stats.last_inference > 0
    names = [(s.name, s.version) for s in serving.model_statistics().model_stats]
    assert names == [("b", "1"), ("m", "1")]
    (m_stats,) = serving.model_statistics("m").model_stats
    assert m_stats.inference_count == m_stats.execution_count == 0


# --- the server ----------------------------------------------------------------------------
def test_server_metadata_and_health(local: LocalRuntime) -> None:
    serving = Serving(local.runtime)
    assert serving.live() and not serving.ready()  # not started
    serving.start()
    assert serving.ready()
    meta = serving.server_metadata()
    assert (meta.name, meta.version) == ("neuron-rtd", neuron_rtd.__version__)
    assert meta.extensions == EXTENSIONS
    assert "statistics" in meta.extensions and "cuda_shared_memory" not in meta.extensions
    serving.close()
    assert not serving.live() and not serving.ready()


def test_bad_arguments_to_serving(local: LocalRuntime) -> None:
    with pytest.raises(ValueError, match="model control mode 'sometimes'"):
        Serving(local.runtime, control_mode="sometimes")


# --- datatypes -------------------------------------------------------------------------------
def test_datatypes_round_trip() -> None:
    names = ("BOOL", "UINT8", "UINT64", "INT8", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES")
    for name in names:
        assert datatype_of(dtype_of(name)) == name
        assert datatype_of_config(config_type_of(name)) == name
    assert datatype_of(np.dtype(">i4")) == "INT32"
    assert dtype_of("BF16") == np.dtype(ml_dtypes.bfloat16)
    assert config_type_of("FP32") == model_config_pb.TYPE_FP32
    # strings: a NEFF's string tensors, numpy object arrays, TYPE_STRING in a config
    assert dtype_of("BYTES") == np.dtype(object)
    assert datatype_of_config(model_config_pb.TYPE_STRING) == "BYTES"
    with pytest.raises(ServingError, match="unknown datatype 'FP8'"):
        dtype_of("FP8")
    with pytest.raises(ServingError) as caught:
        datatype_of(np.dtype("U4"))
    assert caught.value.status is Status.INVALID_ARGUMENT


# --- system shared memory --------------------------------------------------------------------
@pytest.fixture
def shm_object() -> Iterator[str]:
    """A 4096-byte POSIX shm object; its key."""
    key = f"nrt-test-{secrets.token_hex(6)}"
    fd = os.open(f"/dev/shm/{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm/{key}")


def root_regions(local: LocalRuntime) -> SharedMemoryApi:
    """Root's regions, over the runtime's shared-memory table."""
    return SystemSharedMemory(local.runtime).of(caller(0))


def test_shm_register_read_write_and_unregister(local: LocalRuntime, shm_object: str) -> None:
    shm = root_regions(local)
    shm.register("r", "/" + shm_object, 1024, 2048)
    assert shm.status() == [ShmRegion("r", "/" + shm_object, 1024, 2048)]
    shm.write("r", 16, b"abcdefgh")
    with open(f"/dev/shm/{shm_object}", "r+b") as f:
        f.seek(1024 + 16)
        assert f.read(8) == b"abcdefgh"
        f.seek(1024 + 2040)
        f.write(b"12345678")
    assert shm.read("r", 16, 8) == b"abcdefgh"
    assert shm.read("r", 2040, 8) == b"12345678"
    for offset, size in ((2040, 16), (-1, 4), (0, 2049)):
        for call in (shm.check, shm.read, lambda n, o, s: shm.write(n, o, bytes(max(s, 0)))):
            with pytest.raises(ServingError) as caught:
                call("r", offset, size)
            assert caught.value.status is Status.INVALID_ARGUMENT
            assert "do not lie within it (2048 bytes)" in caught.value.message
    with pytest.raises(ServingError) as caught:
        shm.register("r", shm_object, 0, 16)
    assert caught.value.status is Status.ALREADY_EXISTS
    shm.register("s", shm_object, 0, 4096)
    assert [r.name for r in shm.status()] == ["r", "s"]
    shm.unregister("r")
    with pytest.raises(ServingError) as caught:
        shm.status("r")
    assert caught.value.status is Status.NOT_FOUND
    with pytest.raises(ServingError) as caught:
        shm.read("r", 0, 1)
    assert caught.value.status is Status.NOT_FOUND
    shm.unregister()
    assert shm.status() == []


def test_shm_refusals(local: LocalRuntime, shm_object: str) -> None:
    shm = root_regions(local)
    for key in ("a/b", "../etc/passwd", "/", "..", "//x"):
        with pytest.raises(ServingError) as caught:
            shm.register("r", key, 0, 1)
        assert caught.value.status is Status.INVALID_ARGUMENT
        assert "is not a POSIX shm object name" in caught.value.message
    with pytest.raises(ServingError) as caught:
        shm.register("r", shm_object, 4000, 200)
    assert caught.value.message == (
        f"shared memory region 'r': offset 4000 + byte_size 200 is past the end of shm object "
        f"'{shm_object}' (4096 bytes)"
    )
    with pytest.raises(ServingError) as caught:
        shm.register("r", "nrt-test-no-such-object", 0, 1)
    assert caught.value.message == hidden("/nrt-test-no-such-object", "uid 0 (root)")
    with pytest.raises(ServingError) as caught:
        shm.register("r", shm_object, 0, 0)
    assert caught.value.status is Status.INVALID_ARGUMENT
    with pytest.raises(ServingError) as caught:
        shm.register("r" * 256, shm_object, 0, 1)
    assert "longer than 255 bytes" in caught.value.message
    assert len(caught.value.message) < 300
    fifo = f"/dev/shm/nrt-test-fifo-{secrets.token_hex(4)}"
    os.mkfifo(fifo, 0o600)  # a FIFO opened read-write would not block; never a tensor's place
    try:
        with pytest.raises(ServingError) as caught:
            shm.register("r", fifo.removeprefix("/dev/shm"), 0, 1)
        assert "is not a shared memory object" in caught.value.message
    finally:
        os.unlink(fifo)
    assert shm.status() == []


def hidden(path: str, who: str) -> str:
    """The refusal of an object that is missing, that the daemon may not open, or that
    the caller could not open itself: one wording (docs/design.md, "Trust")."""
    return (
        f"SystemSharedMemoryRegister: cannot map '{path}' (no such object, or the daemon may "
        f"not open it, or {who} could not open it itself): make it an object both you and "
        "the daemon's user may open (docs/wire-api.md, shared memory)"
    )


def test_shm_the_daemon_may_not_open(shm_object: str) -> None:
    """As another uid (setpriv), as a daemon of its own user: root's object of mode 0600
    is refused as the kernel refuses it, worded as an object that does not exist."""
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to act as another user")
    os.chmod(f"/dev/shm/{shm_object}", 0o600)
    code = (
        "from neuron_rtd.runtime import LocalRuntime, caller\n"
        "from neuron_rtd.serving import ServingError\n"
        "from neuron_rtd.serving.shm import SystemSharedMemory\n"
        "with LocalRuntime() as local:\n"
        "    regions = SystemSharedMemory(local.runtime).of(caller(0))\n"
        "    try:\n"
        f"        regions.register('r', {shm_object!r}, 0, 1)\n"
        "    except ServingError as exc:\n"
        "        print(exc.status.name, exc.message)\n"
    )
    done = subprocess.run(
        [*nobody, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "NEURON_SIM_ROOT": "", "HOME": "/nonexistent"},
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"INVALID_ARGUMENT {hidden('/' + shm_object, 'uid 0 (root)')}\n"), (
        done.stdout
    )


def test_shm_objects_the_caller_could_not_open(local: LocalRuntime, shm_object: str) -> None:
    """The daemon (root here) may open anything; a region is still only an object its
    caller could open itself: another user's 0600 object is refused, worded as one that
    does not exist; its group's members reach an object of mode 0660 and others do not."""
    path = f"/dev/shm/{shm_object}"
    regions = SystemSharedMemory(local.runtime)
    member = Caller((User(65533, frozenset({65534})),))
    other = Caller((User(65532, frozenset()),))
    os.chown(path, 0, 65534)
    os.chmod(path, 0o600)
    for who in (member, other):
        with pytest.raises(ServingError) as caught:
            regions.of(who).register("r", shm_object, 0, 1)
        assert caught.value.message == hidden("/" + shm_object, who.describe())
    os.chmod(path, 0o660)
    regions.of(member).register("r", shm_object, 0, 1)
    with pytest.raises(ServingError):
        regions.of(other).register("r", shm_object, 0, 1)
    # one region table per caller: the other sees, uses and unregisters none of member's
    assert regions.of(other).status() == []
    with pytest.raises(ServingError) as caught:
        regions.of(other).read("r", 0, 1)
    assert caught.value.status is Status.NOT_FOUND
    regions.of(other).unregister("r")
    regions.of(other).unregister()
    assert [r.name for r in regions.of(member).status()] == ["r"]
    # a region this caller could use is its own: root cannot see member's either
    assert regions.of(caller(0)).status() == []
    regions.close()


def test_shm_a_missing_region_costs_nothing(local: LocalRuntime) -> None:
    """An input claiming 3.5 GB in a region that does not exist is refused before any
    buffer is made (the bounds are checked first)."""
    shm = root_regions(local)
    with pytest.raises(ServingError) as caught:
        shm.read("nowhere", 0, 3_500_000_000)
    assert caught.value.status is Status.NOT_FOUND


def test_shm_permission_denied_says_no_more(
    local: LocalRuntime, shm_object: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*args: object, **kwargs: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    shm = root_regions(local)
    with monkeypatch.context() as patched, pytest.raises(ServingError) as caught:
        patched.setattr(os, "open", denied)
        shm.register("r", shm_object, 0, 1)
    assert caught.value.message == hidden("/" + shm_object, "uid 0 (root)")


def test_shm_an_object_that_shrank(local: LocalRuntime, shm_object: str) -> None:
    """A client that truncates its object gets an error; the daemon is never killed by
    SIGBUS (the object is read and written through its fd, never mapped), and a write
    never grows it back."""
    shm = root_regions(local)
    shm.register("r", shm_object, 0, 4096)
    os.truncate(f"/dev/shm/{shm_object}", 100)
    for call in (lambda: shm.read("r", 0, 4096), lambda: shm.write("r", 0, bytes(4096))):
        with pytest.raises(ServingError) as caught:
            call()
        assert "keep it at its size while it is registered" in caught.value.message
    assert os.stat(f"/dev/shm/{shm_object}").st_size == 100
    assert shm.read("r", 0, 100) == bytes(100)
    shm.write("r", 0, b"x" * 100)
    shm.unregister()


def test_serving_closes_its_regions(local: LocalRuntime, shm_object: str) -> None:
    serving = serve(local, None)
    serving.shm(caller(0)).register("r", shm_object, 0, 64)
    serving.close()
    assert serving.shm(caller(0)).status() == []


def test_unloading_fails_the_queued_requests(local: LocalRuntime, tmp_path: Path) -> None:
    text = "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 60000000 }"
    root = write_repo(tmp_path, {"b": {1: BUCKETS}}, b=text)
    serving = serve(local, root, control_mode="explicit", load_models=["b"])
    failures: list[ServingError] = []

    def ask() -> None:
        try:
            serving.infer(InferRequest("b", {"x": np.ones((1, 4), np.float32)}))
        except ServingError as exc:
            failures.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    (version,) = [v for m in serving._models.values() for v in m.versions.values()]
    while version.batcher is not None and version.batcher.pending == 0:
        threading.Event().wait(0.005)
    serving.unload_model("b")
    thread.join(timeout=30)
    assert [f.status for f in failures] == [Status.UNAVAILABLE]
    assert version.stats.message().inference_stats.fail.count == 1
    assert local.runtime.models() == []
    serving.close()
