"""The project's packaging metadata: what pip and the Debian package build from."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_license_is_an_spdx_expression_so_setuptools_warns_nothing() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # a table ({text = ...}) makes setuptools >= 77 print a deprecation warning per build step
    assert meta["project"]["license"] == "Apache-2.0"
    assert meta["build-system"]["requires"] == ["setuptools>=77"]


# --- the Debian package, built as `make deb` builds it --------------------------------

PREFIX = "/opt/neuron-rtd"


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build_deb.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("neuron-rtd_*.deb")
    return built


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, check=True).stdout


def test_control_conffiles_and_maintainer_scripts(deb: Path, tmp_path: Path) -> None:
    fields = dict(
        line.split(": ", 1) for line in dpkg_deb("-f", str(deb)).splitlines() if ": " in line
    )
    assert fields["Package"] == "neuron-rtd"
    assert (
        fields["Version"]
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    )
    for needed in ("python3 (>= 3.11)", "libc6", "libsystemd0", "passwd"):
        assert needed in fields["Depends"]
    dpkg_deb("-e", str(deb), str(tmp_path / "DEBIAN"))
    conffiles = (tmp_path / "DEBIAN" / "conffiles").read_text().split()
    assert "/etc/neuron-rtd/neuron-rtd.json" in conffiles
    assert "/etc/neuron-rtd/instances/group0.json" in conffiles
    scripts = {s: (tmp_path / "DEBIAN" / s).read_text() for s in ("postinst", "prerm", "postrm")}
    for name, text in scripts.items():
        assert subprocess.run(["sh", "-n", str(tmp_path / "DEBIAN" / name)]).returncode == 0
        assert text.startswith("#!/bin/sh") and "set -e" in text
    assert "groupadd --system neuron" in scripts["postinst"]
    assert "[ -d /run/systemd/system ]" in scripts["postinst"]  # only where systemd runs
    assert "systemctl enable neuron-rtd.service" in scripts["postinst"]
    assert "systemctl stop neuron-rtd.service" in scripts["prerm"]
    purge = scripts["postrm"].split('if [ "$1" = purge ]; then', 1)[1]
    assert "groupdel neuron" in purge and "rm -rf /run/neuron-sim /etc/neuron-rtd" in purge


def test_contents_name_the_installed_place_only(deb: Path, tmp_path: Path) -> None:
    dpkg_deb("-x", str(deb), str(tmp_path))
    check_tree(tmp_path)
    config = json.loads((tmp_path / "etc" / "neuron-rtd" / "neuron-rtd.json").read_text())
    assert (config["socket_group"], config["socket_mode"]) == ("neuron", "0660")


def test_install_sh_lays_the_same_tree_out_under_destdir(tmp_path: Path) -> None:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python")
    mine = tmp_path / "etc" / "neuron-rtd" / "neuron-rtd.json"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"log_level": "debug"}\n')  # a config the user wrote: kept
    done = subprocess.run(
        ["bash", str(ROOT / "packaging" / "install.sh")],
        env={**os.environ, "DESTDIR": str(tmp_path), "PYTHON": "/usr/bin/python3"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check_tree(tmp_path)
    assert mine.read_text() == '{"log_level": "debug"}\n'
    assert (tmp_path / "etc" / "neuron-rtd" / "instances" / "group0.json").is_file()


def check_tree(root: Path) -> None:
    """The installed tree under `root`: what names the install's place, and only it."""
    tmp_path = root
    venv = tmp_path / PREFIX.lstrip("/")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for command in scripts:  # every console command, in /usr/bin
        link = tmp_path / "usr" / "bin" / command
        assert os.readlink(link) == f"{PREFIX}/bin/{command}"
        assert (venv / "bin" / command).read_text().startswith(f"#!{PREFIX}/bin/python")
        page = gzip.decompress((root / "usr/share/man/man1" / f"{command}.1.gz").read_bytes())
        assert page.startswith(f".TH {command.upper()} 1".encode()) and b"usage: " in page
    markers = (b"neuron-rtd-deb-", str(root).encode())  # the deb's staging dir, DESTDIR
    staged = [
        p
        for p in venv.rglob("*")
        if p.is_file() and not p.is_symlink() and any(m in p.read_bytes() for m in markers)
    ]
    assert staged == []  # nothing names the directory it was laid out in
    assert not list(venv.rglob("__pycache__"))  # compiled by postinst, where installed
    units = tmp_path / "lib" / "systemd" / "system"
    assert (units / "neuron-rtd.service").read_text() == (
        ROOT / "systemd" / "neuron-rtd.service"
    ).read_text()
    assert "Group=neuron" in (units / "neuron-rtd.service.d" / "group.conf").read_text()
    for doc in ("copyright", "changelog.gz", "README.md"):
        assert (tmp_path / "usr" / "share" / "doc" / "neuron-rtd" / doc).is_file()
    # the environment is whole: its Python runs the tools from wherever it is unpacked
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "neuron_rtd.cli.neuron_ls", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: neuron-ls"), done.stderr
