"""A short bounded pass of each fuzz harness (fuzz/): the seed corpus kept in the repo,
then mutations of it, and every regression input found so far, with no crash, uncaught
exception, hang or runaway memory. `make fuzz` runs them for longer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
RUNS = {"neff_reader": 4000, "wire_requests": 1500, "example_records": 20000}


def libfuzzer(harness: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FUZZ / f"{harness}.py"), "-timeout=30", "-rss_limit_mb=3072", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("harness", sorted(RUNS))
def test_a_bounded_fuzz_pass_finds_nothing(harness: str, tmp_path: Path) -> None:
    seeds = FUZZ / "corpus" / harness
    assert len(list(seeds.iterdir())) >= 4
    done = libfuzzer(
        harness,
        str(tmp_path),  # new units go here, not into the kept corpus
        str(seeds),
        f"-runs={RUNS[harness]}",
        "-seed=1",
        f"-artifact_prefix={tmp_path}/",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Done {RUNS[harness]} runs" in done.stderr


@pytest.mark.parametrize("harness", sorted(RUNS))
def test_the_regression_inputs_pass(harness: str, tmp_path: Path) -> None:
    found = sorted((FUZZ / "regressions" / harness).glob("*"))
    if not found:
        pytest.skip(f"no regression input for {harness} yet")
    done = libfuzzer(harness, f"-artifact_prefix={tmp_path}/", *map(str, found))
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr.count("Executed ") == len(found)
