"""Client death at scale: client processes that open a session, make an NCG, load (in
small chunks, so a kill can land mid-load), start, map shared memory and post inferences,
each SIGKILLed at a random point; first one after another, then many at once. Meanwhile
an observer keeps inferring on its own model. Afterwards nothing the clients made is
left: no NCG, model, shm map, file descriptor, thread or DRAM byte.

    python tests/client_deaths.py [--sequential 200] [--parallel 20] [--seed 1]

prints the figures (and exits 1 if anything was left or the observer was refused);
tests/daemon/client/test_client_deaths.py runs a small count of each in `make test`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from waiting import wait_until

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc, pb, pb_grpc

CHUNK = 16 << 10  # load in small chunks, a pause between them: kills land mid-load
KILL_WITHIN_S = 1.2  # each client is killed at a uniform random time in [0, this)


def client(address: str, neff: bytes, shm_path: str, x_bytes: int) -> None:
    """One client's life, until it is killed (it never ends on its own)."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub: Any = pb_grpc.nmgr_v1Stub(channel)
    requests: list[Any] = [pb.session_monitor_request(framework_name="deaths")]
    gate = threading.Event()

    def monitor() -> Any:
        yield requests[0]
        gate.wait()  # the stream stays open for the client's life

    stream = pb_grpc.nmgr_session_managerStub(channel).session_monitor(monitor())
    sid = next(stream).session_id  # the session lasts while `stream` does
    ncg = stub.create_eg(pb.create_eg_request(nc_count=1, session_id=sid)).h_eg

    def load_stream(*head: Any) -> Any:
        yield from head
        yield pb.load_request(session_id=sid)
        yield pb.load_request(neff_size=len(neff))
        for at in range(0, len(neff), CHUNK):
            yield pb.load_request(neff_chunk=pb.file_chunk(chunk=neff[at : at + CHUNK]))
            time.sleep(0.002)

    model = stub.load(load_stream(pb.load_request(h_eg=ncg))).h_nn
    stub.start(pb.start_request(h_nn=model))
    implicit = stub.load(load_stream()).h_nn
    Path("/dev/shm", shm_path.lstrip("/")).write_bytes(bytes(x_bytes))
    stub.shm_map(pb.shm_map_request(path=shm_path, mmap_prot=3, session_id=sid))
    x = pb.infer_io(name="x", buf_shm=pb.shared_mem_buf(path=shm_path))
    while True:
        for handle in (model, implicit):
            stub.infer_post(pb.infer_request(h_nn=handle, ifmap=[x]))
        stub.infer(pb.infer_request(h_nn=implicit, ifmap=[x]))


@dataclass
class Observer:
    """Infers on its own model the whole time: every answer must be OK."""

    address: str
    neff: bytes
    x: bytes
    calls: int = 0
    refused: list[str] = field(default_factory=list)
    worst_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS) as channel:
            stub: Any = pb_grpc.nmgr_v1Stub(channel)
            stream = [
                pb.load_request(neff_size=len(self.neff)),
                pb.load_request(neff_chunk=pb.file_chunk(chunk=self.neff)),
            ]
            model = stub.load(iter(stream)).h_nn
            request = pb.infer_request(h_nn=model, ifmap=[pb.infer_io(name="x", buf=self.x)])
            while not self._stop.is_set():
                began = time.monotonic()
                status = stub.infer(request, timeout=30).status
                self.worst_s = max(self.worst_s, time.monotonic() - began)
                self.calls += 1
                if status.code != Nerr.OK:
                    self.refused.append(f"{Nerr(status.code).name}: {status.details.decode()}")
            stub.unload(pb.unload_request(h_nn=model))

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Snapshot:
    ncgs: int
    dram: int
    fds: int
    threads: int

    @classmethod
    def of(cls, stub: Any, ext: Any, pid: int) -> Snapshot:
        describe = ext.describe(ext_pb.describe_request())
        return cls(
            ncgs=len(stub.list_egs(pb.empty()).eg_info),
            dram=sum(d.memory_used for d in describe.devices),
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            threads=len(os.listdir(f"/proc/{pid}/task")),
        )


def gone(before: Snapshot, after: Snapshot) -> bool:
    """The NCGs and DRAM are as they were: the sessions made since have ended."""
    return (after.ncgs, after.dram) == (before.ncgs, before.dram)


def settled(before: Snapshot, after: Snapshot) -> bool:
    """Nothing left of the clients: the same NCGs and DRAM, no more fds (gRPC may keep one
    more for good) and no more threads (the call pool's idle threads have ended; gRPC's own
    native threads may come and go by one or two; a thread left per client would show as
    dozens)."""
    return (
        gone(before, after) and after.fds <= before.fds + 1 and after.threads <= before.threads + 2
    )


@dataclass
class Result:
    clients: int
    seconds: float
    observer_calls: int
    observer_refused: list[str]
    observer_worst_s: float
    before: Snapshot
    after: Snapshot
    settle_s: float
    maps_left: list[str]

    @property
    def clean(self) -> bool:
        return not self.observer_refused and not self.maps_left and settled(self.before, self.after)


def run(address: str, pid: int, *, sequential: int, parallel: int, seed: int) -> Result:
    """Kill `sequential` clients one after another, then `parallel` at once, against the
    daemon at `address` (process `pid`), and look at what is left."""
    rng = random.Random(seed)
    sample = build_mlp((128, 1024, 8), batch=2, seed=4)  # 0.5 MiB: a load takes 33 chunks
    x = bytes(sample.random_inputs()["x"].tobytes())
    context = multiprocessing.get_context("forkserver")
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub: Any = pb_grpc.nmgr_v1Stub(channel)
    ext: Any = ext_pb_grpc.nmgr_extStub(channel)
    observer = Observer(address, sample.neff, x)
    watcher = threading.Thread(target=observer.run)
    watcher.start()
    wait_until(lambda: observer.calls >= 3, 60, "the observer's model answering")
    paths: list[str] = []

    def wave(count: int) -> None:
        procs = []
        for _ in range(count):
            path = f"/nrtd_deaths_{uuid.uuid4().hex}"
            paths.append(path)
            proc = context.Process(target=client, args=(address, sample.neff, path, len(x)))
            proc.start()
            procs.append((proc, time.monotonic() + rng.uniform(0, KILL_WITHIN_S)))
        for proc, kill_at in sorted(procs, key=lambda p: p[1]):
            time.sleep(max(0.0, kill_at - time.monotonic()))
            proc.kill()
            proc.join()

    try:
        # A first wave, not counted, starts what stays for good (pools of the models'
        # runs, shm readers), so that what stays after the counted waves and the settle
        # wait is a leak, however busy this host is. (The gRPC call pool's threads beyond
        # those it keeps end after IDLE_EXIT_S idle, the observer's calls going on: its
        # newest idle thread takes each call.) The snapshot is taken once the wave's
        # sessions have ended: their NCGs and DRAM are given back.
        baseline = Snapshot.of(stub, ext, pid)
        wave(parallel)
        wait_until(
            lambda: gone(baseline, Snapshot.of(stub, ext, pid)), 60, "the first wave's sessions"
        )
        before = Snapshot.of(stub, ext, pid)
        started = time.monotonic()
        for _ in range(sequential):
            wave(1)
        wave(parallel)
        seconds = time.monotonic() - started
        settle_began = time.monotonic()
        after = Snapshot.of(stub, ext, pid)
        while time.monotonic() - settle_began < 10 and not settled(before, after):
            time.sleep(0.05)  # the last sessions' ends, connections and threads
            after = Snapshot.of(stub, ext, pid)
        settle_s = time.monotonic() - settle_began
        maps_left = [
            p
            for p in paths
            if stub.shm_unmap(pb.shm_unmap_request(path=p)).status.code != Nerr.INVALID
        ]
    finally:
        observer.stop()
        watcher.join()
        for path in paths:
            Path("/dev/shm", path.lstrip("/")).unlink(missing_ok=True)
        channel.close()
    return Result(
        clients=sequential + parallel,
        seconds=seconds,
        observer_calls=observer.calls,
        observer_refused=observer.refused,
        observer_worst_s=observer.worst_s,
        before=before,
        after=after,
        settle_s=settle_s,
        maps_left=maps_left,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="nrt-deaths-") as work,
        DaemonProcess(sim_root=Path(work) / "sim") as daemon,
    ):
        result = run(
            daemon.address,
            daemon.pid,
            sequential=args.sequential,
            parallel=args.parallel,
            seed=args.seed,
        )
        log = daemon.log()
    tracebacks = log.count("Traceback")
    if tracebacks:
        print(log[log.index("Traceback") - 2000 :][:6000])
    print(
        f"{result.clients} clients killed ({args.sequential} one after another, "
        f"{args.parallel} at once) in {result.seconds:.1f} s"
    )
    print(f"before: {result.before}")
    print(f"after:  {result.after} (settled {result.settle_s:.2f} s after the last kill)")
    print(f"shm maps left: {len(result.maps_left)}; tracebacks in the daemon log: {tracebacks}")
    print(
        f"observer: {result.observer_calls} inferences, {len(result.observer_refused)} "
        f"refused, slowest {result.observer_worst_s * 1e3:.0f} ms"
    )
    return 0 if result.clean and not tracebacks else 1


if __name__ == "__main__":
    sys.exit(main())
