"""Idle streams cannot starve anyone (issue 38, point 9): a member holding 64
`infer_stream`, `ModelStreamInfer` or `load` streams filled each 64-thread pool, and every
other client's stream or load waited past its deadline.

First the stream table itself (`neuron_rtd/server/streams.py`) on an in-process server
with small limits: idle streams hold no thread, the longest idle gives way when the table
is full and an active one never does, a session's cap, a stalled load, an answer's own
error, the daemon's stop. Then the daemon as the unit starts it (test_service_user.py's
`unit_service`), a member holding hundreds of idle streams of each kind while root's
stream, load and inference are answered within 5 s, past the table's bound, past a
session's cap, a stalled load, and SIGTERM within 15 s after."""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from test_service_user import (
    OTHER_UID,
    STAND_IN_GID,
    Service,
    as_user,
    model_repository,
    unit_service,
)
from waiting import wait_until

from neuron_rtd.client import Client
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import SESSION_METADATA, kserve_pb, kserve_pb_grpc, pb, pb_grpc
from neuron_rtd.server import MAX_OPEN_STREAMS, MAX_STREAMS_PER_SESSION, STALLED_AFTER_S
from neuron_rtd.server.streams import StreamTable

MLP = build_mlp((32, 16, 4), name="mlp")
STACKS = "(most recent call first)"  # in faulthandler's dump of a thread's stack
HOLD = 7  # a request of this model id is held until released
FAIL = 8  # ... raises in its answer


# --- the table, in process -------------------------------------------------------------


class Answers:
    """Each request answered with its model id as the status code; HOLD ones once
    `release` is set; FAIL ones raise. With `last` set (a load-like stream), no request
    is answered and `end` answers 99."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    def answer(self, request: pb.infer_request) -> pb.infer_response | None:
        if self.bench.last:  # a load's messages: its answer comes at the end
            return None
        if request.h_nn.id == HOLD:
            self.bench.held.put(None)
            assert self.bench.release.wait(30)
        if request.h_nn.id == FAIL:
            raise RuntimeError("this answer fails")
        return pb.infer_response(status=pb.status(code=request.h_nn.id))

    def end(self) -> pb.infer_response | None:
        return pb.infer_response(status=pb.status(code=99)) if self.bench.last else None


class Bench:
    """A server of one stream method through a StreamTable with small limits, on a pool
    of 3 threads; `open()` a stream, fed by a queue."""

    def __init__(self, tmp: Path, *, unary: bool = False, **limits: Any) -> None:
        self.table = StreamTable(**limits)
        self.release = threading.Event()
        self.held: queue.Queue[None] = queue.Queue()
        self.last = unary
        self.pool = futures.ThreadPoolExecutor(3)
        handler = self.table.handler(
            "chat",
            lambda context: Answers(self),
            request=pb.infer_request,
            response=pb.infer_response,
            pool=self.pool,
            unary=unary,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Streams",
                    {"Chat": handler},
                ),
            )
        )
        tmp.mkdir()
        self.target = f"unix:{tmp / 'streams.sock'}"
        self.server.add_insecure_port(self.target)
        self.server.start()
        self.channel = grpc.insecure_channel(self.target)
        self.chat = self.channel.stream_stream(
            "/test.Streams/Chat",
            request_serializer=pb.infer_request.SerializeToString,
            response_deserializer=pb.infer_response.FromString,
        )

    def open(self, session: int | None = None) -> Stream:
        requests: queue.Queue[pb.infer_request | None] = queue.Queue()
        metadata = () if session is None else ((SESSION_METADATA, str(session)),)
        call = self.chat(iter(requests.get, None), metadata=metadata)
        return Stream(requests, call)

    def close(self) -> None:
        self.release.set()
        self.channel.close()
        self.server.stop(None)
        self.pool.shutdown()


class Stream:
    def __init__(self, requests: queue.Queue[pb.infer_request | None], call: Any) -> None:
        self.requests = requests
        self.call = call

    def ask(self, model: int) -> None:
        self.requests.put(pb.infer_request(h_nn=pb.h_nn(id=model)))

    def answer(self) -> int:
        """The next answer's code (the stream must give one)."""
        return int(next(self.call).status.code)

    def round(self, model: int = 1) -> int:
        self.ask(model)
        return self.answer()

    def ended(self) -> tuple[grpc.StatusCode, str]:
        """How the stream ended (waiting for its end)."""
        try:
            answer = next(self.call)
        except (StopIteration, grpc.RpcError):
            return self.call.code(), self.call.details() or ""
        raise AssertionError(f"an answer more: {answer}")

    def end_with(self) -> tuple[grpc.StatusCode, str]:
        """End its side, then how the stream ended."""
        self.requests.put(None)
        return self.ended()


@pytest.fixture
def benches(tmp_path: Path) -> Iterator[Callable[..., Bench]]:
    """Make a Bench with the given limits (closed at the end)."""
    made: list[Bench] = []

    def make(**limits: Any) -> Bench:
        made.append(Bench(tmp_path / str(len(made)), **limits))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def bench(benches: Callable[..., Bench]) -> Bench:
    return benches()


def test_idle_streams_hold_no_thread(bench: Bench) -> None:
    """30 streams, each answered once and now waiting for its client, on a pool of 3:
    another stream is answered at once, and so is each of them again."""
    streams = [bench.open() for _ in range(30)]
    assert [s.round(i % 5 + 1) for i, s in enumerate(streams)] == [i % 5 + 1 for i in range(30)]
    latecomer = bench.open()
    assert latecomer.round(3) == 3
    assert [s.round(2) for s in streams] == [2] * 30
    for stream in [*streams, latecomer]:
        assert stream.end_with() == (grpc.StatusCode.OK, "")
    assert bench.table.open_streams() == 0


def test_when_full_the_longest_idle_gives_way_and_an_active_one_never(
    benches: Callable[..., Bench],
) -> None:
    bench = benches(most=3)
    busy, first, second = bench.open(), bench.open(), bench.open()
    first.round()
    second.round()
    busy.ask(HOLD)
    bench.held.get(timeout=10)  # its request is being worked on
    third = bench.open()
    assert third.round(4) == 4
    code, details = first.ended()  # idle longest: it gave way, saying why
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "was idle (waiting for its client) and was closed to serve another client" in details
    assert "at most 3 open streams" in details
    fourth = bench.open()
    assert fourth.round(5) == 5
    assert second.ended()[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    third.ask(HOLD)
    fourth.ask(HOLD)
    for _ in range(2):
        bench.held.get(timeout=10)  # every open stream has work: a new one is refused
    refused = bench.open()
    code, details = refused.ended()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "holds 3 open streams, each with work running: retry" in details
    bench.release.set()
    assert [busy.answer(), third.answer(), fourth.answer()] == [HOLD] * 3
    for stream in (busy, third, fourth):
        assert stream.end_with() == (grpc.StatusCode.OK, "")


def test_a_session_holds_at_most_its_share(benches: Callable[..., Bench]) -> None:
    bench = benches(per_session=2)
    mine = [bench.open(session=5) for _ in range(2)]
    assert [s.round() for s in mine] == [1, 1]
    code, details = bench.open(session=5).ended()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the session presented already holds 2 open streams" in details
    other = bench.open(session=6)
    anonymous = bench.open()
    assert other.round() == anonymous.round() == 1
    assert mine[0].end_with()[0] == grpc.StatusCode.OK
    again = bench.open(session=5)  # one ended: room again
    assert again.round() == 1
    code, details = bench.open(session=0x1_0000_0000_0000_0000).ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nrt-session-id" in details


def test_an_answers_own_error_ends_its_stream_and_the_rest_serve_on(bench: Bench) -> None:
    stream, other = bench.open(), bench.open()
    stream.ask(FAIL)
    code, details = stream.ended()
    assert code == grpc.StatusCode.INTERNAL and "the daemon's log has its traceback" in details
    assert other.round(3) == 3 and bench.open().round(2) == 2


def test_a_load_stream_that_sends_nothing_is_ended(benches: Callable[..., Bench]) -> None:
    bench = benches(unary=True, stalled_after_s=0.5)
    stalled, steady = bench.open(), bench.open()
    stalled.ask(1)  # one message, then nothing
    steady.ask(1)
    steady.ask(2)
    steady.requests.put(None)
    assert steady.answer() == 99  # its one answer, then the end
    assert steady.ended() == (grpc.StatusCode.OK, "")
    code, details = stalled.ended()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the stream sent nothing for 0.5 s and was ended" in details


def test_the_stop_ends_each_stream_once_answered(bench: Bench) -> None:
    idle, busy = bench.open(), bench.open()
    assert idle.round() == 1
    busy.ask(HOLD)
    bench.held.get(timeout=10)
    bench.table.close()
    assert idle.ended() == (grpc.StatusCode.OK, "")
    assert not busy.call.done()  # its request still runs
    bench.release.set()
    assert busy.answer() == HOLD and busy.ended() == (grpc.StatusCode.OK, "")
    code, details = bench.open().ended()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "the daemon is stopping" in details


# --- the daemon as the unit starts it ---------------------------------------------------

# A member holding streams: each kind's count opened (infer_stream and ModelStreamInfer
# answered once each, so that each is open on the daemon and now idle; a load sends its
# neff_size, then nothing), "ready" printed; then, at each line read, how each kind's
# streams stand: alive, or ended with (code, details); at the end of its input it leaves.
HOLDER = """
import asyncio, json, sys, grpc
from neuron_rtd.proto import SESSION_METADATA, kserve_pb, kserve_pb_grpc, pb, pb_grpc
address, plan = sys.argv[1], json.loads(sys.argv[2])
PER_CHANNEL = 100

def started(kind, channel, metadata):  # a new stream of kind, and its first request
    if kind == "infer_stream":
        call = pb_grpc.nmgr_streamStub(channel).infer_stream(metadata=metadata)
        return call, pb.infer_request(h_nn=pb.h_nn(id=424242))
    if kind == "ModelStreamInfer":
        call = kserve_pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            metadata=metadata
        )
        return call, kserve_pb.ModelInferRequest(model_name="nothing-here")
    return pb_grpc.nmgr_v1Stub(channel).load(metadata=metadata), None

async def opened(kind, index, channel, metadata):
    call, first = started(kind, channel, metadata)
    if first is None:
        await call.write(pb.load_request(neff_size=4096))
        return call, True
    try:  # a stream refused at once may end before its first request is written
        await call.write(first)
        answered = await asyncio.wait_for(call.read(), 60) is not grpc.aio.EOF
    except (asyncio.TimeoutError, grpc.RpcError, asyncio.InvalidStateError):
        answered = False
    return call, answered

async def probed(kind, channel, metadata):
    # a stream opened and read, nothing written: one the daemon refuses ends with its
    # status (a write racing the refusal would have grpc.aio's own INTERNAL replace it);
    # one it takes stays open (read until 30 s)
    call, _ = started(kind, channel, metadata)
    try:
        await asyncio.wait_for(call.read(), 30)
    except (asyncio.TimeoutError, grpc.RpcError):
        pass
    return call

async def stand(call):
    if not call.done():
        return "alive"
    return [(await call.code()).name, await call.details()]

async def main():
    channels, calls, unanswered, metadata = [], {}, {}, []
    if plan.get("session"):  # its own session, presented on every stream
        channels.append(grpc.aio.insecure_channel(address))
        monitor = pb_grpc.nmgr_session_managerStub(channels[0]).session_monitor()
        await monitor.write(pb.session_monitor_request(framework_name="holder"))
        metadata = [(SESSION_METADATA, str((await monitor.read()).session_id))]
    for kind, count in plan["open"]:
        made = []
        for index in range(count):
            if index % PER_CHANNEL == 0:
                options = [("nrt.test.channel", len(channels))]  # a connection each
                channels.append(grpc.aio.insecure_channel(address, options=options))
            made.append(await opened(kind, index, channels[-1], metadata))
        calls.setdefault(kind, []).extend(call for call, _ in made)
        unanswered[kind] = unanswered.get(kind, 0) + sum(not ok for _, ok in made)
    for kind in plan.get("probe", []):  # one more of each, read without a write
        calls.setdefault(kind, []).append(await probed(kind, channels[-1], metadata))
    print(json.dumps({"ready": unanswered}), flush=True)
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        report = {kind: [await stand(c) for c in made] for kind, made in calls.items()}
        print(json.dumps(report), flush=True)
    for channel in channels:
        await channel.close()

asyncio.run(main())
"""


class Holder:
    """A member's process holding streams as HOLDER does."""

    def __init__(self, address: str, plan: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [
                *as_user(OTHER_UID, OTHER_UID, STAND_IN_GID),
                sys.executable,
                "-c",
                HOLDER,
                address,
                json.dumps(plan),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
            text=True,
            cwd="/",
        )
        self.unanswered: dict[str, int] = self._line()["ready"]

    def _line(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the holder ended (exit {self.proc.wait(60)})"
        return json.loads(line)

    def report(self) -> dict[str, list[Any]]:
        """How each kind's streams stand now."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return dict(self._line())

    def leave(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(60)


@contextlib.contextmanager
def holding(daemon: Daemon, plan: dict[str, Any]) -> Iterator[Holder]:
    """A member holding the streams of `plan`, each answered as it opened."""
    holder = Holder(daemon.address, plan)
    try:
        assert holder.unanswered == {kind: 0 for kind, _ in plan["open"]}, holder.unanswered
        yield holder
    finally:
        holder.leave()


@dataclass
class Daemon:
    service: Service
    repo: Path

    @property
    def address(self) -> str:
        return f"unix:{self.service.path('/run/neuron.sock')}"

    def log(self) -> str:
        return self.service.log.read_text(errors="replace")

    def within_5s(self) -> None:
        """Root's streams, a load and an inference of each protocol, health: each
        answered within 5 s."""
        channel = grpc.insecure_channel(self.address)
        v2 = kserve_pb_grpc.GRPCInferenceServiceStub(channel)
        x = MLP.random_inputs(1)["x"]
        want = MLP.reference({"x": x})["probs"]
        assert v2.ServerReady(kserve_pb.ServerReadyRequest(), timeout=5).ready
        with Client(self.address, timeout_s=5) as client:
            model = client.load(MLP.neff)  # a load stream
            np.testing.assert_allclose(model(x=x)["probs"], want, rtol=1e-5)
            request = pb.infer_request(
                h_nn=pb.h_nn(id=model.id), ifmap=[pb.infer_io(name="x", buf=x.tobytes())]
            )
            (answer,) = pb_grpc.nmgr_streamStub(channel).infer_stream(iter([request]), timeout=5)
            assert answer.status.code == Nerr.OK
            model.unload()
        v2_request = kserve_pb.ModelInferRequest(
            model_name="mlp",
            inputs=[
                kserve_pb.ModelInferRequest.InferInputTensor(
                    name="x", datatype="FP32", shape=list(x.shape)
                )
            ],
            raw_input_contents=[x.tobytes()],
        )
        (streamed,) = v2.ModelStreamInfer(iter([v2_request]), timeout=5)
        assert not streamed.error_message, streamed.error_message
        probs = np.frombuffer(streamed.infer_response.raw_output_contents[0], np.float32)
        np.testing.assert_allclose(probs.reshape(want.shape), want, rtol=1e-5)
        channel.close()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    top = Path(tempfile.mkdtemp(prefix="nrtd-streams-"))
    try:
        repository = model_repository(top, {"mlp": MLP.neff})
        args = ["--model-repository", str(repository), "--model-control-mode", "explicit"]
        with unit_service(*args, "--load-model", "mlp") as service:
            yield Daemon(service, top / "repo")
    finally:
        shutil.rmtree(top, ignore_errors=True)


KINDS = ("infer_stream", "ModelStreamInfer", "load")


@pytest.mark.daemon
def test_a_member_holding_idle_streams_starves_no_one(daemon: Daemon) -> None:
    """200 idle streams of each kind, three times what used to fill each pool: each was
    answered as it opened, and root's stream, load and inference of both protocols answer
    within 5 s; none of the member's streams was ended for it."""
    plan = {"open": [[kind, 200] for kind in KINDS]}
    with holding(daemon, plan) as holder:
        daemon.within_5s()
        report = holder.report()
    for kind in KINDS:
        assert report[kind] == ["alive"] * 200, (kind, report[kind][:3])
    daemon.within_5s()  # and after


@pytest.mark.daemon
def test_past_the_bound_the_longest_idle_streams_give_way(daemon: Daemon) -> None:
    """MAX_OPEN_STREAMS idle streams and 20 more: the 20 opened first (idle longest) ended
    RESOURCE_EXHAUSTED, saying why; the rest, and root's calls, served."""
    plan = {"open": [["infer_stream", MAX_OPEN_STREAMS + 20]]}
    with holding(daemon, plan) as holder:
        daemon.within_5s()  # root's own streams push out 2 more of the member's idle ones
        report = holder.report()["infer_stream"]
    ended = [(i, stood) for i, stood in enumerate(report) if stood != "alive"]
    assert [i for i, _ in ended] == list(range(len(ended))), ended[:3]
    assert 20 <= len(ended) <= 22, len(ended)
    for _, (code, details) in ended:
        assert code == "RESOURCE_EXHAUSTED", details
        assert "this stream was idle (waiting for its client) and was closed to serve" in details


@pytest.mark.daemon
def test_a_session_holds_at_most_its_share_of_streams(daemon: Daemon) -> None:
    """A member presenting its session on one stream more than a session may hold: that
    one is refused RESOURCE_EXHAUSTED, saying so; the others serve. (The one past the
    bound is read before anything is written on it: a write racing the refusal would
    have the client's own INTERNAL replace the daemon's status.)"""
    plan = {
        "open": [["infer_stream", MAX_STREAMS_PER_SESSION]],
        "probe": ["infer_stream"],
        "session": True,
    }
    holder = Holder(daemon.address, plan)
    try:
        assert holder.unanswered == {"infer_stream": 0}
        *served, (code, details) = holder.report()["infer_stream"]
    finally:
        holder.leave()
    assert served == ["alive"] * MAX_STREAMS_PER_SESSION
    assert code == "RESOURCE_EXHAUSTED", (details, daemon.log()[-4000:])
    assert f"the session presented already holds {MAX_STREAMS_PER_SESSION} open" in details


@pytest.mark.daemon
def test_a_stalled_load_is_ended_and_the_daemon_stops_within_15s(daemon: Daemon) -> None:
    """A load that sends its neff_size and then nothing ends RESOURCE_EXHAUSTED after
    STALLED_AFTER_S; then, with a member's idle streams of each kind open, SIGTERM ends the
    daemon within 15 s."""
    with holding(daemon, {"open": [["load", 1]]}) as holder:
        try:
            wait_until(
                lambda: holder.report()["load"][0] != "alive",
                STALLED_AFTER_S + 30,
                "the stalled load ended",
            )
        except AssertionError:
            daemon.service.proc.send_signal(signal.SIGUSR1)  # its threads' stacks
            with contextlib.suppress(AssertionError):
                wait_until(lambda: STACKS in daemon.log(), 10, "faulthandler's dump")
            raise AssertionError(f"not ended; the log ends:\n{daemon.log()[-20000:]}") from None
        stood = holder.report()["load"][0]
    code, details = stood
    assert code == "RESOURCE_EXHAUSTED"
    assert f"the stream sent nothing for {STALLED_AFTER_S:g} s and was ended" in details
    with holding(daemon, {"open": [[kind, 100] for kind in KINDS]}):
        daemon.within_5s()
        daemon.service.proc.send_signal(signal.SIGTERM)
        code = daemon.service.proc.wait(15)
    assert code == 0, daemon.log()[-4000:]
    assert "Traceback" not in daemon.log()
