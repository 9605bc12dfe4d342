"""What every runtime-control subcommand of `neuron-cli` shares: `-a ADDRESS` and
`-j/--json-output` (or `--json`), one session-less client (what a command makes outlives
it), the answer printed as text or JSON, and every failure as one line on stderr with exit
code 1 (2 for bad input: a file or an npz the command cannot take).

A daemon's error names its nerr code and what to do next, e.g.
`neuron-cli: model 10042 is not loaded (NERR_INVALID_HANDLE): see neuron-cli list-model`.

A command that only reads the daemon's state (`Listing`: list-model, list-ncg) reads it
through a `Watch` (gRPC and the wire's messages), not a `Client`, whose numpy, shared
memory and NEFF reader it has no use for: it answers in a third of the time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_rtd.client.address import default_address
from neuron_rtd.client.errors import NrtClientError, NrtConnectionError
from neuron_rtd.command_line import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    STOPPED_BY,
    add_address,
    add_json_output,
    signal_exit_code,
)
from neuron_rtd.errors import Nerr, NrtError

if TYPE_CHECKING:
    from neuron_rtd.client import Client
    from neuron_rtd.client.observe import Watch

PROG = "neuron-cli"
# Each call's deadline: long enough for a large NEFF's load, short of hanging forever on
# a daemon that stopped answering.
CALL_TIMEOUT_S = 300.0


class Failure(Exception):
    """The command could not do what was asked: exit 1 with this message."""


class UnusableInput(Failure):
    """What the command was given cannot be used (a file that is not there or not readable,
    an npz that does not fit the model): exit 2 with this message."""


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (`stop`) stopped the command, which undid what it could: exit 130
    or 143 with one line saying what it left (`left`)."""

    def __init__(self, stop: KeyboardInterrupt, left: str) -> None:
        super().__init__(left)
        self.code = signal_exit_code(stop)


@dataclass
class Answer:
    """What a command prints: `text` for people, `data` for `--json-output`."""

    text: str
    data: Any = None


class Command:
    """One subcommand. Subclasses give a docstring (its first paragraph the usage line,
    the rest the description for `--help`), `arguments` and `execute`; `run` connects,
    prints the answer and turns every failure into one line and exit code 1."""

    # What to do next after a daemon's error, by nerr code, where this command knows
    # better than HINTS (an empty text: the daemon's words say it already)
    hints: dict[int, str] = {}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.arguments(parser)
        add_address(parser)
        add_json_output(parser, "print the answer as JSON")

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        """The command's own arguments (none by default)."""

    def check(self, args: argparse.Namespace) -> None:
        """What can be checked before connecting (the files named): UnusableInput if wrong."""

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        raise NotImplementedError

    def shm(self, args: argparse.Namespace) -> bool:
        """Whether tensors go through shared memory (only `infer --shm` says yes)."""
        return False

    def connect(self, args: argparse.Namespace, address: str) -> AbstractContextManager[Any]:
        """What the command talks to the daemon through: a session-less client."""
        from neuron_rtd.client.client import Client  # numpy and all: only when used

        return Client(
            address,
            timeout_s=CALL_TIMEOUT_S,
            shm=self.shm(args),
            ncg_sizes=(),  # never NCGs of its own from NEURONCORE_GROUP_SIZES
            session=False,
        )

    def answer(self, args: argparse.Namespace, connection: Any) -> Answer:
        return self.execute(args, connection)

    def run(self, args: argparse.Namespace) -> int:
        try:
            self.check(args)
        except UnusableInput as exc:
            return fail(str(exc), EXIT_USAGE)
        address = args.address or default_address()
        try:
            connection = self.connect(args, address)
        except ValueError as exc:  # a malformed address or environment
            return fail(str(exc))
        try:
            with connection:
                answer = self.answer(args, connection)
        except Stopped as stop:
            return fail(f"{STOPPED_BY[stop.code]}: {stop}", stop.code)
        except NrtConnectionError as exc:
            return fail(exc.details)
        except NrtClientError as exc:
            return fail(explain(exc, self.hints))
        except UnusableInput as exc:
            return fail(str(exc), EXIT_USAGE)
        except (Failure, NrtError) as exc:
            return fail(str(exc))
        except OSError as exc:
            return fail(os_error_text(exc))
        if args.json:
            print(json.dumps(answer.data, indent=2))
        elif answer.text:
            print(answer.text)
        return EXIT_OK


class Listing(Command):
    """A command that only reads the daemon's state: `read` over a `Watch` (no session, no
    shared memory, nothing made), which needs neither numpy nor the client."""

    def connect(self, args: argparse.Namespace, address: str) -> AbstractContextManager[Any]:
        from neuron_rtd.client.observe import Watch

        return Watch(address, timeout_s=CALL_TIMEOUT_S)

    def answer(self, args: argparse.Namespace, connection: Any) -> Answer:
        return self.read(args, connection)

    def read(self, args: argparse.Namespace, watch: Watch) -> Answer:
        raise NotImplementedError


def fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def os_error_text(exc: OSError) -> str:
    """`FILE: what went wrong` (`/x: permission denied`), not `[Errno 13] ...`."""
    what = (exc.strerror or str(exc)).lower()
    return f"{exc.filename}: {what}" if exc.filename else what


# --- the daemon's errors, explained --------------------------------------------------

_LOG_PREFIX = re.compile(r"^\[[A-Z_]+:[A-Za-z_]+\]\s*")

# What to do next, by nerr code (where the daemon's own words do not say it already).
HINTS: dict[int, str] = {
    Nerr.RESOURCE: "device memory is full: unload models you do not need (neuron-cli list-model, "
    "neuron-cli unload ID)",
    Nerr.TIMEOUT: "the inference ran past the model's timeout: load it again with a larger "
    "--timeout",
    Nerr.HW_ERROR: "the device failed: see the daemon's log (journalctl -u neuron-rtd)",
    Nerr.QUEUE_FULL: "the model's queue is full: retry, or load it again with a larger --ninfer",
    Nerr.FAILED_STATE: "the model failed: unload it and load it again",
    Nerr.RESOURCE_NC: "free NeuronCores first (neuron-cli list-ncg, neuron-cli destroy-ncg ID, "
    "neuron-cli reset)",
    Nerr.UNSUPPORTED_VERSION: "compile the model again with a neuron-cc this runtime supports",
    Nerr.INFER_BAD_INPUT: "compare the inputs with what the model takes (neuron-cli list-model "
    "--json)",
    Nerr.INFER_COMPLETED_WITH_ERR: "see the daemon's log (journalctl -u neuron-rtd)",
}


def daemon_words(details: str) -> str:
    """The daemon's log lines for a call, without their `[MODULE:function]` prefixes."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in details.splitlines()]
    return "; ".join(line for line in lines if line) or "no details"


def explain(exc: NrtClientError, hints: Mapping[int, str] | None = None) -> str:
    """`what the daemon said (NERR_NAME): what to do`."""
    nerr = exc.nerr
    name = f"NERR_{nerr.name}" if nerr is not None else f"nerr {exc.code}"
    hint = HINTS.get(exc.code)
    if exc.code == Nerr.INVALID_HANDLE:
        hint = "see neuron-cli list-ncg" if "NCG" in exc.details else "see neuron-cli list-model"
    hint = (hints or {}).get(exc.code, hint)
    words = daemon_words(exc.details)
    return f"{words} ({name}): {hint}" if hint else f"{words} ({name})"


def int_at_least(low: int, message: str, name: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least `low`; `message` (with `{value}`) for one
    below. `name` is what argparse calls it in "invalid NAME value" for a non-integer."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(message.format(value=value))
        return value

    parse.__name__ = name
    return parse
