"""ONNX node attributes as the JSON values a NEFF instruction carries.

ints, floats and strings stay what they are (strings decoded from UTF-8), lists stay
lists, and a tensor becomes {"dtype", "shape", "data"} (read back by
`driver_sim.ops.registry.tensor_attr`). A graph-valued attribute (If, Loop, Scan bodies) has no
instruction form: `UnsupportedAttr` says so, and the op goes to a CPU node.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper


class UnsupportedAttr(ValueError):
    """An attribute that no NC instruction can carry."""


def encode_tensor(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": array.ravel().tolist()}


def attr_value(attr: onnx.AttributeProto) -> Any:
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.INT:
        return int(attr.i)
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.STRING:
        return attr.s.decode("utf-8")
    if kind == A.INTS:
        return [int(v) for v in attr.ints]
    if kind == A.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == A.STRINGS:
        return [v.decode("utf-8") for v in attr.strings]
    if kind == A.TENSOR:
        return encode_tensor(numpy_helper.to_array(attr.t))
    name = A.AttributeType.Name(kind)
    raise UnsupportedAttr(
        f"attribute {attr.name!r} is of type {name}, which no NC instruction carries"
    )


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Every attribute of `node` as JSON values; UnsupportedAttr for graphs and the like.
    What an NC instruction needs that ONNX leaves implicit is made explicit: a Split
    with no sizes splits into as many equal parts as the node has outputs."""
    attrs = {attr.name: attr_value(attr) for attr in node.attribute}
    sizes_given = "split" in attrs or (len(node.input) > 1 and node.input[1])
    if node.op_type == "Split" and not sizes_given and "num_outputs" not in attrs:
        attrs["num_outputs"] = len(node.output)
    return attrs
