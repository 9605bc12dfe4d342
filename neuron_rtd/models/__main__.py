"""python -m neuron_rtd.models NAME -o FILE [--small] [--set key=value ...]

Writes one test model to an .onnx file, e.g.

    python -m neuron_rtd.models bert -o bert2.onnx --set layers=2 --set seq=128
    python -m neuron_rtd.models resnet -o r.onnx --set depth_blocks=3,4,6,3 --set batch=1
    python -m neuron_rtd.models ssd -o ssd.onnx --small

Values are Python literals where they parse as one (ints, floats, tuples like 2,2,2,2),
else strings (dim names such as batch=N).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from neuron_rtd.models import MODELS, SMALL, count_parameters, op_types


def parse_setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


def unknown_settings(name: str, build: Callable[..., Any], keys: list[str]) -> str | None:
    """What is wrong with settings `build` does not take (None: it takes them all): each
    one, a close match where there is one, and every key it takes with its default."""
    parameters = inspect.signature(build).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    wrong = [key for key in keys if key not in parameters]
    if not wrong:
        return None
    said = []
    for key in wrong:
        close = [k for k in parameters if key in k] or difflib.get_close_matches(key, parameters)
        said.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    valid = ", ".join(
        key if p.default is p.empty else f"{key}={p.default!r}" for key, p in parameters.items()
    )
    return f"{name} has no setting {', '.join(said)}: its settings are {valid}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_rtd.models", description="Write a test ONNX model."
    )
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("-o", "--output", required=True, type=Path)
    parser.add_argument(
        "--small", action="store_true", help="start from the family's fast test variant"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=parse_setting,
        metavar="KEY=VALUE",
        help="a build() argument (repeatable)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip onnx.checker")
    args = parser.parse_args(argv)

    kwargs: dict[str, Any] = dict(SMALL[args.name]) if args.small else {}
    kwargs.update(dict(args.settings))
    wrong = unknown_settings(args.name, MODELS[args.name], [key for key, _ in args.settings])
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    try:
        model = MODELS[args.name](**kwargs)
    except (TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.no_check:
        onnx.checker.check_model(model, full_check=True)
    onnx.save(model, args.output)
    settings = " ".join(f"{k}={v!r}" for k, v in kwargs.items())
    print(
        f"{args.output}: {' '.join(filter(None, [args.name, settings]))}: "
        f"{count_parameters(model):,} parameters, {len(model.graph.node)} nodes, "
        f"ops: {', '.join(sorted(op_types(model)))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
