"""`neuron-rtd-demo`: the daemon end to end, as a new user would see it.

Starts neuron-rtd on a simulated inf1.6xlarge (a private sim root and socket), shows
`neuron-ls`, builds an MLP NEFF, loads it (implicit NCG, streamed in 1 MiB chunks) and
runs inferences checked against numpy, loads it again on an explicit NCG by path, shows
what a bad request gets back, and stops the daemon with SIGTERM.
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

import numpy as np

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.neff import read_neff, write_neff
from neuron_rtd.neff.samples import build_mlp


def section(title: str) -> None:
    print(f"\n== {title}")


def neuron_ls(sim_root: str, *args: str) -> str:
    env = {**os.environ, "NEURON_SIM_ROOT": sim_root}
    env.pop("NEURON_RTD_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_ls", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.rstrip()


def run(work: Path, instance_type: str) -> int:
    sim_root = str(work / "sim")
    config = work / "neuron-rtd.json"
    config.write_text(json.dumps({"sim": {"instance_type": instance_type}}))
    daemon = DaemonProcess(sim_root=sim_root, args=["-c", str(config), "-l", "info"])
    section(f"Starting neuron-rtd on a simulated {instance_type} (sim root {sim_root})")
    daemon.start()
    print(f"neuron-rtd pid {daemon.pid} is ready on {daemon.address}")
    try:
        with Client(daemon.address) as client:
            print(f"runtime version {client.version()}")
            section("neuron-ls")
            print(neuron_ls(sim_root))
            print(neuron_ls(sim_root, "--topology"))

            section("Building an MLP NEFF: 784-512-256-10, two Neuron nodes, softmax on the CPU")
            sample = build_mlp(
                (784, 512, 256, 10), batch=8, neuron_nodes=2, cpu_softmax=True, seed=7
            )
            neff = read_neff(sample.neff)
            for node in neff.nodes:
                ops = [i.op for s in node.stages for i in s.instructions]
                print(f"  node {node.name:<8} {node.kind:<6} NCs {node.nc_count}  ops {ops}")
            print(
                f"  {len(sample.neff)} bytes, {neff.weight_bytes} of weights, "
                f"needs {neff.nc_count} NCs"
            )

            section("Loading it (no NCG given: the daemon makes one and starts the model)")
            model = client.load(sample.neff)
            print(f"model id {model.id}; NCGs now: {client.list_ncgs()}")

            section("Inference, checked against numpy")
            inputs = sample.random_inputs(seed=1)
            outputs = model.infer(inputs)
            expected = sample.reference(inputs)
            err = float(np.max(np.abs(outputs["probs"] - expected["probs"])))
            same = bool((outputs["probs"].argmax(1) == expected["probs"].argmax(1)).all())
            print(f"probs[0] = {np.round(outputs['probs'][0], 4)}")
            print(f"max |daemon - numpy| = {err:.2e}; argmax agrees on all 8 rows: {same}")
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                model.infer(inputs)
                times.append(time.perf_counter() - t0)
            print(f"200 round trips: p50 {statistics.median(times) * 1e3:.2f} ms")

            section("Explicit NCG: create one of 4 NCs, load by path (neff_file), start")
            path = work / "mlp.neff"
            write_neff(path, sample.neff)
            ncg, count = client.create_ncg(4)
            second = client.load(path, ncg=ncg, by_path=True)
            second.start()
            again = second.infer(inputs)
            print(
                f"NCG {ncg} ({count} NCs): model {second.id} gives the same answer: "
                f"{np.array_equal(again['probs'], outputs['probs'])}"
            )
            print(neuron_ls(sim_root))

            section("A bad request: an input of the wrong size")
            try:
                model.infer({"x": np.zeros((8, 783), np.float32)})
            except NrtClientError as exc:
                print(f"-> {exc}")

            section("Cleaning up: unload, destroy the NCG")
            second.unload()
            client.destroy_ncg(ncg)
            model.unload()
            print(f"NCGs now: {client.list_ncgs()}")
            ok = err < 1e-5 and same
    finally:
        section("Stopping neuron-rtd with SIGTERM")
        code = daemon.stop()
        print(f"exit code {code}; its log:")
        print("\n".join("  " + line for line in daemon.log().splitlines()[-40:]))
        daemon.close()
    print("\n" + ("DEMO OK" if ok and code == 0 else "DEMO FAILED"))
    return 0 if ok and code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-rtd-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--instance-type", default="inf1.6xlarge")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nrtd-demo-") as work:
        return run(Path(work), args.instance_type)


if __name__ == "__main__":
    sys.exit(main())
