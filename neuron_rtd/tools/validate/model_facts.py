"""What the ONNX model itself says about its inputs and outputs, so that random inputs are
ones the model could be given and top-1 is reported only where it means something.

- An integer input used (directly, or through value-keeping ops: Cast, Reshape, ...) as
  the indices of a Gather from a constant table can take the values 0..table size - 1:
  token ids into an embedding table.
- An integer input whose name says it is a mask (`attention_mask`, `mask`, ...) takes 0
  and 1.
- An output is a classifier's when its last op (past value-keeping ops) is Softmax or
  LogSoftmax, or a Gemm/MatMul (logits), and it is a float matrix with more than one
  class. A box list (a Gather, Concat or NonMaxSuppression's output) is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx

# Ops whose output holds the input's values (possibly re-laid out): what holds for the
# output's values holds for the input's.
_KEEPS_VALUES = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
_CLASSIFIER_HEADS = frozenset({"Softmax", "LogSoftmax", "Gemm", "MatMul"})


def load_graph(path: str | Path) -> onnx.GraphProto:
    """The model's graph, without its external data (only its structure is read)."""
    return onnx.load(str(path), load_external_data=False).graph


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, slot))
    return uses


def _through_value_keepers(
    name: str, uses: dict[str, list[tuple[onnx.NodeProto, int]]]
) -> Iterable[tuple[onnx.NodeProto, int]]:
    """The uses of `name`'s values: its consumers, following value-keeping ops."""
    pending, seen = [name], set()
    while pending:
        tensor = pending.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, slot in uses.get(tensor, []):
            if node.op_type in _KEEPS_VALUES and slot == 0:
                pending.extend(node.output)
            else:
                yield node, slot


def _gather_axis(node: onnx.NodeProto) -> int:
    for attr in node.attribute:
        if attr.name == "axis":
            return int(attr.i)
    return 0


def implied_int_ranges(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """Integer inputs' value ranges [low, high) the model implies (see the module doc)."""
    tables = {init.name: tuple(init.dims) for init in graph.initializer}
    uses = _consumers(graph)
    ranges: dict[str, tuple[int, int]] = {}
    for value in graph.input:
        elem = value.type.tensor_type.elem_type
        if value.name in tables or onnx.helper.tensor_dtype_to_np_dtype(elem).kind not in "iu":
            continue
        sizes = []
        for node, slot in _through_value_keepers(value.name, uses):
            table = tables.get(node.input[0]) if node.op_type == "Gather" else None
            if slot == 1 and table:
                sizes.append(table[_gather_axis(node) % len(table)])
        if sizes:
            ranges[value.name] = (0, min(sizes))
        elif "mask" in value.name.lower():
            ranges[value.name] = (0, 2)
    return ranges


def classifier_outputs(graph: onnx.GraphProto) -> set[str]:
    """The outputs that are a classifier's scores (see the module doc)."""
    producer = {out: node for node in graph.node for out in node.output}
    found = set()
    for output in graph.output:
        tensor = output.name
        node = producer.get(tensor)
        while node is not None and node.op_type in _KEEPS_VALUES:
            node = producer.get(node.input[0])
        if node is not None and node.op_type in _CLASSIFIER_HEADS:
            found.add(output.name)
    return found
