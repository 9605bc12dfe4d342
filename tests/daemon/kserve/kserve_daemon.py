"""The daemon as the KServe tests start it: over a model repository, gRPC on its socket and
the HTTP front on a loopback port of its own choice, its log free of tracebacks when it
stops (no request, however malformed, broke anything); and Triton's perf_analyzer, which
the tests drive it with."""

from __future__ import annotations

import contextlib
import fcntl
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

from neuron_rtd.cli.spawn import DaemonProcess


def http_port(proc: DaemonProcess) -> int:
    """The port the daemon's HTTP front took (`--http-address 127.0.0.1:0`), from its log."""
    (line,) = [x for x in proc.log().splitlines() if "KServe v2 HTTP listening on" in x]
    return int(line.rpartition(":")[2])


@contextlib.contextmanager
def kserve_daemon(
    work: Path, repo: Path, *args: str, sim: str = "sim", ready_timeout_s: float = 30.0
) -> Iterator[tuple[DaemonProcess, int]]:
    """The daemon serving `repo` (more flags in `args`), its simulated machine in
    `work/sim`: (the daemon, its HTTP port)."""
    flags = ["--model-repository", str(repo), "--http-address", "127.0.0.1:0", *args]
    with DaemonProcess(sim_root=work / sim, args=flags, ready_timeout_s=ready_timeout_s) as proc:
        yield proc, http_port(proc)
        log = proc.log()
    assert "Traceback" not in log, log


ROOT = Path(__file__).resolve().parents[3]


def perf_analyzer() -> Path:
    """Triton's perf_analyzer 2.51 in this environment (`make perf-analyzer`, which
    scripts/perf_analyzer.py does), installed when it is not there yet: under a lock, as
    the suite's workers may ask for it at once."""
    lock = Path(sys.prefix) / "lib" / ".perf_analyzer.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        install = runpy.run_path(str(ROOT / "scripts" / "perf_analyzer.py"))["install"]
        binary: Path = install(Path(sys.prefix))
        return binary
