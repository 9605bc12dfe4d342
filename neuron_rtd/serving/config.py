"""A model's configuration (Triton's `ModelConfig`): read from `DIR/NAME/config.pbtxt`
(text format) or given as JSON to a load request, then completed from the NEFF as Triton
completes an ONNX model's:

- `platform` "neuron_neff", `backend` "neuron";
- `max_batch_size`: the NEFF's largest batch bucket when every input and output has the
  same bucket symbol on axis 0 (`--dynamic-batch`), else 0;
- `input` / `output`: name, data_type and dims (the batch axis left out when
  max_batch_size > 0; -1 for an axis that varies);
- one `instance_group` of count 1, `version_policy` latest 1, `default_model_filename`
  "model.neff" (a given one must be a plain file name: the file is read from the
  version's folder only).

A field the user gave is kept when the NEFF agrees and refused, naming the field and both
values, when it does not; what the daemon cannot do (sequence batching, ensembles, GPU
instances) is refused saying so.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from neuron_rtd.errors import shown
from neuron_rtd.neff import Neff, TensorSpec
from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.datatypes import config_type_name, config_type_of, datatype_of

ModelConfig = model_config_pb.ModelConfig

CONFIG_FILE = "config.pbtxt"
PLATFORM = "neuron_neff"
BACKEND = "neuron"
DEFAULT_MODEL_FILENAME = "model.neff"
NAME_MAX_BYTES = 255  # a model's name, a model file's: one file name (NAME_MAX)
CONFIG_MAX_BYTES = 1 << 20  # a config.pbtxt (Triton's are a few KB)

_KIND = model_config_pb.ModelInstanceGroup


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


# --- reading ---------------------------------------------------------------------------
def read_config(model_dir: Path, name: str) -> ModelConfig:
    """The config the user wrote in `model_dir/config.pbtxt` (empty when there is none),
    read as data: opened non-blocking, never through a symbolic link, only when it is a
    regular file of at most CONFIG_MAX_BYTES."""
    path = model_dir / CONFIG_FILE
    try:
        text = read_small_file(path).decode("utf-8")
    except FileNotFoundError:
        return ModelConfig()
    except (OSError, UnicodeDecodeError) as exc:
        raise _invalid(f"cannot read {path} of model '{name}': {_reason(exc)}") from None
    except ValueError as exc:
        raise _invalid(f"cannot read {path} of model '{name}': {exc}") from None
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        detail = str(exc).split(" : ", 1)[-1]
        where = f"{path}:{line}:{column}" if line else str(path)
        raise _invalid(f"{where}: {detail} (model '{name}')") from None
    return config


def read_small_file(
    path: Path, limit: int = CONFIG_MAX_BYTES, kind: str = "a config.pbtxt"
) -> bytes:
    """A small file's bytes (at most `limit`; `kind` names what it is, in messages), read
    as data: non-blocking, never through a symbolic link, only a regular file. ValueError
    saying why a file that is there is not read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    if not stat.S_ISREG(path.lstat().st_mode):  # a device is not even opened
        raise ValueError(f"it is not a regular file ({kind} must be one)")
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"it is not a regular file ({kind} must be one)")
        if info.st_size > limit:
            raise ValueError(f"it is {info.st_size} bytes, more than {kind} may be ({limit})")
        data = os.pread(fd, limit + 1, 0)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew since its size was looked at
        raise ValueError(f"it is more than {kind} may be ({limit} bytes)")
    return data


def parse_json_config(text: str, name: str) -> ModelConfig:
    """A config given as JSON (`RepositoryModelLoad`'s "config" parameter)."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise _invalid(
            f"the config given to load model '{name}' is not a JSON ModelConfig: {exc}"
        ) from None
    return config


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc)


# --- what the NEFF says ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BatchBuckets:
    """A NEFF's batch axis: the bucket symbol every input and output has on axis 0, and
    the smallest and largest batch its buckets take (all 0 when it has none)."""

    symbol: str | None
    low: int
    high: int

    @classmethod
    def of(cls, neff: Neff) -> BatchBuckets:
        tensors = (*neff.inputs, *neff.outputs)
        firsts = {t.symbols[0] if t.symbols else None for t in tensors}
        symbol = firsts.pop() if len(firsts) == 1 else None
        ranges = [b.symbols[symbol] for b in neff.buckets if symbol is not None]
        if symbol is None or not ranges or not all(r is not None for r in ranges):
            return cls(None, 0, 0)
        return cls(symbol, min(r[0] for r in ranges), max(r[1] for r in ranges))


def neff_dims(spec: TensorSpec, batched: bool) -> list[int]:
    """A tensor's config dims: -1 for an axis that varies, the batch axis left out when
    `batched`."""
    varying = set(spec.varying_axes)
    dims = [-1 if axis in varying else size for axis, size in enumerate(spec.shape)]
    return dims[1:] if batched else dims


# --- checking and completing ------------------------------------------------------------
def check_own_fields(config: ModelConfig, name: str, source: str) -> None:
    """Refuse what the daemon cannot do, whatever the NEFF: checked before any load."""
    if config.name and config.name != name:
        raise _invalid(
            f"{source}: name '{shown(config.name)}', but the model's directory is '{name}'"
        )
    check_model_filename(config.default_model_filename, source)
    if config.platform and config.platform != PLATFORM:
        raise _invalid(
            f"{source}: platform '{config.platform}' is not served here; "
            f"this daemon serves '{PLATFORM}' (NEFF) models only"
        )
    if config.backend and config.backend != BACKEND:
        raise _invalid(
            f"{source}: backend '{config.backend}' is not served here; "
            f"this daemon's backend is '{BACKEND}'"
        )
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling in ("sequence_batching", "ensemble_scheduling"):
        raise _invalid(
            f"{source}: {scheduling} is not supported by neuron-rtd "
            "(it serves single models, with or without dynamic_batching)"
        )
    if config.batch_input or config.batch_output:
        raise _invalid(f"{source}: batch_input and batch_output are not supported")
    for group in config.instance_group:
        label = f"instance_group '{group.name}'" if group.name else "instance_group"
        if group.kind == _KIND.KIND_GPU or group.gpus:
            raise _invalid(
                f"{source}: {label} asks for GPUs (KIND_GPU), and this host has none: "
                "copies go on NeuronCores; use KIND_AUTO, KIND_CPU or KIND_MODEL"
            )
        if group.count < 0:
            raise _invalid(f"{source}: {label} count {group.count} is negative")
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "specific" and not config.version_policy.specific.versions:
        raise _invalid(f"{source}: version_policy specific names no versions")


def check_model_filename(filename: str, source: str) -> None:
    """A `default_model_filename` given must be a plain file name: the model file is read
    from the version's folder only."""
    if not filename:
        return
    size = len(filename.encode("utf-8", "surrogatepass"))
    if "/" in filename or "\0" in filename or filename in (".", "..") or size > NAME_MAX_BYTES:
        raise _invalid(
            f"{source}: default_model_filename {shown(filename)!r} is not a plain file name "
            f"(no '/', not '.' or '..', no NUL, at most {NAME_MAX_BYTES} bytes): it names a "
            "file in each version's folder, like 'model.neff'"
        )


def model_filename(config: ModelConfig) -> str:
    return config.default_model_filename or DEFAULT_MODEL_FILENAME


def instance_count(config: ModelConfig) -> int:
    """The copies to load: every instance_group's count summed (a group of count 0
    counts 1, as Triton's do; no group: 1)."""
    return sum(max(group.count, 1) for group in config.instance_group) or 1


def select_versions(config: ModelConfig, available: Sequence[int]) -> list[int]:
    """The versions the policy serves, of those found (a `specific` version not found
    is still named: its load fails saying so)."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return sorted(available)
    if choice == "specific":
        return sorted(set(policy.specific.versions))
    keep = policy.latest.num_versions if choice == "latest" else 1
    return sorted(available)[-max(keep, 1) :]


def complete(user: ModelConfig, neff: Neff, name: str, source: str, version: int) -> ModelConfig:
    """The config of one version: what the user gave, checked against its NEFF, with
    the rest filled in from it. `source` says where the user's config came from, for
    messages ("config.pbtxt of model 'm'")."""
    check_own_fields(user, name, source)
    config = ModelConfig()
    config.CopyFrom(user)
    its_neff = f"its NEFF (version {version})"
    config.name = name
    config.platform = PLATFORM
    config.backend = BACKEND
    config.max_batch_size = _max_batch_size(user, neff, source, its_neff)
    batched = config.max_batch_size > 0
    del config.input[:]
    del config.output[:]
    config.input.extend(_tensors(user.input, neff.inputs, batched, "input", source, its_neff))
    config.output.extend(_tensors(user.output, neff.outputs, batched, "output", source, its_neff))
    if not config.instance_group:
        config.instance_group.add(count=1, kind=_KIND.KIND_MODEL)
    for index, group in enumerate(config.instance_group):
        group.name = group.name or f"{name}_{index}"
        group.count = max(group.count, 1)
        if group.kind == _KIND.KIND_AUTO:
            group.kind = _KIND.KIND_MODEL
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    elif config.version_policy.WhichOneof("policy_choice") == "latest":
        latest = config.version_policy.latest
        latest.num_versions = max(latest.num_versions, 1)
    config.default_model_filename = model_filename(user)
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config, source)
    return config


def _max_batch_size(user: ModelConfig, neff: Neff, source: str, its_neff: str) -> int:
    buckets = BatchBuckets.of(neff)
    given = user.max_batch_size
    if given < 0:
        raise _invalid(f"{source}: max_batch_size {given} is negative")
    if given == 0:
        return buckets.high
    if buckets.symbol is None:
        raise _invalid(
            f"{source}: max_batch_size {given}, but {its_neff} has no batch buckets "
            "(every input and output with a bucket symbol on axis 0: compile it with "
            "--dynamic-batch), so its max_batch_size is 0"
        )
    if given > buckets.high:
        raise _invalid(
            f"{source}: max_batch_size {given}, but the largest batch bucket of {its_neff} "
            f"is {buckets.high}"
        )
    return given


def _tensors(
    given: Sequence[Any],
    specs: Sequence[TensorSpec],
    batched: bool,
    kind: str,
    source: str,
    its_neff: str,
) -> list[Any]:
    """The config's inputs (or outputs), in the NEFF's order: each the user's entry
    checked, or made from the NEFF when the user gave none for it."""
    by_name = {t.name: t for t in given}
    known = {spec.name for spec in specs}
    for entry in given:
        if entry.name not in known:
            raise _invalid(
                f"{source}: {kind} '{entry.name}' is not one of {its_neff}'s {kind}s "
                f"({', '.join(sorted(known))})"
            )
        if sum(1 for other in given if other.name == entry.name) > 1:
            raise _invalid(f"{source}: {kind} '{entry.name}' is named twice")
    made: list[Any] = []
    message = model_config_pb.ModelInput if kind == "input" else model_config_pb.ModelOutput
    for spec in specs:
        entry = message()
        if spec.name in by_name:
            entry.CopyFrom(by_name[spec.name])
        _check_tensor_fields(entry, kind, source)
        data_type = config_type_of(datatype_of(spec.dtype))
        if entry.data_type and entry.data_type != data_type:
            raise _invalid(
                f"{source}: {kind} '{spec.name}' data_type {config_type_name(entry.data_type)}, "
                f"but {its_neff} takes {config_type_name(data_type)}"
            )
        entry.name = spec.name
        entry.data_type = data_type  # type: ignore[assignment]
        dims = neff_dims(spec, batched)
        if spec.name in by_name and entry.dims:
            _check_dims(list(entry.dims), dims, f"{kind} '{spec.name}'", source, its_neff)
        else:
            entry.dims[:] = dims
        made.append(entry)
    return made


def _check_tensor_fields(
    entry: model_config_pb.ModelInput | model_config_pb.ModelOutput, kind: str, source: str
) -> None:
    unsupported = ["reshape", "is_shape_tensor"]
    if isinstance(entry, model_config_pb.ModelInput):
        unsupported += ["optional", "allow_ragged_batch"]
    for field in unsupported:
        present = entry.HasField(field) if field == "reshape" else bool(getattr(entry, field))
        if present:
            raise _invalid(
                f"{source}: {kind} '{entry.name}' sets {field}, which neuron-rtd does not "
                "support (a NEFF takes each input whole, in the shape it was compiled for)"
            )


def _check_dims(given: list[int], neff: list[int], what: str, source: str, its_neff: str) -> None:
    """The user's dims must be the NEFF's, or fix an axis the NEFF lets vary."""
    agree = len(given) == len(neff) and all(
        g == n or (n == -1 and g > 0) for g, n in zip(given, neff, strict=True)
    )
    if not agree:
        raise _invalid(
            f"{source}: {what} dims {_dims(given)}, but {its_neff} takes {_dims(neff)}"
            + (" (the batch axis left out: max_batch_size > 0)" if len(given) != len(neff) else "")
        )


def _dims(dims: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _check_dynamic_batching(config: ModelConfig, source: str) -> None:
    if config.max_batch_size <= 0:
        raise _invalid(
            f"{source}: dynamic_batching needs max_batch_size > 0, and its NEFF has no batch "
            "buckets (compile it with --dynamic-batch, e.g. --dynamic-batch 1:8)"
        )
    for size in config.dynamic_batching.preferred_batch_size:
        if not 1 <= size <= config.max_batch_size:
            raise _invalid(
                f"{source}: dynamic_batching preferred_batch_size {size} is not within "
                f"1..max_batch_size ({config.max_batch_size})"
            )
