"""Every console command's --help: plain text (no Markdown), exit 0, and the daemon's
defaults shown with paths never split across lines."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SCRIPTS = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
    "scripts"
]


def help_of(entry: str, prog: str) -> subprocess.CompletedProcess[str]:
    module, function = entry.split(":")
    code = (
        f"import sys; sys.argv = [{prog!r}, '--help']; "
        f"from {module} import {function}; {function}()"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_is_plain_text(prog: str) -> None:
    done = help_of(SCRIPTS[prog], prog)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {prog}") and "`" not in done.stdout, done.stdout


def test_the_daemon_states_its_defaults() -> None:
    text = help_of(SCRIPTS["neuron-rtd"], "neuron-rtd").stdout
    said = " ".join(text.split())  # where it listens: flags, then the clients' variable
    assert "(default: $NEURON_RTD_ADDRESS, as the clients read it, else the config's " in said
    assert "server_address, else unix:/run/neuron.sock)" in said
    assert "/etc/neuron-rtd/neuron-rtd.json" in text  # on one line, not split at a hyphen
    assert "/etc/neuron-rtd/instances/INSTANCE.json" in text
    assert "log level (default info" in text
