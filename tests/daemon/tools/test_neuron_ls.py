"""neuron-ls with and without a daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess


def run_neuron_ls(
    *args: str, sim_root: Path | str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "NEURON_SIM_ROOT": str(sim_root), **(env or {})}
    if not env or "NEURON_RTD_ADDRESS" not in env:
        full.pop("NEURON_RTD_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_ls", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def neuron_ls(*args: str, sim_root: Path, env: dict[str, str] | None = None) -> str:
    done = run_neuron_ls(*args, sim_root=sim_root, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_table_without_daemon(work: Path) -> None:
    driver_sim.Machine.open(work / "sim")  # made by a daemon earlier (it is never neuron-ls)
    out = neuron_ls(sim_root=work / "sim")
    lines = out.splitlines()
    for column in (
        "NEURON",
        "DEVICE",
        "CORES",
        "MEMORY",
        "CONNECTED",
        "PCI",
        "BDF",
        "RUNTIME",
        "ADDRESS",
        "PID",
        "VERSION",
    ):
        assert column in out
    rows = [line for line in lines if line.startswith("| ") and ":00:" in line]
    assert len(rows) == 4  # default machine: inf1.6xlarge
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["0", "1", "2", "3"]
    assert [c[3] for c in cells] == ["1", "0, 2", "1, 3", "2"]
    assert [c[4] for c in cells] == ["0000:00:1c.0", "0000:00:1d.0", "0000:00:1e.0", "0000:00:1f.0"]
    assert all(c[1] == "4" and c[2] == "8 GB" and c[5:] == ["NA", "NA", "NA"] for c in cells)


def test_json_and_topology_with_a_daemon(work: Path) -> None:
    sim = work / "sim"
    with DaemonProcess(sim_root=sim, args=["-t", "0000:00:1d.0"]) as proc:
        doc = json.loads(neuron_ls("--json-output", sim_root=sim))
        assert [d["bdf"] for d in doc][1] == "0000:00:1d.0"
        assert doc[1]["runtime"] == {
            "address": proc.address,
            "pid": proc.pid,
            "version": doc[1]["runtime"]["version"],
        }
        assert doc[0]["runtime"] is None and doc[1]["nc_count"] == 4
        assert doc[1]["memory_size"] == 8 * 2**30
        table = neuron_ls(sim_root=sim)
        rows = {
            cells[4]: cells[5:]
            for cells in (
                [c.strip() for c in line.strip("|").split("|")]
                for line in table.splitlines()
                if line.startswith("| ") and ":00:" in line
            )
        }
        assert rows["0000:00:1d.0"] == [proc.address, str(proc.pid), doc[1]["runtime"]["version"]]
        assert rows["0000:00:1c.0"] == ["NA", "NA", "NA"]
        topo = neuron_ls("--topology", sim_root=sim)
        assert "[0] 0000:00:1c.0" in topo and "[3] 0000:00:1f.0" in topo
        assert topo.count("|") == 3 and f"runtime pid {proc.pid}" in topo
        # -a asks the daemon which devices it serves, even with another sim root in the env
        only = neuron_ls("-a", proc.address, "--json-output", sim_root=work / "elsewhere")
        assert [d["bdf"] for d in json.loads(only)] == ["0000:00:1d.0"]
        via_env = neuron_ls(
            "--json-output", sim_root=work / "elsewhere", env={"NEURON_RTD_ADDRESS": proc.address}
        )
        assert json.loads(via_env) == json.loads(only)


def test_presets(work: Path) -> None:
    driver_sim.Machine.open(work / "big", instance_type="inf1.24xlarge")
    out = neuron_ls("--instance-type", "inf1.24xlarge", "--json-output", sim_root=work / "big")
    doc = json.loads(out)
    assert len(doc) == 16 and doc[15]["connected_to"] == [14]

    wrong = run_neuron_ls("--instance-type", "inf1.xlarge", sim_root=work / "big")
    assert wrong.returncode == 1 and "is an inf1.24xlarge, not the inf1.xlarge" in wrong.stderr


def test_a_root_that_is_no_machine_is_refused_and_never_made(work: Path) -> None:
    typo = work / "no" / "such" / "dir"
    done = run_neuron_ls(sim_root=typo)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"neuron-ls: no simulated machine at {typo} (from NEURON_SIM_ROOT): start neuron-rtd, "
        "which makes the machine, or set NEURON_SIM_ROOT to the root it serves\n"
    )
    assert not (work / "no").exists()
    a_file = work / "file"
    a_file.write_text("x")
    done = run_neuron_ls(sim_root=a_file)
    assert done.returncode == 1
    assert done.stderr == (
        f"neuron-ls: the simulated machine's root {a_file} is not a directory (from "
        "NEURON_SIM_ROOT)\n"
    )
    done = run_neuron_ls(sim_root="")
    assert done.returncode == 1 and "NEURON_SIM_ROOT is set but empty" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_daemon_at_the_address_is_said_as_every_tool_says_it(work: Path) -> None:
    nobody = f"unix:{work}/nobody.sock"
    done = run_neuron_ls("-a", nobody, sim_root=work / "sim")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"neuron-ls: no runtime answers at {nobody}: no socket ")
    assert "start one (systemctl start neuron-rtd" in done.stderr
