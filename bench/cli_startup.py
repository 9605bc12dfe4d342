"""How long the console commands take to answer, warm, against a real daemon (issue 39,
point 4), side by side with the floors no command can go under: a bare `python -c pass`
and `python -c 'import grpc'`.

    python bench/cli_startup.py [--runs 15]

Starts a daemon on a simulated machine of its own (one model loaded, so `list-model` has
a line to print), then runs each command `--runs` times, interleaved (run 1 of each, then
run 2 of each, ...) so machine noise hits them alike, after one warm-up round. Prints
per command the minimum, the median and the maximum wall time of the whole process, and
`neuron-monitor`'s time to its first line (its period set to 60 s: the first report is
due at once, not after a period).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr!r}")
    return took


def first_line_after(command: list[str], env: dict[str, str]) -> float:
    """Seconds from the start of `command` to its first line on stdout."""
    start = time.perf_counter()
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()
        took = time.perf_counter() - start
        proc.terminate()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp, DaemonProcess(sim_root=Path(tmp) / "sim") as d:
        with Client(d.address, session=False) as client:
            client.load(build_mlp((8, 4), name="bench").neff)
        env = {**os.environ, "NEURON_RTD_ADDRESS": d.address, "NEURON_SIM_ROOT": d.sim_root}
        commands = {
            "python -c pass": [python, "-c", "pass"],
            "python -c 'import grpc'": [python, "-c", "import grpc"],
            "neuron-cli list-model": [python, "-m", "neuron_rtd.cli.neuron_cli", "list-model"],
            "neuron-cli list-ncg": [python, "-m", "neuron_rtd.cli.neuron_cli", "list-ncg"],
            "neuron-cli --help": [python, "-m", "neuron_rtd.cli.neuron_cli", "--help"],
            "neuron-ls": [python, "-m", "neuron_rtd.cli.neuron_ls"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for command in commands.values():  # warm-up: the page cache, .pyc files
            timed(command, env)
        for _ in range(args.runs):
            for name, command in commands.items():
                times[name].append(timed(command, env))
        config = Path(tmp) / "monitor.json"
        runtime = {"address": d.address, "metrics": [{"type": "neuroncore_counters"}]}
        config.write_text(json.dumps({"period": "60s", "neuron_runtimes": [runtime]}))
        monitor = [python, "-m", "neuron_rtd.cli.neuron_monitor", "-c", str(config)]
        first = [first_line_after(monitor, env) for _ in range(min(args.runs, 5))]
    print(f"{'command':<28}{'min':>8}{'median':>8}{'max':>8}  (seconds, {args.runs} runs)")
    for name, took in times.items():
        print(f"{name:<28}{min(took):8.3f}{statistics.median(took):8.3f}{max(took):8.3f}")
    print(
        f"{'neuron-monitor, 1st line':<28}{min(first):8.3f}{statistics.median(first):8.3f}"
        f"{max(first):8.3f}  (period 60 s)"
    )


if __name__ == "__main__":
    main()
