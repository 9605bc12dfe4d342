"""`neuron-cli`: tools around the runtime, one subcommand each.

    neuron-cli validate model.onnx model.neff   compare a NEFF on the daemon with onnxruntime

Exit codes: 0 success, 1 the check failed (the report says why), 2 usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from neuron_rtd.tools import profile
from neuron_rtd.tools.validate import command as validate

Handler = Callable[[argparse.Namespace], int]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="neuron-cli", description="Tools around the Neuron runtime daemon."
    )
    commands = top.add_subparsers(dest="command", required=True, title="commands")
    cmd = commands.add_parser(
        "validate",
        help="run a NEFF on the daemon and its ONNX model on onnxruntime, compare the outputs",
        description=(validate.__doc__ or "").split("\n\n", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    validate.add_arguments(cmd)
    cmd.set_defaults(handler=validate.run)
    cmd = commands.add_parser(
        "profile",
        help="per-op profile of a model: run order, top ops, by op type, per NC (MACE style)",
        description=(profile.__doc__ or "").split("\n\n", 1)[1].strip("\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profile.add_arguments(cmd)
    cmd.set_defaults(handler=profile.run)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
