"""Console commands import only what they use (issue 39, point 4): `neuron-cli list-model`
and `neuron-ls` do not import the compiler, the quantizer, validate, onnx, onnxruntime or
torch (nor numpy, for list-model); neuron-monitor's first report comes at once, and a
reader that goes away ends it then, not a period later. No timing is asserted here: the
figures are bench/cli_startup.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp

# what no listing needs: the compiler and its quantizer, validate, the ONNX stack, torch
HEAVY = (
    "neuron_rtd.compiler",
    "neuron_rtd.tools.validate",
    "onnx",
    "onnxruntime",
    "torch",
    "scipy",
)


def imported(*argv: str, env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules `python -X importtime ARGV` imported, and what it printed on stdout."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return names, done.stdout


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


@pytest.fixture(scope="module")
def loaded(daemon: DaemonProcess) -> DaemonProcess:
    with Client(daemon.address, session=False) as client:
        client.load(build_mlp((8, 4), name="startup").neff)
    return daemon


def test_list_model_imports_neither_the_compiler_nor_numpy(loaded: DaemonProcess) -> None:
    modules, out = imported("-m", "neuron_rtd.cli.neuron_cli", "list-model", "-a", loaded.address)
    assert "Found 1 model" in out and " startup" in out
    assert heavy(modules) == []
    assert "numpy" not in modules  # nor the client's numpy: a listing reads the wire only
    assert "neuron_rtd.tools.control.infer" not in modules


def test_list_ncg_and_help_import_no_subcommand_they_do_not_run(loaded: DaemonProcess) -> None:
    modules, out = imported("-m", "neuron_rtd.cli.neuron_cli", "list-ncg", "-a", loaded.address)
    assert out.startswith("Device ")
    assert heavy(modules) == [] and "numpy" not in modules
    modules, out = imported("-m", "neuron_rtd.cli.neuron_cli", "--help")
    assert "list-model" in out and "validate" in out
    assert heavy(modules) == []
    assert not {m for m in modules if m.startswith("neuron_rtd.tools.")} - {"neuron_rtd.tools"}


def test_a_subcommands_help_still_says_its_options(loaded: DaemonProcess) -> None:
    modules, out = imported("-m", "neuron_rtd.cli.neuron_cli", "validate", "--help")
    assert "--input-shape" in out  # its module imported, as it is the one asked for
    assert "neuron_rtd.tools.validate.command" in modules


def test_neuron_ls_imports_no_kernel_compiler_or_onnx(loaded: DaemonProcess) -> None:
    by_tree = {"NEURON_SIM_ROOT": loaded.sim_root, "NEURON_RTD_ADDRESS": ""}
    for env in ({"NEURON_RTD_ADDRESS": loaded.address}, by_tree):
        modules, out = imported("-m", "neuron_rtd.cli.neuron_ls", env=env)
        assert "NEURON" in out
        assert heavy(modules) == [], env
        assert not {"driver_sim.ops", "driver_sim.core", "driver_sim.fast"} & modules, env
        if env is by_tree:  # no daemon asked: neither gRPC nor the wire, nor numpy
            assert "grpc" not in modules and "neuron_rtd.proto" not in modules
            assert "numpy" not in modules  # the stats files read as plain arrays


MONITOR_CONFIG = (
    '{"period": "1h", "neuron_runtimes": [{"address": "%s", '
    '"metrics": [{"type": "neuroncore_counters"}]}]}'
)


def test_neuron_monitor_reports_at_once_and_ends_when_its_reader_goes(
    loaded: DaemonProcess, tmp_path: Path
) -> None:
    """With a period of an hour, the first report comes while the monitor runs (it is not
    waiting out a period first), and closing the pipe ends the monitor (exit 0) while
    that hour has hardly begun: it does not wait for its next write to find out."""
    config = tmp_path / "monitor.json"
    config.write_text(MONITOR_CONFIG % loaded.address)
    with subprocess.Popen(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_monitor", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        try:
            first = proc.stdout.readline()
            assert proc.poll() is None  # still running: this was not a report at its end
            assert '"neuron_runtime_data"' in first and loaded.address in first
            proc.stdout.close()  # as `| head -n 1` does once it has its line
            assert proc.wait(timeout=60) == 0  # well within the hour's period
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr is not None and proc.stderr.read() == ""
