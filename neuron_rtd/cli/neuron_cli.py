"""`neuron-cli`: tools around the runtime, one subcommand each.

    neuron-cli list-ncg                 the NeuronCore Groups
    neuron-cli list-model               the loaded models and their state
    neuron-cli create-ncg N             an NCG of N NCs
    neuron-cli destroy-ncg ID           free an NCG
    neuron-cli load NEFF                load a model (and start it, unless --ncg-id ID)
    neuron-cli start|stop|unload ID     one model
    neuron-cli reset                    unload every model, destroy every NCG
    neuron-cli infer ID --inputs in.npz one inference
    neuron-cli validate model.onnx model.neff   compare a NEFF on the daemon with onnxruntime

What neuron-cli makes (NCGs, models) outlives it. Every command takes `-a ADDRESS` (default
$NEURON_RTD_ADDRESS, else unix:/run/neuron.sock) and `-j/--json-output` (or `--json`).

Exit codes (docs/cli.md): 0 success, 1 it failed (no daemon answers, the daemon refused;
validate: the check failed), 2 usage errors and bad input (a file that is not there, not
readable or not what the command takes; an npz that does not fit the model), 130 Ctrl-C,
143 SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import sys
from typing import Any, Protocol

from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.command_line import (
    ADDRESS_HELP,
    EXIT_FAILED,
    EXIT_USAGE,
    add_address,
    add_version,
    entry,
)


class Subcommand(Protocol):
    """A subcommand: a module or an object with these two, and a docstring whose first
    paragraph is its usage line and the rest its description."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class Lazy:
    """A subcommand named by where it lives (`module`, and `attribute`: a class of it,
    made, or None: the module itself), imported only when it is the one run or its help
    shown: `neuron-cli list-model` does not import the compiler that `validate` needs."""

    def __init__(self, module: str, attribute: str | None = None) -> None:
        self.module = module
        self.attribute = attribute

    @functools.cached_property
    def command(self) -> Subcommand:
        module = importlib.import_module(self.module)
        if self.attribute is None:
            return module
        made: Subcommand = getattr(module, self.attribute)()
        return made

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.command.add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return self.command.run(args)

    def __repr__(self) -> str:
        return f"Lazy({self.module}:{self.attribute or ''})"


_CONTROL = "neuron_rtd.tools.control"

# (name, one line for `neuron-cli --help`, the subcommand): one line registers one.
COMMANDS: tuple[tuple[str, str, Subcommand], ...] = (
    ("list-ncg", "list the NeuronCore Groups", Lazy(f"{_CONTROL}.ncgs", "ListNcg")),
    (
        "list-model",
        "list the loaded models and their state",
        Lazy(f"{_CONTROL}.models", "ListModel"),
    ),
    ("create-ncg", "create a NeuronCore Group of N NCs", Lazy(f"{_CONTROL}.ncgs", "CreateNcg")),
    ("destroy-ncg", "destroy a NeuronCore Group", Lazy(f"{_CONTROL}.ncgs", "DestroyNcg")),
    (
        "load",
        "load a NEFF (started, unless into an NCG given by id)",
        Lazy(f"{_CONTROL}.models", "Load"),
    ),
    ("start", "make a model the running one of its NCG", Lazy(f"{_CONTROL}.models", "Start")),
    ("stop", "stop a model (it stays loaded)", Lazy(f"{_CONTROL}.models", "Stop")),
    ("unload", "unload a model", Lazy(f"{_CONTROL}.models", "Unload")),
    ("reset", "unload every model and destroy every NCG", Lazy(f"{_CONTROL}.models", "Reset")),
    (
        "infer",
        "run one inference on a model, inputs from an npz",
        Lazy(f"{_CONTROL}.infer", "Infer"),
    ),
    (
        "validate",
        "run a NEFF on the daemon and its ONNX model on onnxruntime, compare the outputs",
        Lazy("neuron_rtd.tools.validate.command"),
    ),
    (
        "profile",
        "per-op profile of a model: run order, top ops, by op type, per NC (MACE style)",
        Lazy("neuron_rtd.tools.profile"),
    ),
)


def description(command: Subcommand) -> str:
    """The docstring after its first paragraph (the usage line argparse writes itself)."""
    doc = inspect.getdoc(command.command if isinstance(command, Lazy) else command) or ""
    return doc.split("\n\n", 1)[1].strip() if "\n\n" in doc else doc


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser, made with its name and summary only: its description and
    arguments are added (its module imported) when argparse hands it the command line,
    i.e. only for the subcommand given."""

    def __init__(self, *args: Any, command: Subcommand | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command = command

    def complete(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            self.description = description(command)
            command.add_arguments(self)
            self.set_defaults(handler=command.run)

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        return super().parse_known_args(args, namespace)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="neuron-cli",
        description="Tools around the Neuron runtime daemon.",
        epilog="neuron-cli COMMAND --help tells more of each.",
    )
    add_address(top, f"{ADDRESS_HELP}, for any command", dest="top_address")
    add_version(top)
    commands = top.add_subparsers(
        dest="command", required=True, title="commands", parser_class=_CommandParser
    )
    for name, summary, command in COMMANDS:
        commands.add_parser(
            name,
            help=summary,
            command=command,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    return top


@entry("neuron-cli")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.address is None:  # `neuron-cli -a ADDRESS COMMAND` as well as after COMMAND
        args.address = args.top_address
    try:  # every command's address read once, as every tool reads it (client/address.py)
        args.address = grpc_target(args.address) if args.address else default_address()
    except AddressError as exc:
        print(f"neuron-cli: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.handler(args))
    except BrokenPipeError:  # stdout's reader went away: `entry` ends it quietly
        raise
    except Exception as exc:  # a bug: still one line, never a traceback
        print(
            f"neuron-cli: unexpected {type(exc).__name__}: {exc} (a bug, please report it)",
            file=sys.stderr,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
