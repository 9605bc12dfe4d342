"""`neuron-cli validate`: a compiled NEFF on the daemon against its ONNX model on
onnxruntime. `command` (arguments and the run), `inputs`, `metrics`, `report`."""

from neuron_rtd.tools.validate.command import PROG, add_arguments, run
from neuron_rtd.tools.validate.errors import UsageError
from neuron_rtd.tools.validate.inputs import input_shapes, npz_inputs, random_inputs
from neuron_rtd.tools.validate.metrics import (
    DEFAULT_MIN_COSINE,
    QUANTIZED_MIN_COSINE,
    OutputReport,
    Thresholds,
    compare,
    compare_one,
    cosine_similarity,
    is_classifier_like,
    sqnr_db,
    top1_agreement,
)
from neuron_rtd.tools.validate.precision import quantized_ops
from neuron_rtd.tools.validate.report import render_text

__all__ = [
    "DEFAULT_MIN_COSINE",
    "PROG",
    "QUANTIZED_MIN_COSINE",
    "OutputReport",
    "Thresholds",
    "UsageError",
    "add_arguments",
    "compare",
    "compare_one",
    "cosine_similarity",
    "input_shapes",
    "is_classifier_like",
    "npz_inputs",
    "quantized_ops",
    "random_inputs",
    "render_text",
    "run",
    "sqnr_db",
    "top1_agreement",
]
