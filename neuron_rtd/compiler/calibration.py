"""The calibration samples `neuron-cc quantize --calibration` names: an npz of arrays
(`quantize.read_npz_samples`), or TFRecord shards of tf.train.Example records, each
record one sample, read and decoded by the code neuron-batch's stream uses
(`neuron_rtd.records`).

Shards are local files, named by path or glob (sorted), uncompressed or compressed whole
(`.gz`, `.zz`) as `neuron_rtd.records.tfrecord` reads them; every CRC is checked and a
corrupt record is an error. A feature spec per model input (`--feature
FEATURE[=INPUT]:DTYPE:D0,D1,...[:raw|list|image]`, neuron-batch's syntax and parser) says
which feature feeds it and how to decode it. The spec's shape is one record's: the
input's own shape, or, when the input's first axis is its batch (symbolic, or 1), the
input's shape without that axis, the record then fed as a batch of one (as neuron-batch
streams records: the batch axis in front).
"""

from __future__ import annotations

import dataclasses
import glob
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from neuron_rtd.arguments import unreadable
from neuron_rtd.compiler.quantize import CalibrationError, ModelInput, Sample, read_npz_samples
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import as_input
from neuron_rtd.records.features import (
    DecodeError,
    FeatureSpec,
    check_cast,
    decode_record,
    fed_inputs,
)
from neuron_rtd.records.tfrecord import CorruptRecord, RecordTooLarge, read_file


@dataclasses.dataclass(frozen=True)
class _Feed:
    """A spec and the model input it feeds: `batch_of_one` when a record is the input's
    shape without its batch axis."""

    spec: FeatureSpec
    input: ModelInput
    batch_of_one: bool


def read_calibration(
    paths: Sequence[str],
    specs: Sequence[FeatureSpec],
    inputs: Sequence[ModelInput],
    *,
    limit: int | None = None,
    cast: bool = False,
) -> tuple[list[Sample], int]:
    """The samples `paths` hold for a model of `inputs`, the first `limit` (None: all),
    and how many there were to take (an npz's all; of TFRecord shards, those read: no more
    than `limit` are). An npz is one path named `.npz`, or a zip archive; anything else is
    TFRecord shards, which need `specs`. CalibrationError saying what is wrong."""
    for path in paths:
        if not _is_pattern(path):
            why = unreadable(path, "calibration file")
            if why:
                raise CalibrationError(f"--calibration {path}: {why}")
    if _is_npz(paths):
        if specs:
            raise CalibrationError(
                f"--feature maps TFRecord features to the model's inputs; {paths[0]} is an "
                "npz, whose arrays are named as the inputs: leave --feature out"
            )
        samples = read_npz_samples(paths[0], inputs, cast=cast)
        return samples[:limit], len(samples)
    if any(path.lower().endswith(".npz") for path in paths):
        raise CalibrationError(
            f"--calibration {' '.join(paths)}: give one npz, or TFRecord shards, not both"
        )
    if not specs:
        raise CalibrationError(
            f"--calibration {' '.join(paths)}: not an npz archive; TFRecord shards need "
            "--feature FEATURE[=INPUT]:DTYPE:D0,D1,...[:raw|list|image] for each model input "
            f"(its inputs: {_described(inputs)})"
        )
    samples = read_tfrecord_samples(paths, specs, inputs, limit=limit, cast=cast)
    return samples, len(samples)


def _is_npz(paths: Sequence[str]) -> bool:
    if len(paths) != 1 or _is_pattern(paths[0]):
        return False
    path = paths[0]
    return path.lower().endswith(".npz") or zipfile.is_zipfile(path)


def _is_pattern(path: str) -> bool:
    """A glob or a URL: not one file to look at."""
    return glob.has_magic(path) or "://" in path


def read_tfrecord_samples(
    paths: Sequence[str],
    specs: Sequence[FeatureSpec],
    inputs: Sequence[ModelInput],
    *,
    limit: int | None = None,
    cast: bool = False,
) -> list[Sample]:
    """A sample per record of the shards `paths` name (in order, the first `limit`), its
    inputs decoded by `specs` and converted to the inputs' dtypes under the one dtype
    policy (`cast`: numpy's unsafe cast, of the records' values and into the inputs).
    CalibrationError for specs that do not fit the model, shards not there, a corrupt
    record, a record the specs do not decode, or no records at all."""
    if cast:
        specs = [dataclasses.replace(spec, cast=True) for spec in specs]
    feeds = feeds_for(specs, inputs)
    shards = expand_shards(paths)
    samples: list[Sample] = []
    for shard in shards:
        if limit is not None and len(samples) >= limit:
            break
        try:
            for record in read_file(shard):
                decoded = decode_record(record.data, record.key, specs)
                samples.append({feed.input.name: _sample(feed, decoded) for feed in feeds})
                if limit is not None and len(samples) >= limit:
                    break
        except (CorruptRecord, RecordTooLarge, DecodeError, BadInput) as exc:
            raise CalibrationError(str(exc)) from None
        except OSError as exc:
            raise CalibrationError(f"{shard}: {exc.strerror or exc}") from None
    if not samples:
        raise CalibrationError(
            f"--calibration {' '.join(paths)}: no records in {len(shards)} shard(s)"
        )
    return samples


def _sample(feed: _Feed, decoded: Mapping[str, np.ndarray]) -> np.ndarray:
    """One input of one record, as the model takes it."""
    array = decoded[feed.input.name]
    if feed.batch_of_one:
        array = array[None]
    return as_input(array, feed.input.dtype, feed.input.name, cast=feed.spec.cast, option="--cast")


def expand_shards(paths: Sequence[str]) -> list[str]:
    """The local files `paths` name, each glob's matches sorted; CalibrationError for a
    URL, or a path or glob that names no file."""
    shards: list[str] = []
    for text in paths:
        if "://" in text:
            raise CalibrationError(
                f"--calibration {text}: neuron-cc reads local TFRecord files only (copy the "
                "shards here; neuron-batch streams them from URLs)"
            )
        if glob.has_magic(text):
            found = sorted(p for p in glob.glob(text) if Path(p).is_file())
            if not found:
                raise CalibrationError(f"--calibration {text}: no file matches")
            shards.extend(found)
        else:
            why = unreadable(text, "calibration file")
            if why:
                raise CalibrationError(f"--calibration {text}: {why}")
            shards.append(text)
    return shards


def feeds_for(specs: Sequence[FeatureSpec], inputs: Sequence[ModelInput]) -> list[_Feed]:
    """Which input each spec feeds, every input once, a record's dtype and shape fitting
    it; CalibrationError saying what is wrong and what to give."""
    fed = fed_inputs(specs, [i.name for i in inputs], _described(inputs), CalibrationError)
    feeds = []
    for model_input in inputs:
        spec = fed[model_input.name]
        check_cast(spec, model_input.dtype, model_input.describe(), CalibrationError)
        feeds.append(_Feed(spec, model_input, _batch_of_one(spec, model_input)))
    return feeds


def _batch_of_one(spec: FeatureSpec, model_input: ModelInput) -> bool:
    """Whether a record of `spec` is fed with a batch axis of one in front (else as it
    is); CalibrationError when neither fits the input."""
    if model_input.fits(spec.shape):
        return False
    if model_input.has_batch_axis and model_input.fits((1, *spec.shape)):
        return True
    dims = [str(d) for d in model_input.shape or ()]
    record = ",".join(dims)
    if model_input.has_batch_axis:
        record = f"{','.join(dims[1:]) or '1'} (fed as a batch of one) or {record}"
    raise CalibrationError(
        f"--feature {spec.name}: the model's input is {model_input.describe()}, so a record "
        f"is {record}, not {','.join(map(str, spec.shape))}"
    )


def _described(inputs: Sequence[ModelInput]) -> str:
    return "; ".join(i.describe() for i in inputs) or "none"
