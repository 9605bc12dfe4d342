"""A command run on a terminal, as a user runs it: script(1) gives it one, and what it
showed there is read back from the typescript."""

from __future__ import annotations

import subprocess
from pathlib import Path


def on_a_terminal(command: str, typescript: Path, timeout: float = 300) -> str:
    """What the shell line `command` showed on its terminal (its typescript, kept in the
    file `typescript`); the command must succeed."""
    done = subprocess.run(
        ["script", "-q", "-e", "-c", command, str(typescript)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return typescript.read_text(errors="replace")
