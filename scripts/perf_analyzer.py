"""Install Triton's perf_analyzer where docs/kserve.md runs it: `.venv/bin/perf_analyzer`.

    make perf-analyzer                       # = .venv/bin/python scripts/perf_analyzer.py
    python scripts/perf_analyzer.py [--prefix PREFIX]   # PREFIX: this Python's (the venv)

The last build that runs on Debian 12 (glibc 2.36) is the binary inside the
`tritonclient==2.51.0` manylinux1 wheel; it needs `libb64.so.0d` (Debian `libb64-0d`,
installed with apt-get when it is missing and we are root) and `libcudart.so.12` (PyPI
`nvidia-cuda-runtime-cu12`), no GPU. Both wheels come with `pip download`; their two files
go to PREFIX/lib/perf_analyzer/, and PREFIX/bin/perf_analyzer is a wrapper that runs the
binary with that folder on LD_LIBRARY_PATH. Installed once: a second run only checks.
`bench/kserve.py` runs perf_analyzer through `install` too.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PA_WHEEL = "tritonclient==2.51.0"
PA_PLATFORM = "manylinux1_x86_64"  # the build of the wheel that holds the binary
CUDART_WHEEL = "nvidia-cuda-runtime-cu12"
CUDART = "libcudart.so.12"
LIBB64 = Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d")


def say(line: str) -> None:
    print(f"perf_analyzer: {line}", flush=True)


def fetch(folder: Path) -> Path:
    """perf_analyzer's binary and libcudart.so.12 in `folder` (downloaded when either is
    missing); the binary's path."""
    binary, cudart = folder / "perf_analyzer", folder / CUDART
    if binary.exists() and cudart.exists():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for wheel, platform in ((PA_WHEEL, PA_PLATFORM), (CUDART_WHEEL, None)):
            say(f"pip download {wheel}")
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            command += ["--only-binary=:all:", "-d", tmp, wheel]
            if platform:
                command += ["--platform", platform]
            subprocess.run(command, check=True)
        for path in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(path) as whl:
                for member in whl.namelist():
                    if member.endswith("/bin/perf_analyzer"):
                        _write(binary, whl.read(member), 0o755)
                    elif member.endswith(f"/{CUDART}"):
                        _write(cudart, whl.read(member), 0o644)
    missing = [p.name for p in (binary, cudart) if not p.exists()]
    if missing:
        raise SystemExit(f"perf_analyzer: the wheels held no {' or '.join(missing)}")
    return binary


def _write(path: Path, data: bytes, mode: int) -> None:
    """`data` as `path`, whole or not at all (a temporary renamed over it)."""
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    part.chmod(mode)
    part.replace(path)


def ensure_libb64() -> None:
    """libb64.so.0d, which the binary links: apt-get installs it when it is missing and we
    are root; otherwise we say how."""
    if ctypes.util.find_library("b64") is not None or LIBB64.exists():
        return
    if os.geteuid() != 0:
        raise SystemExit("perf_analyzer needs libb64.so.0d: sudo apt-get install libb64-0d")
    say("apt-get install libb64-0d")
    subprocess.run(["apt-get", "install", "-y", "-qq", "libb64-0d"], check=True)


def install(prefix: Path) -> Path:
    """PREFIX/bin/perf_analyzer, a wrapper running the binary fetched into
    PREFIX/lib/perf_analyzer with that folder on LD_LIBRARY_PATH; its path."""
    folder = prefix / "lib" / "perf_analyzer"
    binary = fetch(folder)
    ensure_libb64()
    wrapper = prefix / "bin" / "perf_analyzer"
    script = (
        "#!/bin/sh\n"
        "# Triton's perf_analyzer (tritonclient 2.51.0's build), installed by\n"
        "# scripts/perf_analyzer.py; libcudart.so.12 beside it, no GPU needed\n"
        f"LD_LIBRARY_PATH={shlex.quote(str(folder))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        f'export LD_LIBRARY_PATH\nexec {shlex.quote(str(binary))} "$@"\n'
    )
    if not wrapper.exists() or wrapper.read_text() != script:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        _write(wrapper, script.encode(), 0o755)
    return wrapper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/perf_analyzer.py",
        description="Install Triton's perf_analyzer as PREFIX/bin/perf_analyzer.",
    )
    parser.add_argument(
        "--prefix",
        type=Path,
        default=Path(sys.prefix),
        help="where bin/ and lib/ are (default: this Python's, %(default)s)",
    )
    args = parser.parse_args(argv)
    wrapper = install(args.prefix.absolute())
    say(f"installed {wrapper}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
