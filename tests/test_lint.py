"""Hand-written code stays ruff- and mypy-clean (generated code is excluded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff() -> None:
    done = run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy() -> None:
    done = run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr
