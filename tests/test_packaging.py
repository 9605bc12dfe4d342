"""The project's packaging metadata: what pip and the Debian package build from."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import pytest

from neuron_rtd.cli.spawn import DaemonProcess

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
    assert said.splitlines() == [
        "neuron-rtd: systemd is not running, so the service is not started; it is enabled "
        "for the next boot with systemd.",
        "neuron-rtd: ready: user neuron-rtd in group neuron, /run/neuron-rtd, "
        "/run/neuron.sock and /run/neuron-sim.",
        "neuron-rtd: to start the daemon now:",
        "    runuser -u neuron-rtd -- /usr/bin/neuron-rtd -c /etc/neuron-rtd/neuron-rtd.json &",
        "neuron-rtd: to let a user in: usermod -aG neuron USER (who then logs in again).",
        "neuron-rtd: it stops with kill $(cat /run/neuron-rtd/neuron.sock.lock), and on "
        "dpkg -r neuron-rtd.",
    ]


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
    assert "the service is not started; it is not enabled: there is no systemctl." in said
    assert "runuser -u neuron-rtd -- /usr/bin/neuron-rtd" in said


# --- prerm: the package's daemon stopped however it was started ------------------------


def run_prerm(
    root: Path, tmp_path: Path, *, stop_timeout_s: int = 30
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """prerm remove for a package installed under `root` (dpkg's DPKG_ROOT), systemctl a
    stub that records its arguments (this machine's units are not touched)."""
    stubs, calls = tmp_path / "stubs", tmp_path / "systemctl-calls"
    stubs.mkdir()
    (stubs / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >> {calls}\n')
    (stubs / "systemctl").chmod(0o755)
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "packaging" / "debian" / "prerm"), "remove"],
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "DPKG_ROOT": str(root),
            "NEURON_RTD_STOP_TIMEOUT": str(stop_timeout_s),
        },
        capture_output=True,
        text=True,
        timeout=stop_timeout_s + 30,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


class ConsoleScriptDaemon(DaemonProcess):
    """The daemon run by its console script, as the unit and postinst's command run it
    (process name `neuron-rtd`), not by `python -m`."""

    def command(self) -> list[str]:
        script = Path(sys.executable).parent / "neuron-rtd"
        return [str(script), "-g", self.address, "-x", *self.args]


@pytest.mark.daemon
def test_prerm_stops_a_daemon_started_by_hand(work: Path, tmp_path: Path) -> None:
    """Started as postinst says where systemd does not run: prerm finds it by the pid in
    its socket's lock, sends SIGTERM and waits until it has drained and let go."""
    if not (Path(sys.executable).parent / "neuron-rtd").exists():
        pytest.skip("the neuron-rtd console script is not installed beside this Python")
    run = work / "run" / "neuron-rtd"
    run.mkdir(parents=True)
    with ConsoleScriptDaemon(sim_root=run / "sim", socket_path=run / "neuron.sock") as daemon:
        assert daemon.proc is not None
        assert (run / "neuron.sock.lock").read_text() == f"{daemon.pid}\n"
        done, calls = run_prerm(work, tmp_path)
        assert done.returncode == 0, done.stderr
        assert daemon.proc.poll() == 0  # it had ended when prerm did: cleanly, on SIGTERM
        assert done.stdout.splitlines() == [
            f"neuron-rtd: stopping the daemon started by hand, pid {daemon.pid} "
            f"({run}/neuron.sock.lock)",
            f"neuron-rtd: pid {daemon.pid} stopped",
        ]
        assert done.stderr == ""
        assert "Stopped" in daemon.log()
    assert sorted(p.name for p in run.iterdir()) == ["sim"]  # socket, peer socket, lock: gone
    assert not list((run / "sim").glob("neuron*/owner"))  # its devices let go
    assert "systemctl disable neuron-rtd.service" in calls  # enabled offline by postinst


def test_prerm_kills_a_daemon_that_will_not_stop_and_spares_other_processes(
    work: Path, tmp_path: Path
) -> None:
    """A daemon named by a simulated device's owner file that ignores SIGTERM is killed
    when the wait is over; a lock naming a pid that is no neuron-rtd (a killed daemon's,
    its pid since reused: here this test's own) is left alone."""
    stubborn = tmp_path / "neuron-rtd"  # its process name: neuron-rtd
    stubborn.write_text(
        f"#!{sys.executable}\nimport signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    stubborn.chmod(0o755)
    run = work / "run" / "neuron-rtd"
    (run / "sim" / "neuron0").mkdir(parents=True)
    (run / "neuron.sock.lock").write_text(f"{os.getpid()}\n")
    with subprocess.Popen([str(stubborn)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "up\n"
            owner = run / "sim" / "neuron0" / "owner"
            record = {"pid": proc.pid, "create_time": 0.0, "address": "unix:/x", "version": "0"}
            owner.write_text(json.dumps(record) + "\n")  # as driver_sim/owner.py writes it
            started = time.monotonic()
            done, _ = run_prerm(work, tmp_path, stop_timeout_s=1)
            assert done.returncode == 0, done.stderr
            assert time.monotonic() - started < 10
            assert proc.wait(5) == -signal.SIGKILL
        finally:
            proc.kill()
    assert done.stdout.splitlines() == [
        f"neuron-rtd: stopping the daemon started by hand, pid {proc.pid} ({owner})"
    ]
    assert done.stderr == f"neuron-rtd: pid {proc.pid} did not stop within 1 s: killed\n"


def in_throwaway_root(script: str, deb_dir: Path, tmp_path: Path) -> str:
    """`script`, run by bash as root in a copy-on-write copy of this machine's / (an
    overlay, in its own mount and pid namespaces: what it installs, and every process it
    starts, go with it), with fresh /run, /tmp and /dev/shm, `deb_dir` at /mnt; its
    output. Skips where such a root cannot be made (not root, no overlayfs)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a throwaway root needs root and unshare")
    for part in ("upper", "work", "merged"):
        (tmp_path / part).mkdir()
    setup = (
        "m=$0/merged; "
        "mount -t overlay overlay -o lowerdir=/,upperdir=$0/upper,workdir=$0/work $m; "
        "mount -t proc proc $m/proc; mount -t tmpfs -o mode=0755 tmpfs $m/run; "
        "mount -t tmpfs tmpfs $m/tmp; mount --rbind /dev $m/dev; "
        "mount -t tmpfs tmpfs $m/dev/shm; mount --bind $1 $m/mnt; "
        'echo throwaway root ready; exec chroot $m /bin/bash -e -c "$2"'
    )
    done = subprocess.run(
        ["unshare", "-m", "-p", "-f", "sh", "-e", "-c", setup, tmp_path, deb_dir, script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not done.stdout.startswith("throwaway root ready"):
        pytest.skip(f"no throwaway root here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.daemon
def test_dpkg_without_systemd_enables_says_and_purge_stops_a_hand_started_daemon(
    deb: Path, tmp_path: Path
) -> None:
    """The package as an image built in a chroot sees it: `dpkg -i` with no systemd
    running enables the service for the next boot and says how to start the daemon now;
    the daemon started so, `dpkg --purge` stops it, then removes its user and group."""
    said = in_throwaway_root(
        f"""
        [ ! -d /run/systemd/system ]
        dpkg -i /mnt/{deb.name} 2>&1
        runuser -u neuron-rtd -- /usr/bin/neuron-rtd -c /etc/neuron-rtd/neuron-rtd.json \\
            > /tmp/daemon.log 2>&1 &
        for i in $(seq 300); do [ -S /run/neuron-rtd/neuron.sock ] && break; sleep 0.2; done
        echo "serving: pid $(cat /run/neuron-rtd/neuron.sock.lock)"
        dpkg --purge neuron-rtd 2>&1
        wait $! && echo "daemon exit 0"
        getent passwd neuron-rtd || echo "user gone"
        getent group neuron || echo "group gone"
        ls /etc/systemd/system/*.wants/neuron-rtd.service 2>/dev/null || echo "not enabled"
        [ ! -e /run/neuron-rtd ] && [ ! -e /opt/neuron-rtd ] && echo "tree gone"
        """,
        deb.parent,
        tmp_path,
    )
    boot = "enabled for the next boot with systemd" if shutil.which("systemctl") else "not"
    assert f"systemd is not running, so the service is not started; it is {boot}" in said
    assert "runuser -u neuron-rtd -- /usr/bin/neuron-rtd -c /etc" in said
    pid = said.split("serving: pid ", 1)[1].split()[0]
    assert f"neuron-rtd: stopping the daemon started by hand, pid {pid} (" in said
    assert f"neuron-rtd: pid {pid} stopped" in said
    for line in ("daemon exit 0", "user gone", "group gone", "not enabled", "tree gone"):
        assert f"\n{line}\n" in said, said
    assert "userdel" not in said and "groupdel" not in said  # nothing held them


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
    for command in ("neuron-ls", "neuron-cli", "neuron-top", "neuron-monitor"):  # as the SDK
        link = tmp_path / "opt" / "aws" / "neuron" / "bin" / command
        assert os.readlink(link) == f"{PREFIX}/bin/{command}"
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
    pages = [f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")]
    for doc in ("copyright", "changelog.gz", "README.md", "ARCHITECTURE.md", *pages):
        assert (tmp_path / "usr" / "share" / "doc" / "neuron-rtd" / doc).is_file()
    # the environment is whole: its Python runs the tools from wherever it is unpacked
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "neuron_rtd.cli.neuron_ls", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: neuron-ls"), done.stderr
