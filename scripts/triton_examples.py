"""Triton's own client example programs, unmodified, against the daemon: a table of results.

    python scripts/triton_examples.py --examples DIR [--repo REPO | --neff] [--json]
        [--timeout SECONDS] [--only NAME ...] [--keep DIR]

DIR holds the programs of `src/python/examples/` of triton-inference-server/client: that
folder, a checkout of the repository, or a bare git repository of it (read at HEAD). REPO
is a model repository holding their models (default: one `scripts/triton_models.py`
builds in a temporary folder, ONNX as Triton's, or compiled NEFFs with `--neff`).

Three daemons run on the simulated machine, one after another, each on a socket of its
own: one serving REPO (model control `none`), and two in `explicit` mode for the
model-control examples, which count the repository's models: the gRPC one over Triton's
eight example models, the HTTP one over seven of them (it expects seven). Each serves gRPC
on a loopback TCP port (`--grpc-address`
beside its socket when the daemon has it, else `-g HOST:PORT`) and HTTP on another; the
first takes Triton's 8001 and 8000 when they are free, as `memory_growth_test.py`, which
takes no address, needs. Every other program is given the daemon's address with `-u`.

Each run (the program, its arguments) gets `--timeout` seconds, in a process group of
its own, killed whole past that. A run passes when it exits 0, prints its PASS line if
the program has one (one without prints no line of failure). The acceptance of issue 41 expects
some to fail (CUDA shared memory without GPUs, the server's name, a decoupled model, a
DALI ensemble): such a run that fails as expected is `xfail`. A daemon that dies during
the runs, or logs a traceback, adds a failed row of its own. Exit status: 0 when every
run passes or fails as expected, 1 when not, 2 when a daemon does not start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

import triton_models  # noqa: E402  (scripts/triton_models.py, beside this one)

from neuron_rtd.cli.spawn import DaemonProcess, DaemonStartError  # noqa: E402

MAIN, EXPLICIT, EXPLICIT_SEVEN = "main", "explicit", "explicit-7"
# The model-control examples count the repository's models: the gRPC one Triton's eight,
# the HTTP one seven (it was written against a repository one model short). A daemon
# answers what its repository holds, so each runs against a repository of its count.
EXPLICIT_COUNTS = {EXPLICIT: 8, EXPLICIT_SEVEN: 7}


@dataclass(frozen=True)
class Expected:
    """A failure the acceptance allows: why, and a pattern the run's output must show."""

    reason: str
    pattern: str


NO_GPU = Expected(
    "CUDA shared memory with no GPU (Triton without GPUs refuses its register)", r"(?i)gpu|cuda"
)
NAME = Expected(
    "checks the server's name is 'triton' (it is neuron-rtd)", r"FAILED : get_server_metadata"
)
DECOUPLED = Expected("decoupled repeat_int32: its load is refused", r"(?i)decoupled")
DALI = Expected(
    "preprocess_inception_ensemble needs Triton's DALI backend", r"preprocess_inception_ensemble"
)


@dataclass(frozen=True)
class Run:
    """One program run: its file, its arguments ({grpc}, {http} and {image} filled in),
    which daemon it calls, and the failure the acceptance allows it, if any."""

    example: str
    args: tuple[str, ...] = ()
    daemon: str = MAIN
    expect: Expected | None = None
    fixed_ports: bool = False  # takes no address: needs the daemon on 8000/8001

    @property
    def label(self) -> str:
        return f"{self.example} {' '.join(self.args)}".strip()


G, H = ("-u", "{grpc}"), ("-u", "{http}")
IMAGE = ("-c", "3", "-s", "INCEPTION", "{image}")
DENSENET, INCEPTION = ("-m", "densenet_onnx", *IMAGE), ("-m", "inception_onnx", *IMAGE)
RUNS: tuple[Run, ...] = (
    Run("ensemble_image_client.py", (*H, "{image}"), expect=DALI),
    Run("grpc_client.py", G),
    Run("grpc_explicit_byte_content_client.py", G),
    Run("grpc_explicit_int8_content_client.py", G),
    Run("grpc_explicit_int_content_client.py", G),
    Run("grpc_image_client.py", (*G, *DENSENET)),
    Run("image_client.py", (*H, *DENSENET)),
    Run("image_client.py", ("-i", "grpc", *G, *DENSENET)),
    Run("image_client.py", ("-i", "grpc", "--streaming", *G, *INCEPTION)),
    Run("image_client.py", ("-a", *H, *INCEPTION)),
    Run("memory_growth_test.py", ("-i", "http", "-r", "20"), fixed_ports=True),
    Run("memory_growth_test.py", ("-i", "grpc", "-r", "20"), fixed_ports=True),
    Run("reuse_infer_objects_client.py", H),
    Run("reuse_infer_objects_client.py", ("-i", "grpc", *G)),
    Run("simple_grpc_aio_infer_client.py", G),
    Run("simple_grpc_aio_sequence_stream_infer_client.py", (*G, "-o", "10")),
    Run("simple_grpc_aio_sequence_stream_infer_client.py", (*G, "-d", "-o", "20")),
    Run("simple_grpc_async_infer_client.py", G),
    Run("simple_grpc_cudashm_client.py", G, expect=NO_GPU),
    Run("simple_grpc_custom_args_client.py", G),
    Run("simple_grpc_custom_repeat.py", G, expect=DECOUPLED),
    Run("simple_grpc_health_metadata.py", G, expect=NAME),
    Run("simple_grpc_infer_client.py", G),
    Run("simple_grpc_keepalive_client.py", G),
    Run("simple_grpc_model_control.py", G, daemon=EXPLICIT),
    Run("simple_grpc_sequence_stream_infer_client.py", (*G, "-o", "30")),
    Run("simple_grpc_sequence_stream_infer_client.py", (*G, "-d", "-o", "40")),
    Run("simple_grpc_sequence_sync_infer_client.py", (*G, "-o", "50")),
    Run("simple_grpc_sequence_sync_infer_client.py", (*G, "-d", "-o", "60")),
    Run("simple_grpc_shm_client.py", G),
    Run("simple_grpc_shm_string_client.py", G),
    Run("simple_grpc_string_infer_client.py", G),
    Run("simple_http_aio_infer_client.py", H),
    Run("simple_http_async_infer_client.py", H),
    Run("simple_http_cudashm_client.py", H, expect=NO_GPU),
    Run("simple_http_health_metadata.py", H, expect=NAME),
    Run("simple_http_infer_client.py", H),
    Run("simple_http_model_control.py", H, daemon=EXPLICIT_SEVEN),
    Run("simple_http_sequence_sync_infer_client.py", (*H, "-o", "70")),
    Run("simple_http_sequence_sync_infer_client.py", (*H, "-d", "-o", "80")),
    Run("simple_http_shm_client.py", H),
    Run("simple_http_shm_string_client.py", H),
    Run("simple_http_string_infer_client.py", H),
)

# A line saying the program failed, whatever its exit code (some exit 0 on an error).
FAILURE = re.compile(
    r"(?i)^(traceback|FAILED|error|.*exception|context creation failed|incorrect|"
    r"\[ expected \]|.*failed to|.*unexpected|.*expect )"
)
NOISE = re.compile(
    r"^(Unclosed (connector|client session)|connections: \[|connector: <|client_session: <)"
)
RPC_FIELD = re.compile(r'^(status|details) = "?(.*?)"?$', re.M)  # in a grpc error's text
RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")  # a traceback's last line


@dataclass
class Result:
    example: str
    args: str
    daemon: str
    exit_code: int | None  # None: killed at the timeout
    result: str  # pass, fail, xfail (failed as the acceptance allows), timeout, skip, xpass
    reason: str  # the first error line, or why it was skipped or is allowed to fail
    seconds: float


# --- the examples and their inputs ---------------------------------------------------


def examples_folder(given: Path, work: Path) -> Path:
    """The folder of the programs: `given` itself, its src/python/examples, or that
    folder read from a bare git repository at HEAD into `work`."""
    for folder in (given, given / "src" / "python" / "examples"):
        if (folder / "simple_grpc_infer_client.py").is_file():
            return folder
    if (given / "HEAD").is_file() and (given / "objects").is_dir():
        out = work / "examples"
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "--git-dir", str(given), "archive", "HEAD", "src/python/examples"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
        return out / "src" / "python" / "examples"
    raise SystemExit(f"triton_examples: {given} holds no Triton client examples")


def make_image(path: Path) -> Path:
    """A 320x240 JPEG (a colour gradient with a square), as the image clients read."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 240))
    image.putdata([(x * 255 // 320, y * 255 // 240, 128) for y in range(240) for x in range(320)])
    ImageDraw.Draw(image).rectangle((100, 60, 220, 180), fill=(250, 200, 20))
    image.save(path, "JPEG")
    return path


def explicit_repository(repo: Path, out: Path, count: int) -> Path:
    """The first `count` of Triton's eight example models of `repo`, copied: the
    model-control examples count the repository's models."""
    shutil.rmtree(out, ignore_errors=True)
    for name in triton_models.TRITON_EXAMPLE_REPOSITORY[:count]:
        if (repo / name).is_dir():
            shutil.copytree(repo / name, out / name)
    return out


# --- the daemons -----------------------------------------------------------------------


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_has(flag: str) -> bool:
    """Whether this daemon's command line takes `flag`."""
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.daemon.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return flag in done.stdout


@dataclass(frozen=True)
class Addresses:
    grpc: str  # HOST:PORT
    http: str  # HOST:PORT
    socket: str  # the daemon's unix socket (unix:PATH), when it keeps one
    process: DaemonProcess = field(compare=False)


@contextlib.contextmanager
def daemon(
    work: Path, name: str, repo: Path, flags: Sequence[str], ports: tuple[int, int]
) -> Iterator[Addresses]:
    """A daemon serving `repo` (with `flags`) on HTTP and gRPC at 127.0.0.1:`ports`,
    stopped (and its log kept in `work`) on leaving."""
    http, grpc = (f"127.0.0.1:{p}" for p in ports)
    args = ["-l", "warning", "--model-repository", str(repo), "--http-address", http, *flags]
    keeps_socket = daemon_has("--grpc-address")
    args += ["--grpc-address", grpc] if keeps_socket else ["-g", grpc]
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    process = DaemonProcess(
        sim_root=folder / "sim",
        socket_path=folder / "neuron.sock",
        args=args,
        log_path=folder / "daemon.log",
        ready_timeout_s=300,
    )
    try:
        process.start()
        yield Addresses(grpc, http, process.address if keeps_socket else "", process)
    finally:
        process.close()


# --- one run -----------------------------------------------------------------------------


def run_one(
    run: Run, folder: Path, addresses: Addresses, image: Path, timeout: float, cwd: Path
) -> Result:
    args = [a.format(grpc=addresses.grpc, http=addresses.http, image=image) for a in run.args]
    source = (folder / run.example).read_text(errors="replace")
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(folder / run.example), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running
    text = out.decode(errors="replace")
    logs = cwd.parent / "logs"
    logs.mkdir(exist_ok=True)
    number = RUNS.index(run) if run in RUNS else len(RUNS)
    log = logs / f"{number:02d}_{run.example.removesuffix('.py')}.txt"
    log.write_text(f"$ {run.example} {' '.join(args)}\nexit {code}\n{text}")
    verdict, reason = judge(run, source, code, text)
    seconds = time.monotonic() - start
    return Result(run.example, " ".join(run.args), run.daemon, code, verdict, reason, seconds)


def judge(run: Run, source: str, code: int | None, text: str) -> tuple[str, str]:
    """The run's result and the line that says why. A program's PASS lines are those
    its source prints (`print("PASS...")`); passing needs one when it has any."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    while lines and NOISE.match(lines[-1]):  # aiohttp's leak report at exit says nothing
        lines.pop()
    passes = re.findall(r"print\(\s*[\"'](PASS[^\"']*)[\"']", source)
    failure = next((line for line in lines if FAILURE.match(line)), None)
    if passes:  # its own word: exit 0 and its PASS line
        passed = code == 0 and any(line in passes for line in lines)
    else:  # some exit 0 after printing an error: none of those lines
        passed = code == 0 and failure is None
    if code is None:
        verdict, why = "timeout", "killed after the timeout"
    elif passed:
        verdict, why = "pass", ""
    else:
        verdict = "fail"
        why = lines[-1] if lines else f"exit {code}, no output"  # what it said last
        raised = [i for i, line in enumerate(lines) if RAISED.match(line)]
        if raised:  # a traceback: the exception it ends with
            why = lines[raised[-1]]
            rpc = dict(RPC_FIELD.findall("\n".join(lines[raised[-1] :])))
            if "details" in rpc:  # a raw gRPC error, said as tritonclient says one
                why = f"[{rpc.get('status', '?')}] {rpc['details']}"
        stated = [line for line in lines if line.startswith("FAILED")]
        if stated:  # the examples' own word for a failed check comes first
            why = stated[0]
        if code == 0 and passes:
            why = f"exit 0 without its PASS line; last: {why}"
    if run.expect is not None:
        if passed:
            return "xpass", f"passed, though allowed to fail: {run.expect.reason}"
        shown = [line for line in lines if re.search(run.expect.pattern, line)]
        if shown:
            return "xfail", f"{run.expect.reason}: {shown[-1]}"[:300]
    return verdict, why[:300]


# --- the whole run ---------------------------------------------------------------------------


def daemon_health(name: str, process: DaemonProcess) -> list[Result]:
    """A row for a daemon that died during the runs, or logged a traceback (what no
    request may cause): none for a sound one."""
    assert process.proc is not None
    code = process.proc.poll()
    lines = process.log().splitlines()
    raised = [line for line in lines if RAISED.match(line.strip())]
    why = ""
    if code is not None:
        why = f"the daemon exited during the runs (exit {code})"
    elif any(line.startswith("Traceback") for line in lines):
        why = f"the daemon logged a traceback: {raised[-1] if raised else '?'}"
    if not why:
        return []
    return [Result(f"(daemon {name})", "", name, code, "fail", why[:300], 0.0)]


def run_all(
    folder: Path, repo: Path, work: Path, runs: Sequence[Run], timeout: float, progress: bool
) -> list[Result]:
    image = make_image(work / "image.jpg")
    cwd = work / "cwd"
    cwd.mkdir(exist_ok=True)
    fixed = port_free(8000) and port_free(8001)
    main_ports = (8000, 8001) if fixed else (free_port(), free_port())
    results: list[Result] = []

    def each(group: Sequence[Run], addresses: Addresses) -> None:
        for run in group:
            if not (folder / run.example).is_file():
                result = Result(
                    run.example,
                    " ".join(run.args),
                    run.daemon,
                    None,
                    "skip",
                    "no such program",
                    0.0,
                )
            elif run.fixed_ports and not fixed:
                why = "takes no address and localhost:8000/8001 were in use"
                result = Result(run.example, " ".join(run.args), run.daemon, None, "skip", why, 0.0)
            else:
                result = run_one(run, folder, addresses, image, timeout, cwd)
            results.append(result)
            if progress:
                print(f"  {result.result:<7} {run.label}", file=sys.stderr, flush=True)

    with daemon(work, MAIN, repo, [], main_ports) as addresses:
        each([r for r in runs if r.daemon == MAIN], addresses)
        results += daemon_health(MAIN, addresses.process)
    for kind, count in EXPLICIT_COUNTS.items():
        explicit = [r for r in runs if r.daemon == kind]
        if not explicit:
            continue
        models = explicit_repository(repo, work / f"{kind}_repo", count)
        flags = ["--model-control-mode", "explicit"]
        with daemon(work, kind, models, flags, (free_port(), free_port())) as addresses:
            each(explicit, addresses)
            results += daemon_health(kind, addresses.process)
    order = {run.label: i for i, run in enumerate(runs)}
    return sorted(results, key=lambda r: order.get(f"{r.example} {r.args}".strip(), len(order)))


def table(results: Sequence[Result]) -> str:
    rows = [("example", "args", "exit", "result", "reason")]
    for r in results:
        exit_code = "-" if r.exit_code is None else str(r.exit_code)
        rows.append((r.example, r.args, exit_code, r.result, r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    counts: dict[str, int] = {}
    for r in results:
        counts[r.result] = counts.get(r.result, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return "\n".join([*lines, f"{len(results)} runs: {summary}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/triton_examples.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--examples", type=Path, required=True, help="Triton's client examples (above)"
    )
    parser.add_argument("--repo", type=Path, help="the model repository (default: built)")
    parser.add_argument("--neff", action="store_true", help="build the repository with --neff")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run (180)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these programs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (logs, repository)"
    )
    args = parser.parse_args(argv)
    # a TERM ends the runs as an exception does: the program's group killed, daemons stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = args.keep.absolute() if args.keep else Path(tempfile.mkdtemp(prefix="triton-examples-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        folder = examples_folder(args.examples.absolute(), work)
        repo = args.repo.absolute() if args.repo else work / "repo"
        if args.repo is None:
            shutil.rmtree(repo, ignore_errors=True)
            for name, note in triton_models.build(repo, neff=args.neff).items():
                print(f"  model {name}: {note}", file=sys.stderr)
        runs = [
            r
            for r in RUNS
            if not args.only or r.example in args.only or r.example.removesuffix(".py") in args.only
        ]
        known = {r.example for r in RUNS}
        unrun = sorted(p.name for p in folder.glob("*.py") if p.name not in known)
        try:
            results = run_all(folder, repo, work, runs, args.timeout, progress=not args.json)
        except DaemonStartError as exc:
            print(f"triton_examples: a daemon did not start: {exc}", file=sys.stderr)
            return 2
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "not_run": unrun}, indent=1))
    else:
        print(table(results))
        if unrun:
            print(f"programs with no run here: {', '.join(unrun)}")
    return 0 if all(r.result in ("pass", "xfail") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
