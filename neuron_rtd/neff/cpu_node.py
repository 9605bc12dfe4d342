"""CPU nodes in the NEFF format: the parts of a model that run on the host.

A CPU node compiled from ONNX holds one `OnnxRuntime` instruction whose last input is the
weight `onnx_model`: the serialized ONNX sub-model of the ops the NC library lacks; the
runtime runs it with onnxruntime. A CPU node of NC instructions runs with the NC kernels on
the host instead.
"""

from __future__ import annotations

from neuron_rtd.neff.model import Stage

ORT_OP = "OnnxRuntime"
ORT_MODEL = "onnx_model"  # the weight holding the serialized ONNX sub-model


def is_ort_stage(stage: Stage) -> bool:
    return len(stage.instructions) == 1 and stage.instructions[0].op == ORT_OP
