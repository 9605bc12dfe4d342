"""An ensemble's config (`platform: "ensemble"`, `ensemble_scheduling { step [...] }`), as
Triton checks it, in two stages:

- its own fields, before anything is loaded (`check_ensemble_fields`): no backend, no
  instance_group, optimization, model_warmup or batching of its own; its inputs and
  outputs declared in full (name, data_type, dims); every step naming a model and
  mapping its inputs and outputs; and the flow of its tensors (`Plan`): every tensor a
  step reads is an input of the ensemble or an output of another step, no two steps
  write one tensor, the steps form no cycle, every output of the ensemble is written,
  every input read, and every tensor a step writes read or returned;
- against its composing models once they are loaded (`check_steps`): each step's model
  there (the version it names, or any), its inputs all mapped and its map naming only
  inputs and outputs it has, every tensor of one data type and of agreeing dims wherever
  it is met, and no composing model batching fewer rows than the ensemble's
  max_batch_size; no ensemble composed, through its steps, of itself.

A refusal starts with Triton's words for it (scripts match them), then says more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from neuron_rtd.errors import shown
from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.datatypes import config_type_name, datatype_of_config

ModelConfig = model_config_pb.ModelConfig

ENSEMBLE = "ensemble"  # the platform of an ensemble


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == ENSEMBLE


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class EnsembleStep:
    """One step: model `model`, version `version` (-1: its newest ready one), its inputs
    read from ensemble tensors and its outputs written to them ((model's name, ensemble
    tensor) pairs, sorted by the model's name)."""

    number: int  # 1-based, as messages count steps
    model: str
    version: int
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]

    @property
    def what(self) -> str:
        return f"step {self.number} (model '{self.model}')"

    @property
    def version_text(self) -> str:
        """The version as a request names it ("" for the newest)."""
        return str(self.version) if self.version > 0 else ""


@dataclass(frozen=True)
class Plan:
    """The steps and how tensors flow between them: `order` runs every step after those
    it reads from; `waits[i]` is how many distinct tensors step i reads from other steps,
    `readers[t]` the steps reading tensor t (`first`: the steps that read only the
    ensemble's inputs)."""

    steps: tuple[EnsembleStep, ...]
    order: tuple[int, ...]
    waits: tuple[int, ...]
    readers: dict[str, tuple[int, ...]]
    first: tuple[int, ...]


# --- its own fields --------------------------------------------------------------------
def check_ensemble_fields(config: ModelConfig, name: str, source: str) -> Plan:
    """Refuse what Triton refuses of an ensemble's own config (before any load); its
    plan when nothing is wrong."""
    if not is_ensemble(config):
        raise _invalid(
            f"{source}: ensemble scheduling cannot be set for model '{name}' whose platform "
            f"is not {ENSEMBLE} (it is '{config.platform}'): an ensemble's platform is "
            f"'{ENSEMBLE}'"
        )
    if config.name and config.name != name:
        raise _invalid(
            f"{source}: name '{shown(config.name)}', but the model's directory is '{name}'"
        )
    if config.backend:
        raise _invalid(
            f"Ensemble model '{name}' must have platform type '{ENSEMBLE}' and empty backend "
            f"type ({source} gives backend '{config.backend}')"
        )
    if not config.HasField("ensemble_scheduling"):
        raise _invalid(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE} ({source}: add ensemble_scheduling {{ step [...] }})"
        )
    own = {
        "instance_group": "instance group should not be specified",
        "optimization": "optimization should not be specified",
        "model_warmup": "model_warmup can not be specified",
        "dynamic_batching": "dynamic_batching can not be specified",
    }
    for field, words in own.items():
        value = getattr(config, field)
        if config.HasField(field) if field in ("optimization", "dynamic_batching") else value:
            raise _invalid(
                f"{words} for ensemble '{name}' ({source}): an ensemble runs no model of its "
                "own; set it on its composing models"
            )
    if config.max_batch_size < 0:
        raise _invalid(f"{source}: max_batch_size {config.max_batch_size} is negative")
    if config.model_transaction_policy.decoupled:
        raise _invalid(
            f"{source}: ensemble '{name}' sets model_transaction_policy decoupled, and no "
            "step here answers more than once (a NEFF answers each request once)"
        )
    if config.ensemble_scheduling.max_inflight_requests:
        raise _invalid(
            f"{source}: ensemble_scheduling max_inflight_requests is not supported: it bounds "
            "what decoupled steps queue, and no NEFF answers twice (each step here runs "
            "once per request)"
        )
    if config.batch_input or config.batch_output:
        raise _invalid(f"{source}: batch_input and batch_output are not supported")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        if not tensors:
            raise _invalid(f"{source}: ensemble '{name}' declares no {kind}: declare each")
        for tensor in tensors:
            _check_declared(tensor, kind, name, source)
    return plan_of(config, name)


def _check_declared(
    tensor: model_config_pb.ModelInput | model_config_pb.ModelOutput,
    kind: str,
    name: str,
    source: str,
) -> None:
    """An ensemble's input or output is declared in full: no model tells what it is."""
    if not tensor.name:
        raise _invalid(f"{source}: an {kind} of ensemble '{name}' must specify 'name'")
    what = f"{source}: {kind} '{tensor.name}' of ensemble '{name}'"
    if not tensor.data_type:
        raise _invalid(f"{what} must specify 'data_type'")
    try:
        datatype_of_config(tensor.data_type)
    except ServingError as exc:
        raise _invalid(f"{what}: {exc.message}") from None
    if not tensor.dims:
        raise _invalid(f"{what} must specify 'dims'")
    if any(d < -1 or d == 0 for d in tensor.dims):
        raise _invalid(f"{what}: dims {_dims(tensor.dims)} (each > 0, or -1 for any size)")
    if tensor.HasField("reshape") or tensor.is_shape_tensor:
        raise _invalid(f"{what} sets reshape or is_shape_tensor, which ensembles here do not")
    if isinstance(tensor, model_config_pb.ModelInput) and (
        tensor.optional or tensor.allow_ragged_batch
    ):
        raise _invalid(f"{what} sets optional or allow_ragged_batch, which ensembles here do not")


def plan_of(config: ModelConfig, name: str) -> Plan:
    """The steps of ensemble `name` and the flow of its tensors, or INVALID_ARGUMENT naming
    the step and tensor that break it."""
    steps = tuple(
        _step(entry, number, name)
        for number, entry in enumerate(config.ensemble_scheduling.step, start=1)
    )
    if not steps:
        raise _invalid(f"must specify 'step' for ensemble '{name}'")
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    writer: dict[str, EnsembleStep] = {}
    for step in steps:
        for _, tensor in step.outputs:
            if tensor in writer:
                raise _invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {step.number} ({writer[tensor].what} writes it "
                    "already)"
                )
            if tensor in inputs:
                raise _invalid(
                    f"in ensemble '{name}', {step.what} writes tensor '{tensor}', which is an "
                    "input of the ensemble: a tensor has one source"
                )
            writer[tensor] = step
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for _, tensor in step.inputs:
            if tensor not in writer and tensor not in inputs:
                raise _invalid(
                    f"in ensemble '{name}', ensemble tensor '{tensor}' is not connected: "
                    f"{step.what} reads it, and it is neither an input of the ensemble "
                    f"({', '.join(inputs)}) nor written by any step's output_map"
                )
            if index not in readers.setdefault(tensor, []):
                readers[tensor].append(index)
    order = _order(steps, writer, name)
    for tensor in inputs:
        if tensor not in readers:
            raise _invalid(
                f"ensemble input '{tensor}' for ensemble {name}' is not used: no step's "
                "input_map reads it"
            )
    for tensor in outputs:
        if tensor not in writer:
            raise _invalid(
                f"output '{tensor}' for ensemble '{name}' is not written: no step's "
                "output_map names it"
            )
    for tensor, step in writer.items():
        if tensor not in readers and tensor not in outputs:
            raise _invalid(
                f"ensemble tensor '{tensor}' is unused in ensemble '{name}': {step.what} "
                "writes it, and no step reads it nor is it an output of the ensemble"
            )
    waits = tuple(len({t for _, t in step.inputs if t in writer}) for step in steps)
    return Plan(
        steps=steps,
        order=order,
        waits=waits,
        readers={t: tuple(r) for t, r in readers.items()},
        first=tuple(i for i in range(len(steps)) if not waits[i]),
    )


def _step(entry: model_config_pb.ModelEnsembling.Step, number: int, name: str) -> EnsembleStep:
    where = f"step {number} of ensemble '{name}'"
    if not entry.model_name:
        raise _invalid(f"must specify 'model_name' in {where}")
    if not entry.input_map:
        raise _invalid(f"must specify 'input_map' in {where}")
    if not entry.output_map:
        raise _invalid(f"must specify 'output_map' in {where}")
    if entry.model_namespace:
        raise _invalid(f"{where}: model_namespace is not supported (one repository)")
    if entry.model_version < -1 or entry.model_version == 0:
        raise _invalid(
            f"{where}: model_version {entry.model_version} (a version number, or -1 for the "
            "newest ready one)"
        )
    return EnsembleStep(
        number=number,
        model=entry.model_name,
        version=entry.model_version,
        inputs=tuple(sorted(entry.input_map.items())),
        outputs=tuple(sorted(entry.output_map.items())),
    )


def _order(
    steps: Sequence[EnsembleStep], writer: dict[str, EnsembleStep], name: str
) -> tuple[int, ...]:
    """The steps in an order where each comes after the steps it reads from; a cycle is
    refused, naming its tensors."""
    index = {id(step): i for i, step in enumerate(steps)}
    after = [{index[id(writer[t])] for _, t in step.inputs if t in writer} for step in steps]
    order: list[int] = []
    placed: set[int] = set()
    while len(order) < len(steps):
        free = [i for i in range(len(steps)) if i not in placed and after[i] <= placed]
        if not free:
            raise _invalid(_cycle(steps, after, placed, writer, name))
        order.extend(free)
        placed.update(free)
    return tuple(order)


def _cycle(
    steps: Sequence[EnsembleStep],
    after: list[set[int]],
    placed: set[int],
    writer: dict[str, EnsembleStep],
    name: str,
) -> str:
    """Triton's words for a tensor that cannot be written, and the cycle it is in."""
    path = [min(i for i in range(len(steps)) if i not in placed)]
    while True:  # from a step to one it reads from, until a step comes round again
        previous = min(j for j in after[path[-1]] if j not in placed)
        if previous in path:
            loop = path[path.index(previous) :]
            break
        path.append(previous)
    flow = [steps[i] for i in reversed(loop)]  # each writes a tensor the next one reads
    first = flow.index(min(flow, key=lambda s: s.number))
    flow = flow[first:] + flow[:first]  # told from its first step
    hops = []
    for k, step in enumerate(flow):
        reads = {t for _, t in flow[(k + 1) % len(flow)].inputs}
        tensor = next(t for _, t in step.outputs if t in reads and writer.get(t) is step)
        hops.append(f"{step.what} -> '{tensor}'")
    tensor = hops[0].rpartition(" -> ")[2]
    return (
        f"in ensemble '{name}', ensemble tensor {tensor} is not written: its steps form a "
        f"cycle ({' -> '.join(hops)} -> {flow[0].what}); a step can only read tensors the "
        "ensemble's inputs lead to"
    )


def complete_ensemble(user: ModelConfig, name: str) -> ModelConfig:
    """An ensemble's config as served: the user's, named, with Triton's default version
    policy (its inputs and outputs are the user's: no model file tells them)."""
    config = ModelConfig()
    config.CopyFrom(user)
    config.name = name
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    elif config.version_policy.WhichOneof("policy_choice") == "latest":
        latest = config.version_policy.latest
        latest.num_versions = max(latest.num_versions, 1)
    return config


# --- against its composing models -----------------------------------------------------------
# A composing model's config for (name, version -1 or a number), or ServingError saying
# why there is none; and the steps of an ensemble among them, to follow them for cycles.
Lookup = Callable[[str, int], ModelConfig]


@dataclass
class _StepTensor:
    """What an ensemble tensor is, as first met: its data type and dims, from `origin`."""

    data_type: int
    dims: tuple[int, ...]
    full: tuple[int, ...]  # with the batch axis, when `origin` batches
    origin: str

    @classmethod
    def of(cls, data_type: int, dims: Sequence[int], batching: bool, origin: str) -> _StepTensor:
        own = tuple(int(d) for d in dims)
        return cls(data_type, own, (-1, *own) if batching else own, origin)


def check_steps(config: ModelConfig, plan: Plan, name: str, lookup: Lookup) -> None:
    """Ensemble `name` against its composing models (`lookup`): INVALID_ARGUMENT (or what
    the lookup raises) naming the step, model and tensor that do not fit."""
    batching = config.max_batch_size > 0
    tensors: dict[str, _StepTensor] = {}
    for entries in (config.input, config.output):
        for entry in entries:
            tensors[entry.name] = _StepTensor.of(entry.data_type, entry.dims, batching, f"'{name}'")
    for step in plan.steps:
        composing = lookup(step.model, step.version)
        _check_cycle(name, step.model, composing, lookup, [name])
        size = composing.max_batch_size
        if size != 0 and size < config.max_batch_size:
            raise _invalid(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model} which only allows maximum batch size to be "
                f"{size}"
            )
        own_inputs = {t.name: t for t in composing.input}
        own_outputs = {t.name: t for t in composing.output}
        origin = f"'{step.model}'"
        for key, tensor in step.inputs:
            if key not in own_inputs:
                raise _invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {key} in model {step.model} (its inputs: {', '.join(own_inputs)})"
                )
        mapped = {key for key, _ in step.inputs}
        for key, entry in own_inputs.items():
            if key not in mapped and not entry.optional:
                raise _invalid(
                    f"in ensemble {name}, input {key} in model {step.model} is not mapped to "
                    f"any ensemble tensors ({step.what}: add it to its input_map)"
                )
        for key, tensor in step.outputs:
            if key not in own_outputs:
                raise _invalid(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from "
                    f"non-existing output {key} in model {step.model} (its outputs: "
                    f"{', '.join(own_outputs)})"
                )
        step_batching = size > 0
        for key, tensor in step.inputs:
            entry = own_inputs[key]
            met = _StepTensor.of(entry.data_type, entry.dims, step_batching, origin)
            _agree(tensors, tensor, met, name)
        for key, tensor in step.outputs:
            out = own_outputs[key]
            met = _StepTensor.of(out.data_type, out.dims, step_batching, origin)
            _agree(tensors, tensor, met, name)


def _agree(tensors: dict[str, _StepTensor], tensor: str, met: _StepTensor, name: str) -> None:
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = met
        return
    where = f"in ensemble {name}, ensemble tensor {tensor}: "
    if known.data_type != met.data_type:
        raise _invalid(
            f"{where}inconsistent data type: {config_type_name(known.data_type)} is inferred "
            f"from model {known.origin} while {config_type_name(met.data_type)} is inferred "
            f"from model {met.origin}"
        )
    if not _same_dims(known.dims, met.dims) and not _same_dims(known.full, met.full):
        raise _invalid(
            f"{where}inconsistent shape: {_dims(known.full)} is inferred from model "
            f"{known.origin} while {_dims(met.full)} is inferred from model {met.origin}"
        )


def _same_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _check_cycle(
    name: str, model: str, composing: ModelConfig, lookup: Lookup, path: list[str]
) -> None:
    """An ensemble composed, through its steps' ensembles, of itself is refused."""
    if model == name:
        chain = " -> ".join([*path, model])
        raise _invalid(
            f"circular dependency between ensembles: {name} -> ... -> {path[-1]} -> {model} "
            f"({chain})"
        )
    if not is_ensemble(composing) or model in path:
        return
    for entry in composing.ensemble_scheduling.step:
        try:
            inner = lookup(entry.model_name, entry.model_version or -1)
        except ServingError:
            continue  # that ensemble's own check says so
        _check_cycle(name, entry.model_name, inner, lookup, [*path, model])


def step_models(config: ModelConfig) -> tuple[str, ...]:
    """The composing models an ensemble's config names, once each, in step order."""
    return tuple(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def _dims(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
