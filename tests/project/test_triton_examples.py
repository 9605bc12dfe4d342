"""scripts/triton_examples.py, the harness running Triton's example programs: how it
judges a run (exit code, the program's own PASS line, lines of failure, the failures the
acceptance allows), and a real run of two programs of our own in the examples' places
against the daemon it starts (its table in JSON). About 15 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import triton_examples as te  # noqa: E402

PASSING = 'print("PASS: infer")\n'


def test_a_program_with_a_pass_line_passes_only_when_it_prints_it_and_exits_0() -> None:
    run = te.Run("simple_grpc_infer_client.py")
    assert te.judge(run, PASSING, 0, "0 + 1 = 1\nPASS: infer\n") == ("pass", "")
    verdict, why = te.judge(run, PASSING, 0, "0 + 1 = 1\n15 - 1 = 14\n")
    assert verdict == "fail" and why == "exit 0 without its PASS line; last: 15 - 1 = 14"
    verdict, why = te.judge(run, PASSING, 1, "PASS: infer\nboom\n")
    assert (verdict, why) == ("fail", "boom")


def test_a_program_without_one_fails_on_a_line_of_failure_even_at_exit_0() -> None:
    run = te.Run("simple_http_async_infer_client.py")
    assert te.judge(run, "", 0, "0 + 1 = 1\n")[0] == "pass"
    said = "context creation failed: no such host\n"
    assert te.judge(run, "", 0, said) == ("fail", "context creation failed: no such host")


def test_a_traceback_is_said_by_its_exception_and_a_grpc_error_by_its_details() -> None:
    run = te.Run("grpc_client.py")
    text = (
        "Traceback (most recent call last):\n  File 'x', line 1\n"
        "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n"
        "\tstatus = StatusCode.NOT_FOUND\n\tdetails = \"no model named 'x'\"\n"
        '\tdebug_error_string = "..."\n>\n'
        "Unclosed connector\nconnector: <aiohttp.connector.TCPConnector object>\n"
    )
    assert te.judge(run, "", 1, text) == ("fail", "[StatusCode.NOT_FOUND] no model named 'x'")
    # simple_grpc_health_metadata.py exits through a NameError (it never imports sys)
    sys_missing = "FAILED : is_model_ready\nTraceback (most recent call last):\n"
    sys_missing += "NameError: name 'sys' is not defined\n"
    assert te.judge(run, "", 1, sys_missing) == ("fail", "FAILED : is_model_ready")


def test_an_allowed_failure_is_xfail_only_when_it_fails_the_way_allowed() -> None:
    run = te.Run("simple_http_health_metadata.py", expect=te.NAME)
    verdict, why = te.judge(run, "", 1, "FAILED : get_server_metadata\n")
    assert verdict == "xfail" and why.endswith(": FAILED : get_server_metadata")
    assert te.judge(run, "", 1, "FAILED : is_server_live\n")[0] == "fail"
    assert te.judge(run, "", 0, "fine\n")[0] == "xpass"
    assert te.judge(run, "", None, "")[0] == "timeout"


@pytest.mark.daemon
def test_the_harness_runs_programs_against_its_daemon_and_tells_pass_from_fail(
    tmp_path: Path,
) -> None:
    """Stand-ins in two examples' places: one infers `simple` over gRPC at the address
    it is given and prints its PASS line; one does over HTTP but never prints it; a
    third hangs past the timeout and is killed."""
    examples = tmp_path / "examples"
    examples.mkdir()
    infer = (
        "import argparse, numpy as np, tritonclient.{kind} as c\n"
        "p = argparse.ArgumentParser(); p.add_argument('-u'); a = p.parse_args()\n"
        "x = c.InferInput('INPUT0', [1, 16], 'INT32')\n"
        "x.set_data_from_numpy(np.arange(16, dtype=np.int32)[None])\n"
        "y = c.InferInput('INPUT1', [1, 16], 'INT32')\n"
        "y.set_data_from_numpy(np.ones((1, 16), np.int32))\n"
        "r = c.InferenceServerClient(a.u).infer('simple', [x, y])\n"
        "assert r.as_numpy('OUTPUT0').tolist() == [list(range(1, 17))]\n"
    )
    grpc_program = infer.format(kind="grpc") + 'if 1:\n    print("PASS: infer")\n'
    (examples / "simple_grpc_infer_client.py").write_text(grpc_program)
    http_program = infer.format(kind="http") + 'if 0:\n    print("PASS: infer")\n'
    (examples / "simple_http_infer_client.py").write_text(http_program)
    (examples / "simple_grpc_keepalive_client.py").write_text("import time\ntime.sleep(600)\n")
    command = [sys.executable, str(SCRIPTS / "triton_examples.py"), "--examples", str(examples)]
    command += ["--neff", "--json", "--timeout", "20", "--keep", str(tmp_path / "work")]
    command += ["--only", "simple_grpc_infer_client", "simple_http_infer_client"]
    command += ["simple_grpc_keepalive_client"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    results = {r["example"]: r for r in json.loads(done.stdout)["results"]}
    assert results["simple_grpc_infer_client.py"]["result"] == "pass"
    http = results["simple_http_infer_client.py"]
    assert (http["result"], http["exit_code"]) == ("fail", 0)
    assert http["reason"].startswith("exit 0 without its PASS line")
    assert results["simple_grpc_keepalive_client.py"]["result"] == "timeout"
    (log,) = (tmp_path / "work" / "logs").glob("*_simple_grpc_infer_client.txt")
    assert "simple_grpc_infer_client.py -u 127.0.0.1:" in log.read_text()


class _Proc:
    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class _Daemon:
    """What daemon_health reads of a DaemonProcess: its process and its log."""

    def __init__(self, code: int | None, log: str) -> None:
        self.proc, self.text = _Proc(code), log

    def log(self) -> str:
        return self.text


def test_a_daemon_that_died_or_logged_a_traceback_is_a_failed_row() -> None:
    def health(code: int | None, log: str) -> list[te.Result]:
        return te.daemon_health("main", _Daemon(code, log))  # type: ignore[arg-type]

    assert health(None, "nrtd[1]: [KSERVE:load] Model 'x' not served: why\n") == []
    (died,) = health(-11, "")
    assert (died.result, died.exit_code) == (
        "fail",
        -11,
    ) and "exited during the runs" in died.reason
    (raised,) = health(None, "Traceback (most recent call last):\nKeyError: 'INPUT0'\n")
    assert raised.reason == "the daemon logged a traceback: KeyError: 'INPUT0'"
