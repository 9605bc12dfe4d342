"""Shape functions for planning memory where shape inference leaves a dimension unknown.

Three kinds, as in the seed designs: from input shapes (elementwise ops, Gather, Concat,
LSTM/GRU/RNN: the output bound follows the inputs' bounds), from input values (a Range
whose limits are constants was already folded, so its size is static), and upper bounds
(NonMaxSuppression selects at most batch x classes x max_output_boxes_per_class boxes,
NonZero at most one index per element, TopK with a run-time K at most the axis, Reshape
to a run-time shape at most the input's element count per unknown dimension). A tensor
whose size cannot be bounded gets bound 0: the runtime keeps it in host memory, sized per
inference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from neuron_rtd.compiler.onnx_graph import Graph

Bound = tuple[int, ...]

_SAME_AS_FIRST = frozenset(
    {
        "Identity",
        "Cast",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Exp",
        "Log",
        "Neg",
        "Abs",
        "Sqrt",
        "Reciprocal",
        "Erf",
        "Not",
        "Clip",
        "LeakyRelu",
        "Softmax",
        "LogSoftmax",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "HardSigmoid",
        "Softplus",
        "Gelu",
        "Slice",
        "TopK",
    }
)
_BROADCAST = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Where",
        "Equal",
        "Greater",
        "Less",
        "And",
        "Or",
        "Max",
        "Min",
        "GreaterOrEqual",
        "LessOrEqual",
        "Mod",
        "PRelu",
    }
)


def plan_bounds(graph: Graph) -> dict[str, Bound]:
    """An upper bound for every tensor of known rank (0 where a dimension has none)."""
    bounds: dict[str, Bound] = {}
    for name, kind in graph.types.items():
        if kind.shape is not None:
            bounds[name] = tuple(d if isinstance(d, int) else 0 for d in kind.shape)
    for name, value in graph.consts.items():
        bounds[name] = tuple(value.shape)
    for node in graph.nodes:
        for k, out in enumerate(node.output):
            known_type = graph.types.get(out)
            if not out or known_type is None or known_type.shape is None or known_type.static:
                continue
            guess = _bound(node, k, graph, bounds)
            known = bounds.get(out, ())
            if guess is not None and len(guess) == len(known):
                # Keep what inference knows; fill in only the unknown dims.
                bounds[out] = tuple(
                    d if isinstance(d, int) else g
                    for d, g in zip(known_type.shape, guess, strict=True)
                )
    return bounds


def _input(bounds: dict[str, Bound], node: onnx.NodeProto, i: int) -> Bound | None:
    if i >= len(node.input) or not node.input[i]:
        return None
    return bounds.get(node.input[i])


def _bound(node: onnx.NodeProto, k: int, graph: Graph, bounds: dict[str, Bound]) -> Bound | None:
    op = node.op_type
    first = _input(bounds, node, 0)
    if op in _SAME_AS_FIRST:
        return first
    if op in _BROADCAST:
        shapes = [b for i in range(len(node.input)) if (b := _input(bounds, node, i)) is not None]
        return _broadcast(shapes) if len(shapes) == len(node.input) else None
    if op == "NonMaxSuppression":
        return _nms(node, graph, bounds)
    if op == "NonZero":
        return None if first is None else (len(first), math.prod(first))
    if op == "Gather":
        return _gather(node, bounds)
    if op == "Concat":
        return _concat(node, bounds)
    if op == "Reshape":
        return _reshape(node, graph, bounds)
    if op in ("LSTM", "GRU", "RNN"):
        return _recurrent(node, k, bounds)
    return None


def _broadcast(shapes: Sequence[Bound]) -> Bound:
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max(dims) if 0 not in dims else 0 for dims in zip(*padded, strict=True))


def _nms(node: onnx.NodeProto, graph: Graph, bounds: dict[str, Bound]) -> Bound | None:
    boxes, scores = _input(bounds, node, 0), _input(bounds, node, 1)
    if boxes is None or scores is None or len(scores) != 3:
        return None
    batch, classes, count = scores
    per_class = count
    if len(node.input) > 2 and node.input[2] in graph.consts:
        per_class = min(count, int(np.asarray(graph.consts[node.input[2]]).reshape(-1)[0]))
    elif len(node.input) <= 2 or not node.input[2]:
        per_class = 0  # absent: ONNX selects no boxes
    return (batch * classes * max(per_class, 0), 3)


def _gather(node: onnx.NodeProto, bounds: dict[str, Bound]) -> Bound | None:
    data, indices = _input(bounds, node, 0), _input(bounds, node, 1)
    if data is None or indices is None:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis = axis + len(data) if axis < 0 else axis
    return data[:axis] + indices + data[axis + 1 :]


def _reshape(node: onnx.NodeProto, graph: Graph, bounds: dict[str, Bound]) -> Bound | None:
    """Reshape to a shape computed at run time keeps the element count: each unknown
    dimension is at most the input's elements over the known dimensions."""
    data = _input(bounds, node, 0)
    kind = graph.types.get(node.output[0])
    if data is None or 0 in data or kind is None or kind.shape is None:
        return None
    known = math.prod(d for d in kind.shape if isinstance(d, int) and d > 0)
    most = math.prod(data) // max(known, 1)
    return tuple(d if isinstance(d, int) else most for d in kind.shape)


def _concat(node: onnx.NodeProto, bounds: dict[str, Bound]) -> Bound | None:
    parts = [bounds.get(name) for name in node.input]
    if any(p is None for p in parts) or not parts:
        return None
    shapes = [p for p in parts if p is not None]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis = axis + len(shapes[0]) if axis < 0 else axis
    total = sum(s[axis] for s in shapes) if all(s[axis] for s in shapes) else 0
    return (*shapes[0][:axis], total, *shapes[0][axis + 1 :])


def _recurrent(node: onnx.NodeProto, k: int, bounds: dict[str, Bound]) -> Bound | None:
    """Y (k = 0) is (seq, directions, batch, hidden), Y_h and Y_c (directions, batch,
    hidden); with layout 1 batch comes first. Sequence and batch follow X, directions
    and hidden R (directions, gates * hidden, hidden)."""
    x, r = _input(bounds, node, 0), _input(bounds, node, 2)
    if x is None or r is None or len(x) != 3 or len(r) != 3:
        return None
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    batch, seq = (x[0], x[1]) if layout else (x[1], x[0])
    directions, hidden = r[0], r[2]
    if k == 0:
        return (batch, seq, directions, hidden) if layout else (seq, directions, batch, hidden)
    return (batch, directions, hidden) if layout else (directions, batch, hidden)
