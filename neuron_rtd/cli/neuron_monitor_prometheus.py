"""`neuron-monitor-prometheus`: serves neuron-monitor's reports, read on stdin, as
Prometheus metrics on http://HOST:PORT/metrics.

    neuron-monitor | neuron-monitor-prometheus --port 8000

It listens on 127.0.0.1 unless told otherwise (--listen-address: a scrape shows socket
paths, the host's name and counts), serves 64 connections at once (past them, 503) and
drops a connection silent for 5 s. Until the first report a scrape gets no metrics (not
zeros). It serves until its input ends (or SIGINT, SIGTERM). A line that is not a report
is told on stderr and skipped; so are the errors a report carries. Exit codes: 0 at the
end of the input or when stopped (its normal end, as a service's), 1 when the port cannot
be served, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TextIO

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from neuron_rtd.command_line import EXIT_FAILED, EXIT_OK, add_version, entry
from neuron_rtd.tools.monitor.exporter import (
    DEFAULT_LISTEN_ADDRESS,
    Exporter,
    ReportError,
    serve,
)

PROG = "neuron-monitor-prometheus"
DEFAULT_PORT = 8000


class _StopExporter(Exception):
    """A signal asked the exporter to stop."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _StopExporter


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=(__doc__ or "").split("\n\n")[0].replace("`", "")
    )
    parser.add_argument(
        "-p", "--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--listen-address",
        default=DEFAULT_LISTEN_ADDRESS,
        metavar="HOST",
        help=f"address to serve on (default {DEFAULT_LISTEN_ADDRESS}: this machine only; "
        "0.0.0.0 or :: for every interface)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="do not tell the reports' errors on stderr"
    )
    add_version(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port: {args.port} is not a TCP port (0-65535)")
    return args


class AfterFirstReport(Collector):
    """The exporter's metrics once a report has come (`reported` set); before it, none: a
    scrape then shows no samples rather than zeros no report said."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reported = threading.Event()

    def collect(self) -> Iterator[Metric]:
        if self.reported.is_set():
            yield from self.registry.collect()


def feed(
    exporter: Exporter,
    lines: Iterable[str],
    err: TextIO,
    *,
    quiet: bool = False,
    reported: threading.Event | None = None,
) -> int:
    """Give each report line to `exporter`; returns how many were taken (`reported` is
    set at the first)."""
    taken = 0
    told: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            errors = exporter.update(json.loads(line))
        except (json.JSONDecodeError, ReportError) as exc:
            print(f"{PROG}: line {number} skipped: {exc}", file=err, flush=True)
            continue
        taken += 1
        if reported is not None:
            reported.set()
        for message in errors:
            if not quiet and message not in told:  # each error once, while it lasts
                print(f"{PROG}: {message}", file=err, flush=True)
        told = set(errors)
    return taken


def _url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


@entry(PROG)
def main(argv: list[str] | None = None, stdin: TextIO | None = None) -> int:
    args = parse_args(argv)
    source = stdin or sys.stdin
    exporter = Exporter()
    served = CollectorRegistry()
    gate = AfterFirstReport(exporter.registry)
    served.register(gate)
    try:
        server, _thread = serve(served, args.port, args.listen_address)
    except OSError as exc:
        print(
            f"{PROG}: cannot serve {args.listen_address}:{args.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:  # the handlers set inside: a signal at once still ends here, in a clean stop
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if source.isatty():  # run alone: say what it waits for
            print(
                f"{PROG}: serving {_url(args.listen_address, server.server_port)} from the "
                f"reports read on stdin (none yet): run it as neuron-monitor | {PROG}",
                file=sys.stderr,
                flush=True,
            )
        feed(exporter, source, sys.stderr, quiet=args.quiet, reported=gate.reported)
    except (_StopExporter, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        server.shutdown()
        server.server_close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
