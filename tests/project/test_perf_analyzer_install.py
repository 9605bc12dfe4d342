"""`make perf-analyzer` (scripts/perf_analyzer.py) installs Triton's perf_analyzer as
PREFIX/bin/perf_analyzer, a wrapper that runs the binary with its own libraries, as
docs/kserve.md uses it. Downloads the two wheels with pip (the package index)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "perf_analyzer.py"


def install(prefix: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_installed_perf_analyzer_runs_and_a_second_install_keeps_it(tmp_path: Path) -> None:
    said = install(tmp_path)
    wrapper = tmp_path / "bin" / "perf_analyzer"
    assert f"installed {wrapper}" in said
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run(
        [str(wrapper), "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Perf Analyzer Version 2.51.0" in done.stdout + done.stderr  # stderr, in fact
    binary = tmp_path / "lib" / "perf_analyzer" / "perf_analyzer"
    before = binary.stat().st_mtime_ns
    again = install(tmp_path)
    assert "pip download" not in again  # there already: nothing fetched
    assert binary.stat().st_mtime_ns == before
