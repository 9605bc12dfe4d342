"""The ONNX-to-NEFF compiler: `compile_model(path_or_model, ...)` -> CompileResult."""

from neuron_rtd.compiler.buckets import bucket_ranges
from neuron_rtd.compiler.compile import CompileResult, compile_model
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.compiler.onnx_graph import value_type

__all__ = ["CompileError", "CompileResult", "bucket_ranges", "compile_model", "value_type"]
