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
    assert "batch 3: probs (3, 1000)" in out and "top-1 agrees: True" in out
    assert "total: 200 ops on the NC, 0 on the CPU" in out
    assert "PASS: all 1 output(s) meet cosine >= 0.9999" in out
    assert "NERR_INFER_BAD_INPUT" in out
    assert "exit code 0" in out
