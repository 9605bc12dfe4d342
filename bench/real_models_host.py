"""What else the machine does while bench/real_models.py runs: the CPU the other processes
take and the host steals, the daemon's cost at rest, and `--busy`'s competing process (a
busy loop on one core, for the whole comparison, onnxruntime under the same load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infer_roundtrip import cpu_seconds  # bench/infer_roundtrip.py
from vs_onnxruntime import settle

IDLE_S = 3.0
BUSY_LOOP = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextmanager
def busy_core(wanted: bool) -> Iterator[str]:
    """When `wanted`, a child Python spinning in a loop pinned to the last usable core,
    until the block ends; yields what it is, for the report ("" when not wanted)."""
    if not wanted:
        yield ""
        return
    core = max(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)])
    try:
        time.sleep(0.2)  # pinned and spinning before the first model's calls
        if proc.poll() is not None:
            raise SystemExit(f"--busy: the busy loop ended at once ({proc.returncode})")
        yield f"a busy loop (pid {proc.pid}) pinned to CPU {core}"
    finally:
        proc.terminate()
        proc.wait()


def machine_busy_s() -> tuple[float, float]:
    """CPU seconds all processes of the machine have used since boot, and the seconds the
    hypervisor ran something else on its virtual CPUs (steal) (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


class OthersMeter:
    """What others take while the bench runs, as percent of one core: the machine's other
    processes (its busy CPU time less this process's and its servers', `pids`), and on a
    virtual machine the host (the time its CPUs were stolen). Calls on a loaded machine are
    slower, those on more than one thread most of all: a stolen CPU leaves a two-thread run
    waiting for its second half."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = [os.getpid(), *pids]
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float, float]:
        ours = sum(cpu_seconds(pid) for pid in self.pids)
        return (time.perf_counter(), *machine_busy_s(), ours)

    def shares(self) -> tuple[float, float]:
        """Since the start: the other processes' share, and the host's (steal)."""
        (t0, busy0, steal0, ours0), (t1, busy1, steal1, ours1) = self.start, self._sample()
        others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0) * 100
        return others, (steal1 - steal0) / (t1 - t0) * 100


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def idle_cost(daemon_pid: int) -> dict[str, float]:
    """CPU time of the daemon and of this process over IDLE_S seconds of rest, as percent
    of one core, and their thread counts."""
    settle()
    me = os.getpid()
    before = (cpu_seconds(daemon_pid), cpu_seconds(me))
    t0 = time.perf_counter()
    time.sleep(IDLE_S)
    wall = time.perf_counter() - t0
    after = (cpu_seconds(daemon_pid), cpu_seconds(me))
    return {
        "seconds": wall,
        "daemon_pct": (after[0] - before[0]) / wall * 100,
        "in_process_pct": (after[1] - before[1]) / wall * 100,
        "daemon_threads": thread_count(daemon_pid),
        "in_process_threads": thread_count(me),
    }


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0))
    return f"{os.cpu_count()} CPUs ({usable} usable by this process){', ' + model if model else ''}"
