"""The shipped unit files: they pass `systemd-analyze verify`, score "OK" (exposure <= 2.0)
in `systemd-analyze security`, run the daemon as its own user with no capabilities, and
agree with the configs and the package's tmpfiles.d file on where it writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ["neuron-rtd.service", "neuron-rtd@.service"]
MAX_EXPOSURE = 2.0  # systemd-analyze security's "OK"


def unit_settings(unit: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines, every value of a key in order (blank: a reset)."""
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "systemd" / unit).read_text().splitlines():
        if line.strip() and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def analyzable(unit: str, directory: Path) -> Path:
    """A copy of `unit` systemd-analyze takes: an instance of a template, ExecStart the
    installed console script (verify checks that it exists)."""
    target = directory / ("neuron-rtd@group0.service" if "@" in unit else unit)
    text = (ROOT / "systemd" / unit).read_text()
    target.write_text(text.replace("/usr/bin/neuron-rtd", installed_daemon()))
    return target


def systemd_analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/bootstrap.sh installs Debian's systemd"
    return analyze


def installed_daemon() -> str:
    found = shutil.which("neuron-rtd") or str(Path(sys.executable).parent / "neuron-rtd")
    assert Path(found).exists(), "the neuron-rtd console script is not installed"
    return found


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    text = (ROOT / "systemd" / unit).read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text
    target = analyzable(unit, tmp_path)
    done = subprocess.run(
        [systemd_analyze(), "verify", str(target)], capture_output=True, text=True
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "neuron-rtd" in line and "Documentation" not in line
    ]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_exposure_is_ok(unit: str, tmp_path: Path) -> None:
    """`systemd-analyze security --offline=true` rates the unit "OK" or better."""
    target = analyzable(unit, tmp_path)
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(target)],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert found, done.stdout + done.stderr
    exposure = float(found[1])
    failed = [line for line in done.stdout.splitlines() if line.startswith("✗")]
    assert exposure <= MAX_EXPOSURE, f"{unit}: exposure {exposure} {found[2]}:\n" + "\n".join(
        failed
    )


@pytest.mark.parametrize("unit", UNITS)
def test_the_daemon_runs_as_its_own_user_with_no_privilege(unit: str) -> None:
    settings = unit_settings(unit)
    assert settings["User"] == ["neuron-rtd"] and settings["Group"] == ["neuron"]
    assert settings["CapabilityBoundingSet"] == [""] and settings["AmbientCapabilities"] == [""]
    assert settings["NoNewPrivileges"] == ["yes"]
    for key in ("PrivateTmp", "PrivateDevices", "ProtectHome", "PrivateNetwork"):
        assert settings[key] == ["yes"], key
    assert settings["ProtectProc"] == ["invisible"]
    assert settings["RestrictAddressFamilies"] == ["AF_UNIX"]  # TCP: a drop-in adds AF_INET
    assert settings["IPAddressDeny"] == ["any"]
    assert settings["SystemCallFilter"][0] == "@system-service"
    assert settings["MemoryMax"] and settings["TasksMax"]
    # it keeps what systemd needs of it: notify (the notify socket is a Unix socket) and
    # the watchdog
    assert settings["Type"] == ["notify"] and settings["NotifyAccess"] == ["main"]
    assert settings["WatchdogSec"]


@pytest.mark.parametrize("unit", UNITS)
def test_units_keep_dev_shm_shared(unit: str) -> None:
    """Clients' tensors are POSIX shared memory in /dev/shm, which the daemon opens
    read-write: PrivateDevices=yes mounts the host's /dev/shm in its private /dev, and
    nothing may make IPC private or /dev/shm read-only."""
    settings = unit_settings(unit)
    assert "PrivateIPC" not in settings
    assert settings["ReadWritePaths"] == ["/dev/shm"]  # the rest is RuntimeDirectory
    assert settings["ProtectSystem"] == ["strict"]


def tmpfiles_lines() -> list[list[str]]:
    text = (ROOT / "packaging" / "debian" / "tmpfiles.conf").read_text()
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("unit", UNITS)
def test_the_daemon_writes_only_in_its_runtime_directory(unit: str) -> None:
    """The configs of the unit (the instances' too) put the socket and the simulated
    machine in the unit's RuntimeDirectory, the one place in /run the daemon may write;
    the package's tmpfiles.d makes that folder as the unit does, and links the clients'
    default socket and sim root into it."""
    settings = unit_settings(unit)
    (runtime,) = settings["RuntimeDirectory"]
    folder = f"/run/{runtime}"
    configs = (
        sorted((ROOT / "config" / "instances").glob("*.json"))
        if "@" in unit
        else [ROOT / "config" / "neuron-rtd.json"]
    )
    for path in configs:
        config = json.loads(path.read_text())
        socket_path = config["server_address"].removeprefix("unix:")
        assert Path(socket_path).parent == Path(folder), path
        assert Path(config["sim"]["root"]).parent == Path(folder), path
    lines = tmpfiles_lines()
    (made,) = [line for line in lines if line[0] == "d" and line[1].startswith("/run/")]
    mode, user, group = settings["RuntimeDirectoryMode"][0], settings["User"][0], "neuron"
    assert made[1:5] == [folder, mode, user, group]
    assert int(mode, 8) & 0o007 == 0  # the socket's and the tree's group only
    links = {line[1]: line[6] for line in lines if line[0].startswith("L")}
    main = json.loads((ROOT / "config" / "neuron-rtd.json").read_text())
    assert links == {
        "/run/neuron.sock": main["server_address"].removeprefix("unix:"),
        "/run/neuron-sim": main["sim"]["root"],
    }


def test_neff_files_are_read_from_the_folder_the_package_makes() -> None:
    """The shipped config's neff_file_dirs is one folder, made by the package's tmpfiles.d
    for group neuron to add files to (setgid, sticky), and readable under the unit's
    ProtectSystem=strict."""
    config = json.loads((ROOT / "config" / "neuron-rtd.json").read_text())
    (folder,) = config["neff_file_dirs"]
    (made,) = [line for line in tmpfiles_lines() if line[0] == "d" and line[1] == folder]
    assert made[2:5] == ["3775", "root", "neuron"]
    postinst = (ROOT / "packaging" / "debian" / "postinst").read_text()
    assert f"-m 3775 {folder}" in postinst  # made without systemd-tmpfiles too


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


def test_the_instances_are_run_as_the_whole_machines_daemon_is() -> None:
    """neuron-rtd@.service has neuron-rtd.service's settings: only what names the
    instance differs."""
    whole, instance = unit_settings("neuron-rtd.service"), unit_settings("neuron-rtd@.service")
    own = {"Description", "ExecStart", "ConditionPathExists"}
    assert {k: v for k, v in whole.items() if k not in own} == {
        k: v for k, v in instance.items() if k not in own
    }
