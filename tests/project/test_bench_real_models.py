"""bench/real_models.py, its quickest run: the smallest model exported from PyTorch,
compiled, and timed on the four sides (onnxruntime, in-process, the daemon, the transport
floor); the daemon's outputs agree with onnxruntime's; twice (`--repeat 2`), beside a busy
loop (`--busy`), with the ratios across the runs. About 25 s."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.daemon

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_quick_run_prints_every_side_and_the_outputs_agree(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    command = [sys.executable, str(BENCH / "real_models.py"), "--quick", "--budget", "0.05"]
    command += ["--cases", "tiny_mlp", "--cache", str(tmp_path / "onnx"), "--json", str(report)]
    command += ["--repeat", "2", "--busy"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "tiny_mlp: Linear 16-16" in out and "ops on the NC" in out
    for side in ("onnxruntime", "in-process", "daemon", "floor"):
        assert re.search(rf"^  {side}\b.*\d+\.\d{{3}} +\d+\.\d{{3}} +\d+$", out, re.M), side
    assert "daemon / (onnxruntime + floor)" in out and "in-process / onnxruntime" in out
    cosine = re.search(r"check vs onnxruntime: daemon cosine ([0-9.]+)", out)
    assert cosine is not None and float(cosine.group(1)) > 0.9999
    assert re.search(r"^idle, every model loaded, .*daemon [0-9.]+% of a core", out, re.M)
    assert re.search(r"^other processes on the machine .*; stolen by the host: \d+%$", out, re.M)
    assert re.search(r"^worst daemon / \(onnxruntime \+ floor\): [0-9.]+x \(tiny_mlp\)", out, re.M)

    figures = json.loads(report.read_text())
    model = figures["models"]["tiny_mlp"]
    assert set(model["sides"]) == {"onnxruntime", "in-process", "daemon", "floor"}
    assert all(side["calls"] >= 1 and side["p50_ms"] > 0 for side in model["sides"].values())
    assert model["check"]["daemon_cosine"] > 0.9999
    assert figures["failed"] == {} and figures["idle"]["daemon_pct"] >= 0
    assert model["stolen_cpu_pct"] >= 0 and figures["stolen_cpu_pct"] >= 0
    assert list(tmp_path.joinpath("onnx").glob("tiny_mlp-opset17-*.onnx"))  # --cache kept it

    assert out.count("=== run ") == 2 and re.search(r"^--busy: a busy loop \(pid \d+\)", out, re.M)
    assert figures["busy"] and figures["repeat"] == 2 and len(figures["runs"]) == 2
    ratios = [run["models"]["tiny_mlp"]["daemon_over_ort_plus_floor"] for run in figures["runs"]]
    across = figures["across_runs"]["tiny_mlp"]
    assert across["daemon_ratios"] == ratios and across["worst"] == max(ratios)
    assert across["best"] == min(ratios) and min(ratios) <= across["median"] <= max(ratios)
    row = rf"^tiny_mlp +[0-9.]+ +[0-9.]+ +{max(ratios):.2f}x +[0-9.]+x +{min(ratios):.2f}x "
    assert re.search(row, out, re.M), out
    # the busy loop ran beside the comparison: the other processes took about a core
    assert all(run["other_processes_cpu_pct"] > 50 for run in figures["runs"])


def test_every_case_of_the_bench_is_a_net_it_can_export(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import real_models
    import torch_nets

    assert list(real_models.CASES) == list(torch_nets.NETS)
