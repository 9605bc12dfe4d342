"""Streaming batch inference against its two ceilings, side by side in one run.

    python bench/stream.py [--quick] [--ncgs M] [--channels N]

For two models, a compute-bound one (a small ResNet over 64x64 PNG images) and an
I/O-bound one (a small MLP over 64 KiB records), and two stores (local files, and s3
through a local moto server when moto is installed), it measures records/s of:
- the storage ceiling: every shard read and CRC-checked, nothing decoded, as many shards
  at once as the pipeline's channels;
- the model ceiling: the same model on the same M NCGs, with every batch already decoded
  in memory, `ninfer` in flight per NCG (the pipeline's own sending);
- the pipeline: `neuron-batch`'s run (read, decode, batch, infer, write), as a user runs it
  (Pipeline in process, the daemon a separate process), timed from its first record (the
  models' load apart, as the model ceiling's is);
and prints the pipeline's share of the lower ceiling (the goal: >= 90%).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import fsspec
import numpy as np

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import compile_model
from neuron_rtd.models import resnet
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.tools.stream.features import FeatureSpec, decode_record, parse_feature
from neuron_rtd.tools.stream.pipeline import Options, Pipeline, stack_batch
from neuron_rtd.tools.stream.sample import image_shards, local_s3, vector_shards
from neuron_rtd.tools.stream.sources import Shard, expand, shard_records


def storage_ceiling(shards: list[Shard], channels: int) -> tuple[int, float]:
    """Every record read and CRC-checked, `channels` shards at once (as the pipeline reads)."""
    began = time.perf_counter()
    with ThreadPoolExecutor(channels) as pool:
        count = sum(pool.map(lambda shard: sum(1 for _ in shard_records(shard)), shards))
    return count, time.perf_counter() - began


def model_ceiling(
    address: str,
    neff: Path,
    shards: list[Shard],
    specs: list[FeatureSpec],
    batch: int,
    ncgs: int,
    ninfer: int,
) -> tuple[int, float]:
    rows = [decode_record(r.data, r.key, specs) for s in shards for r in shard_records(s)]
    batches = [stack_batch(rows[i : i + batch], specs, batch) for i in range(0, len(rows), batch)]
    with Client(address, async_workers=ncgs * ninfer) as client:
        models = [client.load(neff, ninfer=ninfer, timeout_s=60) for _ in range(ncgs)]
        for model in models:  # warm: the first run of a program builds its session
            model.infer(batches[0])
        window: deque[Future[dict[str, np.ndarray]]] = deque()
        began = time.perf_counter()
        for i, inputs in enumerate(batches):
            window.append(models[i % ncgs].infer_async(inputs, posted=False))
            while len(window) >= ncgs * ninfer:
                window.popleft().result()
        while window:
            window.popleft().result()
        seconds = time.perf_counter() - began
        for model in models:
            model.unload()
    return len(rows), seconds


def pipeline(
    address: str,
    neff: Path,
    shards: list[Shard],
    specs: list[FeatureSpec],
    out: Path,
    ncgs: int,
    channels: int,
    ninfer: int,
) -> tuple[int, float, dict[str, float]]:
    options = Options(
        neff=str(neff), shards=shards, features=specs, output=out, address=address,
        ncgs=ncgs, channels=channels, ninfer=ninfer,
    )  # fmt: skip
    totals = Pipeline(options, lambda figures: None).run()
    figures = totals.snapshot()  # from the first record on: the models' load apart
    shutil.rmtree(out)
    return totals.records, figures["seconds"], figures


def cases(work: Path, quick: bool) -> Iterator[tuple[str, Path, list[Path], list[FeatureSpec]]]:
    images = 64 if quick else 1024
    model = resnet.build(**resnet.SMALL)
    neff = work / "resnet.neff"
    neff.write_bytes(compile_model(model, input_shapes={"input": [4, 3, 64, 64]}).neff)
    paths = image_shards(work / "images", shards=4, per_shard=images // 4, size=64)
    yield (
        "resnet (compute-bound)",
        neff,
        paths,
        [parse_feature("image=input:float32:3,64,64:image")],
    )
    vectors = 256 if quick else 4096
    mlp = build_mlp((16384, 32, 8), batch=8, seed=1)
    (work / "mlp.neff").write_bytes(mlp.neff)
    paths = vector_shards(work / "vectors", shards=4, per_shard=vectors // 4, width=16384)
    yield (
        "mlp, 64 KiB records (I/O-bound)",
        work / "mlp.neff",
        paths,
        [parse_feature("x:float32:16384")],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ncgs", type=int, default=2)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--ninfer", type=int, default=4)
    args = parser.parse_args()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_stream_")))
        daemon = stack.enter_context(DaemonProcess(sim_root=work / "sim"))
        stores: dict[str, dict[str, str] | None] = {"local": None}
        try:
            stores["s3 (moto)"] = stack.enter_context(local_s3(work))
        except (FileNotFoundError, RuntimeError) as exc:
            print(f"(no s3: {exc})")
        head = f"{'case':34} {'store':10} {'storage/s':>10} {'model/s':>9} {'pipeline/s':>11}"
        print(f"{head} {'share':>6}  waits (storage/NC)")
        for name, neff, paths, specs in cases(work, args.quick):
            model_n, model_s = model_ceiling(
                daemon.address,
                neff,
                expand([str(p) for p in paths]),
                specs,
                _batch(neff),
                args.ncgs,
                args.ninfer,
            )
            for store, env in stores.items():
                if env is None:
                    shards = expand([str(p) for p in paths])
                else:
                    os.environ.update(env)  # credentials; the endpoint through fsspec's config
                    fsspec.config.conf["s3"] = {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]}
                    fs = fsspec.filesystem("s3", skip_instance_cache=True)
                    bucket = f"bench{abs(hash(name)) % 10**6}"
                    fs.mkdir(bucket)
                    for p in paths:
                        fs.put(str(p), f"{bucket}/{p.name}")
                    shards = expand([f"s3://{bucket}/*.tfrecord"])
                storage_n, storage_s = storage_ceiling(shards, args.channels)
                n, seconds, figures = pipeline(
                    daemon.address,
                    neff,
                    shards,
                    specs,
                    work / "out",
                    args.ncgs,
                    args.channels,
                    args.ninfer,
                )
                rates = (storage_n / storage_s, model_n / model_s, n / seconds)
                share = rates[2] / min(rates[0], rates[1])
                row = f"{name:34} {store:10} {rates[0]:10.0f} {rates[1]:9.0f} {rates[2]:11.0f}"
                waits = f"{figures['storage_wait_share']:.0%}/{figures['nc_wait_share']:.0%}"
                print(f"{row} {share:6.0%}  {waits}")
    return 0


def _batch(neff: Path) -> int:
    from neuron_rtd.neff import read_neff

    return int(read_neff(neff.read_bytes()).inputs[0].shape[0])


if __name__ == "__main__":
    sys.exit(main())
