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
import sys
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
