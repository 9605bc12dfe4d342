"""The README's run command, end to end."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.demo"], capture_output=True, text=True, timeout=300
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "DEMO OK" in out
    assert "argmax agrees on all 8 rows: True" in out
    assert "NERR_INFER_BAD_INPUT" in out
    assert "exit code 0" in out
