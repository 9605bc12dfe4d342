"""The gRPC adapters over the runtime's face: the nmgr service and streamed inference
(`nmgr`), client sessions (`sessions`), our extension (`ext`), load-stream reading
(`load_stream`), wire conversion (`wire`), the one error mapping (`calls`), the session a
call presents (`caller`), the peer socket where clients pass shared memory
(`peer_socket`), the request streams that hold no thread (`streams`), and the standard
health and reflection services (`health`).

Long streams never hold the server's call threads: session and health-watch streams hold
no thread at all, nor do `load`, `infer_stream` and `ModelStreamInfer` while they wait
for their client (`streams`): a stream takes a thread of its kind's pool (at most
`stream_threads`, the config's) only while one of its requests is worked on, and
computes on a turn of the runtime's compute gate (`neuron_rtd/runtime/compute.py`), as
unary calls do. Clients that keep streams open, idle, cost the daemon memory, not
threads: they cannot starve the unary calls nor each other's streams and loads. What
bounds them: at most `MAX_OPEN_STREAMS` open (the longest idle gives way to a new one),
`MAX_STREAMS_PER_SESSION` of them presenting one session, and a load that sends nothing
for `STALLED_AFTER_S` is ended. Clients whose streams all have work running share the
pools' threads, as unary calls share theirs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_rtd import lazy

if TYPE_CHECKING:
    from neuron_rtd.server.caller import CallerOf
    from neuron_rtd.server.gate import MembersOnly
    from neuron_rtd.server.health import Health
    from neuron_rtd.server.http_server import HttpServer, bind, split_http_address
    from neuron_rtd.server.kserve_http import HttpOptions
    from neuron_rtd.server.metrics import Metrics, MetricsApp
    from neuron_rtd.server.nmgr import NmgrServicer, StreamServicer
    from neuron_rtd.server.peer_socket import PeerSocket, Tickets
    from neuron_rtd.server.pool import server_pool
    from neuron_rtd.server.request_log import RequestLogHandler
    from neuron_rtd.server.services import ServicerSet, add_servicers
    from neuron_rtd.server.streams import (
        MAX_OPEN_STREAMS,
        MAX_STREAMS_PER_SESSION,
        STALLED_AFTER_S,
        StreamTable,
    )

# The face: each name and its module, imported when the name is first asked for, so that
# what the daemon does not use is not loaded (waitress, the HTTP front's server, only for
# a daemon that serves HTTP).
_WHERE = {
    "CallerOf": "caller",
    "MembersOnly": "gate",
    "Health": "health",
    "HttpServer": "http_server",
    "split_http_address": "http_server",
    "bind": "http_server",
    "HttpOptions": "kserve_http",
    "Metrics": "metrics",
    "MetricsApp": "metrics",
    "NmgrServicer": "nmgr",
    "StreamServicer": "nmgr",
    "PeerSocket": "peer_socket",
    "Tickets": "peer_socket",
    "server_pool": "pool",
    "RequestLogHandler": "request_log",
    "ServicerSet": "services",
    "add_servicers": "services",
    "MAX_OPEN_STREAMS": "streams",
    "MAX_STREAMS_PER_SESSION": "streams",
    "STALLED_AFTER_S": "streams",
    "StreamTable": "streams",
}


__getattr__ = lazy.lazy_names(__name__, _WHERE)


__all__ = [
    "MAX_OPEN_STREAMS",
    "MAX_STREAMS_PER_SESSION",
    "STALLED_AFTER_S",
    "CallerOf",
    "Health",
    "HttpOptions",
    "HttpServer",
    "MembersOnly",
    "Metrics",
    "MetricsApp",
    "NmgrServicer",
    "PeerSocket",
    "RequestLogHandler",
    "ServicerSet",
    "StreamServicer",
    "StreamTable",
    "Tickets",
    "add_servicers",
    "bind",
    "server_pool",
    "split_http_address",
]
