"""onnxruntime's QOperator form of a quantized model (its contrib ops: QLinearAdd,
QLinearConcat, QGemm, QLinearSoftmax...) written as QDQ (DequantizeLinear -> float op ->
QuantizeLinear), before shape inference, which does not know those ops: QDQ fusion
(`fuse.py`, `qfunctions.py`) makes them again once the types are known, so both formats
take one path through the compiler."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from driver_sim.ops.quant import CONTRIB_DOMAIN

# contrib op -> (the float op, the positions of its quantized operands)
_QOPERATOR = {
    "QLinearAdd": ("Add", (0, 3)),
    "QLinearMul": ("Mul", (0, 3)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,)),
    "QLinearAveragePool": ("AveragePool", (0,)),
    "QLinearSigmoid": ("Sigmoid", (0,)),
    "QLinearLeakyRelu": ("LeakyRelu", (0,)),
}


def expand_qoperator(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with onnxruntime's quantized ops (QOperator format, which ONNX shape
    inference does not know) written as DequantizeLinear -> float op -> QuantizeLinear,
    which QDQ fusion makes them again once the types are known: one path for both
    formats. Ops it cannot write so (channels-last pooling, a QGemm with a float output
    or an unknown bias scale) stay as they are."""
    if not any(node.domain == CONTRIB_DOMAIN for node in model.graph.node):
        return model
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    extra: list[onnx.TensorProto] = []
    for node in model.graph.node:
        made = _as_qdq(node, consts, extra, opset) if node.domain == CONTRIB_DOMAIN else None
        nodes.extend(made if made is not None else [node])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(extra)
    return out


def _as_qdq(
    node: onnx.NodeProto,
    consts: dict[str, np.ndarray],
    extra: list[onnx.TensorProto],
    opset: int,
) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.pop("channels_last", 0):
        return None
    ins = list(node.input)
    name = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def dq(k: int, axis: int | None = None) -> str:
        real = f"{name}/dq{k}"
        dequantize = helper.make_node("DequantizeLinear", ins[k : k + 3], [real])
        if axis is not None:
            dequantize.attribute.append(helper.make_attribute("axis", axis))
        made.append(dequantize)
        return real

    if node.op_type in _QOPERATOR:
        op, operands = _QOPERATOR[node.op_type]
        scale_at = operands[-1] + 3
        reals = [dq(k) for k in operands]
    elif node.op_type == "QLinearSoftmax":  # its opset attribute: which Softmax it is
        if (attrs.pop("opset", 0) >= 13) != (opset >= 13):
            return None
        op, scale_at, reals = "Softmax", 3, [dq(0)]
    elif node.op_type == "QLinearConcat":
        op, scale_at = "Concat", 0
        reals = [dq(k) for k in range(2, len(ins), 3)]
    elif node.op_type == "QGemm" and len(ins) > 7 and ins[7]:
        op, scale_at = "Gemm", 7
        reals = [dq(0), dq(3, axis=0 if attrs.get("transB", 0) else 1)]
        if ins[6]:
            if ins[1] not in consts or ins[4] not in consts:
                return None
            scale = (consts[ins[1]].astype(np.float32) * consts[ins[4]]).astype(np.float32)
            scale_name = f"{name}/bias_scale"
            extra.append(
                numpy_helper.from_array(scale.reshape(-1 if scale.size > 1 else ()), scale_name)
            )
            bias = f"{name}/dq6"
            made.append(helper.make_node("DequantizeLinear", [ins[6], scale_name], [bias], axis=0))
            reals.append(bias)
    else:
        return None
    result = f"{name}/real"
    made.append(helper.make_node(op, reals, [result], name=f"{name}/op", **attrs))
    zero = ins[scale_at + 1 : scale_at + 2] if len(ins) > scale_at + 1 else []
    made.append(
        helper.make_node("QuantizeLinear", [result, ins[scale_at], *zero], list(node.output))
    )
    return made
