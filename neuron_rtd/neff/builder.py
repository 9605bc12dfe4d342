"""Writing NEFFs: `NeffBuilder` assembles a graph and emits the container bytes.

`build` reads its own output back with `read_neff`, so a builder never emits a NEFF the
reader would reject (a `version` override outside SUPPORTED_VERSIONS is validated as the
current version, then stamped, so tests can make NEFFs of unsupported versions). The
output is deterministic for equal input, apart from the UUID.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import types
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from neuron_rtd.errors import NeffInvalid, UnsupportedVersion
from neuron_rtd.neff.archive import compress, pack_members
from neuron_rtd.neff.dtypes import dtype_name, little_endian
from neuron_rtd.neff.graph import GRAPH_FILE
from neuron_rtd.neff.header import (
    FEATURE_GZIP,
    HEADER_SIZE,
    NEFF_VERSION,
    PACKAGE_VERSION,
    NeffHeader,
    check_version,
)
from neuron_rtd.neff.model import Instruction, NodeKind, ncs_spanned
from neuron_rtd.neff.program import WEIGHT_ALIGNMENT
from neuron_rtd.neff.reader import read_neff

InstructionLike: TypeAlias = (
    Instruction
    | tuple[str, Sequence[str], Sequence[str]]
    | tuple[str, Sequence[str], Sequence[str], Mapping[str, Any]]
)
JsonDict: TypeAlias = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage to build. `inputs`/`outputs` of None mean the node's own."""

    instructions: Sequence[InstructionLike]
    weights: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    inputs: Sequence[str] | None = None
    outputs: Sequence[str] | None = None
    opset: int | None = None  # the ONNX opset of its ops' attributes, when known
    auto_cast: str = "none"  # none, matmult or all (see neff.program.AUTO_CAST_MODES)
    auto_cast_type: str = "bf16"


@dataclasses.dataclass(frozen=True)
class _NodeSpec:
    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stages: tuple[StageSpec, ...]
    nc: int | None = None


def as_instruction(item: InstructionLike) -> Instruction:
    """An Instruction from itself or from (op, inputs, outputs[, attrs])."""
    if isinstance(item, Instruction):
        return item
    if len(item) not in (3, 4):
        raise ValueError(f"an instruction is (op, inputs, outputs[, attrs]), got {item!r}")
    attrs: Mapping[str, Any] = item[3] if len(item) == 4 else {}
    return Instruction(item[0], tuple(item[1]), tuple(item[2]), types.MappingProxyType(dict(attrs)))


def default_build_version() -> str:
    try:
        version = metadata.version("neuron-rtd")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"neuron-rtd-{version}"


def _dtype_name(dtype: npt.DTypeLike) -> str:
    # A string is kept as written, so an unknown name reaches the reader and is refused there.
    return dtype if isinstance(dtype, str) else dtype_name(np.dtype(dtype))


class NeffBuilder:
    """Collects a model's tensors and nodes; `build()` returns the NEFF bytes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._inputs: list[JsonDict] = []
        self._outputs: list[JsonDict] = []
        self._tensors: dict[str, JsonDict] = {}
        self._nodes: list[_NodeSpec] = []
        self._buckets: list[tuple[NeffBuilder, dict[str, tuple[int, int]]]] = []

    def add_input(
        self,
        name: str,
        dtype: npt.DTypeLike,
        shape: Sequence[int],
        *,
        dynamic: Sequence[int] = (),
        symbols: Sequence[str | None] | None = None,
    ) -> None:
        self._inputs.append(self._declare(name, dtype, shape, dynamic, symbols))

    def add_output(
        self,
        name: str,
        dtype: npt.DTypeLike,
        shape: Sequence[int],
        *,
        dynamic: Sequence[int] = (),
        symbols: Sequence[str | None] | None = None,
    ) -> None:
        self._outputs.append(self._declare(name, dtype, shape, dynamic, symbols))

    def add_tensor(
        self,
        name: str,
        dtype: npt.DTypeLike,
        shape: Sequence[int],
        *,
        dynamic: Sequence[int] = (),
    ) -> None:
        """Declare a tensor that crosses a node or stage boundary."""
        self._declare(name, dtype, shape, dynamic)

    def add_bucket(self, name: str, symbols: Mapping[str, tuple[int, int]]) -> NeffBuilder:
        """A builder for one bucket: a complete static graph for these symbol ranges."""
        bucket = NeffBuilder(name)
        self._buckets.append((bucket, {k: (int(lo), int(hi)) for k, (lo, hi) in symbols.items()}))
        return bucket

    def add_node(
        self,
        name: str,
        kind: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        stages: Sequence[StageSpec],
        *,
        nc: int | None = None,
    ) -> None:
        """A node; a Neuron node's stages run on NCs `nc`, `nc + 1`, ... of the NEFF's
        (None: the NCs after the previous Neuron node's; nodes may share an NC)."""
        node = _NodeSpec(name, kind, tuple(inputs), tuple(outputs), tuple(stages), nc)
        self._nodes.append(node)

    def _declare(
        self,
        name: str,
        dtype: npt.DTypeLike,
        shape: Sequence[int],
        dynamic: Sequence[int] = (),
        symbols: Sequence[str | None] | None = None,
    ) -> JsonDict:
        """The tensor's JSON entry, the same each time it is declared."""
        entry: JsonDict = {
            "name": name,
            "dtype": _dtype_name(dtype),
            "shape": [int(d) for d in shape],
        }
        if dynamic:
            entry["dynamic"] = [int(axis) for axis in dynamic]
        if symbols is not None and any(sym is not None for sym in symbols):
            entry["symbols"] = list(symbols)
        known = self._tensors.setdefault(name, entry)
        if known != entry:
            raise NeffInvalid(
                f"tensor {name!r} declared twice: {known['dtype']} {known['shape']} and "
                f"{entry['dtype']} {entry['shape']}"
            )
        return entry

    def build(
        self,
        *,
        gzip: bool = False,
        version: tuple[int, int] = NEFF_VERSION,
        build_version: str | None = None,
        uuid: uuidlib.UUID | None = None,
        requested_nc_count: int | None = None,
        shared_weights: bool = False,
    ) -> bytes:
        """The NEFF bytes, validated by reading them back (NeffInvalid if invalid).
        With `shared_weights` every stage's weights go into one blob where equal arrays
        are stored once (buckets and stages that share weights)."""
        archive = pack_members(self._members(_WeightStore() if shared_weights else None))
        data = compress(archive) if gzip else archive
        nc_count, ncs_per_node = self._nc_counts()
        header = NeffHeader(
            package_version=PACKAGE_VERSION,
            header_size=HEADER_SIZE,
            data_size=len(data),
            major=version[0],
            minor=version[1],
            build_version=default_build_version() if build_version is None else build_version,
            nc_count=nc_count,
            sha256=hashlib.sha256(data).digest(),
            uuid=uuidlib.uuid4() if uuid is None else uuid,
            name=self.name,
            requested_nc_count=nc_count if requested_nc_count is None else requested_nc_count,
            ncs_per_node=ncs_per_node,
            features=FEATURE_GZIP if gzip else 0,
        )
        _validate(header, data)
        return header.pack() + data

    def _nc_counts(self) -> tuple[int, int]:
        if self._buckets:
            counts = [bucket._nc_counts() for bucket, _ in self._buckets]
            return max(c[0] for c in counts), max(c[1] for c in counts)
        neuron = [
            (node.nc, len(node.stages)) for node in self._nodes if node.kind == NodeKind.NEURON
        ]
        return ncs_spanned(neuron), max((count for _, count in neuron), default=0)

    def _members(self, store: _WeightStore | None) -> dict[str, bytes]:
        members: dict[str, bytes] = {}
        doc = self._graph_doc(members, store)
        if self._buckets:
            doc["buckets"] = []
            for bucket, symbols in self._buckets:
                entry = bucket._graph_doc(members, store)
                entry["symbols"] = {k: list(v) for k, v in symbols.items()}
                doc["buckets"].append(entry)
        if store is not None:
            members[_SHARED_WEIGHTS] = bytes(store.blob)
        members[GRAPH_FILE] = _dump(doc, GRAPH_FILE)
        return members

    def _graph_doc(self, members: dict[str, bytes], store: _WeightStore | None) -> JsonDict:
        """This graph's JSON; its stage files go into `members`."""
        graph_nodes = []
        for node in self._nodes:
            stage_paths = []
            for j, stage in enumerate(node.stages):
                where = f"node {node.name!r} stage {j}"
                program, weights = _stage_files(node, stage, where, store)
                own_blob = f"nodes/{node.name}/stage{j}.bin"
                paths = {
                    "program": f"nodes/{node.name}/stage{j}.json",
                    "weights": own_blob if store is None else _SHARED_WEIGHTS,
                }
                members[paths["program"]] = program
                if store is None:
                    members[paths["weights"]] = weights
                stage_paths.append(paths)
            graph_nodes.append(_node_json(node, stage_paths))
        return self._graph_json(graph_nodes)

    def _graph_json(self, nodes: list[JsonDict]) -> JsonDict:
        tensors = {
            name: {key: value for key, value in entry.items() if key != "name"}
            for name, entry in self._tensors.items()
        }
        return {
            "name": self.name,
            "inputs": self._inputs,
            "outputs": self._outputs,
            "tensors": tensors,
            "nodes": nodes,
        }


def _node_json(node: _NodeSpec, stage_paths: list[dict[str, str]]) -> JsonDict:
    entry: JsonDict = {
        "name": node.name,
        "kind": node.kind,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "stages": stage_paths,
    }
    if node.nc is not None:
        entry["nc"] = node.nc
    return entry


_SHARED_WEIGHTS = "weights.bin"


class _WeightStore:
    """One blob for the weights of every stage; an array equal to one already stored
    (same dtype, shape and bytes) is not stored again."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self._offsets: dict[tuple[str, tuple[int, ...], bytes], int] = {}

    def put(self, array: np.ndarray) -> int:
        data = array.tobytes()
        # by name: numpy spells every 1-byte type of ml_dtypes "<V1" (`array` is little-endian)
        key = (dtype_name(array.dtype), array.shape, hashlib.sha256(data).digest())
        offset = self._offsets.get(key)
        if offset is None:
            offset = -(-len(self.blob) // WEIGHT_ALIGNMENT) * WEIGHT_ALIGNMENT
            self.blob.extend(bytes(offset - len(self.blob)))
            self.blob.extend(data)
            self._offsets[key] = offset
        return offset


def _stage_files(
    node: _NodeSpec, stage: StageSpec, where: str, store: _WeightStore | None = None
) -> tuple[bytes, bytes]:
    """The program JSON and the weights blob of one stage (empty when in `store`)."""
    blob, table = _layout_weights(stage.weights, store)
    program: JsonDict = {
        "inputs": list(node.inputs if stage.inputs is None else stage.inputs),
        "outputs": list(node.outputs if stage.outputs is None else stage.outputs),
        "weights": table,
        "instructions": [_instruction_json(as_instruction(i)) for i in stage.instructions],
    }
    if stage.opset is not None:
        program["opset"] = stage.opset
    if stage.auto_cast != "none":
        program["auto_cast"] = stage.auto_cast
        program["auto_cast_type"] = stage.auto_cast_type
    return _dump(program, f"{where} program"), blob


def _instruction_json(ins: Instruction) -> JsonDict:
    return {
        "op": ins.op,
        "inputs": list(ins.inputs),
        "outputs": list(ins.outputs),
        "attrs": dict(ins.attrs),
    }


def _layout_weights(
    weights: Mapping[str, np.ndarray], store: _WeightStore | None = None
) -> tuple[bytes, JsonDict]:
    """Each weight's little-endian bytes at a WEIGHT_ALIGNMENT-aligned offset, in a blob
    of the stage's own or in the shared `store`."""
    blob = bytearray()
    table: JsonDict = {}
    for name, value in weights.items():
        array = little_endian(np.asarray(value))
        if store is not None:
            offset = store.put(array)
        else:
            offset = -(-len(blob) // WEIGHT_ALIGNMENT) * WEIGHT_ALIGNMENT
            blob.extend(bytes(offset - len(blob)))
            blob.extend(array.tobytes())
        table[name] = {
            "offset": offset,
            "nbytes": int(array.nbytes),
            "dtype": dtype_name(array.dtype),
            "shape": list(array.shape),
        }
    return bytes(blob), table


def _dump(doc: JsonDict, what: str) -> bytes:
    try:
        return json.dumps(doc, indent=1).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise NeffInvalid(f"{what} cannot be written as JSON: {exc}") from None


def _validate(header: NeffHeader, data: bytes) -> None:
    """Read the NEFF back; a version outside the supported range is checked as current."""
    try:
        check_version(header.version)
    except UnsupportedVersion:
        major, minor = NEFF_VERSION
        header = dataclasses.replace(header, major=major, minor=minor)
    read_neff(header.pack() + data)


def write_neff(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Write `data` to `path` atomically: a temp file in the same folder, then a rename."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
