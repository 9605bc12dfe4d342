"""What every console command shares (docs/cli.md): `--version`, the JSON flag, the exit
codes, and `entry`, the wrapper each command's `main` runs in.

Under `entry`, Ctrl-C (SIGINT) and SIGTERM stop a command the same way: a
KeyboardInterrupt in the main thread (`Terminated` for SIGTERM), so its cleanup runs; then
one line on stderr and exit 130 or 143, never a traceback. A command that takes the
signals as its normal stop (the daemon, neuron-monitor) installs its own handlers and
exits 0. A reader that went away (`neuron-ls -j | head -c 10`) ends the command quietly
with 141, the status a shell shows for a coreutils command killed by SIGPIPE.

Shared by every layer and importing none.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import ParamSpec

from neuron_rtd import __version__

EXIT_OK = 0  # done
EXIT_FAILED = 1  # the operation failed (the daemon refused, a check failed, no daemon)
EXIT_USAGE = 2  # bad usage or bad input: a flag, a file or an npz that does not fit
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # 141: stdout's reader went away
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


STOPPED_BY = {EXIT_SIGINT: "interrupted", EXIT_SIGTERM: "terminated (SIGTERM)"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so the same cleanup runs."""


def add_version(parser: argparse.ArgumentParser, *flags: str) -> None:
    """`--version` (and `flags`, e.g. the daemon's `-v`): prints `PROG VERSION`, exit 0."""
    parser.add_argument(
        *flags,
        "--version",
        action="version",
        version=f"{parser.prog} {__version__}",
        help="print the program's name and version and exit",
    )


def add_json_output(parser: argparse.ArgumentParser, help: str) -> None:
    """`-j/--json-output` (neuron-ls's, as the original's), `--json` too (as it was
    elsewhere): `args.json`."""
    parser.add_argument(
        "-j", "--json-output", "--json", dest="json", action="store_true", help=help
    )


ADDRESS_HELP = (
    "the daemon's address: a socket path or host:port (default: $NEURON_RTD_ADDRESS, else "
    "unix:/run/neuron.sock)"
)


def add_address(
    parser: argparse.ArgumentParser, help: str = ADDRESS_HELP, dest: str = "address"
) -> None:
    """`-a/--address`, the daemon a tool talks to (read by neuron_rtd/client/address.py),
    as `args.<dest>`."""
    parser.add_argument("-a", "--address", dest=dest, metavar="ADDRESS", help=help)


CAST_HELP = (
    "convert values of another dtype as numpy's unsafe cast does (precision lost, "
    "out-of-range values become inf or wrap); without it only values the model's dtype "
    "holds are taken (docs/dtypes.md)"
)


def add_cast(parser: argparse.ArgumentParser, what: str = "") -> None:
    """`--cast`, the way out of the dtype policy (neuron_rtd/neff/casting.py): `args.cast`.
    `what`: where it applies, when more than the inputs."""
    parser.add_argument(
        "--cast", action="store_true", help=f"{CAST_HELP}{': ' + what if what else ''}"
    )


def signal_exit_code(stop: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (`Terminated`)."""
    return EXIT_SIGTERM if isinstance(stop, Terminated) else EXIT_SIGINT


P = ParamSpec("P")


def entry(prog: str) -> Callable[[Callable[P, int]], Callable[P, int]]:
    """Decorates a command's `main(argv=None, ...) -> int` as described above. Called
    with no argv (as its console script calls it), the process is ending after it: a
    second signal then ends it the default way, quietly, instead of a traceback from the
    interpreter's exit (which waits for the threads)."""

    def wrap(main: Callable[P, int]) -> Callable[P, int]:
        @functools.wraps(main)
        def run(*args: P.args, **kwargs: P.kwargs) -> int:
            whole_process = (not args or args[0] is None) and kwargs.get("argv") is None
            try:
                with _sigterm_raises():
                    return _guarded(prog, main, *args, **kwargs)
            finally:
                if whole_process:
                    _default_signals()

        return run

    return wrap


def _guarded(prog: str, main: Callable[P, int], *args: P.args, **kwargs: P.kwargs) -> int:
    """`main`'s exit code, its output flushed (a closed pipe found here, not at exit)."""
    try:
        code = main(*args, **kwargs)
        _flush_stdout()
        return code
    except SystemExit:  # argparse's --help, --version and usage errors
        try:
            _flush_stdout()
        except BrokenPipeError as exc:
            raise SystemExit(_broken_pipe(prog, exc)) from None
        raise
    except KeyboardInterrupt as stop:
        code = signal_exit_code(stop)
        _say(f"{prog}: {STOPPED_BY[code]}")
        return code
    except BrokenPipeError as exc:
        return _broken_pipe(prog, exc)


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr may be gone too
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread while the block runs (unless
    SIGTERM is ignored, or handled by someone else already)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _default_signals() -> None:
    """SIGINT and SIGTERM end the process the default way (unless ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)


def _broken_pipe(prog: str, exc: BrokenPipeError) -> int:
    """141, quietly, when stdout's reader went away; else one line and exit 1."""
    if not _stdout_closed():
        _say(f"{prog}: {exc.strerror or exc}")
        return EXIT_FAILED
    with contextlib.suppress(OSError, ValueError, AttributeError):
        # what is still buffered goes nowhere, instead of failing again at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_SIGPIPE


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader is gone."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
