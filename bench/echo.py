"""The baseline of the benches: a bare gRPC server whose one method answers the request's
own bytes, on the same kind of socket and with as many threads as the daemon."""

from __future__ import annotations

from concurrent import futures

import grpc

from neuron_rtd.proto import CHANNEL_OPTIONS

ECHO_SERVICE = "bench.Echo"
ECHO_METHOD = f"/{ECHO_SERVICE}/echo"


def serve_echo(address: str) -> None:
    """Serve the echo on `address` until killed; prints `ready` once it listens."""

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE, {"echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(16), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
