"""`neuron-monitor`: the runtimes' and the system's metrics as JSON reports on stdout,
one a line: the first at once, then whenever a metric group's period has passed.

    neuron-monitor                      every metric group of $NEURON_RTD_ADDRESS
                                        (else unix:/run/neuron.sock) and of the system,
                                        every 5 seconds
    neuron-monitor -c monitor.conf      what the configuration file says
    neuron-monitor -a ADDR -a ADDR2     every metric group of several runtimes

A runtime that does not answer shows an `error` in its entry and in its groups; the
monitor keeps going and reports it again when it answers. Exit codes: 0 when stopped
(SIGINT, SIGTERM, stdout closed: its normal end, as a service's), 2 for usage errors (a bad
configuration names its key).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import select
import signal
import sys
import time
from types import FrameType
from typing import TextIO

from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.command_line import EXIT_OK, EXIT_USAGE, add_version, entry
from neuron_rtd.tools.monitor import config as monitor_config
from neuron_rtd.tools.monitor.monitor import Log, Monitor
from neuron_rtd.typed_json import ConfigError

PROG = "neuron-monitor"


class _StopMonitor(Exception):
    """A signal asked the monitor to stop."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _StopMonitor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(__doc__ or "").split("\n\n")[0].strip().replace("`", ""),
        epilog="The configuration format: see docs/tools.md, section neuron-monitor.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "-c", "--config-file", metavar="FILE", help="a neuron-monitor JSON configuration file"
    )
    source.add_argument(
        "-a",
        "--address",
        action="append",
        metavar="ADDRESS",
        help="watch the runtime at this gRPC address with every metric group (repeat for "
        "several; default: $NEURON_RTD_ADDRESS, else unix:/run/neuron.sock)",
    )
    parser.add_argument(
        "--verbose",
        type=int,
        nargs="?",
        const=1,
        default=0,
        choices=range(5),
        metavar="0-4",
        help="what to tell on stderr: 0 nothing, 1 runtimes coming and going, "
        "2 each report, 3 the time each runtime took to answer",
    )
    add_version(parser)
    return parser.parse_args(argv)


def _logger(verbosity: int, err: TextIO) -> Log:
    def log(level: int, message: str) -> None:
        if level <= verbosity:
            print(f"{PROG}: {message}", file=err, flush=True)

    return log


def run(monitor: Monitor, out: TextIO, *, reports: int | None = None) -> None:
    """Write reports to `out` until stopped (or `reports` of them)."""
    written = 0
    while reports is None or written < reports:
        out.write(json.dumps(monitor.collect()) + "\n")
        out.flush()
        written += 1
        if reports is None or written < reports:
            wait(out, monitor.seconds_to_next())


def wait(out: TextIO, seconds: float) -> None:
    """Sleep `seconds`, until the next report is due, unless `out`'s reader goes away
    meanwhile (a pipe whose reader closed polls POLLERR): BrokenPipeError then, as the next
    write would raise, so that `neuron-monitor | head -n 1` ends with its first line, not a
    period later."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # not a file: nothing to watch
        time.sleep(seconds)
        return
    poller = select.poll()
    poller.register(fd, 0)  # no event asked for: only POLLERR, POLLHUP and POLLNVAL come
    if poller.poll(seconds * 1000):
        raise BrokenPipeError(f"{PROG}: stdout's reader went away")


@entry(PROG)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.config_file:
            cfg = monitor_config.load(args.config_file)
        else:
            addresses = [grpc_target(a) for a in args.address or []] or [default_address()]
            cfg = monitor_config.everything(addresses)
    except (ConfigError, AddressError) as exc:
        where = f"{args.config_file}: " if args.config_file else ""
        print(f"{PROG}: error: {where}{exc}", file=sys.stderr)
        return EXIT_USAGE
    monitor = Monitor(cfg, log=_logger(args.verbose, sys.stderr))
    try:  # the handlers set inside: a signal at once still ends here, in a clean stop
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        run(monitor, sys.stdout)
    except (_StopMonitor, KeyboardInterrupt):
        pass
    except BrokenPipeError:
        # stdout's reader went away: no more reports, and no error at exit either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        monitor.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
