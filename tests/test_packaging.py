"""The project's packaging metadata: what pip and the Debian package build from."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
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
BUILDER_UMASK = 0o002  # a builder whose group may write what they make: not the package's
SYSUSERS = "usr/lib/sysusers.d/neuron-rtd.conf"
TMPFILES = "usr/lib/tmpfiles.d/neuron-rtd.conf"


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
        umask=BUILDER_UMASK,
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
    assert f"systemd-sysusers /{SYSUSERS}" in scripts["postinst"]
    assert "groupadd --system neuron" in scripts["postinst"]  # without systemd-sysusers
    assert "useradd --system --gid neuron" in scripts["postinst"]
    assert f"systemd-tmpfiles --create /{TMPFILES}" in scripts["postinst"]
    assert "[ -d /run/systemd/system ]" in scripts["postinst"]  # only where systemd runs
    assert "systemctl enable neuron-rtd.service" in scripts["postinst"]
    assert "systemctl stop neuron-rtd.service" in scripts["prerm"]
    purge = scripts["postrm"].split('if [ "$1" = purge ]; then', 1)[1]
    assert "rm -rf /run/neuron-rtd /etc/neuron-rtd" in purge
    assert "rm -rf /run/neuron-sim /run/neuron.sock" in purge  # the links
    assert purge.index("userdel neuron-rtd") < purge.index("groupdel neuron")  # its group


def test_modes_are_the_packages_whatever_the_builders_umask(deb: Path) -> None:
    """Built with umask 002, nothing in the package is writable by group or others."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True)
    control = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True)
    for name, blob in (("data", data.stdout), ("control", control.stdout)):
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            members = [m for m in tar.getmembers() if not m.issym()]
        assert members, name
        loose = [f"{m.name} {m.mode:04o}" for m in members if m.mode & 0o022]
        assert loose == [], f"{name}: {loose[:10]}"
        for member in members:
            assert (member.uname, member.gname) == ("root", "root"), member.name
            if member.isdir():
                assert member.mode == 0o755, f"{member.name} {member.mode:04o}"
            else:
                assert member.mode in (0o644, 0o755), f"{member.name} {member.mode:04o}"


SYSTEMD_TOOLS = ("systemd-sysusers", "systemd-tmpfiles", "systemctl")


def run_postinst(tmp_path: Path, *, systemd_tools: bool) -> tuple[str, list[str]]:
    """postinst configure, every command it runs a stub that records its arguments (none
    of this machine's users, groups or /run is touched); its output and the calls."""
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir()
    for name in ("getent", "groupadd", "useradd", "install", "ln", "rm", *SYSTEMD_TOOLS):
        if name in SYSTEMD_TOOLS and not systemd_tools:
            continue
        answer = 2 if name == "getent" else 0  # no such user or group yet
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit {answer}\n')
        (stubs / name).chmod(0o755)
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "packaging" / "debian" / "postinst"), "configure"],
        env={"PATH": str(stubs)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def no_systemd() -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd runs here: postinst would restart the service")


@pytest.mark.usefixtures("no_systemd")
def test_postinst_with_systemds_tools_but_no_systemd_running(tmp_path: Path) -> None:
    """As in a chroot building an image: the user and /run from the package's sysusers.d
    and tmpfiles.d files, the service enabled for the image's boot, and what to run now."""
    said, calls = run_postinst(tmp_path, systemd_tools=True)
    assert calls == [
        f"systemd-sysusers /{SYSUSERS}",
        f"systemd-tmpfiles --create /{TMPFILES}",
        "systemctl enable neuron-rtd.service",
    ]
    assert "systemd is not running, so the service is not started, but enabled" in said
    assert "runuser -u neuron-rtd -- /usr/bin/neuron-rtd" in said


@pytest.mark.usefixtures("no_systemd")
def test_postinst_without_systemd_at_all(tmp_path: Path) -> None:
    said, calls = run_postinst(tmp_path, systemd_tools=False)
    assert calls[:4] == [
        "getent group neuron",
        "groupadd --system neuron",
        "getent passwd neuron-rtd",
        "useradd --system --gid neuron --no-create-home --home-dir /nonexistent "
        "--shell /usr/sbin/nologin --comment Neuron runtime daemon neuron-rtd",
    ]
    assert "install -d -o neuron-rtd -g neuron -m 0750 /run/neuron-rtd" in calls
    assert calls[-3:] == [
        "ln -sfn /run/neuron-rtd/sim /run/neuron-sim",
        "ln -sfn /run/neuron-rtd/neuron.sock /run/neuron.sock",
        "install -d -o root -g neuron -m 3775 /var/lib/neuron-rtd/models",
    ]
    assert "the service is not started, nor enabled" in said


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
        umask=BUILDER_UMASK,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check_tree(tmp_path)
    laid_out = [tmp_path / d for d in ("opt", "usr", "lib")]
    for path in [p for top in laid_out for p in (top, *top.rglob("*"))]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o022 == 0, path  # the umask was not the package's
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
    for unit in ("neuron-rtd.service", "neuron-rtd@.service"):
        assert "User=neuron-rtd" in (units / unit).read_text()
    assert not list(units.glob("*.d"))  # no drop-in: the units say it all
    for laid, source in ((SYSUSERS, "sysusers.conf"), (TMPFILES, "tmpfiles.conf")):
        assert (root / laid).read_text() == (ROOT / "packaging" / "debian" / source).read_text()
        assert stat.S_IMODE((root / laid).stat().st_mode) == 0o644
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
