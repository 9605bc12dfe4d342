"""bench/infer_roundtrip.py, a short run: the daemon's tiny infer and get_version beside
the bare gRPC echo, its protobuf call of get_version's shape, and the fast lane beside a
bare unix-socket echo; every side is timed and the ratios printed. About 10 s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemon

BENCH = Path(__file__).resolve().parents[2] / "bench"
NUMBER = r"[0-9]+\.[0-9]{3}"


def test_a_short_run_times_every_side_and_prints_the_ratios() -> None:
    command = [sys.executable, str(BENCH / "infer_roundtrip.py"), "--calls", "100", "--rounds", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for side in (
        "daemon infer",
        "bare gRPC echo",
        "daemon get_version",
        "bare protobuf call",
        "Client infer (fast lane)",
        "bare unix-socket echo",
    ):
        assert re.search(rf"^{re.escape(side)} +{NUMBER} +{NUMBER} +\d+$", out, re.M), side
    assert re.search(r"^ratio infer/echo \(p50\): [0-9.]+x; get_version/echo: [0-9.]+x$", out, re.M)
    floor = r"^with protobuf: bare protobuf call/echo \(p50\) [0-9.]+x; get_version/bare "
    assert re.search(
        floor + r"protobuf call [0-9.]+x; infer/bare protobuf call [0-9.]+x$", out, re.M
    )
