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


@pytest.mark.parametrize("unit", UNITS)
def test_a_killed_daemon_is_restarted_unattended(unit: str) -> None:
    """What systemd does when the daemon dies (SIGKILL, a crash): it starts it again
    after RestartSec, which the next start takes over from (the stale socket, lock and
    device claims: test_daemon_process.py), within the clients' one retry of 5 s; and a
    crash loop is not restarted forever."""
    import configparser

    from neuron_rtd.client.errors import RECONNECT_S

    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((ROOT / "systemd" / unit).read_text())
    service, unit_section = parser["Service"], parser["Unit"]
    assert service["Restart"] in ("on-failure", "always")  # a signal death is a failure
    restart_s = float(service["RestartSec"].removesuffix("s"))
    assert 0 < restart_s < RECONNECT_S
    assert service["Type"] == "notify"  # restarted means ready only once it serves
    # at most StartLimitBurst starts in StartLimitIntervalSec, then systemd gives up: a
    # loop of restarts RestartSec apart must reach the burst within the interval
    burst = int(unit_section["StartLimitBurst"])
    interval = float(unit_section["StartLimitIntervalSec"].removesuffix("s"))
    assert burst >= 3 and burst * restart_s < interval
