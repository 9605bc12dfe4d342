"""A model's `sequence_batching` (Triton's sequence batcher) read and checked against its
NEFF, once at load, into the settings the sequence scheduler
(`neuron_rtd/serving/sequence.py`) runs by:

- the control inputs (`control_input`): START, END and READY as a pair of false/true
  values (`int32_false_true`, `fp32_false_true` or `bool_false_true`), CORRID of a
  `data_type` (TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, or TYPE_STRING for
  string sequence ids, as Triton takes). Each is an input of the NEFF of that dtype and
  of one element per batch row; the server fills it, so the served config and metadata
  leave it out of the model's inputs, as Triton's do.
- the implicit state (`state`): `input_name` an input of the NEFF and `output_name` an
  output, of the state's `data_type` and `dims`, kept per sequence by the server (fed
  as the input, replaced by the output after each request) and hidden from clients
  (the output is shown only when the config lists it among its outputs, Triton's way of
  letting a client read the state). At START it holds its `initial_state` (zeros, or the
  bytes of `initial_state/<data_file>` in the model's folder), or zeros of the state's
  dims (1 for a dim that varies) when none is given.
- the strategy: `direct` (default) or `oldest`, its delays and sizes;
  `max_sequence_idle_microseconds` (Triton's default when 0: one second).

Anything else the daemon cannot do is refused at load, saying what and why.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neuron_rtd.neff import Neff, TensorSpec
from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.datatypes import (
    config_type_name,
    config_type_of,
    datatype_of,
    datatype_of_config,
    dtype_of,
)

ModelConfig = model_config_pb.ModelConfig
_Batching = model_config_pb.ModelSequenceBatching
_Kind = _Batching.Control

IDLE_DEFAULT_US = 1_000_000  # Triton's, when max_sequence_idle_microseconds is 0
INITIAL_STATE_DIR = "initial_state"  # in the model's folder, as Triton reads it
START, END, READY, CORRID = "start", "end", "ready", "corrid"
_KINDS = {
    _Kind.CONTROL_SEQUENCE_START: START,
    _Kind.CONTROL_SEQUENCE_END: END,
    _Kind.CONTROL_SEQUENCE_READY: READY,
    _Kind.CONTROL_SEQUENCE_CORRID: CORRID,
}
_CORRID_TYPES = (
    model_config_pb.TYPE_UINT64,
    model_config_pb.TYPE_INT64,
    model_config_pb.TYPE_UINT32,
    model_config_pb.TYPE_INT32,
    model_config_pb.TYPE_STRING,  # the model's sequence ids are strings
)


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class Control:
    """A control input the server fills: its `kind` (START, END, READY, CORRID), dtype,
    its values for false and true (a flag's), and the shape of one row (() or (1,))."""

    name: str
    kind: str
    dtype: np.dtype
    false_true: tuple[object, object]
    row: tuple[int, ...]

    def datatype_name(self) -> str:
        return config_type_name(_config_type(self.dtype))


@dataclass(frozen=True)
class State:
    """An implicit state: fed as input `input_name`, taken from output `output_name`;
    `initial` is one row of it (no batch axis) as a START request sees it."""

    input_name: str
    output_name: str
    dtype: np.dtype
    initial: np.ndarray


@dataclass(frozen=True)
class SequenceSettings:
    strategy: str  # "direct" or "oldest"
    idle_ns: int
    slots: int  # sequence slots per copy: direct's batch slots, oldest's candidates
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    max_queue_delay_us: int
    minimum_slot_utilization: float  # direct's
    preferred_batch_sizes: tuple[int, ...]  # oldest's

    @property
    def corrid(self) -> Control | None:
        return next((c for c in self.controls if c.kind == CORRID), None)


def hidden_tensors(config: ModelConfig, source: str) -> tuple[frozenset[str], frozenset[str]]:
    """The NEFF inputs and outputs a sequence model's clients never see: its control and
    state inputs, and its state outputs the config does not list among its outputs. A
    config that lists a control or state input among its inputs is refused."""
    if not config.HasField("sequence_batching"):
        return frozenset(), frozenset()
    batching = config.sequence_batching
    controls = {c.name for c in batching.control_input}
    states = {s.input_name for s in batching.state}
    for entry in config.input:
        if entry.name in controls or entry.name in states:
            what = "control input" if entry.name in controls else "implicit state input"
            raise _invalid(
                f"{source}: input '{entry.name}' is a sequence_batching {what}: the server "
                "fills it, so it is not one of the inputs a client sends; leave it out of "
                "'input'"
            )
    listed = {entry.name for entry in config.output}
    outputs = {s.output_name for s in batching.state if s.output_name not in listed}
    return frozenset(controls | states), frozenset(outputs)


def fill_defaults(config: ModelConfig) -> None:
    """The defaults Triton writes into a served config's `sequence_batching`: the idle
    time (when 0) and the oldest strategy's preferred batch size (max_batch_size)."""
    batching = config.sequence_batching
    if not batching.max_sequence_idle_microseconds:
        batching.max_sequence_idle_microseconds = IDLE_DEFAULT_US
    oldest = batching.oldest if batching.HasField("oldest") else None
    if oldest is not None and config.max_batch_size > 0 and not oldest.preferred_batch_size:
        oldest.preferred_batch_size.append(config.max_batch_size)


def sequence_settings(
    config: ModelConfig, neff: Neff, source: str, model_dir: Path
) -> SequenceSettings:
    """The settings of a completed config's `sequence_batching`, checked against its
    NEFF (`model_dir`: the model's folder, where `initial_state/` lies)."""
    batching = config.sequence_batching
    batched = config.max_batch_size > 0
    where = f"{source}: sequence_batching"
    if batching.iterative_sequence:
        raise _invalid(f"{where} iterative_sequence is not supported (no NEFF reschedules itself)")
    inputs = {t.name: t for t in neff.inputs}
    outputs = {t.name: t for t in neff.outputs}
    controls = tuple(_control(c, inputs, batched, where) for c in batching.control_input)
    kinds = [c.kind for c in controls]
    for kind in set(kinds):
        if kinds.count(kind) > 1:
            raise _invalid(
                f"{where}: more than one control_input is CONTROL_SEQUENCE_{kind.upper()}"
            )
    states = tuple(_state(s, inputs, outputs, batched, where, model_dir) for s in batching.state)
    names = [s.input_name for s in states]
    for name in set(names):
        if names.count(name) > 1:
            raise _invalid(f"{where}: state input_name '{name}' is given more than once")
    strategy = batching.WhichOneof("strategy_choice") or "direct"
    most = max(config.max_batch_size, 1)
    if strategy == "oldest":
        oldest = batching.oldest
        if oldest.max_candidate_sequences < 0:
            raise _invalid(
                f"{where} oldest max_candidate_sequences {oldest.max_candidate_sequences} "
                "is negative"
            )
        preferred = tuple(oldest.preferred_batch_size) or (
            (config.max_batch_size,) if batched else ()
        )
        for size in preferred:
            if not 1 <= size <= most:
                raise _invalid(
                    f"{where} oldest preferred_batch_size {size} is not within "
                    f"1..max_batch_size ({config.max_batch_size})"
                )
        return SequenceSettings(
            "oldest",
            _idle_ns(batching),
            oldest.max_candidate_sequences or most,
            controls,
            states,
            oldest.max_queue_delay_microseconds,
            0.0,
            preferred,
        )
    direct = batching.direct
    if not 0.0 <= direct.minimum_slot_utilization <= 1.0:
        raise _invalid(
            f"{where} direct minimum_slot_utilization {direct.minimum_slot_utilization} is "
            "not within 0..1"
        )
    return SequenceSettings(
        "direct",
        _idle_ns(batching),
        most,
        controls,
        states,
        direct.max_queue_delay_microseconds,
        direct.minimum_slot_utilization,
        (),
    )


def _idle_ns(batching: _Batching) -> int:
    return (batching.max_sequence_idle_microseconds or IDLE_DEFAULT_US) * 1000


def _control(
    entry: _Batching.ControlInput, inputs: dict[str, TensorSpec], batched: bool, where: str
) -> Control:
    name = entry.name
    if len(entry.control) != 1:
        raise _invalid(
            f"{where} control_input '{name}' has {len(entry.control)} controls; give it one"
        )
    (control,) = entry.control
    kind = _KINDS[control.kind]
    what = f"{where} control_input '{name}' (CONTROL_SEQUENCE_{kind.upper()})"
    if kind == CORRID:
        if control.data_type not in _CORRID_TYPES:
            raise _invalid(
                f"{what}: data_type {config_type_name(control.data_type)}; a CORRID input is "
                "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
            )
        dtype = dtype_of(datatype_of_config(control.data_type))
        pair: tuple[object, object] = (None, None)  # a CORRID is no flag
    else:
        given = [
            (field, values)
            for field, values in (
                ("int32_false_true", control.int32_false_true),
                ("fp32_false_true", control.fp32_false_true),
                ("bool_false_true", control.bool_false_true),
            )
            if len(values)
        ]
        if len(given) != 1 or len(given[0][1]) != 2:
            raise _invalid(
                f"{what}: give exactly one of int32_false_true, fp32_false_true or "
                "bool_false_true, with two values (false, true)"
            )
        field, values = given[0]
        dtype = np.dtype({"int32": "<i4", "fp32": "<f4", "bool": "?"}[field.split("_")[0]])
        pair = (dtype.type(values[0]), dtype.type(values[1]))
    spec = _neff_tensor(what, inputs, name, "input", _config_type(dtype), dtype)
    row = spec.shape[1:] if batched else spec.shape
    if math.prod(row) != 1:
        raise _invalid(
            f"{what}: its NEFF's input '{name}' has shape {list(spec.shape)}; a control takes "
            "one value per batch row: [batch, 1] (or [1] without a batch axis)"
        )
    return Control(name, kind, dtype, pair, tuple(row))


def _neff_tensor(
    what: str,
    specs: dict[str, TensorSpec],
    name: str,
    kind: str,
    data_type: int,
    dtype: np.dtype,
) -> TensorSpec:
    """The NEFF's `kind` ("input", "output") `name`, of `dtype` (the config's `data_type`)
    as `what` (a control, a state) says; INVALID_ARGUMENT otherwise."""
    spec = specs.get(name)
    if spec is None:
        raise _invalid(f"{what}: its NEFF has no {kind} '{name}' ({', '.join(specs)})")
    if spec.dtype != dtype:
        raise _invalid(
            f"{what} is {config_type_name(data_type)}, but its NEFF's {kind} '{name}' "
            f"is {config_type_name(_config_type(spec.dtype))}"
        )
    return spec


def _state(
    entry: _Batching.State,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
    batched: bool,
    where: str,
    model_dir: Path,
) -> State:
    what = f"{where} state '{entry.input_name}'"
    if not entry.input_name or not entry.output_name:
        raise _invalid(f"{where}: a state needs both input_name and output_name")
    dtype = dtype_of(datatype_of_config(entry.data_type))
    dims = tuple(int(d) for d in entry.dims)
    for name, specs, kind in (
        (entry.input_name, inputs, "input"),
        (entry.output_name, outputs, "output"),
    ):
        spec = _neff_tensor(what, specs, name, kind, entry.data_type, dtype)
        varying = set(spec.varying_axes)
        neff_dims = [-1 if axis in varying else size for axis, size in enumerate(spec.shape)]
        neff_dims = neff_dims[1:] if batched else neff_dims
        fits = len(neff_dims) == len(dims) and all(
            d == n or d == -1 or n == -1 for d, n in zip(dims, neff_dims, strict=True)
        )
        if not fits:
            raise _invalid(
                f"{what}: dims {list(dims)}, but its NEFF's {kind} '{name}' takes {neff_dims}"
                + (" (the batch axis left out)" if batched else "")
            )
    return State(
        entry.input_name, entry.output_name, dtype, _initial(entry, dtype, dims, what, model_dir)
    )


def _initial(
    entry: _Batching.State, dtype: np.dtype, dims: tuple[int, ...], what: str, model_dir: Path
) -> np.ndarray:
    if not entry.initial_state:
        return _zeros(tuple(1 if d < 0 else d for d in dims), dtype)
    if len(entry.initial_state) > 1:
        raise _invalid(f"{what}: initial_state must have at most one element")
    initial = entry.initial_state[0]
    if initial.data_type != entry.data_type:
        raise _invalid(
            f"{what}: initial_state data_type {config_type_name(initial.data_type)} is not the "
            f"state's ({config_type_name(entry.data_type)})"
        )
    shape = tuple(int(d) for d in initial.dims)
    if len(shape) != len(dims) or any(
        s < 0 or (d >= 0 and s != d) for s, d in zip(shape, dims, strict=True)
    ):
        raise _invalid(
            f"{what}: initial_state dims {list(shape)} do not fit the state's {list(dims)} "
            "(same rank, no -1, the state's fixed dims kept)"
        )
    choice = initial.WhichOneof("state_data")
    if choice == "zero_data":
        return _zeros(shape, dtype)
    if choice != "data_file":
        raise _invalid(f"{what}: initial_state needs zero_data or data_file")
    if dtype.hasobject:
        raise _invalid(
            f"{what}: initial_state data_file is not read for a TYPE_STRING state; give "
            "zero_data (empty strings)"
        )
    path = model_dir / INITIAL_STATE_DIR / initial.data_file
    expected = math.prod(shape) * dtype.itemsize
    data = _read_exact(path, expected, what, initial.data_file)
    return np.frombuffer(data, dtype).reshape(shape).copy()


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A state of zeros; of empty strings for a string state (Triton's zero bytes)."""
    return np.full(shape, b"", object) if dtype.hasobject else np.zeros(shape, dtype)


def _read_exact(path: Path, expected: int, what: str, given: str) -> bytes:
    """The `expected` bytes of the regular file `path` (never through a symbolic link, a
    plain name in the model's initial_state folder)."""
    if "/" in given or given in ("", ".", ".."):
        raise _invalid(
            f"{what}: initial_state data_file '{given}' must be a plain file name in the "
            f"model's {INITIAL_STATE_DIR}/ folder"
        )
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _invalid(
            f"{what}: cannot read its initial_state file {path}: "
            f"{(exc.strerror or str(exc)).lower()}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != expected:
            got = f"{info.st_size} bytes" if stat.S_ISREG(info.st_mode) else "not a regular file"
            raise _invalid(
                f"{what}: its initial_state file {path} must hold {expected} bytes (its dims "
                f"and data_type), got {got}"
            )
        return os.pread(fd, expected, 0)
    finally:
        os.close(fd)


def _config_type(dtype: np.dtype) -> int:
    return config_type_of(datatype_of(dtype))
