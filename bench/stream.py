"""Streaming batch inference against its two ceilings, side by side in one run.

    python bench/stream.py [--quick] [--only CASE] [--repeat N] [--ncgs M] [--channels N]
                           [--pin]

For four models, a compute-bound one (ResNet-18 over 224x224 PNG images), a small ResNet
over 64x64 PNG images (whose decoding costs a quarter of its compute), and a small MLP over
64 KiB records batched by 8 (whose rate is the daemon's inferences a second) and by 64 (an
I/O-bound one: on s3 the storage is its lower ceiling by far), and two stores (local files,
and s3 through a local moto server when moto is installed), it measures records/s of:
- the storage ceiling: every shard read and CRC-checked, nothing decoded, as many shards
  at once as the pipeline's channels;
- the model ceiling: the same model on the same M NCGs, with every batch already decoded
  in memory, `ninfer` in flight per NCG (the pipeline's own sending);
- the pipeline: `neuron-batch`'s run (read, decode, batch, infer, write), as a user runs it
  (Pipeline in process, the daemon a separate process), timed from its first record (the
  models' load apart, as the model ceiling's is);
and prints the pipeline's share of the lower ceiling (the goal: >= 90%): the median over
the runs of each pipeline run's against the ceilings measured just before it, so that the
host's drift from run to run cancels, with their range; and the pipeline's own work per
record (reading, decoding, writing) timed on one thread.

Here the NCs are simulated on the host's CPUs, which the storage (page cache, or the moto
server) and the pipeline's decoding share. So it also measures the busy CPU seconds per
record (every process) of each ceiling, and prints a third bound: the records/s the
CPUs could give if they did nothing but the storage's work, the model's (without its
client's copy of each batch into shared memory: the pipeline decodes into it) and the
pipeline's own decoding and writing (`cpus / (storage CPU + model CPU - copy + decode and
write CPU, per record)`, the last two timed on one thread); no pipeline on this host can
pass it, whatever it overlaps. The last column says whether the goal was met, missed, or
is beyond this host (that bound under 90% of the lower ceiling).

With `--pin`, the daemon (the simulated NCs) runs on the first CPU alone, and this process
(the storage's reads, the pipeline, the model ceiling's client) and the s3 server on the
others: as on the real machine, where the NCs' work takes none of the host's cores. Both
ceilings and the pipeline are measured so, and the CPU bound is the pipeline's CPUs' own:
their busy seconds per record in the storage ceiling and the model ceiling's client,
and the pipeline's decoding and writing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import fsspec
import numpy as np
import psutil

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client
from neuron_rtd.compiler import compile_model
from neuron_rtd.models import resnet
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.records.features import (
    FeatureSpec,
    decode_batch,
    output_examples,
    parse_feature,
)
from neuron_rtd.records.tfrecord import Writer
from neuron_rtd.tools.stream.figures import DaemonBusy
from neuron_rtd.tools.stream.pipeline import Options, Pipeline
from neuron_rtd.tools.stream.sample import image_shards, local_s3, vector_shards
from neuron_rtd.tools.stream.sources import Shard, expand, shard_records

Run = tuple[int, float, float]  # records, seconds, host CPU seconds busy
GOAL = 0.9  # the pipeline's share of the lower ceiling the issue asks for


@dataclass(frozen=True)
class Machine:
    """What the daemon did in a run: how busy it kept the run's NCs (0..1), and its CPU
    seconds."""

    nc_busy: float
    daemon_cpu_s: float

    def per_record(self, run: Run) -> tuple[float, float]:
        """NC busy seconds (of each NC) and daemon CPU seconds, per record."""
        records, seconds, _ = run
        return self.nc_busy * seconds / records, self.daemon_cpu_s / records


OWN = ("read", "decode", "write")
T = TypeVar("T")


def busy_cpu_s() -> np.ndarray:
    """CPU seconds each CPU of the host spent busy (every process) since boot."""
    return np.array(
        [sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in psutil.cpu_times(percpu=True)]
    )


def storage_ceiling(
    shards: list[Shard], channels: int, cpus: list[int], at_least_s: float = 1.0
) -> tuple[Run, float]:
    """Every record read and CRC-checked, `channels` shards at once (as the pipeline reads),
    and the busy seconds of the CPUs `cpus` in it; the shards read again until
    `at_least_s` have passed, so that the CPU time (counted in 10 ms ticks) is measured on
    enough of it."""
    began, cpu = time.perf_counter(), busy_cpu_s()
    count = 0
    with ThreadPoolExecutor(channels) as pool:
        while count == 0 or time.perf_counter() - began < at_least_s:
            count += sum(pool.map(lambda shard: sum(1 for _ in shard_records(shard)), shards))
    busy = busy_cpu_s() - cpu
    return (count, time.perf_counter() - began, float(busy.sum())), float(busy[cpus].sum())


def own_work(shards: list[Shard], specs: list[FeatureSpec], neff: Path, out: Path) -> list[float]:
    """The pipeline's own work per record, on one thread (this process's CPU, in us):
    reading and CRC-checking, decoding into batches, writing the outputs' Examples."""
    signature = read_neff(neff.read_bytes())
    batch = int(signature.inputs[0].shape[0])
    outputs = {t.name: np.zeros(t.shape, t.dtype) for t in signature.outputs}
    spent = [0.0, 0.0, 0.0]  # reading, decoding, writing: as the pipeline does, a batch at a time
    count = 0
    with Writer(out) as writer:
        for shard in shards:
            records = shard_records(shard)
            while True:
                began = time.process_time()
                part = [(r.data, r.key) for r in itertools.islice(records, batch)]
                read = time.process_time()
                if not part:
                    break
                decode_batch(part, specs, batch)
                decoded = time.process_time()
                answers = {name: array[: len(part)] for name, array in outputs.items()}
                for record in output_examples([key for _, key in part], answers):
                    writer.write(record)
                marks = (began, read, decoded, time.process_time())
                for i, (a, b) in enumerate(itertools.pairwise(marks)):
                    spent[i] += b - a
                count += len(part)
    out.unlink()
    return [seconds / count * 1e6 for seconds in spent]


def model_ceiling(
    address: str,
    neff: Path,
    shards: list[Shard],
    specs: list[FeatureSpec],
    batch: int,
    ncgs: int,
    ninfer: int,
    cpus: list[int],
) -> tuple[Run, float, float, Machine]:
    """The model's run over decoded batches; the busy seconds of the CPUs `cpus` in it;
    the CPU seconds this thread spent copying the batches into the models' shared memory
    (which the pipeline does not: it decodes into it); what the simulated machine did."""
    rows = [(r.data, r.key) for s in shards for r in shard_records(s)]
    batches = [decode_batch(rows[i : i + batch], specs, batch) for i in range(0, len(rows), batch)]
    with Client(address, async_workers=ncgs * ninfer) as client:
        models = [client.load(neff, ninfer=ninfer, timeout_s=60) for _ in range(ncgs)]
        for model in models:  # warm: the first run of a program builds its session
            model.infer(batches[0])
        window: deque[Future[dict[str, np.ndarray]]] = deque()
        watch = DaemonBusy(client, [model.id for model in models])
        copy_s = 0.0
        began, cpu = time.perf_counter(), busy_cpu_s()
        for i, inputs in enumerate(batches):
            model = models[i % ncgs]
            staged = model.stage()
            copying = time.thread_time()
            if staged is not None:
                for name, array in staged.inputs.items():
                    np.copyto(array, inputs[name])
            copy_s += time.thread_time() - copying
            window.append(model.infer_async(staged or inputs, posted=False))
            while len(window) >= ncgs * ninfer:
                window.popleft().result()
        while window:
            window.popleft().result()
        seconds, busy = time.perf_counter() - began, busy_cpu_s() - cpu
        nc_busy, daemon_cpu_s = watch.since_start()
        for model in models:
            model.unload()
    run = (len(rows), seconds, float(busy.sum()))
    return run, float(busy[cpus].sum()), copy_s, Machine(nc_busy or 0.0, daemon_cpu_s or 0.0)


def pipeline(
    address: str,
    neff: Path,
    shards: list[Shard],
    specs: list[FeatureSpec],
    out: Path,
    ncgs: int,
    channels: int,
    ninfer: int,
) -> tuple[Run, dict[str, float]]:
    options = Options(
        neff=str(neff), shards=shards, features=specs, output=out, address=address,
        ncgs=ncgs, channels=channels, ninfer=ninfer,
    )  # fmt: skip
    totals = Pipeline(options, lambda figures: None).run()
    figures = totals.snapshot()  # from the first record to the last: load and unload apart
    shutil.rmtree(out)
    return (totals.records, figures["seconds"], figures["host_cpu_s"]), figures


# The MLP over 64 KiB records, batched by 8 (its rate is the daemon's inferences a second
# times 8) and by 64 (its rate is the storage's on s3: I/O-bound).
MLPS = {8: "mlp b8, 64 KiB records", 64: "mlp b64, 64 KiB records (I/O-bound)"}


def cases(
    work: Path, quick: bool, only: str
) -> Iterator[tuple[str, Path, list[Path], list[FeatureSpec]]]:
    for name, size, images, built in (
        ("resnet-18 224 (compute-bound)", 224, 16 if quick else 256, resnet.build),
        ("small resnet 64", 64, 64 if quick else 1024, lambda: resnet.build(**resnet.SMALL)),
    ):
        if only not in name:
            continue
        neff = work / f"resnet{size}.neff"
        shape = [4, 3, size, size]
        neff.write_bytes(compile_model(built(), input_shapes={"input": shape}).neff)
        folder = work / f"images{size}"
        paths = image_shards(folder, shards=4, per_shard=images // 4, size=size)
        spec = parse_feature(f"image=input:float32:3,{size},{size}:image")
        yield name, neff, paths, [spec]
    mlps = {batch: name for batch, name in MLPS.items() if only in name}
    if not mlps:
        return
    vectors = 256 if quick else 4096
    paths = vector_shards(work / "vectors", shards=4, per_shard=vectors // 4, width=16384)
    for batch, name in mlps.items():
        neff = work / f"mlp{batch}.neff"
        neff.write_bytes(build_mlp((16384, 32, 8), batch=batch, seed=1).neff)
        yield name, neff, paths, [parse_feature("x:float32:16384")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ncgs", type=int, default=2)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--ninfer", type=int, default=4)
    parser.add_argument("--only", default="", help="the cases whose name holds this text")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, medians shown")
    parser.add_argument(
        "--pin", action="store_true", help="the daemon on the first CPU, the rest on the others"
    )
    args = parser.parse_args()
    usable = sorted(os.sched_getaffinity(0))
    if args.pin and len(usable) < 2:
        parser.error(f"--pin needs 2 CPUs or more; this process may use {len(usable)}")
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_stream_")))
        if args.pin:  # the daemon, started now, keeps the first CPU; the rest go elsewhere
            os.sched_setaffinity(0, usable[:1])
        daemon = stack.enter_context(DaemonProcess(sim_root=work / "sim"))
        if args.pin:
            os.sched_setaffinity(0, usable[1:])
        stores: dict[str, dict[str, str] | None] = {"local": None}
        try:
            stores["s3 (moto)"] = stack.enter_context(local_s3(work))
        except (FileNotFoundError, RuntimeError) as exc:
            print(f"(no s3: {exc})")
        cpus = psutil.cpu_count() or 1
        # the CPUs the pipeline's side runs on: all, or all but the daemon's
        bound_cpus = usable[1:] if args.pin else usable
        head = f"{'case':36} {'store':9} {'storage/s':>9} {'model/s':>8} {'pipeline/s':>10}"
        print(
            f"{head} {'share':>5} {'(range)':11} {'CPU bound/s':>11} {'share':>5}  host cores busy"
            "  waits  NCs"
            "   x NC/daemon  goal"
        )
        for name, neff, paths, specs in cases(work, args.quick, args.only):
            sources = {store: _shards(name, paths, env) for store, env in stores.items()}
            runs: dict[str, list[Run]] = {}
            # per run of a ceiling: busy CPU seconds of bound_cpus (and the model's copy's)
            bound_cpu_s: dict[str, list[float]] = {}
            waits: dict[str, list[tuple[float, float, float]]] = {}
            machines: dict[str, list[Machine]] = {}  # per run of the model and the pipelines
            for _ in range(args.repeat):  # interleaved, so that the host's drift hits all alike
                ceiling, on_bound, copy_s, machine = model_ceiling(
                    daemon.address,
                    neff,
                    sources["local"],
                    specs,
                    _batch(neff),
                    args.ncgs,
                    args.ninfer,
                    bound_cpus,
                )
                runs.setdefault("model", []).append(ceiling)
                bound_cpu_s.setdefault("model", []).append(on_bound - copy_s)
                bound_cpu_s.setdefault("copy", []).append(copy_s)
                machines.setdefault("model", []).append(machine)
                for store, shards in sources.items():
                    read, on_bound = storage_ceiling(shards, args.channels, bound_cpus)
                    runs.setdefault(f"storage {store}", []).append(read)
                    bound_cpu_s.setdefault(f"storage {store}", []).append(on_bound)
                    streamed, figures = pipeline(
                        daemon.address,
                        neff,
                        shards,
                        specs,
                        work / "out",
                        args.ncgs,
                        args.channels,
                        args.ninfer,
                    )
                    runs.setdefault(f"pipeline {store}", []).append(streamed)
                    machines.setdefault(f"pipeline {store}", []).append(
                        Machine(figures["nc_busy_share"], figures["daemon_cpu_s"])
                    )
                    waits.setdefault(store, []).append(
                        (
                            figures["storage_wait_share"],
                            figures["nc_wait_share"],
                            figures["nc_busy_share"],
                        )
                    )
            model = _median(runs["model"])
            work_us = own_work(sources["local"], specs, neff, work / "own.tfrecord")
            for store in sources:
                storage = _median(runs[f"storage {store}"])
                streamed = _median(runs[f"pipeline {store}"])
                rates = [n / seconds for n, seconds, _ in (storage, model, streamed)]
                lower = min(rates[0], rates[1])
                shares = sorted(  # each repeat's pipeline against the ceilings measured beside it
                    _rate(p) / min(_rate(r), _rate(m))
                    for p, r, m in zip(
                        runs[f"pipeline {store}"],
                        runs[f"storage {store}"],
                        runs["model"],
                        strict=True,
                    )
                )
                share = shares[len(shares) // 2]
                spread = f"({shares[0]:.0%}-{shares[-1]:.0%})" if len(shares) > 1 else ""
                own_s = (work_us[1] + work_us[2]) / 1e6  # decoding and writing (reading: storage's)
                per_record = [
                    _at_median(runs[key], bound_cpu_s[key]) / _median(runs[key])[0]
                    for key in (f"storage {store}", "model")
                ]
                cpu_bound = len(bound_cpus) / (sum(per_record) + own_s)
                row = f"{name:36} {store:9} {rates[0]:9.0f} {rates[1]:8.0f} {rates[2]:10.0f}"
                row += f" {share:5.0%} {spread:11} {cpu_bound:11.0f} {rates[2] / cpu_bound:5.0%} "
                if share >= GOAL:
                    goal = "met"
                elif cpu_bound < GOAL * lower:
                    goal = "beyond this host"
                else:
                    goal = "missed"
                cores = " ".join(
                    f"{cpu / seconds:.2f}" for _, seconds, cpu in (storage, model, streamed)
                )
                wait = waits[store][runs[f"pipeline {store}"].index(streamed)]
                slower = [  # the simulated machine's work per record, against the ceiling's
                    p / c if c else float("nan")
                    for p, c in zip(
                        _at_median(
                            runs[f"pipeline {store}"], machines[f"pipeline {store}"]
                        ).per_record(streamed),
                        _at_median(runs["model"], machines["model"]).per_record(model),
                        strict=True,
                    )
                ]
                print(
                    f"{row} {cores}  {wait[0]:.0%}/{wait[1]:.0%}  {wait[2]:.0%}  "
                    f"{slower[0]:.2f}/{slower[1]:.2f}  {goal}",
                    flush=True,
                )
            parts = " + ".join(f"{what} {us:.0f}" for what, us in zip(OWN, work_us, strict=True))
            copy_us = _at_median(runs["model"], bound_cpu_s["copy"]) / model[0] * 1e6
            print(
                f"  the pipeline's own work on one thread: {parts} = {sum(work_us):.0f} us per "
                f"record; the model ceiling's: {model[2] / model[0] * 1e6:.0f} us of host CPU "
                f"(its client's copy in: {copy_us:.0f} us), "
                f"NCs {_at_median(runs['model'], machines['model']).nc_busy:.0%} busy"
            )
        where = f"The CPU bound is of CPUs {bound_cpus}" + (
            f"; the daemon on CPU {usable[0]} alone, the rest on them."
            if args.pin
            else ", shared by all."
        )
        legend = (
            f"Medians of {args.repeat} run(s); share: the median of each run's pipeline against "
            "the lower of the ceilings measured beside it (the host's drift between runs "
            "cancels), and their range. host cores busy: in the storage, model and "
            f"pipeline runs, of {cpus}; waits: the pipeline's channels' time waiting on the "
            "storage / on the NCs; NCs: how busy the pipeline kept its NCs; x NC/daemon: the "
            "NCs' busy time and the daemon's CPU time per record in the pipeline, against the "
            "model ceiling's (above 1: the simulated machine slowed by what shares its CPUs); "
            f"goal: the pipeline at >= {GOAL:.0%} of the lower ceiling; beyond this host: its "
            f"CPU bound is under that. {where}"
        )
        print(textwrap.fill(legend, 88))
    return 0


def _shards(name: str, paths: list[Path], env: dict[str, str] | None) -> list[Shard]:
    """The case's shards: local (env None), or put in a bucket of the s3 server at env."""
    if env is None:
        return expand([str(p) for p in paths])
    os.environ.update(env)  # credentials; the endpoint through fsspec's config
    fsspec.config.conf["s3"] = {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]}
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    bucket = f"bench{abs(hash(name)) % 10**6}"
    fs.mkdir(bucket)
    for p in paths:
        fs.put(str(p), f"{bucket}/{p.name}")
    return expand([f"s3://{bucket}/*.tfrecord"])


def _rate(run: Run) -> float:
    return run[0] / run[1]


def _median(runs: list[Run]) -> Run:
    """The run of the median rate."""
    return sorted(runs, key=lambda run: run[0] / run[1])[len(runs) // 2]


def _at_median(runs: list[Run], figures: list[T]) -> T:
    """The figure of the run of the median rate."""
    return figures[runs.index(_median(runs))]


def _batch(neff: Path) -> int:
    return int(read_neff(neff.read_bytes()).inputs[0].shape[0])


if __name__ == "__main__":
    sys.exit(main())
