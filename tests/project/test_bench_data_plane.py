"""bench/data_plane.py, its quickest part: the transport of 1-16 MiB tensors inline, in
shared memory, through the bare echo and by memcpy. Its raw calls name the shared memory
of the bench client's session, as every bench part's shm variants do: the daemon answers
them only when they present that session. About 5 s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemon

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_quick_transport_run_checks_and_times_every_variant() -> None:
    command = [sys.executable, str(BENCH / "data_plane.py"), "--transport", "--quick"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for size in (1, 4, 16):
        for variant in ("inline", "shm", "echo", "memcpy"):
            assert re.search(rf"^ *{size} MiB {variant} +[0-9.]+ +[0-9.]+ +\d+$", out, re.M), (
                size,
                variant,
            )
        assert re.search(rf"^ +{size} MiB: shm/inline [0-9.]+x", out, re.M), size
