"""Programs for a NeuronCore: what a caller hands in (`NcProgram` of `Instr`), and what
loading makes of it (`LoadedProgram`): validated instructions resolved to a flat list of
steps over numbered tensor slots, plus the per-run counter totals.

Loading checks every instruction (known op, arity, attributes) and the dataflow (each
input defined before use, each name defined once, every program output defined), so a
run does no name lookups beyond its inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from driver_sim import autocast
from driver_sim.cost import Engine, engine_cycles, side_cycles
from driver_sim.errors import KernelError
from driver_sim.ops import KERNELS, ComputeFn, Kernel, Shape
from driver_sim.stats import NC_FIELD, NC_FIELDS, SLOT_DTYPE

if TYPE_CHECKING:
    from driver_sim.fast import FastProgram

ABSENT = ""  # an input name that leaves an optional input out
MAX_CACHED_COSTS = 1024  # input-shape sets whose run cost a program remembers
# Ops whose output shape can depend on the values (not only the shapes) of their inputs.
VALUE_SHAPED_OPS = frozenset(
    {
        "Reshape",
        "Slice",
        "Range",
        "ConstantOfShape",
        "Expand",
        "Tile",
        "TopK",
        "Split",
        "Squeeze",
        "Unsqueeze",
        "Pad",
        "Resize",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL2",
        "ReduceL1",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "CenterCropPad",
        "AffineGrid",
        "OneHot",
        "Compress",
        "Unique",
        "Col2Im",
        "MaxUnpool",
        "NonZero",
        "NonMaxSuppression",
    }
)


class Instr(NamedTuple):
    """One instruction: `op` reads the tensors named `inputs`, writes those in `outputs`."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = {}


@dataclass(frozen=True)
class NcProgram:
    """What a NeuronCore runs: instructions, constant weights, and the named I/O."""

    instructions: Sequence[Instr]
    weights: Mapping[str, np.ndarray]
    inputs: Sequence[str]
    outputs: Sequence[str]
    opset: int | None = None  # the ONNX opset its ops' attributes follow (None: unknown)
    auto_cast: str = "none"  # fp32 ops computed in `auto_cast_type`: none, matmult, all
    auto_cast_type: str = "bf16"  # bf16 or fp16, accumulating in fp32
    # The dtype and shape of each input, when the caller knows them (a rank, or None for an
    # axis, where any size is fed): the fast engine then prepares the program as it loads,
    # not at its first run, for those sizes (onnxruntime fuses more when it knows them).
    input_types: Sequence[tuple[Any, int | tuple[int | None, ...]]] | None = None


class Step(NamedTuple):
    """A resolved instruction: call `fn` on slots `inputs`, store into slots `outputs`
    (`multi`: `fn` returns a tuple, of which the first len(outputs) are kept)."""

    fn: ComputeFn
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    multi: bool = False


@dataclass(frozen=True)
class RunCost:
    """Counter increments of one run: NC_FIELDS slots (busy_ns 0) and engine cycles."""

    nc_totals: np.ndarray
    engine_cycles: np.ndarray

    cycles: int = field(init=False)  # the run's cycles: its busiest engine's

    def __post_init__(self) -> None:
        object.__setattr__(self, "cycles", int(self.engine_cycles.max(initial=0)))


@dataclass(eq=False)
class LoadedProgram:
    """A program resolved for one NeuronCore (`owner` is that core)."""

    owner: object
    program: NcProgram
    steps: tuple[Step, ...]
    kernels: tuple[Kernel, ...]
    attrs: tuple[Mapping[str, Any], ...]
    template: list[Any]
    input_slots: tuple[tuple[str, int], ...]
    output_slots: tuple[tuple[str, int, int | None], ...]
    static_totals: np.ndarray
    value_shaped: tuple[int, ...] = ()  # output slots of ops shaped by input values
    # Per step, the slots no later step reads: a run frees them right after the step.
    release: tuple[tuple[int, ...], ...] = ()
    costs: dict[tuple[Shape, ...], RunCost] = field(default_factory=dict)
    fast: FastProgram | None = None  # the fast engine's form of it, when it has one

    def cost_of(
        self, key: tuple[Shape, ...], env: list[Any], freed: Mapping[int, Shape]
    ) -> RunCost:
        """The counter increments of a run whose inputs had shapes `key`; `env` holds
        that run's tensors and `freed` the shapes of those it released, from which the
        first run of each shape set is measured. The outputs of ops whose shape depends
        on input values are part of the key."""
        if self.value_shaped:
            key = key + tuple(_slot_shape(s, env, freed) for s in self.value_shaped)
        cost = self.costs.get(key)
        if cost is None:
            cost = _measure(self, env, freed)
            if len(self.costs) < MAX_CACHED_COSTS:
                self.costs[key] = cost
        return cost


def _shape(value: Any) -> Shape:
    return () if value is None else tuple(np.shape(value))


def _slot_shape(slot: int, env: list[Any], freed: Mapping[int, Shape]) -> Shape:
    shape = freed.get(slot)
    return _shape(env[slot]) if shape is None else shape


def _measure(loaded: LoadedProgram, env: list[Any], freed: Mapping[int, Shape]) -> RunCost:
    totals = loaded.static_totals.copy()
    cycles = np.zeros(len(Engine), dtype=SLOT_DTYPE)
    for step, kern, attrs in zip(loaded.steps, loaded.kernels, loaded.attrs, strict=True):
        ins = [_slot_shape(s, env, freed) for s in step.inputs]
        outs = [_slot_shape(s, env, freed) for s in step.outputs]
        macs = kern.macs(ins, outs, attrs)
        elements = sum(int(np.prod(shape)) for shape in outs)
        totals[NC_FIELD["macs"]] += macs
        cycles[kern.engine] += engine_cycles(kern.engine, macs, elements)
        if kern.side_work is not None:
            for engine, (count, written) in kern.side_work(ins, outs, attrs).items():
                for name in _INSTR_FIELDS[engine]:
                    totals[NC_FIELD[name]] += count
                cycles[engine] += side_cycles(engine, count, written)
    return RunCost(totals, cycles)


# The instruction counters an instruction on each engine adds to.
_INSTR_FIELDS = {
    Engine.PE: ("pe_executed_instr", "pe_matmul_executed_instr"),
    Engine.ACT: ("act_executed_instr",),
    Engine.POOL: ("pool_executed_instr",),
}


def _static_totals(kernels: Sequence[Kernel]) -> np.ndarray:
    totals = np.zeros(len(NC_FIELDS), dtype=SLOT_DTYPE)
    for kern in kernels:
        for name in _INSTR_FIELDS[kern.engine]:
            totals[NC_FIELD[name]] += 1
        totals[NC_FIELD["sb_rmw_count"]] += kern.read_modify_write
    totals[NC_FIELD["runs"]] = 1
    return totals


class _Resolver:
    """Assigns slots to tensor names while checking the dataflow."""

    def __init__(self) -> None:
        self.slots: dict[str, int] = {ABSENT: 0}
        self.producer: dict[str, int] = {}

    def define(self, name: str, what: str, index: int | None = None, op: str = "") -> int:
        if name in self.slots:
            raise KernelError(f"{what} {name!r} is already defined", op=op or None, index=index)
        self.slots[name] = len(self.slots)
        if index is not None:
            self.producer[name] = index
        return self.slots[name]

    def use(self, name: str, index: int, op: str) -> int:
        if name not in self.slots:
            raise KernelError(f"input {name!r} is not defined before use", op=op, index=index)
        return self.slots[name]


def _check_instr(index: int, instr: Instr) -> tuple[Kernel, dict[str, Any]]:
    kern = KERNELS.get(instr.op)
    if kern is None:
        raise KernelError(f"unknown op {instr.op!r}", op=instr.op, index=index)
    count = len(instr.inputs)
    if not kern.min_inputs <= count <= kern.max_inputs:
        wanted = (
            f"{kern.min_inputs}"
            if kern.min_inputs == kern.max_inputs
            else f"{kern.min_inputs}..{kern.max_inputs}"
        )
        raise KernelError(f"takes {wanted} inputs, got {count}", op=instr.op, index=index)
    if not kern.min_outputs <= len(instr.outputs) <= kern.max_outputs:
        wanted = (
            f"{kern.min_outputs}"
            if kern.min_outputs == kern.max_outputs
            else f"{kern.min_outputs}..{kern.max_outputs}"
        )
        raise KernelError(
            f"produces {wanted} output(s), got {len(instr.outputs)} names",
            op=instr.op,
            index=index,
        )
    try:
        return kern, kern.parse_attrs(instr.attrs or {})
    except ValueError as exc:
        raise KernelError(str(exc), op=instr.op, index=index) from None


def load_program(owner: object, program: NcProgram) -> LoadedProgram:
    """Validate `program` and resolve it for `owner`; KernelError says what is wrong."""
    autocast.check(program.auto_cast, program.auto_cast_type)
    resolver = _Resolver()
    template: list[Any] = [None]
    weights = {name: np.asarray(value) for name, value in program.weights.items()}
    for name, value in weights.items():
        resolver.define(name, "weight")
        template.append(value)
    input_slots = tuple((name, resolver.define(name, "program input")) for name in program.inputs)
    template.extend([None] * len(input_slots))
    steps: list[Step] = []
    kernels: list[Kernel] = []
    attrs: list[Mapping[str, Any]] = []
    for index, raw in enumerate(program.instructions):
        instr = Instr(*raw)
        kern, values = _check_instr(index, instr)
        ins = tuple(resolver.use(name, index, instr.op) for name in instr.inputs)
        outs = tuple(_define_output(resolver, name, index, instr.op) for name in instr.outputs)
        template.extend([None] * len(outs))
        fn = kern.bind(values)
        if autocast.casts(instr.op, program.auto_cast):
            fn = autocast.rounding(fn, program.auto_cast_type)
        steps.append(Step(fn, ins, outs, kern.multi_output))
        kernels.append(kern)
        attrs.append(values)
    output_slots = tuple(
        (name, _program_output_slot(resolver, name), resolver.producer.get(name))
        for name in program.outputs
    )
    value_shaped = tuple(
        slot
        for step, kern in zip(steps, kernels, strict=True)
        if kern.op in VALUE_SHAPED_OPS
        for slot in step.outputs
    )
    return LoadedProgram(
        owner=owner,
        value_shaped=value_shaped,
        release=_releases(steps, {slot for _, slot, _ in output_slots}, len(template)),
        program=program,
        steps=tuple(steps),
        kernels=tuple(kernels),
        attrs=tuple(attrs),
        template=template,
        input_slots=input_slots,
        output_slots=output_slots,
        static_totals=_static_totals(kernels),
    )


def _releases(
    steps: Sequence[Step], keep: set[int], slot_count: int
) -> tuple[tuple[int, ...], ...]:
    """Per step, the intermediate slots whose last reader (or, for those never read, whose
    producer) it is: program outputs, inputs and weights are never released."""
    last: dict[int, int] = {}
    for index, step in enumerate(steps):
        for slot in step.outputs:
            last[slot] = index
        for slot in step.inputs:
            if slot in last:
                last[slot] = index
    release: list[list[int]] = [[] for _ in steps]
    for slot, index in last.items():
        if slot not in keep and slot < slot_count:
            release[index].append(slot)
    return tuple(tuple(slots) for slots in release)


def _define_output(resolver: _Resolver, name: str, index: int, op: str) -> int:
    """The slot of an instruction output; an ABSENT name (an optional output left out)
    gets a scratch slot of its own."""
    if name == ABSENT:
        resolver.slots[f"\0absent{len(resolver.slots)}"] = len(resolver.slots)
        return len(resolver.slots) - 1
    return resolver.define(name, "output", index, op)


def _program_output_slot(resolver: _Resolver, name: str) -> int:
    slot = resolver.slots.get(name)
    if slot is None or name == ABSENT:
        raise KernelError(f"program output {name!r} is not produced by any instruction")
    return slot
