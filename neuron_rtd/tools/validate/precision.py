"""In what precision the NEFF computes, against its reference, and so the least cosine
`neuron-cli validate` asks for by default.

- fp32: as the reference, `DEFAULT_MIN_COSINE`.
- Auto-cast (compiled with --auto-cast): 16-bit matmul inputs, `AUTO_CAST_MIN_COSINE`.
- Int8 against float: a quantized NEFF (`neuron-cc quantize`, or a model quantized
  elsewhere) validated against the float model it was quantized from, as MACE validates a
  quantized model: `QUANTIZED_MIN_COSINE`. The NEFF is quantized when it computes
  quantized ops (QuantizeLinear, DequantizeLinear, QLinear*, *Integer) on its NCs or CPU
  nodes, or NC ops on int8 weights; the reference is float when its graph has no such op.
  A quantized NEFF against the quantized ONNX model it was compiled from is held to the
  fp32 default, as any model against its own source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import onnx

from neuron_rtd.compiler.quantize import is_quantized_op
from neuron_rtd.neff import Neff
from neuron_rtd.neff.cpu_node import ORT_MODEL, is_ort_stage
from neuron_rtd.neff.model import Stage
from neuron_rtd.tools.validate.metrics import (
    AUTO_CAST_MIN_COSINE,
    DEFAULT_MIN_COSINE,
    QUANTIZED_MIN_COSINE,
)

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def auto_casts(neff: Neff) -> list[tuple[str, str]]:
    """The auto-cast modes and types the NEFF's stages compute with (none: fp32)."""
    found = {
        (stage.auto_cast, stage.auto_cast_type)
        for node in neff.nodes
        for stage in node.stages
        if stage.auto_cast != "none"
    }
    return sorted(found)


def quantized_ops(neff: Neff) -> dict[str, int]:
    """The NEFF's quantized ops by name, counted in its first graph (bucket)."""
    found: Counter[str] = Counter()
    for node in neff.variants()[0].nodes:
        for stage in node.stages:
            found.update(_stage_quantized_ops(stage))
    return dict(found)


def _stage_quantized_ops(stage: Stage) -> list[str]:
    if is_ort_stage(stage):
        model = onnx.load_from_string(stage.weights[ORT_MODEL].tobytes())
        return [n.op_type for n in model.graph.node if is_quantized_op(n.op_type)]
    return [
        inst.op
        for inst in stage.instructions
        if is_quantized_op(inst.op)
        or any(stage.weights[name].dtype in _INT8 for name in inst.inputs if name in stage.weights)
    ]


def is_float_graph(graph: onnx.GraphProto) -> bool:
    return not any(is_quantized_op(node.op_type) for node in graph.node)


def default_min_cosine(
    casts: list[tuple[str, str]], int8_against_float: Mapping[str, int]
) -> float:
    """The least cosine asked for when --min-cosine is not given: `casts` as `auto_casts`
    gives them, `int8_against_float` the quantized ops of a NEFF whose reference is float
    (empty otherwise)."""
    if int8_against_float:
        return QUANTIZED_MIN_COSINE
    return AUTO_CAST_MIN_COSINE if casts else DEFAULT_MIN_COSINE
