"""The in-memory form of a NEFF: a graph of Neuron and CPU nodes, each a chain of stages.

Everything is immutable: mappings are read-only proxies and weights are read-only numpy
views into the buffer the NEFF was read from.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neuron_rtd.neff.dtypes import dtype_name
from neuron_rtd.neff.header import NeffHeader


class NodeKind(enum.StrEnum):
    NEURON = "neuron"
    CPU = "cpu"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A tensor's dtype and shape. `dynamic` names the axes whose size is known only at
    run time (an output of NonMaxSuppression, say): there `shape` holds the upper bound,
    or 0 when there is none. `symbols` (model inputs and outputs of a bucketed NEFF)
    names per axis the dynamic dimension it follows (None for fixed axes); there `shape`
    holds the largest bucket's size."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: tuple[int, ...] = ()
    symbols: tuple[str | None, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor at its declared shape (for a dynamic one, its bound)."""
        return self.dtype.itemsize * math.prod(self.shape)

    @property
    def varying_axes(self) -> tuple[int, ...]:
        """The axes whose size may change from one inference to the next."""
        named = tuple(i for i, sym in enumerate(self.symbols) if sym is not None)
        return tuple(sorted(set(self.dynamic) | set(named)))

    @property
    def unbounded(self) -> bool:
        return any(self.shape[axis] == 0 for axis in self.dynamic)

    def shape_with(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with each axis that follows a symbol of `sizes` sized so (the others
        as declared)."""
        if not self.symbols:
            return self.shape
        return tuple(
            sizes.get(symbol, dim) if symbol is not None else dim
            for symbol, dim in zip(self.symbols, self.shape, strict=True)
        )

    def array_from(
        self, data: bytes | memoryview, sizes: Mapping[str, int] | None = None
    ) -> np.ndarray:
        """The tensor held in `data`: an axis that follows a symbol of `sizes` sized so,
        and its one other varying axis (if any) sized by the byte count (ValueError if more
        than one is left: the bytes do not tell their sizes apart)."""
        flat = np.frombuffer(data, dtype=self.dtype)
        if not self.symbols and not self.dynamic:
            return flat.reshape(self.shape)
        shape = list(self.shape)
        unknown = []
        for axis in self.varying_axes:
            symbol = self.symbols[axis] if self.symbols else None
            if sizes and symbol is not None and symbol in sizes:
                shape[axis] = sizes[symbol]
            else:
                unknown.append(axis)
        if len(unknown) == 1:
            rest = math.prod(d for axis, d in enumerate(shape) if axis != unknown[0])
            shape[unknown[0]] = flat.size // rest if rest else 0
        elif len(unknown) > 1:  # a model of free input axes: its answers carry shapes
            raise ValueError(
                f"tensor '{self.name}' ({self.describe()}) varies along axes {unknown}, so its "
                f"{flat.nbytes} bytes alone do not tell its shape: ask the model through "
                "the KServe front, whose answers carry their shapes"
            )
        return flat.reshape(shape)

    def describe(self) -> str:
        """`float32 (1, 784)`: the dtype and shape, for messages (`?` marks a varying
        axis, with its bound or symbol where there is one)."""
        dims: list[str] = []
        for axis, dim in enumerate(self.shape):
            symbol = self.symbols[axis] if self.symbols else None
            if symbol is not None:
                dims.append(f"{symbol}<={dim}")
            elif axis in self.dynamic:
                dims.append(f"?<={dim}" if dim else "?")
            else:
                dims.append(str(dim))
        name = dtype_name(self.dtype)
        if not self.varying_axes:
            return f"{name} {self.shape}"
        return f"{name} ({', '.join(dims)})"


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
    opset: int | None = None  # the ONNX opset its ops' attributes follow (None: not said)
    auto_cast: str = "none"  # which fp32 ops compute in `auto_cast_type`: none, matmult, all
    auto_cast_type: str = "bf16"  # bf16 or fp16 (fp32 accumulation either way)

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
            and self.opset == other.opset
            and (self.auto_cast, self.auto_cast_type) == (other.auto_cast, other.auto_cast_type)
            and _same_weights(self.weights, other.weights)
        )

    __hash__ = None  # type: ignore[assignment]


def _same_weights(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    if list(a) != list(b):
        return False
    return all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and np.array_equal(a[k], b[k], equal_nan=True)  # NaN weights are the same too
        for k in a
    )


@dataclasses.dataclass(frozen=True)
class Node:
    """A Neuron node runs stage j on its j-th NC: NC `nc + j` of the NEFF's, in normal
    mode (Neuron nodes may share an NC, which runs their programs one at a time); a CPU
    node has one stage, run on the host."""

    name: str
    kind: NodeKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stages: tuple[Stage, ...]
    nc: int = 0

    @property
    def nc_count(self) -> int:
        return len(self.stages) if self.kind == NodeKind.NEURON else 0

    @property
    def weight_bytes(self) -> int:
        return sum(stage.weight_bytes for stage in self.stages)


def first_ncs(nodes: Sequence[tuple[int | None, int]]) -> list[int]:
    """Per Neuron node, given as (the first NC it declares or None, its NC count), the
    first NC it runs on: the declared one, else the one after the previous node's NCs."""
    firsts: list[int] = []
    following = 0
    for declared, count in nodes:
        first = following if declared is None else declared
        firsts.append(first)
        following = first + count
    return firsts


def ncs_spanned(nodes: Sequence[tuple[int | None, int]]) -> int:
    """The NCs Neuron nodes given as for `first_ncs` span: up to the last one they use."""
    firsts = first_ncs(nodes)
    return max((first + count for first, (_, count) in zip(firsts, nodes, strict=True)), default=0)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One planned copy of the graph, for the sizes `symbols` maps to (low, high) ranges;
    its inputs and outputs are static at the high end of each range."""

    name: str
    symbols: Mapping[str, tuple[int, int]]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tensors: Mapping[str, TensorSpec]
    nodes: tuple[Node, ...]

    @property
    def nc_count(self) -> int:
        """NCs it spans in normal mode: up to the last NC a Neuron node runs on."""
        return max((node.nc + node.nc_count for node in self.nodes if node.nc_count), default=0)


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
    buckets: tuple[Bucket, ...] = ()

    def variants(self) -> tuple[Bucket, ...]:
        """The graphs a runtime loads: the buckets, or the one graph as a bucket of its own."""
        if self.buckets:
            return self.buckets
        return (Bucket("", {}, self.inputs, self.outputs, self.tensors, self.nodes),)

    @property
    def nc_count(self) -> int:
        """NCs needed in normal mode: those its Neuron nodes span (in its largest bucket)."""
        return max(variant.nc_count for variant in self.variants())

    @property
    def max_node_ncs(self) -> int:
        """The NCs of the largest Neuron node (0 when there is none)."""
        return max((node.nc_count for node in self.neuron_nodes), default=0)

    @property
    def stored_weight_bytes(self) -> int:
        """The weight bytes the NEFF holds: an array shared by buckets or stages counts
        once (weights are views into the NEFF's buffer: one address, one array)."""
        stored = {
            (weight.__array_interface__["data"][0], weight.nbytes)
            for node in self.all_nodes
            for stage in node.stages
            for weight in stage.weights.values()
        }
        return sum(nbytes for _, nbytes in stored)

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        """Every node of every variant."""
        return tuple(node for variant in self.variants() for node in variant.nodes)

    @property
    def weight_bytes(self) -> int:
        return sum(node.weight_bytes for node in self.all_nodes)

    @property
    def neuron_nodes(self) -> tuple[Node, ...]:
        return tuple(node for node in self.all_nodes if node.kind == NodeKind.NEURON)

    @property
    def cpu_nodes(self) -> tuple[Node, ...]:
        return tuple(node for node in self.all_nodes if node.kind == NodeKind.CPU)

    @property
    def size(self) -> int:
        """Total bytes of the NEFF: header plus data."""
        return self.header.header_size + self.header.data_size
