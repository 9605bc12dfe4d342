"""Sample models for tests and demos: an MLP built as a NEFF, with a numpy reference.

`build_mlp` spreads the layers over Neuron nodes and their stages (as evenly as possible)
and optionally runs the final Softmax as a CPU node. Tensor names: input "x", layer i's
output "act<i>" (hidden) or "logits" (last), and the model output "probs"; layer i's
weights are "w<i>" (in, out) and "b<i>" (out,).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from collections.abc import Mapping, Sequence

import numpy as np

from neuron_rtd.neff.builder import InstructionLike, NeffBuilder, StageSpec
from neuron_rtd.neff.dtypes import parse_dtype
from neuron_rtd.neff.model import NodeKind, TensorSpec

FLOAT_DTYPES = ("float16", "float32", "float64")
INPUT = "x"
LOGITS = "logits"
OUTPUT = "probs"


@dataclasses.dataclass(frozen=True, eq=False)
class SampleModel:
    """A built sample NEFF plus what is needed to check a runtime's answers."""

    neff: bytes
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weights: Mapping[str, np.ndarray]
    sizes: tuple[int, ...]

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {
            spec.name: rng.standard_normal(spec.shape).astype(spec.dtype) for spec in self.inputs
        }

    def reference(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The forward pass in float64 numpy, cast to the output dtype."""
        spec = self.inputs[0]
        x = np.asarray(inputs[spec.name])
        if x.shape != spec.shape:
            raise ValueError(f"input {spec.name!r} has shape {x.shape}, expected {spec.shape}")
        h = x.astype(np.float64)
        layers = len(self.sizes) - 1
        for i in range(layers):
            w, b = self.weights[f"w{i}"], self.weights[f"b{i}"]
            h = h @ w.astype(np.float64) + b.astype(np.float64)
            if i < layers - 1:
                h = np.maximum(h, 0.0)
        out = self.outputs[0]
        return {out.name: softmax(h).astype(out.dtype)}


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def build_mlp(
    sizes: Sequence[int] = (784, 128, 10),
    *,
    batch: int = 1,
    seed: int = 0,
    neuron_nodes: int = 1,
    stages_per_node: int = 1,
    cpu_softmax: bool = False,
    gzip: bool = False,
    dtype: str = "float32",
    name: str = "mlp",
) -> SampleModel:
    """An MLP NEFF needing neuron_nodes * stages_per_node NCs in normal mode."""
    sizes = tuple(sizes)
    _check_mlp_args(sizes, batch, neuron_nodes, stages_per_node, dtype)
    layers = len(sizes) - 1
    weights = _mlp_weights(sizes, seed, dtype)
    groups = split_evenly(layers, neuron_nodes * stages_per_node)
    stages = [_stage(group, layers, weights, cpu_softmax) for group in groups]
    builder = NeffBuilder(name)
    builder.add_input(INPUT, dtype, (batch, sizes[0]))
    builder.add_output(OUTPUT, dtype, (batch, sizes[-1]))
    for stage in stages:
        for tensor in (*(stage.inputs or ()), *(stage.outputs or ())):
            builder.add_tensor(tensor, dtype, (batch, sizes[_width_index(tensor, layers)]))
    _add_nodes(builder, stages, stages_per_node, cpu_softmax)
    element = parse_dtype(dtype, "dtype")
    return SampleModel(
        neff=builder.build(gzip=gzip),
        name=name,
        inputs=(TensorSpec(INPUT, element, (batch, sizes[0])),),
        outputs=(TensorSpec(OUTPUT, element, (batch, sizes[-1])),),
        weights=types.MappingProxyType(weights),
        sizes=sizes,
    )


def _add_nodes(
    builder: NeffBuilder, stages: list[StageSpec], stages_per_node: int, cpu_softmax: bool
) -> None:
    """Neuron node n takes stages [n*stages_per_node, (n+1)*stages_per_node)."""
    for n, first in enumerate(range(0, len(stages), stages_per_node)):
        own = stages[first : first + stages_per_node]
        inputs, outputs = own[0].inputs or (), own[-1].outputs or ()
        builder.add_node(f"neuron{n}", NodeKind.NEURON, inputs, outputs, own)
    if cpu_softmax:
        softmax_stage = StageSpec(instructions=[_softmax_instruction()])
        builder.add_node("softmax", NodeKind.CPU, [LOGITS], [OUTPUT], [softmax_stage])


def _check_mlp_args(
    sizes: tuple[int, ...], batch: int, neuron_nodes: int, stages_per_node: int, dtype: str
) -> None:
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"an MLP needs at least 2 positive sizes, got {sizes}")
    if batch < 1 or neuron_nodes < 1 or stages_per_node < 1:
        raise ValueError(
            f"batch ({batch}), neuron_nodes ({neuron_nodes}) and stages_per_node "
            f"({stages_per_node}) must be at least 1"
        )
    layers, stages = len(sizes) - 1, neuron_nodes * stages_per_node
    if layers < stages:
        raise ValueError(
            f"{layers} layers cannot fill {neuron_nodes} nodes x {stages_per_node} stages "
            f"= {stages} stages"
        )
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")


def split_evenly(count: int, parts: int) -> list[range]:
    """`range(count)` cut into `parts` contiguous runs whose lengths differ by at most 1."""
    base, extra = divmod(count, parts)
    runs, start = [], 0
    for part in range(parts):
        length = base + (1 if part < extra else 0)
        runs.append(range(start, start + length))
        start += length
    return runs


def _mlp_weights(sizes: tuple[int, ...], seed: int, dtype: str) -> dict[str, np.ndarray]:
    """He-scaled weights (plain 1/fan-in for the last layer) and small biases, read-only."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    last = len(sizes) - 2
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        gain = 1.0 if i == last else 2.0
        w = rng.standard_normal((fan_in, fan_out)) * math.sqrt(gain / fan_in)
        b = rng.standard_normal(fan_out) * 0.1
        weights[f"w{i}"] = w.astype(dtype)
        weights[f"b{i}"] = b.astype(dtype)
    for array in weights.values():
        array.flags.writeable = False
    return weights


def _layer_input(layer: int) -> str:
    return INPUT if layer == 0 else f"act{layer - 1}"


def _layer_output(layer: int, layers: int) -> str:
    return LOGITS if layer == layers - 1 else f"act{layer}"


def _width_index(tensor: str, layers: int) -> int:
    """Which entry of `sizes` is the width of boundary tensor `tensor`."""
    if tensor == INPUT:
        return 0
    if tensor in (LOGITS, OUTPUT):
        return layers
    return int(tensor.removeprefix("act")) + 1


def _stage(
    group: range, layers: int, weights: Mapping[str, np.ndarray], cpu_softmax: bool
) -> StageSpec:
    instructions: list[InstructionLike] = []
    for i in group:
        instructions.extend(_layer_instructions(i, layers))
    output = _layer_output(group[-1], layers)
    if output == LOGITS and not cpu_softmax:
        instructions.append(_softmax_instruction())
        output = OUTPUT
    names = [f"{kind}{i}" for i in group for kind in ("w", "b")]
    return StageSpec(
        instructions=instructions,
        weights={key: weights[key] for key in names},
        inputs=[_layer_input(group[0])],
        outputs=[output],
    )


def _layer_instructions(layer: int, layers: int) -> list[InstructionLike]:
    src, out = _layer_input(layer), _layer_output(layer, layers)
    matmul, pre = f"mm{layer}", f"pre{layer}"
    if layer == layers - 1:
        return [("MatMul", [src, f"w{layer}"], [matmul]), ("Add", [matmul, f"b{layer}"], [out])]
    return [
        ("MatMul", [src, f"w{layer}"], [matmul]),
        ("Add", [matmul, f"b{layer}"], [pre]),
        ("Relu", [pre], [out]),
    ]


def _softmax_instruction() -> InstructionLike:
    return ("Softmax", [LOGITS], [OUTPUT], {"axis": -1})


def build_relu(
    shape: Sequence[int],
    *,
    name: str = "relu",
    dtype: str = "float32",
    version: tuple[int, int] | None = None,
) -> bytes:
    """A weightless one-node NEFF, y = Relu(x): its size is all I/O, so a large `shape`
    makes a model whose DRAM is all I/O buffers. `version` stamps another NEFF version."""
    b = NeffBuilder(name)
    b.add_input("x", dtype, shape)
    b.add_output("y", dtype, shape)
    b.add_node("nc0", "neuron", ["x"], ["y"], [StageSpec(instructions=[("Relu", ["x"], ["y"])])])
    return b.build() if version is None else b.build(version=version)
