"""The shipped unit files pass `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ["neuron-rtd.service", "neuron-rtd@.service"]


def installed_daemon() -> str:
    found = shutil.which("neuron-rtd") or str(Path(sys.executable).parent / "neuron-rtd")
    assert Path(found).exists(), "the neuron-rtd console script is not installed"
    return found


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/bootstrap.sh installs Debian's systemd"
    text = (ROOT / "systemd" / unit).read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text
    # verify checks that ExecStart exists: point it at the installed console script
    target = tmp_path / ("neuron-rtd@group0.service" if "@" in unit else unit)
    target.write_text(text.replace("/usr/bin/neuron-rtd", installed_daemon()))
    done = subprocess.run([analyze, "verify", str(target)], capture_output=True, text=True)
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "neuron-rtd" in line and "Documentation" not in line
    ]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr


def test_units_keep_dev_shm_shared() -> None:
    for unit in UNITS:
        text = (ROOT / "systemd" / unit).read_text()
        assert "PrivateTmp=yes" not in text and "PrivateIPC=yes" not in text
        assert "PrivateDevices=yes" not in text
        assert "ReadWritePaths=/run /dev/shm" in text


def test_instance_unit_reads_instance_config() -> None:
    text = (ROOT / "systemd" / "neuron-rtd@.service").read_text()
    assert "ExecStart=/usr/bin/neuron-rtd -i %i" in text
    for name in ("group0", "group1"):
        assert (ROOT / "config" / "instances" / f"{name}.json").exists()
