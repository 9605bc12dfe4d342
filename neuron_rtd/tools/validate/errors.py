"""The one error of `neuron-cli validate` besides a failed check."""

from __future__ import annotations


class UsageError(Exception):
    """The command cannot run as asked: exit 2 with this message."""
