"""The conventions every console command keeps (docs/cli.md), checked on the installed
commands as a user runs them: `--version`; `-j/--json-output` (and `--json`) wherever
JSON comes out; `-a/--address` wherever a daemon is named; no short flag with two
meanings; exit code 2 for usage errors and bad input; no traceback and 130 on Ctrl-C (in
a terminal), 143 on SIGTERM, 141 and silence when stdout's reader is gone. Then the
messages of issue 25's wording list that need no daemon."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import io
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
import tomllib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

import driver_sim
from neuron_rtd import __version__
from neuron_rtd.cli import neuron_cli
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.models import resnet
from neuron_rtd.neff.samples import build_mlp

ROOT = Path(__file__).parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# What outputs JSON (neuron-cc: its `compile`, shown in its help) and what names a daemon
JSON_OUTPUT = {"neuron-ls", "neuron-cc", "neuron-batch"}
ADDRESS = {"neuron-rtd", "neuron-ls", "neuron-cli", "neuron-monitor", "neuron-top", "neuron-batch"}
# The one short flag with two meanings, both the originals' (docs/cli.md): the daemon's
# device (`-t BDF`) and neuron-ls's `-t/--topology`
INHERITED = {"-t": {"neuron-rtd": "BDF", "neuron-ls": "--topology"}}
# the daemon's short flags have no long form: what each means, as the others' long ones say
DAEMON_MEANINGS = {"CONFIG": "--config-file"}
NOBODY = 65534
NO_DAEMON = "unix:/nonexistent/neuron.sock"


def command(prog: str) -> list[str]:
    """The installed console script, or its entry point run as the script runs it."""
    script = Path(sys.executable).parent / prog
    if script.exists():
        return [str(script)]
    module, function = SCRIPTS[prog].split(":")
    code = (
        f"import sys; sys.argv[0] = {prog!r}; from {module} import {function}; "
        f"sys.exit({function}())"
    )
    return [sys.executable, "-c", code]


def run(prog: str, *args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(prog), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


@functools.cache
def help_of(prog: str) -> str:
    done = run(prog, "--help")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def neuron_cli_helps() -> dict[str, str]:
    """`neuron-cli COMMAND --help` of every command (in process: the same parser)."""
    texts = {}
    for name, _, _ in neuron_cli.COMMANDS:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
            neuron_cli.parser().parse_args([name, "--help"])
        texts[f"neuron-cli {name}"] = printed.getvalue()
    return texts


def short_flags(help_text: str) -> dict[str, str]:
    """Each short flag of a --help text and what it means: its long form, else its
    metavar (`-t BDF`), else the flag itself."""
    found = {}
    for line in help_text.splitlines():
        match = re.match(r"^  (-\w.*?)(?:\s{2,}|$)", line)
        if not match:
            continue
        forms = [form.split(" ", 1) for form in match.group(1).split(", ")]
        longs = [form[0] for form in forms if form[0].startswith("--")]
        for form in forms:
            if re.fullmatch(r"-\w", form[0]):
                metavar = form[1] if len(form) > 1 else form[0]
                found[form[0]] = longs[0] if longs else DAEMON_MEANINGS.get(metavar, metavar)
    return found


# --- the flags ----------------------------------------------------------------------------


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_version_names_the_program_and_the_package_version(prog: str) -> None:
    done = run(prog, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{prog} {__version__}\n", "")
    assert "--version" in help_of(prog)


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_json_output_and_address_are_spelled_one_way(prog: str) -> None:
    text = help_of(prog)
    assert ("-j, --json-output, --json" in text) == (prog in JSON_OUTPUT), text
    assert ("-a ADDRESS, --address ADDRESS" in text) == (prog in ADDRESS), text


def test_every_neuron_cli_command_takes_the_json_flag_and_the_address() -> None:
    for name, text in neuron_cli_helps().items():
        assert "-j, --json-output, --json" in text, name
        assert "-a ADDRESS, --address ADDRESS" in text, name


def test_the_daemon_keeps_its_original_flags() -> None:
    text = " ".join(help_of("neuron-rtd").split())
    for flag in ("-t BDF", "-g ADDRESS, -a ADDRESS, --address ADDRESS", "-c CONFIG", "-x"):
        assert flag in text, flag
    assert "-i INSTANCE" in text and "-v, --version" in text


def test_no_short_flag_means_two_things() -> None:
    meanings: dict[str, dict[str, str]] = defaultdict(dict)
    helps = {prog: help_of(prog) for prog in SCRIPTS} | neuron_cli_helps()
    for prog, text in helps.items():
        for flag, meaning in short_flags(text).items():
            meanings[flag][prog.split()[0]] = meaning
    assert meanings["-a"]["neuron-rtd"] == "--address"  # its -g too
    assert meanings["-i"] == {"neuron-rtd": "INSTANCE"}  # neuron-top's interval: --interval
    clashes = {
        flag: by_prog
        for flag, by_prog in meanings.items()
        if len(set(by_prog.values())) > 1 and by_prog != INHERITED.get(flag)
    }
    assert clashes == {}
    assert {flag: meanings[flag] for flag in INHERITED} == INHERITED


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_a_usage_error_exits_2_with_the_usage(prog: str) -> None:
    done = run(prog, "--no-such-option")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith(f"usage: {prog}") and "Traceback" not in done.stderr


# --- signals and pipes --------------------------------------------------------------------


def closed_stdout(prog: str, *args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is gone (as `| head -c 10` leaves it)."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [*command(prog), *map(str, args)],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        os.close(writer)


def test_a_closed_pipe_ends_a_command_quietly_with_141(tmp_path: Path) -> None:
    driver_sim.Machine.open(tmp_path / "sim")  # what neuron-ls reads
    env = {**os.environ, "NEURON_SIM_ROOT": str(tmp_path / "sim")}
    env.pop("NEURON_RTD_ADDRESS", None)
    for args in (["--json-output"], ["-t"], []):
        done = closed_stdout("neuron-ls", *args, env=env)
        assert (done.returncode, done.stderr) == (141, ""), args
    onnx.save(relu_model(), str(tmp_path / "m.onnx"))
    out = tmp_path / "m.neff"
    done = closed_stdout("neuron-cc", "compile", tmp_path / "m.onnx", "-o", out, "-j", env=env)
    assert (done.returncode, done.stderr) == (141, "") and out.exists()


class Terminal:
    """A command on a pseudo-terminal of its own, as run from a shell: Ctrl-C there
    signals it (and its children, its process group) as a keyboard does."""

    def __init__(self, argv: Sequence[str | Path]) -> None:
        self.master, slave = os.openpty()

        def controlling_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # a test run in the background
            # ignores it, and its children would too

        self.proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.screen = b""

    def read_until(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text.encode() not in self.screen:
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.text()}"
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.text()}"
            self._read(0.2)

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def wait(self, timeout_s: float = 120) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"still running:\n{self.text()}"
            self._read(0.2)
        while self._read(0.1):
            pass
        os.close(self.master)
        return self.proc.returncode

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the terminal's other side closed
            return False
        self.screen += data
        return bool(data)

    def text(self) -> str:
        return self.screen.decode(errors="replace")


@pytest.fixture(scope="module")
def big_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model neuron-cc takes seconds over (ResNet-18, 4 batch buckets)."""
    path = tmp_path_factory.mktemp("big") / "resnet18.onnx"
    onnx.save(resnet.build(seed=0), str(path))
    return path


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_neuron_cc_stopped_mid_compile_says_so_and_writes_nothing(
    big_onnx: Path, tmp_path: Path, stop: str
) -> None:
    out = tmp_path / "r.neff"
    terminal = Terminal(
        [*command("neuron-cc"), "compile", big_onnx, "-o", out, "--dynamic-batch", "1:8"]
    )
    terminal.read_until("compiling bucket", timeout_s=120)  # its progress, on the terminal
    if stop == "ctrl-c":
        terminal.ctrl_c()
    else:
        terminal.proc.send_signal(signal.SIGTERM)
    code = terminal.wait()
    screen = terminal.text()
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen
    if stop == "ctrl-c":
        assert code == 130 and "neuron-cc: interrupted" in screen, screen
    else:
        assert code == 143 and "neuron-cc: terminated (SIGTERM)" in screen, screen
    assert not out.exists()


def test_ctrl_c_stops_the_demo_and_its_daemon_cleanly() -> None:
    terminal = Terminal(command("neuron-rtd-demo"))
    terminal.read_until("== neuron-ls", timeout_s=120)  # the daemon is up
    terminal.ctrl_c()
    code = terminal.wait()
    screen = terminal.text()
    assert code == 130 and "Traceback" not in screen, screen
    assert "neuron-rtd-demo: interrupted" in screen
    assert "exit code 0" in screen  # its daemon drained and stopped
    (sim_root,) = re.findall(r"\(sim root (\S+)\)", screen)
    assert not Path(sim_root).exists()  # its private folder removed


# --- the wording list (issue 25), where no daemon is needed -----------------------------


def relu_model(batch: str | int = 1) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what the installed onnxruntime reads
    return model


def neuron_cli_alone(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """neuron-cli pointed at no daemon: what it says before it would connect."""
    return run("neuron-cli", "-a", NO_DAEMON, *args, **kwargs)


def test_load_says_what_a_path_is_when_it_is_not_a_neff_file(tmp_path: Path) -> None:
    for path, why in (
        ("/tmp", "a directory, not a NEFF file"),
        ("/dev/zero", "a character device, not a NEFF file"),
        (tmp_path / "none.neff", "no such NEFF file"),
    ):
        done = neuron_cli_alone("load", path)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == f"neuron-cli: {path}: {why}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run neuron-cli as uid 65534")
def test_load_of_a_file_the_user_may_not_read_names_the_file_and_why(work: Path) -> None:
    work.chmod(0o755)  # nobody may look in it (not in pytest's tmp_path: 0700 above it)
    secret = work / "secret.neff"
    secret.write_bytes(build_mlp((4, 4), batch=1).neff)
    secret.chmod(0o600)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    load = ["load", str(secret), "--enable-direct-file-load"]
    done = subprocess.run(
        [*as_nobody, *command("neuron-cli"), "-a", NO_DAEMON, *load],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Errno" not in done.stderr, done.stderr
    assert done.stderr.startswith(
        f"neuron-cli: {secret}: permission denied: nobody (uid {NOBODY}) may not read it "
        "(neuron-cli reads the NEFF too"
    )


def test_a_bad_npz_is_bad_input_for_infer_and_validate_alike(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    infer = neuron_cli_alone("infer", "10001", "--inputs", bad)
    assert infer.returncode == 2 and infer.stderr == f"neuron-cli: {bad}: not an npz file " + (
        "(numpy.savez writes one)\n"
    )
    onnx.save(relu_model("N"), str(tmp_path / "m.onnx"))
    neff = compile_model(relu_model("N"), dynamic_batch=bucket_ranges(1, 4)).neff
    (tmp_path / "m.neff").write_bytes(neff)
    validate = neuron_cli_alone(
        "validate", tmp_path / "m.onnx", tmp_path / "m.neff", "--inputs", bad
    )
    assert validate.returncode == 2 and "not an npz archive" in validate.stderr


def test_neuron_batch_usage_shows_the_feature_to_input_form() -> None:
    usage = " ".join(help_of("neuron-batch").split("\n\n")[0].split())
    assert "--feature NAME[=INPUT]:DTYPE:D0,D1,...[:raw|list|image]" in usage


def test_neuron_cc_help_and_manual_list_the_compile_options() -> None:
    text = help_of("neuron-cc")
    for option in ("--dynamic-batch", "--input-shape", "--auto-cast", "--num-neuroncores"):
        assert option in text, option
    spec = importlib.util.spec_from_file_location("build_deb", ROOT / "packaging/build_deb.py")
    assert spec and spec.loader
    build_deb: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_deb)
    page = build_deb.man_page(Path(sys.executable), "neuron-cc", SCRIPTS["neuron-cc"], "9")
    assert "--dynamic-batch" in page and "--auto-cast-type" in page


def test_neuron_batch_refuses_a_used_output_folder_without_resume(tmp_path: Path) -> None:
    """A folder a run used (its checkpoint there) is not started over silently."""
    neff = tmp_path / "m.neff"
    neff.write_bytes(build_mlp((16, 8), batch=4, seed=1).neff)
    (tmp_path / "in.tfrecord").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    (out / ".checkpoint.json").write_text('{"done": ["e000-aa-part-00"], "weights": {}}')
    (out / "e000-aa-part-00.tfrecord").write_bytes(b"")
    args: list[str | Path] = [
        "--neff",
        neff,
        "--feature",
        "x:float32:16",
        "--input",
        tmp_path / "in.tfrecord",
    ]
    done = run("neuron-batch", *args, "--output", out, "-a", NO_DAEMON)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"neuron-batch: error: --output {out}: a run used it already (its checkpoint "
        f"{out}/.checkpoint.json: 1 shard(s) done): give --resume to go on with that run, "
        "--overwrite to start over in it, or another folder\n"
    )
    assert sorted(p.name for p in out.iterdir()) == [".checkpoint.json", "e000-aa-part-00.tfrecord"]
    both = run("neuron-batch", *args, "--output", out, "--resume", "--overwrite")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
