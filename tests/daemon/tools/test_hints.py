"""Hints and small inconsistencies of issue 39, point 8: each error says what to do, each
name and flag is where a user looks for it."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.daemon import main as daemon_main
from neuron_rtd.daemon.config import load_config
from neuron_rtd.models import __main__ as models_main
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.typed_json import ConfigError


def test_an_unknown_model_setting_lists_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = models_main.main(["resnet", "--set", "depth=3", "-o", str(tmp_path / "r.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "r.onnx").exists()
    assert "resnet has no setting 'depth' (did you mean 'depth_blocks'?)" in err, err
    assert "depth_blocks=(2, 2, 2, 2)" in err and "num_classes=1000" in err and "batch=" in err


def daemon_help() -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        daemon_main.parse_args(["--help"])
    return " ".join(printed.getvalue().split())


def test_the_daemons_help_names_neuron_sim_root_and_allow_remote_clients() -> None:
    text = daemon_help()
    assert "NEURON_SIM_ROOT, the folder of the simulated machine it serves" in text
    assert "--allow-remote-clients" in text


def test_allow_remote_clients_is_a_flag_too() -> None:
    remote = ["-a", "0.0.0.0:50051"]
    with pytest.raises(ConfigError, match="--allow-remote-clients"):
        load_config(overrides=vars(daemon_main.parse_args(remote)), environ={})
    args = daemon_main.parse_args([*remote, "--allow-remote-clients"])
    config = load_config(overrides=vars(args), environ={})
    assert config.allow_remote_clients and config.server_address == "0.0.0.0:50051"
    # not given: the config file's value stands (None is no override)
    assert daemon_main.parse_args([]).allow_remote_clients is None


def test_a_stale_neuron_rtd_address_falls_back_to_the_machines_tree(
    machine: driver_sim.Machine, tmp_path: Path
) -> None:
    stale = f"unix:{tmp_path}/gone.sock"
    env = {**os.environ, "NEURON_RTD_ADDRESS": stale, "NEURON_SIM_ROOT": str(machine.root)}
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_ls", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"neuron_device"') == machine.device_count
    assert f"no runtime answers at {stale}" in done.stderr
    assert f"listing the simulated machine's tree at {machine.root} instead" in done.stderr
    # -a names a daemon on purpose: its silence is still an error
    named = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_ls", "-a", stale],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert named.returncode == 1 and "no runtime answers" in named.stderr


@pytest.mark.daemon
def test_a_repository_model_is_listed_under_its_repository_name(work: Path) -> None:
    """Its NEFF's graph is `main_graph` (as torch exports it); neuron-cli list-model shows
    the name it is served under."""
    repository = work / "models"
    (repository / "resnet_small" / "1").mkdir(parents=True)
    neff = build_mlp((8, 4), name="main_graph").neff
    (repository / "resnet_small" / "1" / "model.neff").write_bytes(neff)
    with DaemonProcess(sim_root=work / "sim", args=["--model-repository", str(repository)]) as d:
        done = subprocess.run(
            [sys.executable, "-m", "neuron_rtd.cli.neuron_cli", "list-model", "-a", d.address],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].endswith(" READY 1 resnet_small"), done.stdout


@pytest.fixture(scope="module")
def torch_daemon(module_work: Path) -> Iterator[DaemonProcess]:
    pytest.importorskip("torch")
    with DaemonProcess(sim_root=module_work / "sim") as proc:
        yield proc


@pytest.mark.daemon
def test_a_traced_modules_batch_error_suggests_dynamic_batch_size(
    torch_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import neuron_rtd.torch as neuron

    monkeypatch.setenv("NEURON_RTD_ADDRESS", torch_daemon.address)
    for name in ("NEURONCORE_GROUP_SIZES", "NEURON_RT_VISIBLE_CORES"):
        monkeypatch.delenv(name, raising=False)
    traced = neuron.trace(torch.nn.Linear(6, 3).eval(), torch.randn(2, 6))
    with pytest.raises(neuron.InputMismatch) as refused:
        traced(torch.randn(5, 6))
    message = str(refused.value)
    assert "expected float32 (2, 6), got float32 (5, 6)" in message
    assert "traced for a batch of 2 only" in message
    assert "dynamic_batch_size=True" in message
    with pytest.raises(neuron.InputMismatch) as other:  # not a batch: no batch hint
        traced(torch.randn(2, 7))
    assert "dynamic_batch_size" not in str(other.value)
    del traced
