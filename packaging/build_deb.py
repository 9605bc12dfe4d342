"""Build the Debian package (`make deb`): dist/neuron-rtd_VERSION_ARCH.deb, with dpkg-deb.

What it holds:
- the project and its dependencies in a virtual environment, /opt/neuron-rtd, built in a
  staging directory and then made to name /opt/neuron-rtd (shebangs, pyvenv.cfg);
- every console command of pyproject.toml linked into /usr/bin;
- the systemd units in /lib/systemd/system: the daemon runs as its own user `neuron-rtd`,
  in the group `neuron`, with no capabilities;
- that user and group (/usr/lib/sysusers.d/neuron-rtd.conf), and the daemon's folder in
  /run with the links /run/neuron.sock and /run/neuron-sim into it
  (/usr/lib/tmpfiles.d/neuron-rtd.conf);
- the config in /etc/neuron-rtd (conffiles), the packaged one with `socket_group: neuron`
  and mode 0660: members of `neuron` connect without root;
- the README and docs/ in /usr/share/doc/neuron-rtd;
- maintainer scripts (packaging/debian/): the user, group and /run made by postinst (with
  groupadd/useradd where there is no systemd-sysusers; which of the user and group it made
  written down, so that purge removes those and only those), the original SDK's tools
  (neuron-ls, neuron-cli, neuron-top, neuron-monitor) linked into /opt/aws/neuron/bin,
  where it put them and where Ray looks for neuron-ls, only where nothing is there (a
  checkout's links, scripts/bootstrap.sh's, stay as they are, and remove takes only its
  own), the service enabled and started where systemd runs (enabled, and what to run said,
  where it does not), the daemon stopped by prerm however it was started, and remove/purge
  that leave nothing of the package's behind.

It says each step as it starts (`build_deb.py: ...`), and pip says each package it takes:
its progress bars where the output is a terminal, a line per package where it is not.

Every file and folder has the mode it is given here (0644/0755), whatever the builder's
umask: the umask is set to 022 before anything is laid out.

    python packaging/build_deb.py [--out DIR] [--python PYTHON]
    python packaging/build_deb.py --install ROOT    (packaging/install.sh: no dpkg)

`--install ROOT` lays the same tree out under ROOT instead of packing it (config files
already there are kept) and, when ROOT is /, does what the package's postinst does
(elsewhere, the SDK's tools are linked into ROOT/opt/aws/neuron/bin as postinst would).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging" / "debian"
PREFIX = "/opt/neuron-rtd"
GROUP = "neuron"
UNIT_DIR = "lib/systemd/system"
SYSUSERS = "usr/lib/sysusers.d/neuron-rtd.conf"
TMPFILES = "usr/lib/tmpfiles.d/neuron-rtd.conf"
UMASK = 0o022
SDK_BIN = "opt/aws/neuron/bin"  # where the original SDK put its tools (Ray runs neuron-ls there)
SDK_TOOLS = ("neuron-ls", "neuron-cli", "neuron-top", "neuron-monitor")
DEPENDS = "python3 (>= 3.11), libc6 (>= 2.28), libsystemd0, passwd"
MAINTAINER = "neuron-rtd developers <dev@neuron-rtd.example.org>"


def project() -> dict[str, object]:
    meta: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return meta


def run(*command: str | Path) -> None:
    subprocess.run([str(c) for c in command], check=True)


def step(what: str) -> None:
    """Say what the build does now (before it does it: the steps take seconds to a minute)."""
    print(f"build_deb.py: {what}", flush=True)


def pip_progress() -> str:
    """pip's --progress-bar: its bars on a terminal; in a log (make test, CI) none, pip's
    line per package saying enough."""
    return "on" if sys.stdout.isatty() else "off"


def build_venv(stage: Path, python: str) -> Path:
    """The virtual environment with the project installed, at stage + PREFIX."""
    venv = stage / PREFIX.lstrip("/")
    step(f"a virtual environment on {python}, for {PREFIX}")
    run(python, "-m", "venv", venv)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
    # systemd-python is built here, against this Python (a wheel cached from another
    # Python's build would carry that Python's library path)
    step("pip: the project and its dependencies into it (systemd-python compiled)")
    run(
        *pip,
        "install",
        f"--progress-bar={pip_progress()}",
        "--no-compile",
        "--no-warn-script-location",
        "--no-binary=systemd-python",
        ROOT,
    )
    run(*pip, "uninstall", "-q", "-y", "pip")  # the package is not a development venv
    for leftover in (venv / "bin").glob("activate*"):
        leftover.unlink()
    for record in (venv / "lib").glob("python3*/site-packages/*.dist-info/direct_url.json"):
        record.unlink()  # it names the checkout the package was built from
    return venv


def tidy(venv: Path) -> None:
    """No compiled Python (postinst compiles it where it is installed); in lib, a file is
    executable exactly when it is a script (#!), shared libraries included (they are
    mapped, not run)."""
    for cache in sorted(venv.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    for path in (venv / "lib").rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as file:
                script = file.read(2) == b"#!"
            path.chmod(0o755 if script else 0o644)


def relocate(venv: Path) -> None:
    """Make every file that names the staging directory name PREFIX instead."""
    staged = str(venv).encode()
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if staged in data:
            path.write_bytes(data.replace(staged, PREFIX.encode()))


def install_file(source: Path, target: Path, mode: int = 0o644) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)


def packaged_config(source: Path) -> str:
    """A config file as the package installs it: the socket for group `neuron`."""
    config = json.loads(source.read_text())
    config["socket_group"] = GROUP
    config["socket_mode"] = "0660"
    return json.dumps(config, indent=2) + "\n"


def _troff(text: str) -> str:
    """Text as troff shows it verbatim: backslashes escaped, no line read as a request."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def man_page(python: Path, command: str, entry: str, version: str) -> str:
    """The command's manual page: its --help, run by the environment's Python."""
    module, function = entry.split(":")
    code = (
        f"import sys; sys.argv = [{command!r}, '--help']; "
        f"from {module} import {function}; {function}()"
    )
    help_text = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout
    usage, _, rest = help_text.partition("\n\n")
    summary = rest.strip().split("\n\n", 1)[0].replace("\n", " ").split(". ")[0].rstrip(".")
    return (
        f'.TH {command.upper()} 1 "" "neuron-rtd {version}" "User Commands"\n'
        f".SH NAME\n{command} \\- {_troff(summary) or 'a neuron-rtd command'}\n"
        f".SH SYNOPSIS\n.nf\n{_troff(usage)}\n.fi\n"
        f".SH DESCRIPTION\n.nf\n{_troff(rest.strip())}\n.fi\n"
        f".SH SEE ALSO\n/usr/share/doc/neuron-rtd/README.md\n"
    )


def lay_out(stage: Path, version: str) -> list[str]:
    """Everything beside the venv (config files already there are kept); the conffiles'
    paths."""
    scripts = project()["scripts"]
    assert isinstance(scripts, dict)
    step(f"each command's link in /usr/bin and man page (its --help): {len(scripts)}")
    bin_dir = stage / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    man_dir = stage / "usr" / "share" / "man" / "man1"
    man_dir.mkdir(parents=True, exist_ok=True)
    venv_python = stage / PREFIX.lstrip("/") / "bin" / "python"
    for command in sorted(scripts):
        link = bin_dir / command
        link.unlink(missing_ok=True)
        link.symlink_to(f"{PREFIX}/bin/{command}")
        step(f"man page: {command}")
        page = man_page(venv_python, command, str(scripts[command]), version)
        (man_dir / f"{command}.1.gz").write_bytes(gzip.compress(page.encode(), 9, mtime=0))
    step("units, sysusers.d and tmpfiles.d files, config, docs")
    units = stage / UNIT_DIR
    for unit in sorted((ROOT / "systemd").glob("*.service")):
        install_file(unit, units / unit.name)
    install_file(PACKAGING / "sysusers.conf", stage / SYSUSERS)
    install_file(PACKAGING / "tmpfiles.conf", stage / TMPFILES)
    conffiles = []
    etc = stage / "etc" / "neuron-rtd"
    for source in [
        ROOT / "config" / "neuron-rtd.json",
        *sorted((ROOT / "config" / "instances").glob("*.json")),
    ]:
        relative = source.relative_to(ROOT / "config")
        target = etc / relative
        conffiles.append(f"/etc/neuron-rtd/{relative}")
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(packaged_config(source))
        target.chmod(0o644)
    doc = stage / "usr" / "share" / "doc" / "neuron-rtd"
    pages = [p.relative_to(ROOT) for p in sorted((ROOT / "docs").glob("*.md"))]
    for relative in (Path("README.md"), Path("ARCHITECTURE.md"), *pages):
        install_file(ROOT / relative, doc / relative)  # the README's links hold there too
    install_file(PACKAGING / "copyright", doc / "copyright")
    changelog = (PACKAGING / "changelog").read_text()
    changelog = changelog.replace("@VERSION@", version).replace("@MAINTAINER@", MAINTAINER)
    (doc / "changelog.gz").write_bytes(gzip.compress(changelog.encode(), 9, mtime=0))
    overrides = stage / "usr" / "share" / "lintian" / "overrides" / "neuron-rtd"
    install_file(PACKAGING / "lintian-overrides", overrides)
    return conffiles


def link_sdk_tools(root: Path) -> None:
    """The SDK's tools linked into root/opt/aws/neuron/bin as postinst links them: where
    nothing is there (or a dead link)."""
    sdk_bin = root / SDK_BIN
    sdk_bin.mkdir(parents=True, exist_ok=True)
    for command in SDK_TOOLS:
        link = sdk_bin / command
        if link.exists():  # a checkout's link, the SDK's tool: left as it is
            print(f"build_deb.py: /{SDK_BIN}/{command} is there already: left as it is")
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(f"{PREFIX}/bin/{command}")


def control(stage: Path, version: str, arch: str, conffiles: list[str]) -> None:
    step("control files, md5sums, maintainer scripts")
    meta = stage / "DEBIAN"
    meta.mkdir()
    size_kib = sum(p.lstat().st_size for p in stage.rglob("*") if not p.is_dir()) // 1024
    (meta / "control").write_text(
        f"Package: neuron-rtd\n"
        f"Version: {version}\n"
        f"Architecture: {arch}\n"
        f"Maintainer: {MAINTAINER}\n"
        f"Installed-Size: {size_kib}\n"
        f"Depends: {DEPENDS}\n"
        f"Section: misc\n"
        f"Priority: optional\n"
        f"Homepage: https://localhost/neuron-rtd\n"
        f"Description: Inferentia runtime daemon on a simulated machine\n"
        f" A Python re-implementation of the Inferentia runtime daemon, on a\n"
        f" simulated machine that really computes. It serves the Neuron runtime's\n"
        f" gRPC API on /run/neuron.sock for members of the group neuron, as its\n"
        f" own unprivileged user, with neuron-ls, neuron-cli, the compiler and the\n"
        f" other tools.\n"
    )
    (meta / "conffiles").write_text("".join(f"{path}\n" for path in conffiles))
    sums = []
    for path in sorted(stage.rglob("*")):
        if path.is_file() and not path.is_symlink() and meta not in path.parents:
            digest = hashlib.md5(path.read_bytes()).hexdigest()  # dpkg keeps md5 sums
            sums.append(f"{digest}  {path.relative_to(stage)}\n")
    (meta / "md5sums").write_text("".join(sums))
    for script in ("postinst", "prerm", "postrm"):
        install_file(PACKAGING / script, meta / script, 0o755)


def build(out: Path, python: str) -> Path:
    os.umask(UMASK)  # before anything is made: the package's modes are not the builder's
    version = str(project()["version"])
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], check=True, capture_output=True, text=True
    ).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"neuron-rtd_{version}_{arch}.deb"
    with tempfile.TemporaryDirectory(prefix="neuron-rtd-deb-") as tmp:
        stage = Path(tmp) / "root"
        venv = build_venv(stage, python)
        step("the environment made to name its installed place; no compiled Python")
        relocate(venv)
        tidy(venv)
        conffiles = lay_out(stage, version)
        control(stage, version, arch, conffiles)
        pack(stage, deb)
        step(f"built {deb} ({deb.stat().st_size // 2**20} MiB); removing the staging tree")
    return deb


PACK_REPORT_S = 10  # how often the packing says how far it is


def pack(stage: Path, deb: Path) -> None:
    """dpkg-deb --build, saying every PACK_REPORT_S how far it is (it says nothing itself
    for the minute gzip takes): how much of the tree its tar has read, then how much of
    the .deb it has written."""
    size = sum(p.lstat().st_size for p in stage.rglob("*") if not p.is_dir())
    step(f"packing {size // 2**20} MiB with dpkg-deb (gzip) into {deb}: the longest step")
    command = ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(stage), str(deb)]
    with subprocess.Popen(command) as packing:
        while True:
            try:
                packing.wait(PACK_REPORT_S)
                break
            except subprocess.TimeoutExpired:
                read = tar_read(packing.pid)
                if read is not None:
                    step(f"packing: {min(99, 100 * read // max(size, 1))}% of the tree read")
                else:  # the tree read: its compression ends, then the .deb is written
                    written = deb.stat().st_size if deb.exists() else 0
                    step(f"packing: the tree read; {written // 2**20} MiB of the .deb written")
    if packing.returncode:
        raise subprocess.CalledProcessError(packing.returncode, command)


def tar_read(parent: int) -> int | None:
    """The bytes read so far by the tar that process `parent` (dpkg-deb) runs, if any."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            if fields[0].endswith("(tar") and int(fields[1].split()[1]) == parent:
                io = (stat.parent / "io").read_text()
                return int(io.split("rchar:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return None


def install(root: Path, python: str) -> None:
    """The package's tree laid out under `root` (packaging/install.sh), configured as the
    package's postinst does when `root` is /."""
    os.umask(UMASK)
    root = root.resolve()
    shutil.rmtree(root / PREFIX.lstrip("/"), ignore_errors=True)  # a fresh environment
    venv = build_venv(root, python)
    if root != Path("/"):
        relocate(venv)
    tidy(venv)
    lay_out(root, str(project()["version"]))
    if root == Path("/"):
        step("what the package's postinst does")
        run("sh", PACKAGING / "postinst", "configure")
    else:
        link_sdk_tools(root)


PREREQUISITES = (  # (check run by the venv's Python, what is missing, the Debian package)
    ("import ensurepip", "cannot make virtual environments", "python3-venv"),
    (
        "import os, sysconfig; "
        "assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))",
        "has no C headers (systemd-python is compiled against them)",
        "python3-dev",
    ),
)


def missing_prerequisite(python: str) -> str | None:
    """What the Python the environment is made from lacks, and how to get it."""
    if shutil.which(python) is None:
        return f"there is no Python {python} (--python, or PYTHON= for install.sh)"
    for check, what, package in PREREQUISITES:
        if subprocess.run([python, "-c", check], capture_output=True).returncode:
            return f"{python} {what} (on Debian: apt-get install {package})"
    if not Path("/usr/include/systemd/sd-daemon.h").exists():
        return "libsystemd's headers are missing (on Debian: apt-get install libsystemd-dev)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_deb.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the .deb goes")
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python of the venv")
    parser.add_argument(
        "--install", type=Path, metavar="ROOT", help="lay the tree out under ROOT instead"
    )
    args = parser.parse_args(argv)
    missing = missing_prerequisite(args.python)
    if missing:
        print(f"build_deb.py: {missing}", file=sys.stderr)
        return 1
    if args.install is not None:
        install(args.install, args.python)
        print(f"installed neuron-rtd under {args.install}")
        return 0
    if shutil.which("dpkg-deb") is None:
        print("build_deb.py: dpkg-deb is not installed (apt-get install dpkg)", file=sys.stderr)
        return 1
    print(build(args.out, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
