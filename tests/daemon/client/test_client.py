"""The Python client (`neuron_rtd.client`) against the real daemon and, for transport
behaviour, against a tiny fake daemon: address, retry once on UNAVAILABLE, the session
stream and what closing releases, shared memory for IFMAPs/OFMAPs, the ninfer semaphore,
NEURONCORE_GROUP_SIZES, async inference, and errors."""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import (
    DEFAULT_ADDRESS,
    Client,
    NrtClientError,
    NrtConnectionError,
    _connection,
)
from neuron_rtd.client import default_address as default_address_exported
from neuron_rtd.client._lane import Lanes
from neuron_rtd.client._peer import pass_objects
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import Nerr
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import SampleModel, build_mlp, build_relu
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, pb, pb_grpc

pytestmark = pytest.mark.daemon

SHM_PREFIX = f"aws_neuron_runtime_{os.getpid()}_"


# --- helpers ------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's settings come from each test, never from the caller's environment."""
    for name in (
        "NEURON_RTD_ADDRESS",
        "NEURON_RTD_SHM_MAP",
        "NEURON_RTD_FAST_LANE",
        "NEURONCORE_GROUP_SIZES",
    ):
        monkeypatch.delenv(name, raising=False)


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """Records every unary call the client makes: (method, request, response)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        response = None if outcome.exception() is not None else outcome.result()
        with self._lock:
            self.calls.append((method.rsplit("/", 1)[-1], request, response))
        return outcome

    def requests(self, method: str) -> list[Any]:
        with self._lock:
            return [req for name, req, _ in self.calls if name == method]

    def responses(self, method: str) -> list[Any]:
        with self._lock:
            return [resp for name, _, resp in self.calls if name == method]

    def laned(self, infer: Any) -> Any:
        """`Lanes.infer` recording each infer the fast lane answered, as gRPC's are."""

        def recorded_infer(lanes: Any, request: Any, session_id: int, timeout_s: Any) -> Any:
            answer = infer(lanes, request, session_id, timeout_s)
            if answer is not None:
                with self._lock:
                    self.calls.append(("infer", request, answer))
            return answer

        return recorded_infer

    def passed(self, socket_path: str, session_id: int, buffers: Any, prot: int) -> None:
        """Records the objects a client passes over the peer socket, as "shm_share"
        requests, then passes them."""
        with self._lock:
            for buffer in buffers:
                request = ext_pb.shm_share_request(
                    session_id=session_id, path=buffer.path, mmap_prot=prot
                )
                self.calls.append(("shm_share", request, None))
        pass_objects(socket_path, session_id, buffers, prot)


@pytest.fixture
def recorded(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[grpc.Channel, Recorder]]:
    """A channel to the daemon whose unary calls (infers on the fast lane too), and the
    shm objects passed, are recorded."""
    recorder = Recorder()
    monkeypatch.setattr(_connection, "pass_objects", recorder.passed)
    monkeypatch.setattr(Lanes, "infer", recorder.laned(Lanes.infer))
    with grpc.insecure_channel(daemon.address, options=CHANNEL_OPTIONS) as raw:
        yield grpc.intercept_channel(raw, recorder), recorder


def daemon_shm(pid: int, prefix: str = SHM_PREFIX) -> set[str]:
    """The shm objects of this test process (of any client, with the bare prefix
    `aws_neuron_runtime_`) that the daemon holds open: named ones (/dev/shm) and the
    memfds passed to it (named after the path calls give them)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        name = _shm_name(target, prefix)
        if name is not None:
            held.add(name)
    return held


def daemon_maps_shm(pid: int, prefix: str = SHM_PREFIX) -> set[str]:
    """The shm objects of this test process that the daemon has mapped (not only open)."""
    mapped = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        name = _shm_name(fields[5], prefix) if len(fields) == 6 else None
        if name is not None:
            mapped.add(name)
    return mapped


def _shm_name(target: str, prefix: str) -> str | None:
    for root in ("/dev/shm/", "/memfd:"):
        if target.startswith(f"{root}{prefix}"):
            return "/" + target.removeprefix(root).removesuffix(" (deleted)")
    return None


def leftover_names() -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}*")]


def assert_probs(got: dict[str, np.ndarray], sample: SampleModel, x: np.ndarray) -> None:
    want = sample.reference({"x": x})["probs"]
    assert set(got) == {"probs"}
    assert got["probs"].shape == want.shape and got["probs"].dtype == want.dtype
    np.testing.assert_allclose(got["probs"], want, rtol=1e-5, atol=1e-6)


def raw_infer(stub: Any, model_id: int, x: np.ndarray) -> np.ndarray:
    response = stub.infer(
        pb.infer_request(h_nn=pb.h_nn(id=model_id), ifmap=[pb.infer_io(name="x", buf=x.tobytes())])
    )
    assert response.status.code == Nerr.OK, response.status.details
    return np.frombuffer(response.ofmap[0].buf, np.float32)


def dynamic_relu() -> bytes:
    """y = Relu(x), x of shape (N, 4) with N in 1..4 (3 buckets): a varying-size input
    and output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return compile_model(model, dynamic_batch=bucket_ranges(1, 4)).neff


@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    return build_mlp((16, 32, 8), batch=2, seed=21)


@pytest.fixture(scope="module")
def mlp2() -> SampleModel:
    return build_mlp((16, 24, 8), batch=2, seed=22)


@pytest.fixture
def slow_ncs(daemon: DaemonProcess) -> Iterator[Callable[[int], None]]:
    """Every following NC run on device 0 first sleeps `ms`; cleared afterwards."""
    inject = Path(daemon.sim_root) / "neuron0" / "inject"

    def set_delay(ms: int) -> None:
        inject.write_text(f"nc_delay_ms={ms}\n")

    yield set_delay
    set_delay(0)


# --- a fake daemon, for the transport -----------------------------------------------
class FakeNmgr(pb_grpc.nmgr_v1Servicer):
    """get_version: UNAVAILABLE on every other call. list_egs: always UNAVAILABLE.
    unload_all: INTERNAL. The rest records what it is sent and answers OK."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.loads: list[list[tuple[str, Any]]] = []
        self.create_egs: list[Any] = []
        self._lock = threading.Lock()

    def _count(self, method: str) -> int:
        with self._lock:
            self.calls[method] += 1
            return self.calls[method]

    def get_version(self, request: Any, context: Any) -> Any:
        if self._count("get_version") % 2 == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return pb.get_version_response(runtime_version=pb.version(full_version="9.8.7"))

    def list_egs(self, request: Any, context: Any) -> Any:
        self._count("list_egs")
        context.abort(grpc.StatusCode.UNAVAILABLE, "down for good")

    def unload_all(self, request: Any, context: Any) -> Any:
        self._count("unload_all")
        context.abort(grpc.StatusCode.INTERNAL, "broken")

    def load(self, request_iterator: Any, context: Any) -> Any:
        self._count("load")
        stream = []
        for msg in request_iterator:
            kind = msg.WhichOneof("content")
            stream.append((kind, getattr(msg, kind)))
        self.loads.append(stream)
        return pb.load_response(h_nn=pb.h_nn(id=10001))

    def create_eg(self, request: Any, context: Any) -> Any:
        self._count("create_eg")
        self.create_egs.append(request)
        return pb.create_eg_response(h_eg=pb.h_eg(id=1), nc_count=request.nc_count)

    def start(self, request: Any, context: Any) -> Any:
        self._count("start")
        return pb.start_response()

    def unload(self, request: Any, context: Any) -> Any:
        self._count("unload")
        return pb.unload_response()

    def destroy_eg(self, request: Any, context: Any) -> Any:
        self._count("destroy_eg")
        return pb.destroy_eg_response()


class Fake:
    def __init__(self, servicer: FakeNmgr, unix: str, tcp: str) -> None:
        self.servicer, self.unix, self.tcp = servicer, unix, tcp


@pytest.fixture
def fake(work: Path) -> Iterator[Fake]:
    """A fake daemon (no session service: session_monitor is UNIMPLEMENTED) on a unix
    socket and on a TCP port."""
    servicer = FakeNmgr()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_nmgr_v1Servicer_to_server(servicer, server)
    unix = f"unix:{work / 'fake.sock'}"
    server.add_insecure_port(unix)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield Fake(servicer, unix, f"127.0.0.1:{port}")
    server.stop(None)


# --- transport ----------------------------------------------------------------------
def test_address_from_the_environment_and_tcp(fake: Fake, monkeypatch: Any) -> None:
    assert default_address_exported() == DEFAULT_ADDRESS == "unix:/run/neuron.sock"
    assert Client().address == DEFAULT_ADDRESS
    monkeypatch.setenv("NEURON_RTD_ADDRESS", fake.unix)
    with Client() as client:
        assert client.address == fake.unix
        assert client.version() == "9.8.7"
    with Client(fake.tcp) as client:  # host:port is TCP
        assert client.version() == "9.8.7"
    assert fake.servicer.calls["get_version"] == 4  # each call: UNAVAILABLE, then retried


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Client(shm=None).shm_enabled and Client().ncg_sizes == ()
    for off in ("no", "NO", "0", "false", "off"):
        monkeypatch.setenv("NEURON_RTD_SHM_MAP", off)
        assert not Client().shm_enabled
    monkeypatch.setenv("NEURON_RTD_SHM_MAP", "yes")
    assert Client().shm_enabled and not Client(shm=False).shm_enabled
    monkeypatch.setenv("NEURONCORE_GROUP_SIZES", "1, 1,2")
    assert Client().ncg_sizes == (1, 1, 2) and Client(ncg_sizes=[4]).ncg_sizes == (4,)
    for bad in ("2,x", "0", "1,,2", "-1"):
        monkeypatch.setenv("NEURONCORE_GROUP_SIZES", bad)
        with pytest.raises(ValueError, match="NEURONCORE_GROUP_SIZES"):
            Client()


def test_unavailable_is_retried_once_and_only_once(fake: Fake) -> None:
    with Client(fake.unix) as client:
        assert client.version() == "9.8.7"
        assert fake.servicer.calls["get_version"] == 2
        with pytest.raises(NrtConnectionError) as info:
            client.list_ncgs()
        assert info.value.grpc_code == grpc.StatusCode.UNAVAILABLE
        assert fake.servicer.calls["list_egs"] == 2  # one try, one retry, no more
        with pytest.raises(NrtConnectionError) as info:
            client.unload_all()
        assert info.value.grpc_code == grpc.StatusCode.INTERNAL
        assert fake.servicer.calls["unload_all"] == 1  # only UNAVAILABLE is retried
        assert client.ping()  # `start` of model 0: only the gRPC status counts


def test_no_session_service_means_session_zero(fake: Fake, mlp: SampleModel) -> None:
    with Client(fake.unix, shm=False, ncg_sizes=[2]) as client:
        assert client.session_id == 0  # session_monitor answered UNIMPLEMENTED
        (create,) = fake.servicer.create_egs
        assert create.nc_count == 2 and create.session_id == 0
        model = client.load(mlp.neff, ninfer=3, timeout=1.5)
        assert model.ncg == 1 and client.ncgs == [1]
        assert fake.servicer.calls["start"] == 1  # loaded on a client-made NCG: started
    (stream,) = fake.servicer.loads
    kinds = [kind for kind, _ in stream]
    assert kinds[:3] == ["h_eg", "neff_size", "model_params"]  # no session_id message
    assert set(kinds[3:]) == {"neff_chunk"}
    params = dict(stream)["model_params"]
    assert params.ninfer.data == 3 and params.timeout.data == 2  # whole seconds, rounded up
    assert sum(len(v.chunk) for k, v in stream if k == "neff_chunk") == len(mlp.neff)
    # without a session the client releases what it made itself at close
    assert fake.servicer.calls["unload"] == 1 and fake.servicer.calls["destroy_eg"] == 1


# --- shared memory ------------------------------------------------------------------
def test_tensors_go_through_shared_memory(
    daemon: DaemonProcess, stub: Any, recorded: Any, mlp: SampleModel
) -> None:
    channel, recorder = recorded
    with Client(daemon.address, channel=channel, shm=True) as client:
        model = client.load(mlp.neff)
        assert model.ninfer == 4
        for seed in range(5):
            x = mlp.random_inputs(seed)["x"]
            got = model(x=x)
            assert_probs(got, mlp, x)
            np.testing.assert_array_equal(got["probs"].ravel(), raw_infer(stub, model.id, x))
        for request in recorder.requests("infer"):
            assert [io.WhichOneof("data") for io in request.ifmap] == ["buf_shm"]
            assert [io.name for io in request.shm_ofmap] == ["probs"]
        assert all(len(r.ofmap) == 0 for r in recorder.responses("infer"))
        maps = recorder.requests("shm_share")
        assert len(maps) == 2  # one input and one output buffer, reused for all 5 calls
        paths = {m.path for m in maps}
        for request in maps:
            assert request.path.startswith("/aws_neuron_runtime_")
            assert request.session_id == client.session_id != 0
            assert request.mmap_prot == 3  # PROT_READ | PROT_WRITE
        assert daemon_shm(daemon.pid) == paths  # the daemon holds them open ...
        assert leftover_names() == []  # ... and their names are gone already
        # fixed-size tensors: memfds sealed at their size, which the daemon maps (memcpy)
        assert daemon_maps_shm(daemon.pid) == paths
        model.unload()
        assert {r.path for r in recorder.requests("shm_unmap")} == paths
        assert daemon_shm(daemon.pid) == set()
        assert daemon_maps_shm(daemon.pid) == set()


def test_sync_infers_take_the_fast_lane_and_answer_as_grpc(
    daemon: DaemonProcess, mlp: SampleModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its tensors in shared memory, a synchronous infer goes over the peer socket's
    fast lane: the same outputs, and the same errors, as a client that calls over gRPC
    (NEURON_RTD_FAST_LANE=no)."""
    laned: list[bool] = []
    infer = Lanes.infer

    def counted(lanes: Lanes, *args: Any) -> Any:
        answer = infer(lanes, *args)
        laned.append(answer is not None)
        return answer

    monkeypatch.setattr(Lanes, "infer", counted)
    with Client(daemon.address, shm=True) as client:
        monkeypatch.setenv("NEURON_RTD_FAST_LANE", "no")
        with Client(daemon.address, shm=True) as grpc_only:
            model = client.load(mlp.neff)
            other = grpc_only.attach(model.id)
            for seed in range(5):
                x = mlp.random_inputs(seed)["x"]
                got = model(x=x)
                assert_probs(got, mlp, x)
                np.testing.assert_array_equal(got["probs"], other(x=x)["probs"])
            assert laned == [True] * 5  # every call on the lane, none on the gRPC-only one
            with pytest.raises(NrtClientError) as on_lane:
                model(x=np.zeros((3, 16), np.float32))
            assert on_lane.value.nerr == Nerr.INFER_BAD_INPUT
            with pytest.raises(NrtClientError) as on_grpc:
                other(x=np.zeros((3, 16), np.float32))
            assert str(on_grpc.value) == str(on_lane.value)


def test_a_slot_sends_its_request_again(
    daemon: DaemonProcess, mlp: SampleModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot keeps the request that names only its objects: a next call with the same
    inputs sends that very request, and the lane's message of it is made once. A call
    whose input the model does not take (its shape) sends nothing, and the kept request
    serves the call after it."""
    sent: list[Any] = []
    infer = Lanes.infer

    def recorded(lanes: Lanes, request: Any, *args: Any) -> Any:
        sent.append(request)
        return infer(lanes, request, *args)

    monkeypatch.setattr(Lanes, "infer", recorded)
    with Client(daemon.address, shm=True) as client:
        model = client.load(mlp.neff)
        for seed in range(3):
            x = mlp.random_inputs(seed)["x"]
            assert_probs(model(x=x), mlp, x)
        with pytest.raises(NrtClientError) as info:
            model(x=np.zeros((3, 16), np.float32))
        assert info.value.nerr == Nerr.INFER_BAD_INPUT
        assert "input 'x' has shape (3, 16)" in str(info.value)  # refused before it is sent
        x = mlp.random_inputs(7)["x"]
        assert_probs(model(x=x), mlp, x)
        kept = sent[0]
        assert [r is kept for r in sent] == [True, True, True, True]
        lanes = client.connection._lanes
        assert lanes is not None
        assert [entry[0] for entry in lanes._messages.values()].count(kept) == 1


def inferences_ended(stub: Any) -> int:
    """How many inferences the daemon has ended, whatever their outcome."""
    counters = stub.read_inference_counters(pb.empty()).nmgr_counters
    return sum(c.count for c in counters.infer_status_counts)


def test_an_infer_past_its_timeout_on_the_lane_is_a_timeout(
    daemon: DaemonProcess, stub: Any, mlp: SampleModel, slow_ncs: Callable[[int], None]
) -> None:
    """A lane that does not answer within the client's timeout fails the call with
    NERR_TIMEOUT, as gRPC's deadline does; its late answer never reaches the next call."""
    with Client(daemon.address, shm=True, timeout_s=0.5) as client:
        model = client.load(mlp.neff)
        x = mlp.random_inputs(1)["x"]
        assert_probs(model(x=x), mlp, x)
        ended = inferences_ended(stub)
        slow_ncs(1500)
        with pytest.raises(NrtConnectionError) as late:
            model(x=x)
        assert late.value.nerr == Nerr.TIMEOUT
        assert "did not answer within 0.5 s" in late.value.details
        slow_ncs(0)
        # the late inference ends, its answer going nowhere
        wait_until(lambda: inferences_ended(stub) > ended, 30, "the late inference's end")
        y = mlp.random_inputs(2)["x"]
        assert_probs(model(x=y), mlp, y)


def test_shm_map_no_sends_everything_inline(
    daemon: DaemonProcess, stub: Any, recorded: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("NEURON_RTD_SHM_MAP", "no")
    assert not Client(daemon.address).shm_enabled
    assert Client(daemon.address, shm=True).shm_enabled
    channel, recorder = recorded
    shape = (1100, 1024)  # 4.3 MiB each way: past gRPC's default 4 MiB message limit
    with Client(daemon.address, channel=channel) as client:
        model = client.load(build_relu(shape))
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        got = model.infer({"x": x})
        np.testing.assert_array_equal(got["y"], np.maximum(x, 0))
        assert got["y"].shape == shape and got["y"].dtype == np.float32
        (request,) = recorder.requests("infer")
        assert request.ifmap[0].WhichOneof("data") == "buf" and not request.shm_ofmap
        assert recorder.requests("shm_map") == []


def test_staged_inputs_are_filled_in_place_and_sent_with_no_copy(
    daemon: DaemonProcess, stub: Any, recorded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel, recorder = recorded
    shape = (64, 256)
    rng = np.random.default_rng(3)
    with Client(daemon.address, channel=channel) as client:
        model = client.load(build_relu(shape), ninfer=2)
        other = client.load(build_relu(shape))
        staged = model.stage()
        assert staged is not None and set(staged.inputs) == {"x"}
        assert staged.inputs["x"].shape == shape and staged.inputs["x"].dtype == np.float32
        x = rng.standard_normal(shape).astype(np.float32)
        staged.inputs["x"][...] = x
        writes: list[Any] = []
        monkeypatch.setattr("neuron_rtd.client._shm.ShmBuffer.write", lambda *a: writes.append(a))
        np.testing.assert_array_equal(model.infer(staged)["y"], np.maximum(x, 0))
        assert writes == []  # sent as filled: no copy into the slot
        (request,) = recorder.requests("infer")
        assert request.ifmap[0].WhichOneof("data") == "buf_shm"
        with pytest.raises(ValueError, match=r"sent \(or given back\) already"):
            model.infer(staged)
        futures_ = []
        for _ in range(4):  # async, more than ninfer: some wait their turn in the pool
            staged = model.stage()
            assert staged is not None
            x = rng.standard_normal(shape).astype(np.float32)
            staged.inputs["x"][...] = x
            futures_.append((x, model.infer_async(staged, posted=False)))
        for x, future in futures_:
            np.testing.assert_array_equal(future.result()["y"], np.maximum(x, 0))
        assert writes == []
        monkeypatch.undo()
        staged = model.stage()
        assert staged is not None
        with pytest.raises(ValueError, match="staged for"):
            other.infer(staged)
        model.unstage(staged)  # given back unsent: its slot serves plain inferences again
        model.unstage(staged)  # a no-op the second time
        with pytest.raises(ValueError, match="given back"):
            model.infer(staged)
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(model.infer({"x": x})["y"], np.maximum(x, 0))
        staged = model.stage()
        assert staged is not None
        staged.inputs["x"] = np.zeros(shape, np.float32)  # not filled in place: refused
        with pytest.raises(ValueError, match="sent as they are"):
            model.infer(staged)
    monkeypatch.setenv("NEURON_RTD_SHM_MAP", "no")
    with Client(daemon.address) as client:
        assert client.load(build_relu(shape)).stage() is None  # inline: fill arrays of your own


def test_varying_inputs_use_objects_of_their_exact_size_outputs_their_largest(
    daemon: DaemonProcess, stub: Any, recorded: Any
) -> None:
    """A dynamic batch: the input's object is resized to each batch, the output's holds
    the largest bucket's, and the output is read at the batch the input gave (so its
    answer is small: the fast lane carries it)."""
    channel, recorder = recorded
    with Client(daemon.address, channel=channel) as client:
        model = client.load(dynamic_relu())
        rng = np.random.default_rng(2)
        for n in (3, 1, 4, 2):
            x = rng.standard_normal((n, 4)).astype(np.float32)
            got = model(x=x)
            np.testing.assert_array_equal(got["y"], np.maximum(x, 0))  # shape from x's
        with pytest.raises(NrtClientError) as info:
            model(x=np.zeros((5, 4), np.float32))
        assert info.value.nerr == Nerr.INFER_BAD_INPUT  # past its largest bucket: not sent
        assert "has shape (5, 4); the model takes float32 (batch<=4, 4)" in info.value.details
        requests = recorder.requests("infer")
        assert len(requests) == 4
        for request in requests:
            assert request.ifmap[0].WhichOneof("data") == "buf_shm"
            assert [io.name for io in request.shm_ofmap] == ["y"]
        assert len(recorder.requests("shm_share")) == 2  # the input's, resized; the output's


# --- sessions and NEURONCORE_GROUP_SIZES ----------------------------------------------
def test_close_releases_everything_the_session_made(
    daemon: DaemonProcess,
    stub: Any,
    recorded: Any,
    mlp: SampleModel,
    mlp2: SampleModel,
    monkeypatch: Any,
) -> None:
    monkeypatch.setenv("NEURONCORE_GROUP_SIZES", "1,2")
    channel, recorder = recorded
    client = Client(daemon.address, channel=channel)
    a, b = client.load(mlp.neff), client.load(mlp2.neff)
    assert [a.ncg, b.ncg] == client.ncgs
    egs = stub.list_egs(pb.empty()).eg_info
    assert sorted((e.eg.id, e.nc_count) for e in egs) == [(a.ncg, 1), (b.ncg, 2)]
    for model, sample in ((a, mlp), (b, mlp2)):  # both started on their NCG
        x = sample.random_inputs(3)["x"]
        assert_probs(model(x=x), sample, x)

    ncg, count = client.create_ncg(1)  # named by the caller: its model loads stopped
    assert count == 1
    c = client.load(mlp.neff, ncg=ncg)
    x = mlp.random_inputs(4)["x"]
    with pytest.raises(NrtClientError) as info:
        c(x=x)
    assert info.value.nerr == Nerr.FAIL and "not running" in info.value.details
    c.start()
    assert_probs(c(x=x), mlp, x)
    implicit = Client(daemon.address, ncg_sizes=[])  # another client, no groups
    d = implicit.load(mlp.neff)
    assert d.ncg is None
    mine = {a.ncg, b.ncg, ncg}
    (d_ncg,) = {e.eg.id for e in stub.list_egs(pb.empty()).eg_info} - mine

    session = client.session_id
    assert {r.session_id for r in recorder.requests("create_eg")} == {session}
    assert {r.session_id for r in recorder.requests("shm_share")} == {session}
    paths = {r.path for r in recorder.requests("shm_share")}
    assert daemon_shm(daemon.pid) >= paths and len(paths) == 6
    client.close()  # returns once the daemon has ended the session

    assert [e.eg.id for e in stub.list_egs(pb.empty()).eg_info] == [d_ncg]
    for model in (a, b, c):
        status = stub.start(pb.start_request(h_nn=pb.h_nn(id=model.id))).status
        assert status.code == Nerr.INVALID_HANDLE
    for path in paths:
        status = stub.shm_unmap(pb.shm_unmap_request(path=path)).status
        assert status.code == Nerr.INVALID and b"not mapped" in status.details
    assert not daemon_shm(daemon.pid) & paths  # the daemon closed them all
    x = mlp.random_inputs(5)["x"]
    assert_probs(d(x=x), mlp, x)  # the other client is untouched
    implicit.close()
    assert stub.list_egs(pb.empty()).eg_info == [] and daemon_shm(daemon.pid) == set()


def test_without_a_session_what_the_client_made_outlives_it_and_others_attach(
    daemon: DaemonProcess, stub: Any, recorded: Any, mlp: SampleModel
) -> None:
    channel, recorder = recorded
    x = mlp.random_inputs(6)["x"]
    with Client(daemon.address, channel=channel, session=False, shm=True) as maker:
        assert maker.session_id == 0
        ncg, _ = maker.create_ncg(1)
        model = maker.load(mlp.neff, ncg=ncg, start=True)
        assert_probs(model(x=x), mlp, x)
        paths = {r.path for r in recorder.requests("shm_share")}
        assert len(paths) == 2 and daemon_shm(daemon.pid) == paths
    assert [r.session_id for r in recorder.requests("create_eg")] == [0]
    # its shared memory went in a session of its own, which its models do not belong to
    (shm_session,) = {r.session_id for r in recorder.requests("shm_share")}
    assert shm_session != 0
    assert {r.session_id for r in recorder.requests("create_eg")} == {0}
    # closed: its NCG and model stay; its shared memory went with its session
    assert [e.eg.id for e in stub.list_egs(pb.empty()).eg_info] == [ncg]
    assert daemon_shm(daemon.pid) == set()

    with Client(daemon.address) as other:
        attached = other.attach(model.id)
        assert (attached.inputs, attached.outputs) == (mlp.inputs, mlp.outputs)
        assert attached.signature.name == "mlp" and attached.ninfer == 4
        assert (attached.ncg, attached.neff, model.neff is not None) == (ncg, None, True)
        assert_probs(attached(x=x), mlp, x)
        with pytest.raises(NrtClientError) as info:
            other.attach(10999)
        assert info.value.nerr == Nerr.INVALID_HANDLE and "no model 10999" in info.value.details
    # the attaching client closed its session: the model it did not load is still there
    assert stub.start(pb.start_request(h_nn=pb.h_nn(id=model.id))).status.code == Nerr.OK


def test_a_restarted_daemon_gets_a_new_session(work: Path, mlp: SampleModel) -> None:
    proc = DaemonProcess(sim_root=work / "sim")
    with proc, Client(proc.address, ncg_sizes=[1]) as client:
        old = client.load(mlp.neff)
        x = mlp.random_inputs(1)["x"]
        assert_probs(old(x=x), mlp, x)
        assert proc.proc is not None
        proc.proc.kill()  # a crash (SIGTERM would wait out the drain of the open session)
        proc.stop()  # reaps it
        proc.start()
        assert client.connection.session is not None
        session = client.connection.session  # its stream broke with the connection
        wait_until(lambda: session.ended, 30, "the old session's end")
        new = client.load(mlp.neff)  # a new session, a new NCG from ncg_sizes
        assert_probs(new(x=x), mlp, x)
        with pytest.raises(NrtClientError) as info:
            old(x=x)  # the old daemon's model: not sent to whichever model has its id now
        assert info.value.nerr == Nerr.INVALID_HANDLE
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.nmgr_v1Stub(channel)
            assert len(stub.list_egs(pb.empty()).eg_info) == 1
            client.close()
            assert len(stub.list_egs(pb.empty()).eg_info) == 0  # tied to the new session


def test_a_session_without_a_ticket_is_said_only_once_it_is_open(
    work: Path, mlp: SampleModel, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon whose peer socket cannot give a ticket still gets a session, said once
    it is open ("session opened unidentified"); a daemon gone is only the error."""
    proc = DaemonProcess(sim_root=work / "sim")
    with proc, Client(proc.address) as client:
        os.unlink(proc.socket_path + ".peer")  # the ticket cannot be had; the rest works
        with caplog.at_level("WARNING", logger="neuron_rtd.client"):
            model = client.load(mlp.neff)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0].startswith("session opened unidentified: ")
        x = mlp.random_inputs(1)["x"]
        assert_probs(model(x=x), mlp, x)
        assert proc.proc is not None
        proc.proc.kill()
        proc.stop()
        caplog.clear()
        with (
            caplog.at_level("WARNING", logger="neuron_rtd.client"),
            pytest.raises(NrtConnectionError),
        ):
            client.load(mlp.neff)
        assert not [r for r in caplog.records if "unidentified" in r.getMessage()]


def test_more_models_than_groups_take_turns(
    daemon: DaemonProcess, stub: Any, mlp: SampleModel, mlp2: SampleModel
) -> None:
    with Client(daemon.address, ncg_sizes=[1]) as client:
        a, b = client.load(mlp.neff), client.load(mlp2.neff)
        assert a.ncg == b.ncg == client.ncgs[0]
        jobs = [(a, mlp, seed) for seed in range(6)] + [(b, mlp2, seed) for seed in range(6)]
        for model, sample, seed in jobs[::5] + jobs[1::3]:  # switch back and forth
            x = sample.random_inputs(seed)["x"]
            assert_probs(model(x=x), sample, x)

        def run(job: tuple[Any, SampleModel, int]) -> None:
            model, sample, seed = job
            x = sample.random_inputs(seed)["x"]
            assert_probs(model(x=x), sample, x)

        with futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(run, jobs * 2))  # concurrent calls on both: each waits its turn


# --- ninfer and async ---------------------------------------------------------------
def test_ninfer_bounds_what_the_client_sends(
    daemon: DaemonProcess, stub: Any, recorded: Any, mlp: SampleModel, slow_ncs: Any
) -> None:
    channel, recorder = recorded
    with Client(daemon.address, channel=channel) as client:
        model = client.load(mlp.neff, ninfer=2, timeout=30)
        x = mlp.random_inputs(0)
        slow_ncs(300)
        # without the client's semaphore a third inference in flight is refused
        posts = [
            stub.infer_post(
                pb.infer_request(
                    h_nn=pb.h_nn(id=model.id), ifmap=[pb.infer_io(name="x", buf=x["x"].tobytes())]
                )
            )
            for _ in range(3)
        ]
        assert [p.status.code for p in posts] == [Nerr.OK, Nerr.OK, Nerr.QUEUE_FULL]
        for p in posts[:2]:
            assert stub.infer_wait(pb.infer_wait_request(cookie=p.cookie)).status.code == 0
        slow_ncs(25)
        inputs = [mlp.random_inputs(seed)["x"] for seed in range(32)]

        def call(i: int) -> np.ndarray:
            return model(x=inputs[i])["probs"]

        with futures.ThreadPoolExecutor(16) as pool:  # 16 threads x 2 calls
            results = list(pool.map(call, range(32)))
        pending = [model.infer_async({"x": x}) for x in inputs[:12]]  # 12 at once
        asynced = [f.result(timeout=30) for f in pending]
        # posted=False: the first ninfer go at once as gRPC futures, the rest to the pool
        sent = [model.infer_async({"x": x}, posted=False) for x in inputs[12:24]]
        unposted = [f.result(timeout=30) for f in sent]
    for i, got in enumerate(results):
        assert_probs({"probs": got}, mlp, inputs[i])
    for i, outputs in enumerate(asynced + unposted):
        np.testing.assert_array_equal(outputs["probs"], results[i])
    assert len(recorder.requests("infer")) == 32 + 12
    assert len(recorder.requests("infer_post")) == len(recorder.requests("infer_wait")) == 12
    assert len(recorder.requests("shm_share")) == 4  # 2 slots x (input + output)
    codes = {r.status.code for r in recorder.responses("infer") + recorder.responses("infer_post")}
    assert codes == {Nerr.OK}  # never NERR_QUEUE_FULL


def test_an_unposted_async_inference_fails_as_infer_does(work: Path, mlp: SampleModel) -> None:
    """posted=False sent as a gRPC future: the daemon's refusal is an NrtClientError, and
    a daemon gone mid-call an NrtConnectionError (after the one retry), never a raw gRPC
    error or a hang; the client closes cleanly after either."""
    proc = DaemonProcess(sim_root=work / "sim_unposted")
    with proc, Client(proc.address) as client:
        model = client.load(mlp.neff, ninfer=2)
        bad = model.infer_async({"x": np.zeros((3, 16), np.float32)}, posted=False)
        error = bad.exception(timeout=30)
        assert isinstance(error, NrtClientError) and error.nerr == Nerr.INFER_BAD_INPUT
        x = mlp.random_inputs(3)["x"]
        assert_probs(model.infer_async({"x": x}, posted=False).result(timeout=30), mlp, x)
        inject = Path(proc.sim_root) / "neuron0" / "inject"
        inject.write_text("nc_delay_ms=3000\n")
        late = model.infer_async({"x": x}, posted=False)
        # in the daemon, sleeping on the NC: its run took the delay (the file emptied)
        wait_until(lambda: inject.stat().st_size == 0, 30, "the run's injected delay")
        assert proc.proc is not None
        proc.proc.kill()
        error = late.exception(timeout=30)
        assert isinstance(error, NrtConnectionError), repr(error)
        assert error.nerr == Nerr.FAIL and "no runtime answers" in error.details
        assert not model._slots._idle  # its slot, which the daemon might still write into, dropped


def test_async_errors_and_client_side_checks(
    daemon: DaemonProcess, stub: Any, mlp: SampleModel, tmp_path: Path
) -> None:
    with Client(daemon.address) as client:
        first = client.load(mlp.neff)
        bad = first.infer_async({"x": np.zeros((3, 16), np.float32)})
        error = bad.exception(timeout=30)
        assert isinstance(error, NrtClientError) and error.nerr == Nerr.INFER_BAD_INPUT
        first.unload()

        with pytest.raises(NrtClientError) as info:
            client.load(b"not a NEFF at all")
        assert info.value.nerr == Nerr.INVALID and info.value.method == "load"
        assert info.value.details  # the daemon's log lines
        with pytest.raises(NrtClientError) as info:
            client.unload(424242)
        assert info.value.code == Nerr.INVALID_HANDLE

        path = tmp_path / "mlp.neff"
        path.write_bytes(mlp.neff)
        x = mlp.random_inputs(7)["x"]
        for source, by_path in (
            (path, False),
            (str(path), True),
            (read_neff(mlp.neff), False),
            (bytearray(mlp.neff), False),
        ):
            with client.load(source, by_path=by_path) as model:
                assert_probs(model.infer({"x": x}), mlp, x)
                model.stop()
                with pytest.raises(NrtClientError):
                    model(x=x)
                model.start()
                assert_probs(model(x=x.astype(np.float64)), mlp, x)  # cast to the NEFF's dtype
            with pytest.raises(NrtClientError) as info:
                model(x=x)  # unloaded: refused here, its buffers are gone
            assert info.value.nerr == Nerr.INVALID_HANDLE
        assert daemon_shm(daemon.pid) == set() and leftover_names() == []


def test_no_daemon_is_an_nrt_client_error_naming_the_address(tmp_path: Path) -> None:
    missing = f"unix:{tmp_path}/none.sock"
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on (a dead daemon's)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(stale))
    listener.close()
    for address, reason in (
        (missing, "no socket"),
        (f"unix:{stale}", "is there but no daemon listens on it"),
    ):
        with Client(address, timeout_s=5) as client:
            with pytest.raises(NrtClientError) as info:
                client.version()
            assert isinstance(info.value, NrtConnectionError)
            assert info.value.nerr is Nerr.FAIL and info.value.method == "get_version"
            text = str(info.value)
            assert f"no runtime answers at {address}: " in text and reason in text
            assert "systemctl start neuron-rtd" in text and "NEURON_RTD_ADDRESS" in text
            with pytest.raises(NrtConnectionError, match=f"no runtime answers at {address}"):
                client.load(build_mlp((4, 4)).neff)
