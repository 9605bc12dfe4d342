"""The README's run command, end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest

DEMO = [sys.executable, "-m", "neuron_rtd.cli.demo"]


# the default machine, and the smallest (one device of 4 NCs): the demo fits its NCGs to it
@pytest.mark.parametrize("machine", [[], ["--instance-type", "inf1.xlarge"]], ids=["6xl", "xl"])
def test_demo_runs_clean(machine: list[str]) -> None:
    done = subprocess.run([*DEMO, *machine], capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "DEMO OK" in out
    assert "batch 3: probs (3, 1000)" in out and "top-1 agrees: True" in out
    assert "total: 200 ops on the NC, 0 on the CPU" in out
    assert "PASS: all 1 output(s) meet cosine >= 0.9999" in out
    assert "NERR_INFER_BAD_INPUT" in out
    assert "exit code 0" in out


def test_an_unknown_instance_type_is_a_usage_error_listing_the_choices() -> None:
    done = subprocess.run(
        [*DEMO, "--instance-type", "inf1.huge"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "invalid choice: 'inf1.huge'" in done.stderr and "'inf1.xlarge'" in done.stderr
    assert "Traceback" not in done.stderr
