"""Synchronous infer round trip of a tiny model through the daemon, against a bare gRPC
echo over the same kind of socket, side by side in one run.

    python bench/infer_roundtrip.py [--calls 2000] [--rounds 5]

Both servers are separate processes on unix sockets; the echo server answers with the
request's own bytes (the serialized infer request, so both carry the same payload). Beside
them, our `Client`'s synchronous infer of the same model (its tensors in shared memory, on
the peer socket's fast lane) against a bare echo on a SOCK_SEQPACKET unix socket, the
lane's own floor.
Calls alternate in rounds so machine noise hits both alike. Prints p50/p99 and the ratio,
plus the daemon's cheapest call (get_version), which separates the daemon's fixed cost per
call from the inference's own, and each server's CPU time per call (user + system, from
/proc), which is what bounds a server's throughput. The echo server also answers a
protobuf call of get_version's shape (a trivial handler behind gRPC's (de)serializers, on
both ends): what protobuf adds to a call, which the bytes echo does not pay, so that
get_version against it is the daemon's own cost.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from echo import (  # bench/echo.py (a script's folder is on its path)
    ECHO_METHOD,
    VERSION_METHOD,
    serve_echo,
    serve_socket_echo,
)
from timing import percentile  # bench/timing.py (a script's folder is on its path)

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import CHANNEL_OPTIONS, pb, pb_grpc


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per side in all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve-echo", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--serve-socket-echo", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return 0
    if args.serve_socket_echo:
        serve_socket_echo(args.serve_socket_echo)
        return 0

    work = Path(tempfile.mkdtemp(prefix="nrt-bench-"))
    echo_address = f"unix:{work}/echo.sock"
    echo = subprocess.Popen(
        [sys.executable, __file__, "--serve-echo", echo_address], stdout=subprocess.PIPE, text=True
    )
    assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
    socket_path = str(work / "socket-echo.sock")
    socket_echo = subprocess.Popen(
        [sys.executable, __file__, "--serve-socket-echo", socket_path],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert socket_echo.stdout is not None and socket_echo.stdout.readline().strip() == "ready"
    sample = build_mlp((16, 16, 4), batch=1, seed=0)
    with DaemonProcess(sim_root=work / "sim", args=["-t", "0000:00:1c.0", "-l", "warning"]) as d:
        daemon_ch = grpc.insecure_channel(d.address, options=CHANNEL_OPTIONS)
        echo_ch = grpc.insecure_channel(echo_address, options=CHANNEL_OPTIONS)
        stub = pb_grpc.nmgr_v1Stub(daemon_ch)
        stream = [
            pb.load_request(neff_size=len(sample.neff)),
            pb.load_request(neff_chunk=pb.file_chunk(chunk=sample.neff)),
        ]
        loaded = stub.load(iter(stream))
        assert loaded.status.code == 0, loaded.status.details
        x = sample.random_inputs()["x"].tobytes()
        request = pb.infer_request(h_nn=loaded.h_nn, ifmap=[pb.infer_io(name="x", buf=x)])
        payload = request.SerializeToString()
        echo_call = echo_ch.unary_unary(
            ECHO_METHOD, request_serializer=None, response_deserializer=None
        )
        protobuf_call = echo_ch.unary_unary(
            VERSION_METHOD,
            request_serializer=pb.get_version_request.SerializeToString,
            response_deserializer=pb.get_version_response.FromString,
        )

        cpu: dict[str, float] = dict.fromkeys(
            ("infer", "echo", "version", "protobuf", "lane", "sock"), 0.0
        )
        client = Client(d.address)
        model = client.load(sample.neff)
        array = sample.random_inputs()["x"]
        lane_echo = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lane_echo.connect(socket_path)

        def echo_on_socket() -> bytes:
            lane_echo.send(payload)
            return lane_echo.recv(1 << 16)

        def time_calls(call: object, n: int, name: str = "", pid: int = 0) -> list[float]:
            out = []
            before = cpu_seconds(pid) if pid else 0.0
            for _ in range(n):
                t0 = time.perf_counter()
                response = call()  # type: ignore[operator]
                out.append(time.perf_counter() - t0)
            del response
            if pid:
                cpu[name] += cpu_seconds(pid) - before
            return out

        def infer() -> object:
            response = stub.infer(request)
            assert response.status.code == 0
            return response

        version = pb.get_version_request()
        time_calls(infer, 200)  # warm-up each
        time_calls(lambda: echo_call(payload), 200)
        time_calls(lambda: protobuf_call(version), 200)
        time_calls(lambda: model.infer({"x": array}), 200)
        time_calls(echo_on_socket, 200)
        per_round = max(1, args.calls // args.rounds)
        t_infer: list[float] = []
        t_echo: list[float] = []
        t_version: list[float] = []
        t_protobuf: list[float] = []
        t_lane: list[float] = []
        t_sock: list[float] = []
        for _ in range(args.rounds):
            t_echo += time_calls(lambda: echo_call(payload), per_round, "echo", echo.pid)
            t_infer += time_calls(infer, per_round, "infer", d.pid)
            t_version += time_calls(lambda: stub.get_version(version), per_round, "version", d.pid)
            t_protobuf += time_calls(
                lambda: protobuf_call(version), per_round, "protobuf", echo.pid
            )
            t_lane += time_calls(lambda: model.infer({"x": array}), per_round, "lane", d.pid)
            t_sock += time_calls(echo_on_socket, per_round, "sock", socket_echo.pid)
        client.close()
        lane_echo.close()
        daemon_ch.close()
        echo_ch.close()
    for server in (echo, socket_echo):
        server.terminate()
        server.wait()

    p50_i, p50_e = statistics.median(t_infer), statistics.median(t_echo)
    print(f"tiny MLP 16-16-4 b1, request {len(payload)} bytes, {len(t_infer)} calls per side")
    print(f"{'':26}{'p50 ms':>10}{'p99 ms':>10}{'server CPU us/call':>20}")
    rows = [("daemon infer", t_infer, "infer"), ("bare gRPC echo", t_echo, "echo")]
    rows.append(("daemon get_version", t_version, "version"))
    rows.append(("bare protobuf call", t_protobuf, "protobuf"))
    rows.append(("Client infer (fast lane)", t_lane, "lane"))
    rows.append(("bare unix-socket echo", t_sock, "sock"))
    for label, times, name in rows:
        p50, p99 = statistics.median(times) * 1e3, percentile(times, 0.99) * 1e3
        print(f"{label:26}{p50:10.3f}{p99:10.3f}{cpu[name] / len(times) * 1e6:20.0f}")
    p50_v, p50_l = statistics.median(t_version), statistics.median(t_lane)
    print(f"ratio infer/echo (p50): {p50_i / p50_e:.2f}x; get_version/echo: {p50_v / p50_e:.2f}x")
    p50_p = statistics.median(t_protobuf)
    print(
        f"with protobuf: bare protobuf call/echo (p50) {p50_p / p50_e:.2f}x; "
        f"get_version/bare protobuf call {p50_v / p50_p:.2f}x; infer/bare protobuf call "
        f"{p50_i / p50_p:.2f}x"
    )
    if cpu["echo"] > 0:
        print(f"ratio infer/echo (server CPU per call): {cpu['infer'] / cpu['echo']:.2f}x")
    else:  # a short run: the echo's CPU time below the process clock's tick
        print("ratio infer/echo (server CPU per call): n/a (the echo used no measurable CPU)")
    print(
        f"Client infer on the fast lane / gRPC echo (p50): {p50_l / p50_e:.2f}x; "
        f"/ unix-socket echo: {p50_l / statistics.median(t_sock):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
