"""`neuron-rtd-demo`: the daemon end to end, as a new user would see it.

Starts neuron-rtd on a simulated inf1.6xlarge (a private sim root and socket), shows
`neuron-ls`, writes a ResNet-18-style CNN as ONNX, compiles it with `neuron-cc` (batch
buckets 1..8), loads the NEFF (implicit NCG, streamed in 1 MiB chunks) and runs it on
batches of 1 and 3 images, checked against onnxruntime on the same inputs, validates it
with `neuron-cli validate`, loads it again on an explicit NCG by path, shows what a bad
request gets back, and stops the daemon with SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.command_line import EXIT_FAILED, EXIT_OK, Terminated, add_version, entry
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.proto import pb


def section(title: str) -> None:
    print(f"\n== {title}")


def neuron_ls(sim_root: str, *args: str) -> str:
    env = {**os.environ, "NEURON_SIM_ROOT": sim_root}
    env.pop("NEURON_RTD_ADDRESS", None)
    return tool("neuron_rtd.cli.neuron_ls", *args, env=env)


def tool(*args: str, env: dict[str, str] | None = None) -> str:
    """Run one of our command-line tools as a user would; its output. A tool stopped by
    Ctrl-C or SIGTERM (the terminal signals the demo with it) stops the demo the same way."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env)
    if done.returncode in (130, -signal.SIGINT):
        raise KeyboardInterrupt
    if done.returncode in (143, -signal.SIGTERM):
        raise Terminated
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.rstrip()


def _real_model(client: Client, work: Path, sim_root: str) -> bool:
    import onnx

    from neuron_rtd import onnxrt
    from neuron_rtd.models import count_parameters, random_inputs, resnet

    section("A real model: a ResNet-18-style CNN written as ONNX (224x224, 1000 classes)")
    onnx_path, neff_path = work / "resnet18.onnx", work / "resnet18.neff"
    onnx_model = resnet.build(seed=0)
    onnx.save(onnx_model, str(onnx_path))
    print(
        f"{onnx_path.name}: {len(onnx_model.graph.node)} nodes, "
        f"{count_parameters(onnx_model) / 1e6:.1f} M parameters, batch dimension 'N'"
    )

    section("neuron-cc compile resnet18.onnx -o resnet18.neff --dynamic-batch 1:8")
    t0 = time.perf_counter()
    print(
        tool(
            "neuron_rtd.compiler.cli",
            "compile",
            str(onnx_path),
            "-o",
            str(neff_path),
            "--dynamic-batch",
            "1:8",
        )
    )
    print(f"(compiled in {time.perf_counter() - t0:.1f} s)")

    section("Loading it (no NCG given: the daemon makes one and starts the model)")
    model = client.load(neff_path, ninfer=4, timeout=10)
    print(f"model id {model.id}; NCGs now: {client.list_ncgs()}")

    section("Inference on 1 and on 3 images, checked against onnxruntime")
    # no spinning between calls: its idle threads would take the cores from the daemon
    session = onnxrt.session(onnx_model, spinning=onnxrt.WHILE_BUSY)
    images = random_inputs(onnx_model, seed=1, N=3)["input"]
    want = session.run(["probs"], {"input": images})[0]
    good = True
    for n in (1, 3):
        got = model.infer({"input": images[:n]})["probs"]
        a, b = got.astype(np.float64).ravel(), want[:n].astype(np.float64).ravel()
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        err = float(np.max(np.abs(got - want[:n])))
        top1 = bool((got.argmax(1) == want[:n].argmax(1)).all())
        print(
            f"batch {n}: probs {got.shape}, top-1 class {got.argmax(1).tolist()}, "
            f"cosine {cosine:.6f}, max |daemon - onnxruntime| {err:.1e}, top-1 agrees: {top1}"
        )
        good = good and cosine >= 0.9999 and top1
    one = {"input": images[:1]}
    times, ort_times = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        model.infer(one)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        session.run(["probs"], one)
        ort_times.append(time.perf_counter() - t0)
    print(
        f"batch 1 latency p50: daemon {statistics.median(times) * 1e3:.1f} ms, "
        f"onnxruntime in this process {statistics.median(ort_times) * 1e3:.1f} ms"
    )

    section("12 inferences posted at once (futures; ninfer 4; tensors in shared memory)")
    singles = [{"input": images[i % 3 : i % 3 + 1]} for i in range(12)]
    t0 = time.perf_counter()
    pending = [model.infer_async(x) for x in singles]
    results = [f.result()["probs"] for f in pending]
    elapsed = time.perf_counter() - t0
    same = all(
        np.allclose(r, want[i % 3 : i % 3 + 1], rtol=1e-4, atol=1e-6) for i, r in enumerate(results)
    )
    counters = client.stub.read_inference_counters(pb.empty()).nmgr_counters
    print(
        f"12 results in {elapsed * 1e3:.0f} ms ({12 / elapsed:.1f}/s), all match onnxruntime: "
        f"{same}; the daemon has run {counters.infer_count} inferences, "
        f"{counters.infer_queue_drop_count} refused for a full queue"
    )
    good = good and same

    section("neuron-cli validate resnet18.onnx resnet18.neff")
    print(
        tool(
            "neuron_rtd.cli.neuron_cli",
            "validate",
            str(onnx_path),
            str(neff_path),
            "-a",
            client.address,
            "--input-shape",
            "input=2,3,224,224",
        )
    )

    section("Explicit NCG: the largest run of free NCs, load by path (neff_file), start")
    ncg, count = client.create_ncg(0)  # 0: as many as are free in one run, on any machine
    second = client.load(neff_path, ncg=ncg, by_path=True, timeout=10)
    second.start()
    again = second.infer({"input": images})["probs"]
    print(
        f"NCG {ncg} ({count} NCs): model {second.id} gives the same answer: "
        f"{np.array_equal(again, model.infer({'input': images})['probs'])}"
    )
    print(neuron_ls(sim_root))

    section("A bad request: 9 images, past the largest bucket (8)")
    try:
        model.infer({"input": np.zeros((9, 3, 224, 224), np.float32)})
    except NrtClientError as exc:
        print(f"-> {exc}")

    section("Cleaning up: unload, destroy the NCG")
    second.unload()
    client.destroy_ncg(ncg)
    model.unload()
    print(f"NCGs now: {client.list_ncgs()}")
    return good


def run(work: Path, instance_type: str) -> int:
    sim_root = str(work / "sim")
    config = work / "neuron-rtd.json"
    config.write_text(json.dumps({"sim": {"instance_type": instance_type}}))
    daemon = DaemonProcess(sim_root=sim_root, args=["-c", str(config), "-l", "info"])
    section(f"Starting neuron-rtd on a simulated {instance_type} (sim root {sim_root})")
    try:  # started inside: stopped whatever happens, Ctrl-C while it starts too
        daemon.start()
        print(f"neuron-rtd pid {daemon.pid} is ready on {daemon.address}")
        with Client(daemon.address) as client:
            print(f"runtime version {client.version()}")
            section("neuron-ls")
            print(neuron_ls(sim_root))
            print(neuron_ls(sim_root, "--topology"))

            ok = _real_model(client, work, sim_root)
    finally:
        section("Stopping neuron-rtd with SIGTERM")
        code = daemon.stop()
        print(f"exit code {code}; its log:")
        print("\n".join("  " + line for line in daemon.log().splitlines()[-40:]))
        daemon.close()
    print("\n" + ("DEMO OK" if ok and code == 0 else "DEMO FAILED"))
    return EXIT_OK if ok and code == 0 else EXIT_FAILED


@entry("neuron-rtd-demo")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-rtd-demo",
        description="The daemon end to end on a private simulated machine: a ResNet-18-style "
        "model compiled, loaded, inferred and validated, a bad request, and a clean stop.",
        formatter_class=PlainHelp,
    )
    parser.add_argument(
        "--instance-type",
        default=driver_sim.DEFAULT_INSTANCE_TYPE,
        choices=sorted(driver_sim.PRESETS),
        help="the simulated machine (default %(default)s)",
    )
    add_version(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nrtd-demo-") as work:
        return run(Path(work), args.instance_type)


if __name__ == "__main__":
    sys.exit(main())
