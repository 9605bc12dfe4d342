"""A Triton repository's ONNX models (`platform: "onnxruntime_onnx"`, `backend:
"onnxruntime"`, or no config and a `model.onnx`), compiled on load into a NEFF that is then
served as any NEFF version is (`versions.load_version`).

The config decides what is served, checked against the ONNX file first (a contradiction
is refused naming the field and both values): the inputs are the config's, or the
model's true inputs (an IR 3 file lists its weights among its graph inputs; those are
not inputs); an axis the model leaves free is fixed by the config's dims, or left free
by a -1 there (any size per request, as Triton takes it: the compiler puts every op on a
tensor of such a size on CPU nodes, whose onnxruntime takes any shape, and keeps the NC
parts fixed); the batch axis: `max_batch_size` > 0 needs every input's first axis free
and compiles batch buckets up to it (its `dynamic_batching` preferred sizes as the
buckets' bounds, else 1, 2, 3-4, 5-8, ...); `max_batch_size` 0 compiles the whole shapes
the config states.
`reshape` is compiled into the model, as Triton applies it: the served tensor has the
config's `dims`, the model's own the `reshape` shape (each after the batch axis when
there is one), so the NEFF's tensors are those served and nothing after the load knows
it came from ONNX. The NEFF is kept in the compile cache (`compile_cache.py`), keyed by the
ONNX bytes and these options.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from neuron_rtd.compiler import CompileError, bucket_ranges, compile_model, value_type
from neuron_rtd.errors import shown
from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.compile_cache import CompileCache, cache_key
from neuron_rtd.serving.config import (
    ONNX_BACKEND,
    ONNX_MAX_BYTES,
    ONNX_PLATFORM,
    check_reshape,
    model_filename,
    read_data_file,
)
from neuron_rtd.serving.datatypes import config_type_name, config_type_of, datatype_of

ModelConfig = model_config_pb.ModelConfig
Dim = int | str | None  # an ONNX axis: its size, its symbol, or unknown
Note = Callable[[str], None]  # told what the compile is doing, as it goes

BATCH = "batch"  # the served batch axis's symbol in a rewritten model
AUTO_MAX_BATCH_SIZE = 4  # Triton's --backend-config default-max-batch-size
MIN_RESHAPE_OPSET = 5  # Reshape takes its shape as an input from opset 5


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A version's NEFF in the compile cache, and the user's config as that NEFF is
    checked against it (`versions.load_version`): no platform, no reshape, the cache
    entry as its model file."""

    folder: Path
    filename: str
    neff_config: ModelConfig
    built: bool  # compiled by this load (False: found in the cache)


@dataclasses.dataclass
class _Tensor:
    """One config input or output, as served and as the model takes or gives it."""

    name: str
    served: list[int]  # the config's dims (no batch axis)
    fed: list[int]  # the model's own shape (the reshape, else `served`)
    given: bool  # named by the user's config


def compile_version(
    cache: CompileCache,
    name: str,
    version: int,
    directory: Path,
    user: ModelConfig,
    source: str,
    note: Note,
) -> Compiled:
    """Version `version` of model `name` (its folder `directory`) compiled from its ONNX
    file, or found compiled in `cache`. ServingError saying why not."""
    what = f"model '{name}' version {version}"
    path = directory / model_filename(user, onnx=True)
    real = Path(os.path.realpath(path))  # a link to a file of the same folder is fine
    if not real.is_relative_to(os.path.realpath(directory)):
        raise _invalid(
            f"{what}: its model file {path} leads outside its version folder {directory} (a "
            "symbolic link): a model file is read only from within its version folder"
        )
    try:
        data = read_data_file(real, ONNX_MAX_BYTES, "an ONNX model file")
    except (OSError, ValueError) as exc:
        why = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ServingError(
            Status.UNAVAILABLE,
            f"{what}: cannot read its model file {path} ({why}): the daemon reads it with its "
            f"own rights, from within {directory} (default_model_filename names it, "
            "model.onnx if none)",
        ) from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise _invalid(f"{what}: {path} is not an ONNX model: {shown(str(exc))}") from None
    if not model.graph.node and not model.graph.output:
        raise _invalid(f"{what}: {path} is not an ONNX model: it holds no graph")
    external = [t.name for t in model.graph.initializer if t.data_location == t.EXTERNAL]
    if external:
        raise _invalid(
            f"{what}: {path} keeps weights in external data files ({_names(external[:3])}"
            f"{', ...' if len(external) > 3 else ''}), which neuron-rtd does not read: save "
            "the model as one file (onnx.save with save_as_external_data=False)"
        )
    where = f"{path.name} (version {version})"
    plan = _Plan(model, autocomplete(user, model), source, where)
    key = cache_key(data, plan.options())
    began = time.monotonic()

    def build() -> bytes:
        note(f"compiling {path.name}")

        def progress(step: str, done: int, total: int) -> None:
            note(f"compiling {path.name}: {step} ({done}/{total})")

        try:
            return compile_model(
                plan.model(),
                input_shapes=plan.input_shapes(),
                dynamic_batch=plan.batch_ranges(),
                name=name,
                progress=progress,
            ).neff
        except CompileError as exc:
            raise _invalid(f"{what}: compiling {path} failed: {exc}") from None

    try:
        entry, built = cache.get_or_build(key, build)
    except OSError as exc:
        raise ServingError(
            Status.UNAVAILABLE,
            f"{what}: cannot keep its compiled NEFF in the compile cache "
            f"{cache.root or '(a temporary folder)'}: {(exc.strerror or str(exc)).lower()}",
        ) from None
    if built:
        note(f"compiled {path.name} in {time.monotonic() - began:.1f} s into {entry}")
    else:
        note(f"compiled before: its NEFF found in the compile cache, {entry}")
    return Compiled(entry.parent, entry.name, plan.neff_config(entry.name), built)


def autocomplete(user: ModelConfig, model: onnx.ModelProto) -> ModelConfig:
    """Triton's auto-complete of a config that names no tensors and no max_batch_size (no
    config.pbtxt at all, say): a model whose every input and output has a free first axis
    batches, max_batch_size AUTO_MAX_BATCH_SIZE; the rest comes from the model anyway."""
    if user.max_batch_size or user.input or user.output:
        return user
    weights = {init.name for init in model.graph.initializer}
    values = [vi for vi in (*model.graph.input, *model.graph.output) if vi.name not in weights]
    firsts = [_dims(vi) for vi in values]
    if not values or not all(dims and not isinstance(dims[0], int) for dims in firsts):
        return user
    config = ModelConfig()
    config.CopyFrom(user)
    config.max_batch_size = AUTO_MAX_BATCH_SIZE
    return config


def served_config(completed: ModelConfig, user: ModelConfig) -> ModelConfig:
    """The config a compiled version answers with: the one completed from its NEFF, with
    the platform, backend, model file and reshapes of the ONNX model as the user gave them."""
    config = ModelConfig()
    config.CopyFrom(completed)
    config.platform = ONNX_PLATFORM
    config.backend = ONNX_BACKEND
    config.default_model_filename = model_filename(user, onnx=True)
    for given, made in ((user.input, config.input), (user.output, config.output)):
        shapes = {e.name: e.reshape for e in given if e.HasField("reshape")}
        for entry in made:
            if entry.name in shapes:
                entry.reshape.CopyFrom(shapes[entry.name])
    return config


class _Plan:
    """What the config asks of an ONNX model: each input and output as served and as the
    model takes it, the batch buckets, and the model rewritten for its reshapes."""

    def __init__(self, model: onnx.ModelProto, user: ModelConfig, source: str, where: str):
        self.onnx = model
        self.user = user
        self.source = source
        self.where = where
        self.batched = user.max_batch_size > 0
        if user.max_batch_size < 0:
            raise _invalid(f"{source}: max_batch_size {user.max_batch_size} is negative")
        if user.HasField("dynamic_batching") and not self.batched:
            raise _invalid(
                f"{source}: dynamic_batching needs max_batch_size > 0 (the largest batch "
                f"{where} is compiled for); it is 0"
            )
        weights = {init.name for init in model.graph.initializer}
        real = [vi for vi in model.graph.input if vi.name not in weights]
        self.inputs = self._tensors("input", user.input, real, weights)
        self.outputs = self._tensors("output", user.output, list(model.graph.output), set())

    # --- checking the config against the model ------------------------------------------
    def _tensors(
        self,
        kind: str,
        given: Iterable[Any],
        values: Sequence[onnx.ValueInfoProto],
        weights: set[str],
    ) -> list[_Tensor]:
        by_name = {vi.name: vi for vi in values}
        entries: dict[str, Any] = {}
        for entry in given:
            if entry.name in entries:
                raise _invalid(f"{self.source}: {kind} '{entry.name}' is named twice")
            if entry.name in weights:
                raise _invalid(
                    f"{self.source}: input '{entry.name}' is a weight (an initializer) of "
                    f"{self.where}, not an input it takes; its inputs: {_names(by_name)}"
                )
            if entry.name not in by_name:
                raise _invalid(
                    f"{self.source}: {kind} '{entry.name}' is not one of {self.where}'s "
                    f"{kind}s ({_names(by_name)})"
                )
            entries[entry.name] = entry
        return [self._tensor(kind, vi, entries.get(vi.name)) for vi in values]

    def _tensor(self, kind: str, vi: onnx.ValueInfoProto, entry: Any) -> _Tensor:
        what = f"{kind} '{vi.name}'"
        if not vi.type.HasField("tensor_type"):
            raise _invalid(f"{self.where}: {what} is not a tensor; a NEFF carries tensors only")
        data_type = self._data_type(vi, what)
        dims = _dims(vi)
        if self.batched:
            if dims is not None and (not dims or isinstance(dims[0], int)):
                first = f"a fixed first axis of {dims[0]}" if dims else "no axes"
                raise _invalid(
                    f"{self.source}: max_batch_size {self.user.max_batch_size}, but {what} of "
                    f"{self.where} has {first}, so it takes no batch: set max_batch_size 0 "
                    "and give its whole shape in dims"
                )
            dims = dims[1:] if dims is not None else None
        if entry is None:
            if kind == "output":  # its shape is the NEFF's, whatever the compile makes
                return _Tensor(vi.name, [], [], False)
            if dims is None or not all(isinstance(d, int) for d in dims):
                raise _invalid(
                    f"{self.where}: {what} has axes of no fixed size ({_shown(dims)}) and the "
                    "config does not give its dims: give them in config.pbtxt (the batch "
                    "axis left out when max_batch_size > 0)"
                )
            fixed = [int(d) for d in dims if isinstance(d, int)]
            return _Tensor(vi.name, fixed, fixed, False)
        if entry.data_type and entry.data_type != data_type:
            raise _invalid(
                f"{self.source}: {what} data_type {config_type_name(entry.data_type)}, but "
                f"{self.where} has {config_type_name(data_type)}"
            )
        served = [int(d) for d in entry.dims]
        reshaped = entry.HasField("reshape")
        fed = [int(d) for d in entry.reshape.shape] if reshaped else list(served)
        check_reshape(entry, kind, self.source)
        if reshaped and -1 in served:
            raise _invalid(
                f"{self.source}: {what} dims {_shown(served)} with a reshape: neuron-rtd "
                "compiles fixed shapes, so dims with a reshape must all be fixed"
            )
        label = f"{what} " + (f"reshape {_shown(fed)}" if reshaped else f"dims {_shown(fed)}")
        if dims is not None:
            if len(dims) != len(fed):
                raise _invalid(
                    f"{self.source}: {label}, but {self.where} has {_shown(dims)}"
                    + (" (the batch axis left out: max_batch_size > 0)" if self.batched else "")
                )
            for axis, (want, got) in enumerate(zip(dims, fed, strict=True)):
                if isinstance(want, int) and got not in (want, -1):
                    raise _invalid(f"{self.source}: {label}, but {self.where} has {_shown(dims)}")
                if isinstance(want, int):
                    fed[axis] = want
        if reshaped:
            return _Tensor(vi.name, served, fed, True)
        if -1 in fed and kind == "output":  # its free axis: the NEFF's, as compiled
            return _Tensor(vi.name, [], [], True)
        return _Tensor(vi.name, list(fed), fed, True)

    def _data_type(self, vi: onnx.ValueInfoProto, what: str) -> int:
        elem = vi.type.tensor_type.elem_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        except (KeyError, TypeError, ValueError):
            dtype = np.dtype("V")
        try:
            return config_type_of(datatype_of(dtype))
        except ServingError as exc:
            kind = onnx.TensorProto.DataType.Name(elem) if elem else "undefined"
            raise _invalid(f"{self.where}: {what} is {kind}: {exc.message}") from None

    # --- what is compiled -----------------------------------------------------------------
    def options(self) -> dict[str, object]:
        """The compile options, as the cache key takes them."""
        return {
            "max_batch_size": self.user.max_batch_size,
            "buckets": self.batch_ranges(),
            "inputs": [[t.name, t.served, t.fed] for t in self.inputs],
            "outputs": [[t.name, t.served, t.fed] for t in self.outputs],
        }

    def batch_ranges(self) -> list[tuple[int, int]] | None:
        """The batch buckets: none for max_batch_size 0; up to max_batch_size, bounded at
        the preferred sizes when dynamic_batching names some (a max_batch_size of 1 is
        compiled as 1..2: a NEFF's batch axis has more than one size)."""
        most = self.user.max_batch_size
        if most <= 0:
            return None
        if most == 1:
            return [(1, 2)]
        preferred = sorted(
            {p for p in self.user.dynamic_batching.preferred_batch_size if 1 <= p < most}
        )
        scheme = ",".join(str(p) for p in [*preferred, most]) if preferred else "log2"
        return bucket_ranges(1, most, scheme)

    def input_shapes(self) -> dict[str, list[int]]:
        """Each input's size on every axis (1 for the batch axis: its buckets are given;
        -1 for an axis left free)."""
        batch = [1] if self.batched else []
        return {t.name: [*batch, *t.served] for t in self.inputs}

    def model(self) -> onnx.ModelProto:
        """The model to compile: the ONNX model with a Reshape after each reshaped input
        and before each reshaped output."""
        reshaped = [t for t in (*self.inputs, *self.outputs) if t.served != t.fed]
        if not reshaped:
            return self.onnx
        opset = next((o.version for o in self.onnx.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < MIN_RESHAPE_OPSET:
            raise _invalid(
                f"{self.where}: reshape needs opset {MIN_RESHAPE_OPSET} or later (Reshape "
                f"with its shape as an input); the model imports opset {opset}"
            )
        model = onnx.ModelProto()
        model.CopyFrom(self.onnx)
        graph = model.graph
        batch = [0] if self.batched else []  # 0: Reshape keeps the batch axis as it is
        front: list[onnx.NodeProto] = []
        for tensor in self.inputs:
            if tensor.served == tensor.fed:
                continue
            inner = f"{tensor.name}__reshaped"
            _rename(graph, tensor.name, inner)
            front += _reshape(tensor.name, inner, [*batch, *tensor.fed])
            _set_dims(graph.input, tensor.name, tensor.served, self.batched)
        for tensor in self.outputs:
            if tensor.served == tensor.fed:
                continue
            inner = f"{tensor.name}__unshaped"
            _rename(graph, tensor.name, inner)
            graph.node.extend(_reshape(inner, tensor.name, [*batch, *tensor.served]))
            _set_dims(graph.output, tensor.name, tensor.served, self.batched)
        nodes = [*front, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
        return model

    def neff_config(self, filename: str) -> ModelConfig:
        """The user's config as the compiled NEFF is checked against it."""
        config = ModelConfig()
        config.CopyFrom(self.user)
        config.ClearField("platform")
        config.ClearField("backend")
        config.default_model_filename = filename
        for entries, tensors in ((config.input, self.inputs), (config.output, self.outputs)):
            by_name = {t.name: t for t in tensors}
            for entry in entries:
                entry.ClearField("reshape")
                served = by_name[entry.name].served
                entry.dims[:] = served  # empty: the NEFF's (an output left free)
        return config


def _dims(vi: onnx.ValueInfoProto) -> list[Dim] | None:
    """An ONNX tensor's axes (None when its rank is not declared), as the compiler reads
    them."""
    found = value_type(vi)
    return None if found is None or found.shape is None else list(found.shape)


def _shown(dims: Sequence[Dim] | None) -> str:
    if dims is None:
        return "no declared shape"
    return "[" + ", ".join("-1" if not isinstance(d, int) else str(d) for d in dims) + "]"


def _names(values: Iterable[str]) -> str:
    return ", ".join(f"'{n}'" for n in values) or "none"


def _reshape(source: str, target: str, shape: Sequence[int]) -> list[onnx.NodeProto]:
    """Nodes making `target` as `source` in `shape` (a Constant, not an initializer: an
    IR 3 file would need it listed among its inputs too)."""
    const = f"{target}__shape"
    value = numpy_helper.from_array(np.array(shape, dtype=np.int64), const)
    return [
        helper.make_node("Constant", [], [const], name=const, value=value),
        helper.make_node("Reshape", [source, const], [target], name=f"{target}__reshape"),
    ]


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every use and definition of value `old` in `graph` (and its subgraphs) as `new`."""
    for node in graph.node:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                if name == old:
                    names[index] = new
        for attribute in node.attribute:
            for sub in (attribute.g, *attribute.graphs):
                _rename(sub, old, new)
    for info in graph.value_info:
        if info.name == old:
            info.name = new


def _set_dims(
    values: Iterable[onnx.ValueInfoProto], name: str, dims: Sequence[int], batched: bool
) -> None:
    for vi in values:
        if vi.name != name:
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        if batched:
            shape.dim.add().dim_param = BATCH
        for size in dims:
            shape.dim.add().dim_value = size
