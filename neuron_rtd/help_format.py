"""How every command's `--help` is laid out: plain text, wrapped at spaces only (a path
such as /etc/neuron-rtd/... is never split at its hyphen)."""

from __future__ import annotations

import argparse
import textwrap


class PlainHelp(argparse.HelpFormatter):
    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )
