"""perf_analyzer 2.51, unmodified, on Triton's example models: gRPC and HTTP, with and
without system shared memory, and on the sequence models with `--sequence-length`.

    python bench/triton_perf.py [--repo REPO | --neff] [--seconds 3] [--concurrency 4] [--json]

One daemon serves the repository `scripts/triton_models.py` builds (ONNX as Triton's, or
compiled NEFFs with `--neff`; or REPO) on HTTP and on a loopback gRPC port, as
scripts/triton_examples.py starts it. Each run prints its throughput and p50/p99 latency,
and whether it was clean: exit 0 and no line of error in perf_analyzer's output. A run
gets a deadline (its window's worth several times over) and is killed whole past it; its
stability bar is off (`--stability-percentage 100`): on a shared machine a correct run
must not fail for noise. Figures are the last window's.
perf_analyzer: the build `make perf-analyzer` installs (scripts/perf_analyzer.py),
installed first when it is not there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import perf_analyzer  # noqa: E402  (scripts/perf_analyzer.py: the one install)
import triton_examples  # noqa: E402  (scripts/triton_examples.py: the daemon as it runs it)
import triton_models  # noqa: E402

# (model, protocol, shared memory, sequence length); 0: not a sequence run
RUNS = [
    ("simple", "grpc", "none", 0),
    ("simple", "grpc", "system", 0),
    ("simple", "http", "none", 0),
    ("simple", "http", "system", 0),
    ("simple_sequence", "grpc", "none", 5),
    ("simple_sequence", "http", "none", 5),
    ("simple_dyna_sequence", "grpc", "system", 5),
]
ERROR = re.compile(r"(?i)error|failed|unable|exception|invalid|not supported")


@dataclass
class PerfRun:
    model: str
    protocol: str
    shared_memory: str
    sequence_length: int
    exit_code: int | None  # None: killed at its deadline
    clean: bool
    throughput: float | None  # inferences a second
    p50_us: float | None
    p99_us: float | None
    error: str  # the first error line, or why it was not clean

    def line(self) -> str:
        what = f"{self.model:<21} {self.protocol:<4} shm={self.shared_memory:<6}"
        what += f" seq={self.sequence_length or '-':<2}"
        if self.throughput is None or self.p50_us is None or self.p99_us is None:
            numbers = f"{'':>14}{'':>22}"
        else:
            numbers = f"{self.throughput:9.1f} inf/s  p50 {self.p50_us / 1e3:6.2f} ms"
            numbers += f"  p99 {self.p99_us / 1e3:6.2f} ms"
        verdict = "clean" if self.clean else f"NOT CLEAN (exit {self.exit_code}): {self.error}"
        return f"  {what}  {numbers}  {verdict}"


def last_number(pattern: str, text: str) -> float | None:
    found = re.findall(pattern, text)
    return float(found[-1]) if found else None


def run_perf(
    binary: Path,
    run: tuple[str, str, str, int],
    address: str,
    seconds: float,
    concurrency: int,
) -> PerfRun:
    model, protocol, shm, length = run
    command = [
        str(binary), "-m", model, "-i", protocol, "-u", address, "-b", "1",
        "--concurrency-range", str(concurrency), "--measurement-mode", "time_windows",
        "-p", str(int(seconds * 1000)), "--percentile", "99", "--max-trials", "10",
        "--stability-percentage", "100", "--shared-memory", shm,
    ]  # fmt: skip
    if length:
        command += ["--sequence-length", str(length)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=seconds * 12 + 60)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    text = out.decode(errors="replace")
    errors = [line.strip() for line in text.splitlines() if ERROR.search(line)]
    throughput = last_number(r"Throughput: ([\d.]+) infer/sec", text)
    clean = code == 0 and not errors and throughput is not None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [e for e in errors if "had error" in e] or errors  # a thread's own error says most
    error = said[0] if said else ("" if clean else (lines[-1] if lines else "no output"))
    if code is None:
        error = f"killed at its deadline; {error}"
    return PerfRun(
        model,
        protocol,
        shm,
        length,
        code,
        clean,
        throughput,
        last_number(r"p50 latency: (\d+) usec", text),
        last_number(r"p99 latency: (\d+) usec", text),
        error[:300],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/triton_perf.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repo", type=Path, help="the model repository (default: built)")
    parser.add_argument("--neff", action="store_true", help="build the repository with --neff")
    parser.add_argument("--seconds", type=float, default=3.0, help="perf_analyzer's window")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    args = parser.parse_args(argv)
    binary = perf_analyzer.install(Path(sys.prefix))
    work = Path(tempfile.mkdtemp(prefix="triton-perf-"))
    results: list[PerfRun] = []
    try:
        repo = args.repo.absolute() if args.repo else work / "repo"
        if args.repo is None:
            triton_models.build(repo, neff=args.neff, only=sorted({r[0] for r in RUNS}))
        ports = (triton_examples.free_port(), triton_examples.free_port())
        with triton_examples.daemon(work, "main", repo, [], ports) as addresses:
            if not args.json:
                print(
                    f"perf_analyzer 2.51, concurrency {args.concurrency}, {args.seconds} s windows"
                )
            for run in RUNS:
                address = addresses.grpc if run[1] == "grpc" else addresses.http
                result = run_perf(binary, run, address, args.seconds, args.concurrency)
                results.append(result)
                if not args.json:
                    print(result.line(), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
