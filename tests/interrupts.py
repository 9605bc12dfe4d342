"""Children a test interrupts as from a terminal: started with SIGINT at its default
disposition, whatever the test run's own (a run in the background, `make test &`, has
SIGINT ignored, and its children would inherit that).

Not with `preexec_fn`: Python code run between fork and exec in a process with threads
(the test's gRPC channels have theirs) may deadlock or abort the child before its program
runs; a neuron-cli started so was seen killed by SIGABRT, having said nothing. A short
Python step sets the disposition and execs the command, in the same process."""

from __future__ import annotations

import sys
from collections.abc import Sequence

_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def as_from_a_terminal(command: Sequence[str]) -> list[str]:
    """`command`, to be started with SIGINT at its default (the same pid runs it)."""
    return [sys.executable, "-c", _DEFAULT_SIGINT, *command]
