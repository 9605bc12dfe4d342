"""Concurrency stress through the real daemon: 16 threads make and destroy NCGs, load,
start, stop and unload models and infer (sync and posted), at random, on each other's
NCGs and models, for a bounded time (NEURON_RTD_STRESS_SECONDS, default 6).

Every call is answered within its deadline (a call past it means a deadlock: the
daemon's stacks are dumped with SIGUSR1 into its log, shown with the failure), with a
defined nerr code and never an internal error; afterwards the NCGs do not overlap, and
unloading everything leaves no NCG and no DRAM byte."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc, pb, pb_grpc

SECONDS = float(os.environ.get("NEURON_RTD_STRESS_SECONDS", "6"))
THREADS = 16
DEADLINE_S = 30.0  # per call: far past any legitimate wait (a model's timeout is 2 s)


class Shared:
    """The NCGs and models the threads made, which any thread may use or destroy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ncgs: list[int] = []
        self.models: list[int] = []
        self.codes: Counter[tuple[str, str]] = Counter()
        self.failures: list[str] = []

    def pick(self, rng: random.Random, kind: list[int]) -> int:
        with self.lock:
            return rng.choice(kind) if kind and rng.random() < 0.9 else rng.randrange(1, 5)

    def forget(self, kind: list[int], handle: int, code: int) -> None:
        """A handle unloaded or destroyed (by this call, or already) is used no more."""
        if code in (Nerr.OK, Nerr.INVALID_HANDLE):
            with self.lock:
                if handle in kind:
                    kind.remove(handle)


def status_of(response: Any) -> Any:
    return response if isinstance(response, pb.status) else response.status


def worker(index: int, address: str, neff: bytes, x: bytes, shared: Shared, end: float) -> None:
    rng = random.Random(index)
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub: Any = pb_grpc.nmgr_v1Stub(channel)

        def load() -> Any:
            head = []
            if rng.random() < 0.7:
                head.append(pb.load_request(h_eg=pb.h_eg(id=shared.pick(rng, shared.ncgs))))
            stream = [
                *head,
                pb.load_request(neff_size=len(neff)),
                pb.load_request(neff_chunk=pb.file_chunk(chunk=neff)),
            ]
            response = stub.load(iter(stream), timeout=DEADLINE_S)
            if response.status.code == Nerr.OK:
                with shared.lock:
                    shared.models.append(response.h_nn.id)
            return response

        def create() -> Any:
            response = stub.create_eg(
                pb.create_eg_request(nc_count=rng.choice([1, 1, 2])), timeout=DEADLINE_S
            )
            if response.status.code == Nerr.OK:
                with shared.lock:
                    shared.ncgs.append(response.h_eg.id)
            return response

        def model() -> Any:
            return pb.h_nn(id=shared.pick(rng, shared.models))

        def infer() -> Any:
            request = pb.infer_request(h_nn=model(), ifmap=[pb.infer_io(name="x", buf=x)])
            return stub.infer(request, timeout=DEADLINE_S)

        def post_wait() -> Any:
            request = pb.infer_request(h_nn=model(), ifmap=[pb.infer_io(name="x", buf=x)])
            posted = stub.infer_post(request, timeout=DEADLINE_S)
            if posted.status.code != Nerr.OK:
                return posted
            wait = pb.infer_wait_request(cookie=posted.cookie)
            return stub.infer_wait(wait, timeout=DEADLINE_S)

        def destroy() -> Any:
            handle = shared.pick(rng, shared.ncgs)
            request = pb.destroy_eg_request(h_eg=pb.h_eg(id=handle))
            response = stub.destroy_eg(request, timeout=DEADLINE_S)
            shared.forget(shared.ncgs, handle, response.status.code)
            return response

        def unload() -> Any:
            handle = model()
            response = stub.unload(pb.unload_request(h_nn=handle), timeout=DEADLINE_S)
            shared.forget(shared.models, handle.id, response.status.code)
            return response

        ops: dict[str, Callable[[], Any]] = {
            "create_eg": create,
            "destroy_eg": destroy,
            "load": load,
            "unload": unload,
            "start": lambda: stub.start(pb.start_request(h_nn=model()), timeout=DEADLINE_S),
            "stop": lambda: stub.stop(pb.stop_request(h_nn=model()), timeout=DEADLINE_S),
            "infer": infer,
            "post_wait": post_wait,
            "list_egs": lambda: stub.list_egs(pb.empty(), timeout=DEADLINE_S),
        }
        weights = [2, 1, 3, 1, 2, 1, 6, 4, 1]
        names = list(ops)
        while time.monotonic() < end:
            name = rng.choices(names, weights)[0]
            try:
                status = status_of(ops[name]())
            except grpc.RpcError as exc:
                shared.failures.append(f"{name}: {exc.code()} {exc.details()}")
                return
            details = status.details.decode(errors="replace")
            try:
                code = Nerr(status.code).name
            except ValueError:
                shared.failures.append(f"{name}: undefined code {status.code}: {details}")
                continue
            if "internal error" in details or "Traceback" in details:
                shared.failures.append(f"{name}: {code}: {details}")
            with shared.lock:
                shared.codes[name, code] += 1


@pytest.fixture
def one_device(tmp_path: Path) -> Any:
    with DaemonProcess(sim_root=tmp_path / "sim", args=["-t", "0000:00:1c.0"]) as daemon:
        yield daemon


def test_random_calls_from_16_threads_end_answered_and_consistent(one_device: Any) -> None:
    daemon = one_device
    sample = build_mlp((16, 32, 4), batch=1, neuron_nodes=2, seed=2)
    x = sample.random_inputs()["x"].tobytes()
    shared = Shared()
    end = time.monotonic() + SECONDS
    threads = [
        threading.Thread(target=worker, args=(i, daemon.address, sample.neff, x, shared, end))
        for i in range(THREADS)
    ]
    faulthandler.dump_traceback_later(SECONDS + 3 * DEADLINE_S)  # our own stacks if stuck
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        faulthandler.cancel_dump_traceback_later()
    if shared.failures:
        logged = len(daemon.log())
        os.kill(daemon.pid, signal.SIGUSR1)  # the daemon's stacks, into its log
        with contextlib.suppress(AssertionError):  # the failures are told even without them
            wait_until(lambda: "most recent call first" in daemon.log()[logged:], 10, "stacks")
        log = daemon.log()[-8000:]
        pytest.fail("\n".join(shared.failures[:10]) + "\n--- daemon log ---\n" + log)
    done = sum(shared.codes.values())
    ok = {name for (name, code), n in shared.codes.items() if code == "OK"}
    assert {"create_eg", "load", "infer", "post_wait", "unload"} <= ok, shared.codes
    assert done > 50 * THREADS * min(1.0, SECONDS / 6), done

    with grpc.insecure_channel(daemon.address, options=CHANNEL_OPTIONS) as channel:
        stub: Any = pb_grpc.nmgr_v1Stub(channel)
        ncgs = stub.list_egs(pb.empty()).eg_info
        used = [set(range(g.vnc_start_index, g.vnc_start_index + g.nc_count)) for g in ncgs]
        assert sum(map(len, used)) == len(set().union(*used)) <= 4, ncgs  # no NC twice
        assert stub.unload_all(pb.empty()).code == Nerr.OK
        assert not stub.list_egs(pb.empty()).eg_info
        describe = ext_pb_grpc.nmgr_extStub(channel).describe(ext_pb.describe_request())
        assert [d.memory_used for d in describe.devices] == [0]
    assert "Traceback" not in daemon.log()
