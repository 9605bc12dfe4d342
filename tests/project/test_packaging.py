"""The project's packaging metadata: what pip and the Debian package build from."""

from __future__ import annotations

import gzip
import io
import json
import os
import pty
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from neuron_rtd.cli.spawn import DaemonProcess

ROOT = Path(__file__).parents[2]


def test_license_is_an_spdx_expression_so_setuptools_warns_nothing() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # a table ({text = ...}) makes setuptools >= 77 print a deprecation warning per build step
    assert meta["project"]["license"] == "Apache-2.0"
    assert meta["build-system"]["requires"] == ["setuptools>=77"]


# --- scripts/bootstrap.sh: what `make setup` (demo, test) runs first ---------------------

# what stands for the Python of the venv: pip's words, a line per package as in a log, or
# a bar where its output is a terminal (--progress-bar=on)
FAKE_PIP = """#!/bin/sh
echo "pip $*" >> CALLS
case "$*" in *--progress-bar=on*) printf 'Downloading numpy [####      ] 40%%\\r' ;; esac
echo "Collecting numpy"
echo "Successfully installed numpy"
"""
FAKE_PYTHON = """#!/bin/sh
case "$1" in
-c) exit 0 ;;  # the version check
-m) mkdir -p "$3/bin" && cp STUBS/venv-python "$3/bin/python" ;;  # -m venv .venv
esac
"""
FAKE_APT = """#!/bin/sh
echo "apt-get $*" >> CALLS
case "$1" in
update) echo "Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]" ;;
install) for p; do case "$p" in -*) ;; *) echo "Setting up $p (1.0) ..." ;; esac; done ;;
esac
"""


def run_bootstrap(tmp_path: Path, *, terminal: bool) -> tuple[str, list[str]]:
    """scripts/bootstrap.sh, in a copy of the checkout's scripts/, on a machine that has
    none of the commands it looks for (PATH: stubs of apt-get and sudo, and a Python whose
    venv's pip records its arguments and prints as pip does), the SDK's folder
    tmp_path/sdk-bin; its output (on a terminal, a pty, if `terminal`) and the calls."""
    checkout, stubs, calls = tmp_path / "checkout", tmp_path / "stubs", tmp_path / "calls"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", checkout / "scripts")
    stubs.mkdir()
    for name, text in (
        ("venv-python", FAKE_PIP),
        ("python3", FAKE_PYTHON),
        ("apt-get", FAKE_APT),
        ("sudo", '#!/bin/sh\nexec "$@"\n'),
    ):
        (stubs / name).write_text(text.replace("CALLS", str(calls)).replace("STUBS", str(stubs)))
        (stubs / name).chmod(0o755)
    for name in ("id", "dirname", "mkdir", "ln", "touch", "readlink", "cp"):
        (stubs / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    sdk_bin = tmp_path / "sdk-bin"
    sdk_bin.mkdir()
    (sdk_bin / "neuron-ls").write_text("#!/bin/sh\n")  # the SDK's own
    command = ["/bin/bash", str(checkout / "scripts" / "bootstrap.sh")]
    env = {"PATH": str(stubs), "PYTHON": str(stubs / "python3"), "NEURON_SDK_BIN": str(sdk_bin)}
    if not terminal:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        said = done.stdout + done.stderr
    else:
        leader, follower = pty.openpty()
        with subprocess.Popen(command, env=env, stdout=follower, stderr=follower) as proc:
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's other side is closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            os.close(leader)
            assert proc.wait(60) == 0, b"".join(chunks)
        said = b"".join(chunks).decode().replace("\r\n", "\n")
    return said, calls.read_text().splitlines()


def test_bootstrap_says_each_step_and_lets_apt_and_pip_show_their_progress(
    tmp_path: Path,
) -> None:
    """Minutes of install, each step said as it starts, apt's and pip's own lines shown
    (a line per package: the output is a log here), and what it installs from apt named
    with why."""
    said, calls = run_bootstrap(tmp_path, terminal=False)
    lines = said.splitlines()
    steps = [line for line in lines if line.startswith("bootstrap: [")]
    assert [line.split("]")[0] for line in steps] == [
        "bootstrap: [1/4",
        "bootstrap: [1/4",
        "bootstrap: [2/4",
        "bootstrap: [3/4",
        "bootstrap: [4/4",
    ]
    wanted = steps[0].split("from apt: ", 1)[1]
    for package in ("pkg-config (", "gcc (compiles systemd-python)", "acl (setfacl", "systemd ("):
        assert package in wanted, wanted
    assert steps[1].startswith("bootstrap: [1/4] from apt: prometheus (scrapes")
    apt = [call for call in calls if call.startswith("apt-get")]
    assert apt[0] == "apt-get update -q"  # once, before the first install
    assert apt[1].startswith("apt-get install -y -q pkg-config ")
    assert apt[2] == "apt-get install -y -q --no-install-recommends prometheus"
    assert len(apt) == 3
    assert "Setting up gcc (1.0) ..." in lines and "Setting up prometheus (1.0) ..." in lines
    assert lines.index("Setting up gcc (1.0) ...") < lines.index(steps[1])
    pip = [call for call in calls if call.startswith("pip ")]
    assert pip == [
        "pip -m pip install --progress-bar=off --upgrade pip",
        "pip -m pip install --progress-bar=off -e .[test]",
        "pip -m pip install --progress-bar=off --no-deps tritonclient==2.73.0",
    ]
    pip_said = lines[lines.index(steps[3]) + 1 : lines.index(steps[4])]
    assert pip_said == ["Collecting numpy", "Successfully installed numpy"] * 3
    assert "\r" not in said
    sdk_bin, venv_bin = tmp_path / "sdk-bin", tmp_path / "checkout" / ".venv" / "bin"
    assert lines[lines.index(steps[4]) + 1 :] == [
        f"bootstrap: {sdk_bin}/neuron-ls is there already (a file): left as it is",
        *(f"bootstrap: linked {sdk_bin}/{t} -> {venv_bin}/{t}" for t in SDK_TOOLS[1:]),
        "bootstrap: .venv ready",
    ]
    assert (sdk_bin / "neuron-ls").read_text() == "#!/bin/sh\n"
    assert (tmp_path / "checkout" / ".venv" / ".installed").exists()


def test_bootstrap_on_a_terminal_shows_pips_progress_bars(tmp_path: Path) -> None:
    said, calls = run_bootstrap(tmp_path, terminal=True)
    assert [call for call in calls if call.startswith("pip ")] == [
        "pip -m pip install --progress-bar=on --upgrade pip",
        "pip -m pip install --progress-bar=on -e .[test]",
        "pip -m pip install --progress-bar=on --no-deps tritonclient==2.73.0",
    ]
    assert "Downloading numpy [####      ] 40%\r" in said
    apt = [call for call in calls if call.startswith("apt-get")]
    assert apt[0] == "apt-get update" and apt[1].startswith("apt-get install -y pkg-config")


# --- the Debian package, built as `make deb` builds it --------------------------------

PREFIX = "/opt/neuron-rtd"
BUILDER_UMASK = 0o002  # a builder whose group may write what they make: not the package's
SYSUSERS = "usr/lib/sysusers.d/neuron-rtd.conf"
TMPFILES = "usr/lib/tmpfiles.d/neuron-rtd.conf"


@pytest.fixture(scope="module")
def deb_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`make deb`'s build, its output into a pipe (as in CI's log): the .deb and that output."""
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
    return built, done.stdout


@pytest.fixture(scope="module")
def deb(deb_build: tuple[Path, str]) -> Path:
    return deb_build[0]


def test_make_deb_says_each_step_as_it_starts_and_pip_a_line_per_package(
    deb_build: tuple[Path, str],
) -> None:
    """Not a minute of silence: each step said before it runs, pip's lines between them,
    and in a log (not a terminal) no progress bar redrawn in place."""
    built, said = deb_build
    lines = said.splitlines()
    steps = [line for line in lines if line.startswith("build_deb.py: ")]
    # while dpkg-deb packs (a minute), how far its tar has read, every 10 s
    packing = re.compile(
        r"build_deb\.py: packing: "
        r"([0-9]{1,2}% of the tree read|the tree read; [0-9]+ MiB of the \.deb written)"
    )
    reports = [line for line in steps if packing.fullmatch(line)]
    pages = [line for line in steps if line.startswith("build_deb.py: man page: ")]
    steps = [line for line in steps if line not in reports + pages]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert pages == [f"build_deb.py: man page: {command}" for command in sorted(scripts)]
    assert [step.split(":")[1].split()[0] for step in steps] == [
        "a",  # a virtual environment on /usr/bin/python3, for /opt/neuron-rtd
        "pip",  # the project and its dependencies
        "the",  # the environment made to name its installed place
        "each",  # each command's link and man page
        "units,",
        "control",
        "packing",
        "built",
    ], steps
    assert steps[-2].startswith("build_deb.py: packing ") and str(built) in steps[-2]
    at = [lines.index(line) for line in steps]
    assert at == sorted(at)
    assert all(at[3] < lines.index(page) < at[4] for page in pages)  # after "each command's"
    assert all(at[-2] < lines.index(report) < at[-1] for report in reports)  # as it packs
    pip_said = lines[lines.index(steps[1]) + 1 : lines.index(steps[2])]
    for package in ("numpy", "grpcio", "onnxruntime", "systemd-python"):  # a line each
        assert any(package in line for line in pip_said), package
    assert "Successfully installed" in "\n".join(pip_said)
    assert "\r" not in said and "\x1b" not in said  # no bar drawn for a terminal
    assert lines[-1] == str(built)


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
SDK_TOOLS = ("neuron-ls", "neuron-cli", "neuron-top", "neuron-monitor")
MADE = "var/lib/neuron-rtd/made-by-package"  # the user and group postinst made


def account_stubs(stubs: Path, calls: Path, *, stub: tuple[str, ...] = ()) -> Path:
    """Stubs in `stubs` for the commands of users and groups and the others in `stub`: each
    records its arguments in `calls`. getent answers from a folder of the accounts there
    (returned; a file `passwd-NAME` or `group-NAME`), which groupadd, useradd,
    systemd-sysusers, userdel and groupdel change. A few harmless tools are the real ones."""
    accounts = stubs.parent / "accounts"
    accounts.mkdir(exist_ok=True)
    stubs.mkdir(exist_ok=True)
    act = {
        "getent": f'[ -e {accounts}/"$1-$2" ] || exit 2',
        "groupadd": f'touch {accounts}/group-"$2"',
        "useradd": f'for name; do :; done; touch {accounts}/passwd-"$name"',
        "systemd-sysusers": f"touch {accounts}/group-neuron {accounts}/passwd-neuron-rtd",
        "userdel": f'/bin/rm {accounts}/passwd-"$1"',
        "groupdel": f'/bin/rm {accounts}/group-"$1"',
    }
    for name in (*act, *stub):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{act.get(name, "")}\n')
        (stubs / name).chmod(0o755)
    for name in ("mkdir", "readlink", "cat", "rmdir", "touch"):
        if not (stubs / name).exists():
            (stubs / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    return accounts


def run_postinst(
    tmp_path: Path, *, systemd_tools: bool, there: tuple[str, ...] = ()
) -> tuple[str, list[str]]:
    """postinst configure, every command it runs a stub that records its arguments (none
    of this machine's users, groups or /run is touched), what it makes on disk under
    tmp_path/root (dpkg's DPKG_ROOT); accounts `there` before (`passwd-neuron-rtd`); its
    output and the calls."""
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    tools = SYSTEMD_TOOLS if systemd_tools else ()
    accounts = account_stubs(stubs, calls, stub=("install", "ln", "rm", *tools[1:]))
    if not systemd_tools:
        (stubs / "systemd-sysusers").unlink()
    for account in there:
        (accounts / account).touch()
    (tmp_path / "root").mkdir(exist_ok=True)
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "packaging" / "debian" / "postinst"), "configure"],
        env={"PATH": str(stubs), "DPKG_ROOT": str(tmp_path / "root")},
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
    sdk_bin = tmp_path / "root" / "opt" / "aws" / "neuron" / "bin"
    assert [c for c in calls if not c.startswith("getent ")] == [
        f"systemd-sysusers /{SYSUSERS}",
        f"systemd-tmpfiles --create /{TMPFILES}",
        *(f"ln -sfn /opt/neuron-rtd/bin/{tool} {sdk_bin}/{tool}" for tool in SDK_TOOLS),
        "systemctl enable neuron-rtd.service",
    ]
    assert (tmp_path / "root" / MADE).read_text() == "group neuron\nuser neuron-rtd\n"
    assert said.splitlines() == [
        "neuron-rtd: linked into /opt/aws/neuron/bin: neuron-ls neuron-cli neuron-top "
        "neuron-monitor",
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
    calls = calls[2:]  # what was there before: getent passwd neuron-rtd, group neuron
    assert calls[:4] == [
        "getent group neuron",
        "groupadd --system neuron",
        "getent passwd neuron-rtd",
        "useradd --system --gid neuron --no-create-home --home-dir /nonexistent "
        "--shell /usr/sbin/nologin --comment Neuron runtime daemon neuron-rtd",
    ]
    assert "install -d -o neuron-rtd -g neuron -m 0750 /run/neuron-rtd" in calls
    sdk_bin = tmp_path / "root" / "opt" / "aws" / "neuron" / "bin"
    assert calls[-7:] == [
        "ln -sfn /run/neuron-rtd/sim /run/neuron-sim",
        "ln -sfn /run/neuron-rtd/neuron.sock /run/neuron.sock",
        "install -d -o root -g neuron -m 3775 /var/lib/neuron-rtd/models",
        *(f"ln -sfn /opt/neuron-rtd/bin/{tool} {sdk_bin}/{tool}" for tool in SDK_TOOLS),
    ]
    assert (tmp_path / "root" / MADE).read_text() == "group neuron\nuser neuron-rtd\n"
    assert "the service is not started; it is not enabled: there is no systemctl." in said
    assert "runuser -u neuron-rtd -- /usr/bin/neuron-rtd" in said


@pytest.mark.usefixtures("no_systemd")
def test_postinst_notes_only_the_accounts_it_made(tmp_path: Path) -> None:
    """A user neuron-rtd there before the package is not the package's: not written down
    (purge leaves it); the group it made is."""
    _, calls = run_postinst(tmp_path, systemd_tools=False, there=("passwd-neuron-rtd",))
    assert not any(call.startswith("useradd") for call in calls)
    assert (tmp_path / "root" / MADE).read_text() == "group neuron\n"
    run_postinst(tmp_path, systemd_tools=False)  # configured again (an upgrade): no change
    assert (tmp_path / "root" / MADE).read_text() == "group neuron\n"


def sdk_links(root: Path) -> dict[str, str]:
    """What is in root/opt/aws/neuron/bin: each link's target, `file` for a file."""
    sdk_bin = root / "opt" / "aws" / "neuron" / "bin"
    if not sdk_bin.is_dir():
        return {}
    return {p.name: os.readlink(p) if p.is_symlink() else "file" for p in sdk_bin.iterdir()}


def lay_sdk_links(root: Path, links: dict[str, str]) -> None:
    sdk_bin = root / "opt" / "aws" / "neuron" / "bin"
    sdk_bin.mkdir(parents=True)
    for name, target in links.items():
        if target == "file":
            (sdk_bin / name).write_text("#!/bin/sh\n")
        else:
            (sdk_bin / name).symlink_to(target)


@pytest.mark.usefixtures("no_systemd")
def test_postinst_leaves_the_sdk_links_a_checkout_made_and_says_so(tmp_path: Path) -> None:
    """bootstrap.sh's links (to a checkout's .venv) and the SDK's own tool stay; a dead
    link and a missing one become the package's."""
    root = tmp_path / "root"
    checkout = tmp_path / "checkout" / ".venv" / "bin"
    checkout.mkdir(parents=True)
    for tool in SDK_TOOLS:
        (checkout / tool).touch()
    lay_sdk_links(
        root,
        {
            "neuron-ls": f"{checkout}/neuron-ls",
            "neuron-cli": f"{checkout}/neuron-cli",
            "neuron-top": "file",  # the SDK's own
            "neuron-monitor": "/gone/.venv/bin/neuron-monitor",  # a checkout since removed
        },
    )
    said, calls = run_postinst(tmp_path, systemd_tools=False)
    sdk_bin = root / "opt" / "aws" / "neuron" / "bin"
    assert [c for c in calls if "/opt/neuron-rtd/bin/" in c] == [
        f"ln -sfn /opt/neuron-rtd/bin/neuron-monitor {sdk_bin}/neuron-monitor"
    ]
    ours = "to use it: ln -sfn /opt/neuron-rtd/bin/{0} /opt/aws/neuron/bin/{0}"
    assert said.splitlines()[:4] == [
        f"neuron-rtd: /opt/aws/neuron/bin/neuron-ls is left as it is ({checkout}/neuron-ls): "
        f"not this package's; {ours.format('neuron-ls')}",
        f"neuron-rtd: /opt/aws/neuron/bin/neuron-cli is left as it is ({checkout}/neuron-cli): "
        f"not this package's; {ours.format('neuron-cli')}",
        "neuron-rtd: /opt/aws/neuron/bin/neuron-top is left as it is (a file, not a link): "
        f"not this package's; {ours.format('neuron-top')}",
        "neuron-rtd: linked into /opt/aws/neuron/bin: neuron-monitor",
    ]


def run_postrm(
    tmp_path: Path, action: str, *, there: tuple[str, ...], in_use: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """postrm ACTION, the package installed under tmp_path/root (DPKG_ROOT), every command
    that would change this machine a stub (accounts `there`: `passwd-neuron-rtd`, ...;
    userdel failing as for a user a process runs as, `in_use`); its result and the calls."""
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    accounts = account_stubs(stubs, calls, stub=("rm", "systemctl"))
    if in_use:
        (stubs / "userdel").write_text(
            f'#!/bin/sh\necho "userdel $*" >> {calls}\n'
            'echo "userdel: user $1 is currently used by process 4242" >&2\nexit 8\n'
        )
    for account in there:
        (accounts / account).touch()
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "packaging" / "debian" / "postrm"), action],
        env={"PATH": str(stubs), "DPKG_ROOT": str(tmp_path / "root")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr  # never a failed purge
    return done, calls.read_text().splitlines() if calls.exists() else []


BOTH = ("passwd-neuron-rtd", "group-neuron")


def test_purge_removes_the_user_and_group_postinst_made(tmp_path: Path) -> None:
    (tmp_path / "root" / MADE).parent.mkdir(parents=True)
    (tmp_path / "root" / MADE).write_text("group neuron\nuser neuron-rtd\n")
    done, calls = run_postrm(tmp_path, "purge", there=BOTH)
    assert [c for c in calls if c.startswith(("userdel", "groupdel"))] == [
        "userdel neuron-rtd",
        "groupdel neuron",
    ]
    assert (done.stdout, done.stderr) == ("", "")
    assert f"rm -rf /run/neuron-rtd /etc/neuron-rtd {tmp_path}/root/var/lib/neuron-rtd" in calls


def test_purge_keeps_a_user_that_was_there_before_the_package(tmp_path: Path) -> None:
    """The user neuron-rtd was there before (postinst noted only the group): it stays,
    said, and no userdel runs (one a process runs as said `currently used by process`)."""
    (tmp_path / "root" / MADE).parent.mkdir(parents=True)
    (tmp_path / "root" / MADE).write_text("group neuron\n")
    done, calls = run_postrm(tmp_path, "purge", there=BOTH, in_use=True)
    assert [c for c in calls if c.startswith(("userdel", "groupdel"))] == ["groupdel neuron"]
    assert done.stdout == (
        "neuron-rtd: the user neuron-rtd was there before this package: it stays\n"
    )
    assert done.stderr == ""


def test_purge_of_a_user_still_in_use_says_so_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "root" / MADE).parent.mkdir(parents=True)
    (tmp_path / "root" / MADE).write_text("group neuron\nuser neuron-rtd\n")
    done, calls = run_postrm(tmp_path, "purge", there=BOTH, in_use=True)
    assert [c for c in calls if c.startswith(("userdel", "groupdel"))] == [
        "userdel neuron-rtd",
        "groupdel neuron",
    ]
    assert done.stderr == (
        "neuron-rtd: the user neuron-rtd stays (userdel: user neuron-rtd is currently used "
        "by process 4242); remove it once nothing uses it: userdel neuron-rtd\n"
    )


def test_remove_takes_only_its_own_sdk_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    theirs = {"neuron-ls": "/srv/checkout/.venv/bin/neuron-ls", "neuron-top": "file"}
    ours = {t: f"/opt/neuron-rtd/bin/{t}" for t in ("neuron-cli", "neuron-monitor")}
    lay_sdk_links(root, {**theirs, **ours})
    _, calls = run_postrm(tmp_path, "remove", there=BOTH)
    sdk_bin = root / "opt" / "aws" / "neuron" / "bin"
    assert [c for c in calls if c.startswith("rm ")] == [
        f"rm -f {sdk_bin}/neuron-cli",
        f"rm -f {sdk_bin}/neuron-monitor",
    ]
    assert not any(c.startswith(("userdel", "groupdel")) for c in calls)  # remove: not purge


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
            done, _ = run_prerm(work, tmp_path, stop_timeout_s=1)
            assert done.returncode == 0, done.stderr
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


def test_dpkg_and_a_checkout_share_the_sdk_links_and_purge_keeps_a_user_it_found(
    deb: Path, tmp_path: Path
) -> None:
    """A checkout's bootstrap.sh linked the SDK's tools to its .venv, and a user
    neuron-rtd, which a process runs as, was there before: `dpkg -i` leaves the links and
    says so, `dpkg --purge` leaves them and the user (no `userdel`, no `currently used by
    process`) and removes the group it made; the one link the package made goes with it."""
    said = in_throwaway_root(
        f"""
        rm -rf /opt/aws/neuron/bin && mkdir -p /opt/aws/neuron/bin /srv/checkout/.venv/bin
        for tool in neuron-ls neuron-cli neuron-monitor; do   # as bootstrap.sh links them
            touch /srv/checkout/.venv/bin/$tool
            ln -s /srv/checkout/.venv/bin/$tool /opt/aws/neuron/bin/$tool
        done
        useradd --system --no-create-home --shell /usr/sbin/nologin neuron-rtd
        runuser -u neuron-rtd -- sleep 600 > /dev/null 2>&1 & sleeper=$!
        show() {{ echo "$1: $(cd /opt/aws/neuron/bin && for l in *; do
            printf '%s->%s ' $l $(readlink $l); done)"; }}
        dpkg -i /mnt/{deb.name} 2>&1
        show installed
        dpkg --purge neuron-rtd 2>&1
        show purged
        getent passwd neuron-rtd > /dev/null && echo "user stays"
        getent group neuron || echo "group gone"
        kill $sleeper
        """,
        deb.parent,
        tmp_path,
    )
    checkout = " ".join(
        f"{t}->/srv/checkout/.venv/bin/{t}" for t in ("neuron-cli", "neuron-ls", "neuron-monitor")
    )
    lines = said.splitlines()
    assert f"installed: {checkout} neuron-top->/opt/neuron-rtd/bin/neuron-top " in lines
    assert f"purged: {checkout} " in lines
    for tool in ("neuron-ls", "neuron-cli", "neuron-monitor"):
        assert (
            f"neuron-rtd: /opt/aws/neuron/bin/{tool} is left as it is "
            f"(/srv/checkout/.venv/bin/{tool}): not this package's; to use it: "
            f"ln -sfn /opt/neuron-rtd/bin/{tool} /opt/aws/neuron/bin/{tool}"
        ) in lines
    assert "neuron-rtd: linked into /opt/aws/neuron/bin: neuron-top" in lines
    assert "neuron-rtd: the user neuron-rtd was there before this package: it stays" in lines
    assert "user stays" in lines and "group gone" in lines
    assert "currently used" not in said and "userdel" not in said, said


def test_contents_name_the_installed_place_only(deb: Path, tmp_path: Path) -> None:
    dpkg_deb("-x", str(deb), str(tmp_path))
    check_tree(tmp_path)
    # the SDK's tools are linked by postinst, where nothing is there: not files of the
    # package, which dpkg would put over a checkout's links and take away with them
    assert not (tmp_path / "opt" / "aws").exists()
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
    assert sdk_links(tmp_path) == {t: f"{PREFIX}/bin/{t}" for t in SDK_TOOLS}  # as postinst
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
