"""Command-line argument types more than one command takes (`argparse` `type=` functions).

Shared by every layer and importing none: `neuron-cc` (the compiler) and `neuron-cli
validate` (a tool) parse `--input-shape` here.
"""

from __future__ import annotations

import argparse


def parse_shape(text: str, *, example: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` as (NAME, sizes); ArgumentTypeError, showing the command's
    `example` (`type=functools.partial(parse_shape, example=...)`), unless there is a name
    and every size is an integer of 0 or more."""
    name, sep, dims = text.rpartition("=")
    try:
        sizes = tuple(int(d) for d in dims.split(","))
    except ValueError:
        sizes = ()
    if not sep or not name or not sizes or any(d < 0 for d in sizes):
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... (e.g. {example}), got {text!r}")
    return name, sizes
