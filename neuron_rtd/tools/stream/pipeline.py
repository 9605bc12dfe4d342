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
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import psutil

from neuron_rtd.client import Client, Model, NrtClientError, Staged
from neuron_rtd.client.observe import interval
from neuron_rtd.neff import Neff, read_neff
from neuron_rtd.proto import ext_pb
from neuron_rtd.tools.stream.features import (
    FeatureSpec,
    check_specs,
    decode_batch,
    output_examples,
)
from neuron_rtd.tools.stream.output_folder import Temporary, prepare, remove_leftovers, write_whole
from neuron_rtd.tools.stream.sources import (
    Interleave,
    ManifestWeights,
    Shard,
    epoch_order,
    read_manifest,
    redact,
    shard_records,
)
from neuron_rtd.tools.stream.tfrecord import (
    MAX_RECORD_BYTES,
    OnCorrupt,
    ReadStats,
    Record,
    Writer,
    is_whole,
)

log = logging.getLogger("neuron_rtd.stream")

OutputFormat = Literal["tfrecord", "npy"]
CHECKPOINT = ".checkpoint.json"


@dataclass(frozen=True)
class Unit:
    epoch: int
    shard: Shard | None  # None: a chunk of a manifest's interleave
    chunk: int = 0

    @property
    def name(self) -> str:
        """Stable across runs: the epoch and the shard's URL without its credentials (or
        the chunk's index)."""
        if self.shard is None:
            return f"e{self.epoch:03d}-mix-{self.chunk:05d}"
        url = redact(self.shard.url)
        digest = hashlib.sha1(url.encode()).hexdigest()[:8]
        base = Path(url.split("://", 1)[-1]).name
        for suffix in (".gz", ".zz", ".zlib", ".tfrecord", ".tfrecords"):
            base = base.removesuffix(suffix)
        return f"e{self.epoch:03d}-{digest}-{base}"

    def output_name(self, fmt: OutputFormat) -> str:
        return f"{self.name}{'.tfrecord' if fmt == 'tfrecord' else '.npz'}"


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


def host_busy_cpu_s() -> float:
    """CPU seconds the host spent busy (every process, every core) since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


@dataclass
class Totals:
    """What a run did; updated by the channels, reported every second and at the end."""

    records: int = 0
    bytes: int = 0
    skipped: int = 0
    units_done: int = 0
    units_skipped: int = 0  # done by an earlier run (resume)
    storage_s: float = 0.0
    nc_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    host_cpu_started: float = field(default_factory=host_busy_cpu_s)
    ended: tuple[float, float] | None = None  # (monotonic, host CPU) when streaming ended
    nc_busy_share: float = 0.0  # of the NCs of the run's models, since it started (last read)
    daemon_cpu_s: float = 0.0  # the daemon's CPU seconds since it started (last read)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def restart(self) -> None:
        with self.lock:
            self.started = time.monotonic()
            self.host_cpu_started = host_busy_cpu_s()

    def end(self) -> None:
        """Streaming is over: the figures stop here (the models' unload apart)."""
        with self.lock:
            self.ended = (time.monotonic(), host_busy_cpu_s())

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            now, cpu = self.ended or (time.monotonic(), host_busy_cpu_s())
            seconds = max(now - self.started, 1e-9)
            waited = self.storage_s + self.nc_s
            return {
                "seconds": round(seconds, 3),
                "records": self.records,
                "skipped": self.skipped,
                "units_done": self.units_done,
                "units_skipped": self.units_skipped,
                "records_per_s": round(self.records / seconds, 1),
                "mb_per_s": round(self.bytes / seconds / 1e6, 2),
                "storage_wait_share": round(self.storage_s / waited, 3) if waited else 0.0,
                "nc_wait_share": round(self.nc_s / waited, 3) if waited else 0.0,
                # the host's CPU seconds busy (every process), and its cores
                "host_cpu_s": round(cpu - self.host_cpu_started, 3),
                "host_cpus": psutil.cpu_count() or 1,
                "nc_busy_share": round(self.nc_busy_share, 3),
                "daemon_cpu_s": round(self.daemon_cpu_s, 3),
            }


class BadCheckpoint(ValueError):
    """A checkpoint a run cannot resume from: which file, and what is wrong with it."""


class Checkpoint:
    """The units done, in `output/.checkpoint.json`, each write atomic."""

    def __init__(self, output: Path, *, resume: bool) -> None:
        self.folder = output
        self.path = output / CHECKPOINT
        self._lock = threading.Lock()
        self.done: set[str] = set()
        # a manifest run's weights, per epoch, as its interleave read them: replayed
        self.weights: dict[str, list[dict[str, float]]] = {}
        if resume and self.path.exists():
            self.done, self.weights = _read_checkpoint(self.path)

    def mark(self, unit: Unit, weights: list[dict[str, float]] | None = None) -> None:
        with self._lock:
            self.done.add(unit.name)
            if weights is not None:
                self.weights[str(unit.epoch)] = weights
            saved = {"done": sorted(self.done), "weights": self.weights}
            write_whole(self.folder, CHECKPOINT, json.dumps(saved).encode())


def _read_checkpoint(path: Path) -> tuple[set[str], dict[str, list[dict[str, float]]]]:
    """The units done and the weights a checkpoint file holds; BadCheckpoint for one that
    cannot be read, or is not what `Checkpoint.mark` writes."""

    def bad(why: str) -> BadCheckpoint:
        return BadCheckpoint(f"{path}: cannot resume from it ({why}); remove it to start over")

    try:
        saved = json.loads(path.read_bytes())
    except OSError as exc:
        raise bad(exc.strerror or type(exc).__name__) from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise bad(f"not JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("done"), list):
        raise bad('expected {"done": [UNIT, ...], "weights": {...}}')
    done, weights = saved["done"], saved.get("weights", {})
    if not all(isinstance(name, str) for name in done):
        raise bad('"done" must list unit names (strings)')
    if not isinstance(weights, dict) or not all(
        isinstance(turns, list) and all(_is_weights(turn) for turn in turns)
        for turns in weights.values()
    ):
        raise bad('"weights" must map each epoch to a list of {CLASS: WEIGHT}')
    return set(done), weights


def _is_weights(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(weight, int | float) and not isinstance(weight, bool)
        for weight in value.values()
    )


def _is_written(path: Path, fmt: OutputFormat) -> bool:
    """Whether a unit's output is there and whole, as far as a cheap look tells: a
    TFRecord file's frames end where it does; an npz's zip directory (at its end) reads."""
    try:
        if fmt == "tfrecord":
            return is_whole(path)
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


class _Outputs:
    """One unit's outputs, written in order under a temporary name."""

    def __init__(self, output: Path, unit: Unit, fmt: OutputFormat) -> None:
        self.temporary = Temporary(output, unit.output_name(fmt))
        self.fmt = fmt
        self._writer = (
            Writer(self.temporary.path, self.temporary.file) if fmt == "tfrecord" else None
        )
        self._keys: list[str] = []
        self._arrays: dict[str, list[np.ndarray]] = {}

    def add(self, keys: Sequence[str], outputs: dict[str, np.ndarray]) -> None:
        if self._writer is not None:
            for record in output_examples(keys, outputs):
                self._writer.write(record)
            return
        self._keys.extend(keys)
        for name, array in outputs.items():
            self._arrays.setdefault(name, []).extend(array)

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
        else:
            arrays: dict[str, np.ndarray] = {
                name: np.stack(rows) for name, rows in self._arrays.items()
            }
            arrays["keys"] = np.array(self._keys)
            np.savez(self.temporary.file, **arrays)  # type: ignore[arg-type]
        self.temporary.commit()

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.temporary.discard()


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

    def units(self) -> list[Unit]:
        o = self.options
        return [
            Unit(epoch, shard)
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
                models, o.ninfer, self._fail, stage=_decodes_in_place(o.features, neff, batch)
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
        pending: deque[Unit] = deque(todo)
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
                unit = Unit(epoch, None, chunk)
                if self._done_before(unit, checkpoint):
                    self.totals.units_skipped += 1
                    continue
                self._unit(unit, iter(part), copies, batch, checkpoint, mixed.history)

    def _done_before(self, unit: Unit, checkpoint: Checkpoint) -> bool:
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
        unit: Unit,
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
        self, unit: Unit, records: Iterator[Record], batch: int
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


Fill = Callable[[dict[str, np.ndarray] | None], dict[str, np.ndarray]]


def _decoder(rows: list[tuple[bytes, str]], specs: list[FeatureSpec], batch: int) -> Fill:
    """A batch decoded into the arrays given (None: new ones)."""
    return lambda out: decode_batch(rows, specs, batch, out)


def _copier(decoding: Future[dict[str, np.ndarray]]) -> Fill:
    """A batch decoded elsewhere, copied into the arrays given (None: as it came)."""

    def fill(out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        decoded = decoding.result()
        if out is None:
            return decoded
        for name, array in out.items():
            array[...] = decoded[name]
        return out

    return fill


def _decodes_in_place(specs: Sequence[FeatureSpec], neff: Neff, batch: int) -> bool:
    """Whether the batches decode straight into the model's input buffers: each spec of
    its input's dtype and shape (not a smaller one of a varying axis, not scalars)."""
    inputs = {t.name: t for t in neff.inputs}
    return all(
        spec.input_name in inputs
        and inputs[spec.input_name].dtype == spec.dtype
        and tuple(inputs[spec.input_name].shape) == (batch, *spec.shape)
        for spec in specs
    )


class _Copies:
    """The M copies of the model (one per NCG), each taking `ninfer` inferences in flight.
    A batch takes a place on the least busy copy first (`stage`: its input arrays in that
    copy's shared memory, to be decoded into), at most one beyond the `ninfer` in flight,
    and is sent once that copy has a free place (`send`), so that each is sent at once,
    none queued in the client's pool. The first inference that fails is told to `failed`
    at once, and no batch is sent after it (_Stopped): a daemon gone stops the run in one
    reconnection wait, not one per batch."""

    def __init__(
        self,
        models: Sequence[Model],
        ninfer: int,
        failed: Callable[[BaseException], None],
        *,
        stage: bool = True,
    ) -> None:
        self._models = list(models)
        self._ninfer = ninfer
        self._failed = failed
        self._stage = stage  # else the batches are decoded into arrays of their own
        self._placed = [0] * len(models)  # batches staged or in flight
        self._busy = [0] * len(models)  # in flight
        self._broken = False
        self._changed = threading.Condition()

    def stage(self) -> tuple[int, Staged | None]:
        """A place on the least busy copy: its index and input arrays in its shared memory
        (None: not to be decoded in place, or the client's tensors go inline)."""
        with self._changed:
            self._changed.wait_for(lambda: self._broken or min(self._placed) <= self._ninfer)
            if self._broken:
                raise _Stopped
            index = self._placed.index(min(self._placed))
            self._placed[index] += 1
        try:
            return index, self._models[index].stage() if self._stage else None
        except BaseException:
            self.unstage(index, None)
            raise

    def unstage(self, index: int, staged: Staged | None) -> None:
        """A place given back unsent."""
        if staged is not None:
            self._models[index].unstage(staged)
        with self._changed:
            self._placed[index] -= 1
            self._changed.notify_all()

    def send(
        self, index: int, inputs: Staged | dict[str, np.ndarray]
    ) -> Future[dict[str, np.ndarray]]:
        """The batch staged on copy `index` sent, once that copy has a free place."""
        with self._changed:
            self._changed.wait_for(lambda: self._broken or self._busy[index] < self._ninfer)
            broken = self._broken
            if not broken:
                self._busy[index] += 1
        if broken:
            self.unstage(index, inputs if isinstance(inputs, Staged) else None)
            raise _Stopped
        try:
            future = self._models[index].infer_async(inputs, posted=False)
        except BaseException:
            self._done(index, None)
            raise
        future.add_done_callback(lambda done: self._done(index, done))
        return future

    def _done(self, index: int, future: Future[dict[str, np.ndarray]] | None) -> None:
        error = None if future is None or future.cancelled() else future.exception()
        if error is not None:
            self._failed(error)  # first: the run's failure is this, not a _Stopped after it
        with self._changed:
            self._busy[index] -= 1
            self._placed[index] -= 1
            self._broken = self._broken or error is not None
            self._changed.notify_all()


class DaemonBusy:
    """How busy the NCs of the run's models, and the daemon, have been since it started:
    their busy time and its CPU time in the daemon's ext snapshots (what neuron-top and
    neuron-monitor read)."""

    def __init__(self, client: Client, model_ids: Sequence[int]) -> None:
        self._client = client
        self._ids = set(model_ids)
        self._first = self._read()

    def _read(self) -> ext_pb.snapshot_response | None:
        try:
            return self._client.connection.snapshot(retry=False)  # a figure: never waited for
        except NrtClientError as exc:  # a daemon without it, or gone: the run goes on
            log.debug("no NC busy time: %s", exc)
            return None

    def since_start(self) -> tuple[float | None, float | None]:
        """Since the start: the share (0..1) of the time the NCs were busy, and the CPU
        seconds the daemon spent (each None: unread)."""
        now = self._read()
        if self._first is None or now is None:
            return None, None
        cpu_s = (now.cpu_user_s + now.cpu_system_s) - (
            self._first.cpu_user_s + self._first.cpu_system_s
        )
        ncs = {
            vnc
            for ncg in now.ncgs
            if self._ids & set(ncg.model_ids)
            for vnc in range(ncg.vnc_start, ncg.vnc_start + ncg.nc_count)
        }
        utilization = interval(self._first, now).nc_utilization
        shares = [utilization[vnc] / 100 for vnc in ncs if vnc in utilization]
        return (sum(shares) / len(shares) if shares else None), cpu_s


class _Stopped(Exception):
    """Another channel failed: this one stops, its unit undone."""
