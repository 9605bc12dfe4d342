"""Lowering ONNX nodes to NC instructions, where the NC has a better instruction than the
op's own kernel.

A 3x3 Conv with stride 1, dilation 1 and one group becomes `WinogradConv` (Winograd's
minimal filtering: fewer multiplies than the direct convolution) where it pays at its
shapes; its weights are transformed here, at compile time, not on every inference.
Every other node is its own instruction. An optional output left out before one that is
named (an LSTM's Y when only Y_h is wanted) gets a name of its own: a NEFF names every
instruction output, and no one reads that one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

import driver_sim
from driver_sim.ops import winograd
from neuron_rtd.compiler.onnx_attrs import node_attrs
from neuron_rtd.compiler.onnx_graph import Graph


def lower(node: onnx.NodeProto, graph: Graph) -> tuple[driver_sim.Instr, dict[str, np.ndarray]]:
    """The NC instruction for `node`, and any weights it needs that the graph lacks."""
    # Under auto-cast the Conv stays a Conv: its 16-bit inputs are its own weights.
    if node.op_type == "Conv" and node.domain in ("", "ai.onnx") and graph.auto_cast[0] == "none":
        lowered = _winograd(node, graph)
        if lowered is not None:
            return lowered
    outputs = [name or _unread(node, k, graph) for k, name in enumerate(_trim(node.output))]
    return _instruction(node.op_type, node.input, outputs, node_attrs(node)), {}


def _unread(node: onnx.NodeProto, k: int, graph: Graph) -> str:
    """A name for output k of `node`, which the model leaves out: unique in the graph."""
    name = f"{node.name}.unread{k}"
    while name in graph.types or name in graph.consts:
        name += "_"
    return name


def _instruction(op: str, inputs: Any, outputs: Any, attrs: dict[str, Any]) -> driver_sim.Instr:
    return driver_sim.Instr(op, tuple(_trim(inputs)), tuple(_trim(outputs)), attrs)


def _trim(names: Any) -> list[str]:
    """Names with trailing empty (absent optional) entries dropped."""
    out = list(names)
    while out and not out[-1]:
        out.pop()
    return out


def _winograd(
    node: onnx.NodeProto, graph: Graph
) -> tuple[driver_sim.Instr, dict[str, np.ndarray]] | None:
    weight = graph.consts.get(node.input[1]) if len(node.input) > 1 else None
    bias_name = node.input[2] if len(node.input) > 2 else ""
    if weight is None or weight.dtype != np.float32 or weight.shape[2:] != (3, 3):
        return None
    if bias_name and bias_name not in graph.consts:
        return None
    x_type = graph.types.get(node.input[0])
    y_type = graph.types.get(node.output[0])
    if x_type is None or y_type is None or x_type.dtype != np.float32:
        return None
    x_shape, y_shape = x_type.static_shape, y_type.static_shape
    if x_shape is None or y_shape is None or len(x_shape) != 4:
        return None
    pads = _stride_one_pads(node_attrs(node))
    if pads is None:
        return None
    n, cin, _, _ = x_shape
    _, cout, h_out, w_out = y_shape
    if not winograd.winograd_pays(n, cin, cout, h_out, w_out):
        return None
    transformed = f"{node.input[1]}.winograd"
    inputs = [node.input[0], transformed] + ([bias_name] if bias_name else [])
    instr = _instruction("WinogradConv", inputs, node.output, {"pads": list(pads)})
    return instr, {transformed: winograd.winograd_weights(weight)}


def _stride_one_pads(attrs: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """The pads of a 2-D 3x3 conv with stride 1, dilation 1 and one group; None for any
    other conv."""
    if attrs.get("group", 1) != 1 or list(attrs.get("kernel_shape", [3, 3])) != [3, 3]:
        return None
    if list(attrs.get("strides", [1, 1])) != [1, 1]:
        return None
    if list(attrs.get("dilations", [1, 1])) != [1, 1]:
        return None
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return (1, 1, 1, 1)
    if auto_pad == "VALID":
        return (0, 0, 0, 0)
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if auto_pad != "NOTSET" or len(pads) != 4 or min(pads) < 0:
        return None
    return (pads[0], pads[1], pads[2], pads[3])
