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
import inspect
import sys
from typing import Protocol

from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.command_line import (
    ADDRESS_HELP,
    EXIT_FAILED,
    EXIT_USAGE,
    add_address,
    add_version,
    entry,
)
from neuron_rtd.tools import control, profile
from neuron_rtd.tools.validate import command as validate


class Subcommand(Protocol):
    """A subcommand: a module or an object with these two, and a docstring whose first
    paragraph is its usage line and the rest its description."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# (name, one line for `neuron-cli --help`, the subcommand): one line registers one.
COMMANDS: tuple[tuple[str, str, Subcommand], ...] = (
    ("list-ncg", "list the NeuronCore Groups", control.ListNcg()),
    ("list-model", "list the loaded models and their state", control.ListModel()),
    ("create-ncg", "create a NeuronCore Group of N NCs", control.CreateNcg()),
    ("destroy-ncg", "destroy a NeuronCore Group", control.DestroyNcg()),
    ("load", "load a NEFF (started, unless into an NCG given by id)", control.Load()),
    ("start", "make a model the running one of its NCG", control.Start()),
    ("stop", "stop a model (it stays loaded)", control.Stop()),
    ("unload", "unload a model", control.Unload()),
    ("reset", "unload every model and destroy every NCG", control.Reset()),
    ("infer", "run one inference on a model, inputs from an npz", control.Infer()),
    (
        "validate",
        "run a NEFF on the daemon and its ONNX model on onnxruntime, compare the outputs",
        validate,
    ),
    (
        "profile",
        "per-op profile of a model: run order, top ops, by op type, per NC (MACE style)",
        profile,
    ),
)


def description(command: Subcommand) -> str:
    """The docstring after its first paragraph (the usage line argparse writes itself)."""
    doc = inspect.getdoc(command) or ""
    return doc.split("\n\n", 1)[1].strip() if "\n\n" in doc else doc


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="neuron-cli",
        description="Tools around the Neuron runtime daemon.",
        epilog="neuron-cli COMMAND --help tells more of each.",
    )
    add_address(top, f"{ADDRESS_HELP}, for any command", dest="top_address")
    add_version(top)
    commands = top.add_subparsers(dest="command", required=True, title="commands")
    for name, summary, command in COMMANDS:
        sub = commands.add_parser(
            name,
            help=summary,
            description=description(command),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(handler=command.run)
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
