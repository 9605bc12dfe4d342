"""Streaming batch inference: shards in, one model on M NCGs, outputs out, in order.

The work is cut into units, one per shard and epoch. `channels` threads each take a unit,
read its records (the storage), and decode them by the feature specs, a batch at a time,
straight into the shared memory of the least busy of the M copies of the model (data
parallel, `ninfer` in flight on each), which it is sent from with no copy. The unit's
outputs are written in the order of its records, to a file named after the unit, under a
temporary name renamed into place when the unit is whole (`output_folder`: a folder of the
run's own, temporaries no planted link can redirect). Then the unit is recorded
done in the checkpoint (`.checkpoint.json`, replaced atomically): a run started again with
`resume` skips the units done whose output is there and whole (one missing or cut short is
done again), so that no output is missing and none is written twice, whatever point the
run was killed at.

Time is accounted as the channels see it: waiting on the storage (reading records) or on
the NCs (waiting for a batch's answer); `Totals` reports it with records/s, MB/s, and how
busy the host's CPUs were (all processes: where the NCs, the storage and the pipeline share
a machine, a host near all its cores busy is what bounds the run).

Its parts: the units of work (`units`), the checkpoint (`checkpoint`), a unit's outputs
written in order (`outputs`), the M copies of the model batches are sent to (`copies`),
where a batch is decoded (`decoding`) and the run's figures (`figures`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neuron_rtd.client import Client
from neuron_rtd.neff import Neff, read_neff
from neuron_rtd.records.features import FeatureSpec, check_specs, decode_batch
from neuron_rtd.records.tfrecord import MAX_RECORD_BYTES, OnCorrupt, ReadStats, Record
from neuron_rtd.tools.stream.checkpoint import Checkpoint
from neuron_rtd.tools.stream.copies import _Copies, _Stopped
from neuron_rtd.tools.stream.decoding import Fill, _copier, _decoder, _decodes_in_place
from neuron_rtd.tools.stream.figures import DaemonBusy, Totals
from neuron_rtd.tools.stream.output_folder import prepare, remove_leftovers
from neuron_rtd.tools.stream.outputs import _is_written, _Outputs
from neuron_rtd.tools.stream.sources import (
    Interleave,
    ManifestWeights,
    Shard,
    epoch_order,
    read_manifest,
    shard_records,
)
from neuron_rtd.tools.stream.units import OutputFormat, WorkUnit

log = logging.getLogger("neuron_rtd.stream")


@dataclass
class Options:
    neff: str | Neff  # a path, or the NEFF read already (as neuron-batch has, to check it)
    shards: Sequence[Shard]
    features: Sequence[FeatureSpec]
    output: Path
    address: str | None = None
    format: OutputFormat = "tfrecord"
    ncgs: int = 1
    channels: int = 2
    ninfer: int = 4
    batch: int | None = None  # default: the model's batch (its inputs' first axis)
    on_corrupt: OnCorrupt = "fail"
    shuffle: int | None = None
    epochs: int = 1
    resume: bool = False
    timeout_s: float = 60.0  # one batch's inference (the daemon's default is 2 s)
    manifest: Path | None = None  # classes of shards with weights, instead of `shards`
    # processes decoding batches (0: the reading threads decode). Each costs a second or
    # two to start and a pickle of every batch: on 2 cores, a third slower for PNG images.
    decode_workers: int = 0
    chunk_records: int = 256  # records a unit of a manifest's interleave
    max_record_bytes: int = MAX_RECORD_BYTES  # a longer record is refused unread


class Pipeline:
    def __init__(self, options: Options, report: Callable[[dict[str, float]], None]) -> None:
        self.options = options
        self.report = report
        self.totals = Totals()
        self._failed: BaseException | None = None
        self._failing = threading.Lock()
        self._stop = threading.Event()
        self._decoders: ProcessPoolExecutor | None = None
        self._busy: DaemonBusy | None = None
        self._decoders_count = options.decode_workers

    def units(self) -> list[WorkUnit]:
        o = self.options
        return [
            WorkUnit(epoch, shard)
            for epoch in range(o.epochs)
            for shard in epoch_order(o.shards, o.shuffle, epoch)
        ]

    def run(self) -> Totals:
        """Run to the end; the first failure (a corrupt record under `fail`, the daemon)
        stops every channel and is raised, its unit left undone."""
        o = self.options
        neff = o.neff if isinstance(o.neff, Neff) else read_neff(Path(o.neff).read_bytes())
        batch = check_specs(o.features, neff.inputs, o.batch)  # before the daemon is asked
        prepare(o.output)
        remove_leftovers(o.output)
        checkpoint = Checkpoint(o.output, resume=o.resume)
        with contextlib.ExitStack() as stack:
            if o.decode_workers > 0:  # spawned: forking a process with gRPC threads is unsafe
                context = multiprocessing.get_context("spawn")
                self._decoders = stack.enter_context(
                    ProcessPoolExecutor(o.decode_workers, mp_context=context)
                )
            client = stack.enter_context(Client(o.address, async_workers=max(1, o.ncgs * o.ninfer)))
            models = [
                client.load(neff, ninfer=o.ninfer, timeout_s=o.timeout_s) for _ in range(o.ncgs)
            ]
            self.totals.restart()  # rates count the streaming, not the models' load
            self._busy = DaemonBusy(client, [model.id for model in models])
            copies = _Copies(
                models,
                o.ninfer,
                self._fail,
                stage=_decodes_in_place(o.features, neff, batch),
                cast=any(spec.cast for spec in o.features),
            )
            ticker = threading.Thread(target=self._tick, daemon=True)
            ticker.start()
            try:
                if o.manifest is not None:
                    self._run_manifest(o.manifest, checkpoint, copies, batch)
                else:
                    self._run_units(checkpoint, copies, batch)
            except _Stopped:  # by the failure kept in _failed, raised below
                pass
            finally:
                self._stop.set()
                ticker.join()
                self._read_busy()
                self.totals.end()
        self.report(self.totals.snapshot())
        if self._failed is not None:
            raise self._failed
        return self.totals

    def _run_units(self, checkpoint: Checkpoint, copies: _Copies, batch: int) -> None:
        """Units of shard and epoch, taken by the channels; a failure is kept in
        `_failed` and stops them all."""
        o = self.options
        units = self.units()
        todo = [u for u in units if not self._done_before(u, checkpoint)]
        self.totals.units_skipped = len(units) - len(todo)
        pending: deque[WorkUnit] = deque(todo)
        lock = threading.Lock()

        def channel() -> None:
            while not self._stop.is_set():
                with lock:
                    if not pending:
                        return
                    unit = pending.popleft()
                try:
                    self._unit(unit, None, copies, batch, checkpoint)
                except BaseException as exc:
                    self._fail(exc)
                    return

        channels = ThreadPoolExecutor(o.channels, thread_name_prefix="channel")
        running: list[Future[None]] = []
        try:
            running = [channels.submit(channel) for _ in range(o.channels)]
            wait(running)
        except BaseException:  # KeyboardInterrupt: each channel leaves its unit undone
            self._stop.set()
            # waited for by their futures: a Thread.join that Ctrl-C interrupted may take a
            # running thread for stopped (Python 3.11), and the process would end under it,
            # its temporaries left
            wait(running)
            raise
        finally:
            channels.shutdown(wait=True)

    def _fail(self, exc: BaseException) -> None:
        """The run's first failure, kept to be raised; every channel stops."""
        with self._failing:
            if self._failed is None:
                self._failed = exc
        self._stop.set()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._read_busy()
            self.report(self.totals.snapshot())

    def _read_busy(self) -> None:
        share, cpu_s = self._busy.since_start() if self._busy is not None else (None, None)
        with self.totals.lock:
            if share is not None:
                self.totals.nc_busy_share = share
            if cpu_s is not None:
                self.totals.daemon_cpu_s = cpu_s

    def _run_manifest(
        self, manifest_path: Path, checkpoint: Checkpoint, copies: _Copies, batch: int
    ) -> None:
        """The manifest's classes interleaved by weight (the file read again every batch:
        dynamic boosting), cut into units of `chunk_records`, one after another. A resumed
        run replays the weights the checkpoint kept, so it draws the same records, and
        skips (reads, but does not infer) the units done."""
        o = self.options
        manifest = read_manifest(manifest_path)
        weights = ManifestWeights(manifest_path, manifest.weights)
        for epoch in range(o.epochs):
            streams = {
                label: self._class_records(shards, epoch)
                for label, shards in manifest.shards.items()
            }
            mixed = Interleave(
                streams,
                weights,
                seed=(o.shuffle or 0) + epoch,
                reweigh_every=batch,
                replay=checkpoint.weights.get(str(epoch), []),
            )
            records = iter(mixed)
            for chunk in itertools.count():
                part = list(itertools.islice(records, o.chunk_records))
                if not part:
                    break
                unit = WorkUnit(epoch, None, chunk)
                if self._done_before(unit, checkpoint):
                    self.totals.units_skipped += 1
                    continue
                self._unit(unit, iter(part), copies, batch, checkpoint, mixed.history)

    def _done_before(self, unit: WorkUnit, checkpoint: Checkpoint) -> bool:
        """Whether an earlier run did `unit`: the checkpoint says so, and its output is
        there and whole (else it is done again, with a warning)."""
        if unit.name not in checkpoint.done:
            return False
        output = self.options.output / unit.output_name(self.options.format)
        if _is_written(output, self.options.format):
            return True
        log.warning(
            "%s: done by an earlier run, but its output %s is missing or cut short: done again",
            unit.name,
            output,
        )
        return False

    def _class_records(self, shards: Sequence[Shard], epoch: int) -> Iterator[Record]:
        o = self.options
        stats = ReadStats()
        for shard in epoch_order(shards, o.shuffle, epoch):
            yield from shard_records(
                shard, on_corrupt=o.on_corrupt, stats=stats, max_record_bytes=o.max_record_bytes
            )
            with self.totals.lock:
                self.totals.skipped += stats.skipped
            stats = ReadStats()

    def _unit(
        self,
        unit: WorkUnit,
        records: Iterator[Record] | None,
        copies: _Copies,
        batch: int,
        checkpoint: Checkpoint,
        weights: list[dict[str, float]] | None = None,
    ) -> None:
        """One unit: its records (None: its shard's) inferred and written in order."""
        o = self.options
        out = _Outputs(o.output, unit, o.format)
        window: deque[tuple[list[str], int, Future[dict[str, np.ndarray]]]] = deque()
        limit = max(2, o.ncgs * o.ninfer)
        stats = ReadStats()
        if records is None:
            assert unit.shard is not None
            records = shard_records(
                unit.shard,
                on_corrupt=o.on_corrupt,
                stats=stats,
                max_record_bytes=o.max_record_bytes,
            )
        try:
            for keys, count, fill in self._batches(unit, records, batch):
                if self._stop.is_set():
                    raise _Stopped
                began = time.monotonic()
                index, staged = copies.stage()  # waits while all are full
                waited = time.monotonic() - began
                try:
                    inputs = fill(staged.inputs if staged is not None else None)
                except BaseException:
                    copies.unstage(index, staged)
                    raise
                began = time.monotonic()
                window.append((keys, count, copies.send(index, staged or inputs)))
                with self.totals.lock:
                    self.totals.nc_s += waited + time.monotonic() - began
                while len(window) >= limit:
                    self._drain_one(window, out)
            while window:
                self._drain_one(window, out)
            out.finish()
        except BaseException:
            for _, _, future in window:
                future.cancel()
            out.abandon()
            raise
        checkpoint.mark(unit, weights)
        with self.totals.lock:
            self.totals.units_done += 1
            self.totals.skipped += stats.skipped

    def _drain_one(
        self,
        window: deque[tuple[list[str], int, Future[dict[str, np.ndarray]]]],
        out: _Outputs,
    ) -> None:
        keys, count, future = window.popleft()
        began = time.monotonic()
        outputs = future.result()
        waited = time.monotonic() - began
        out.add(keys, {name: array[:count] for name, array in outputs.items()})
        with self.totals.lock:
            self.totals.nc_s += waited

    def _batches(
        self, unit: WorkUnit, records: Iterator[Record], batch: int
    ) -> Iterator[tuple[list[str], int, Fill]]:
        """The records in batches of `batch` (the last one padded with zeros to the
        model's batch): (keys, real count, how to decode it into input arrays). Decoded
        here, into the arrays given (shared memory: no copy to send it); or, with decode
        workers, in their processes (off this process's GIL, which the client's calls
        need), a few batches ahead of the one given, then copied into the arrays."""
        o = self.options
        specs = list(o.features)
        ahead: deque[tuple[list[str], int, Fill]] = deque()
        depth = self._decoders_count
        while True:
            began = time.monotonic()
            part = list(itertools.islice(records, batch))
            waited = time.monotonic() - began
            with self.totals.lock:
                self.totals.storage_s += waited
                self.totals.records += len(part)
                self.totals.bytes += sum(len(record.data) for record in part)
            if part:
                keys = [f"{r.key}#{unit.epoch}" if o.epochs > 1 else r.key for r in part]
                rows = [(r.data, r.key) for r in part]
                if self._decoders is None:
                    ahead.append((keys, len(part), _decoder(rows, specs, batch)))
                else:
                    decoding = self._decoders.submit(decode_batch, rows, specs, batch)
                    ahead.append((keys, len(part), _copier(decoding)))
            last = len(part) < batch
            while ahead and (len(ahead) > depth or last):
                yield ahead.popleft()
            if last:
                return
