"""A version's files read and its copies loaded: its NEFF through the runtime's one
model-file reader, its config completed from it, its sequence settings and labels read
beside its config, and its `instance_group` copies put on the runtime, all or none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from neuron_rtd.errors import (
    ModelFileRefused,
    NeffInvalid,
    NrtError,
    ResourceNcError,
    UnsupportedVersion,
)
from neuron_rtd.neff import Neff
from neuron_rtd.runtime import Runtime, read_model_file
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.classification import read_labels
from neuron_rtd.serving.config import ModelConfig, complete, instance_count, model_filename
from neuron_rtd.serving.sequence_config import sequence_settings
from neuron_rtd.serving.served import ServedVersion, serving_error, unload_copies


def read_model(runtime: Runtime, what: str, directory: Path, filename: str) -> Neff:
    """The NEFF of `what` (a version), in file `filename` of its folder `directory`: read by
    the runtime's one model-file reader (`read_model_file`: only from within `directory`,
    as data, its memory admitted as a load's), or ServingError saying why not."""
    path = directory / filename
    try:
        return read_model_file(path, (directory,), into=runtime.neff_buffer)
    except ModelFileRefused as exc:
        if exc.outside:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"{what}: its model file {path} leads outside its version folder {directory} "
                "(a symbolic link): a model file is read only from within its version folder",
            ) from None
        raise ServingError(
            Status.UNAVAILABLE,
            f"{what}: cannot read its model file {path} ({exc.reason}): the daemon reads it "
            "with its own rights; make it a regular file readable to the daemon's user in "
            f"{directory} (default_model_filename names it, model.neff if none)",
        ) from None
    except (NeffInvalid, UnsupportedVersion) as exc:
        raise ServingError(
            Status.INVALID_ARGUMENT, f"{what}: {path} is not a NEFF this daemon runs: {exc}"
        ) from None
    except NrtError as exc:
        raise serving_error(exc, f"{what}: reading {path}") from None


def load_version(
    runtime: Runtime,
    name: str,
    version: int,
    directory: Path,
    user: ModelConfig,
    source: str,
    model_dir: Path | None = None,
) -> ServedVersion:
    """Version `version` of model `name` from `directory`: its NEFF read, its config
    completed, and its copies loaded (all, or none: a copy that fails unloads the others).
    The files its config names (labels, initial state) are read from `model_dir`, the
    model's folder (default: `directory`'s parent; an ONNX model's NEFF is elsewhere, in
    the compile cache). ServingError with the reason otherwise."""
    what = f"model '{name}' version {version}"
    folder = model_dir if model_dir is not None else directory.parent
    neff = read_model(runtime, what, directory, model_filename(user))
    config = complete(user, neff, name, source, version)
    sequences = None
    if config.HasField("sequence_batching"):  # checked before any copy is loaded
        sequences = sequence_settings(config, neff, source, folder)
    labels = read_labels(folder, config, what)  # beside config.pbtxt
    count = instance_count(config)
    model_ids: list[int] = []
    named = replace(neff, name=name)  # on the runtime (list-model, its log) as served
    try:
        for _ in range(count):
            model_ids.append(runtime.load(named).id)
    except NrtError as exc:
        unload_copies(runtime, model_ids)
        if isinstance(exc, ResourceNcError):
            reason = (
                f"{what}: not enough free NeuronCores for its {count} copies of "
                f"{max(neff.nc_count, 1)} NC(s) each (instance_group count; "
                f"{len(model_ids)} loaded before the shortage): {exc.message}"
            )
            raise ServingError(Status.UNAVAILABLE, reason) from None
        raise serving_error(exc, f"{what}: loading copy {len(model_ids) + 1} of {count}") from None
    try:
        return ServedVersion(runtime, name, version, config, neff, model_ids, sequences, labels)
    except BaseException:
        unload_copies(runtime, model_ids)
        raise
