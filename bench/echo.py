"""The baseline of the benches: a bare gRPC server whose method answers the request's own
bytes, on the same kind of socket and with the daemon's call threads (its pool, of the
daemon's default size); and beside it a protobuf method of `get_version`'s shape, a
trivial handler behind gRPC's (de)serializers."""

from __future__ import annotations

import socket
from typing import Any

import grpc

from neuron_rtd.daemon.config import DaemonConfig
from neuron_rtd.proto import CHANNEL_OPTIONS, pb
from neuron_rtd.runtime import ComputeGate
from neuron_rtd.server import server_pool

ECHO_SERVICE = "bench.Echo"
ECHO_METHOD = f"/{ECHO_SERVICE}/echo"
# The same server's protobuf call: a get_version_request in, a constant
# get_version_response out, (de)serialized as gRPC's generated code does: what protobuf
# adds to a call of the daemon's API before the handler's own work (`get_version`'s).
VERSION_METHOD = f"/{ECHO_SERVICE}/version"


def serve_socket_echo(path: str) -> None:
    """Answer each message on a SOCK_SEQPACKET unix socket at `path` with its own bytes,
    one connection at a time, until killed (the fast lane's floor, as `serve_echo` is
    gRPC's); prints `ready` once it listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(path)
        listener.listen(1)
        print("ready", flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(1 << 16):
                    conn.send(data)


def serve_echo(address: str) -> None:
    """Serve the echo on `address` until killed; prints `ready` once it listens."""

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    answer = pb.get_version_response()

    def version(request: pb.get_version_request, context: grpc.ServicerContext) -> Any:
        return answer

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "echo": grpc.unary_unary_rpc_method_handler(echo),
            "version": grpc.unary_unary_rpc_method_handler(
                version,
                request_deserializer=pb.get_version_request.FromString,
                response_serializer=pb.get_version_response.SerializeToString,
            ),
        },
    )
    pool = server_pool(ComputeGate(), DaemonConfig().server_threads)  # the daemon's pool
    server = grpc.server(pool, options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
