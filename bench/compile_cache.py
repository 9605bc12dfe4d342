"""What the compile cache saves on a restart: a Triton repository of ONNX models, served
by a daemon that compiles them on load, then by the same daemon started again on the
same cache, side by side in one run.

    python bench/compile_cache.py [--small] [--starts 2]

The repository holds the project's ResNet (`python -m neuron_rtd.models resnet`),
as Triton's users ship it: `model.onnx`, `platform: "onnxruntime_onnx"`, `max_batch_size`
8 with `dynamic_batching`, so its NEFF has batch buckets to compile. Each start is timed
from the process's spawn to the model answering `ModelReady` over gRPC; the first on an
empty cache folder, the others on the folder the first filled. The daemon's log says
which it did ("compiled before: its NEFF found in the compile cache").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tritonclient.grpc as grpcclient


def repository(root: Path, small: bool) -> Path:
    """`root/repo/m/{config.pbtxt,1/model.onnx}`."""
    folder = root / "repo" / "m"
    (folder / "1").mkdir(parents=True)
    onnx_file = str(folder / "1/model.onnx")
    build = [sys.executable, "-m", "neuron_rtd.models", "resnet", "-o", onnx_file]
    subprocess.run([*build, *(["--small"] if small else [])], check=True)
    (folder / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    )
    return root / "repo"


def start(root: Path, repo: Path, cache: Path, n: int) -> tuple[float, str]:
    """Seconds from spawn to the model ready, and what the log says of the cache."""
    sock = root / f"s{n}.sock"
    log = root / f"daemon{n}.log"
    env = {**os.environ, "NEURON_SIM_ROOT": str(root / "sim")}
    args = ["-g", f"unix:{sock}", "--model-repository", str(repo), "--compile-cache", str(cache)]
    began = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_rtd.daemon.main", *args],
            stderr=out,
            stdout=out,
            env=env,
        )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
            if sock.exists():
                try:
                    client = grpcclient.InferenceServerClient(f"unix:{sock}")
                    if client.is_model_ready("m"):
                        break
                    index = client.get_model_repository_index().models
                except Exception:  # not listening yet
                    index = []
                refused = [m.reason for m in index if m.state == "UNAVAILABLE"]
                if refused:
                    raise SystemExit(f"the model is not served: {refused[0]}")
            time.sleep(0.05)
        took = time.perf_counter() - began
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    said = "found in the compile cache" if "found in the compile cache" in text else "compiled"
    return took, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the family's small variant")
    parser.add_argument("--starts", type=int, default=2, help="starts on the same cache")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nrt-cache-bench-") as work:
        root = Path(work)
        repo = repository(root, options.small)
        cache = root / "cache"
        size = (repo / "m/1/model.onnx").stat().st_size
        print(f"resnet{' (small)' if options.small else ''}: model.onnx {size >> 10} KiB")
        first = None
        for n in range(options.starts):
            took, said = start(root, repo, cache, n)
            first = first or took
            ratio = f"  ({took / first:.2f}x the first)" if n else ""
            print(f"  start {n + 1}: ready in {took:6.2f} s, {said}{ratio}")
        entries = sorted(cache.glob("*.neff"))
        total = sum(e.stat().st_size for e in entries)
        print(f"  cache: {len(entries)} entry, {total >> 20} MiB")


if __name__ == "__main__":
    main()
