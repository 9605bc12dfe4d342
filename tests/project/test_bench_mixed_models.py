"""bench/mixed_models.py, one short round: clients of a big model on one NCG and of a
small model on another, every call answered, both throughputs and the small model's
latency printed. About 10 s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemon

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_one_short_round_serves_both_models() -> None:
    command = [sys.executable, str(BENCH / "mixed_models.py"), "--seconds", "0.5", "--rounds", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    line = re.search(
        r"^round 1: big model (\d+) calls/s \(p50 [0-9.]+ ms\); small model (\d+) calls/s, "
        r"p50 [0-9.]+ ms, p99 [0-9.]+ ms$",
        out,
        re.M,
    )
    assert line is not None, out
    assert int(line.group(1)) > 0 and int(line.group(2)) > 0
