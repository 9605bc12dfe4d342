"""The in-memory form of a NEFF: a graph of Neuron and CPU nodes, each a chain of stages.

Everything is immutable: mappings are read-only proxies and weights are read-only numpy
views into the buffer the NEFF was read from.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from neuron_rtd.neff.header import NeffHeader


class NodeKind(enum.StrEnum):
    NEURON = "neuron"
    CPU = "cpu"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)

    def describe(self) -> str:
        """`float32 (1, 784)`: the dtype and shape, for messages."""
        return f"{self.dtype.name} {self.shape}"


@dataclasses.dataclass(frozen=True)
class Instruction:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
    """One NC's program: its boundary tensors, instructions and (read-only) weights."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    instructions: tuple[Instruction, ...]
    weights: Mapping[str, np.ndarray]

    @property
    def weight_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stage):
            return NotImplemented
        return (
            self.inputs == other.inputs
            and self.outputs == other.outputs
            and self.instructions == other.instructions
            and _same_weights(self.weights, other.weights)
        )

    __hash__ = None  # type: ignore[assignment]


def _same_weights(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    if list(a) != list(b):
        return False
    return all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k])
        for k in a
    )


@dataclasses.dataclass(frozen=True)
class Node:
    """A Neuron node runs stage j on its j-th NC; a CPU node has one stage, run on the host."""

    name: str
    kind: NodeKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stages: tuple[Stage, ...]

    @property
    def nc_count(self) -> int:
        return len(self.stages) if self.kind == NodeKind.NEURON else 0

    @property
    def weight_bytes(self) -> int:
        return sum(stage.weight_bytes for stage in self.stages)


@dataclasses.dataclass(frozen=True)
class Neff:
    """A read and validated NEFF. `buffer` is what it was read from (kept alive for views)."""

    header: NeffHeader
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tensors: Mapping[str, TensorSpec]
    nodes: tuple[Node, ...]
    buffer: memoryview | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def nc_count(self) -> int:
        """NCs needed in normal mode: the sum over Neuron nodes."""
        return sum(node.nc_count for node in self.nodes)

    @property
    def max_node_ncs(self) -> int:
        """The NCs of the largest Neuron node (0 when there is none)."""
        return max((node.nc_count for node in self.neuron_nodes), default=0)

    @property
    def weight_bytes(self) -> int:
        return sum(node.weight_bytes for node in self.nodes)

    @property
    def neuron_nodes(self) -> tuple[Node, ...]:
        return tuple(node for node in self.nodes if node.kind == NodeKind.NEURON)

    @property
    def cpu_nodes(self) -> tuple[Node, ...]:
        return tuple(node for node in self.nodes if node.kind == NodeKind.CPU)

    @property
    def size(self) -> int:
        """Total bytes of the NEFF: header plus data."""
        return self.header.header_size + self.header.data_size
