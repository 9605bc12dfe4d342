"""The ONNX-to-NEFF compiler: `compile_model(path_or_model, ...)` -> CompileResult."""

from neuron_rtd.compiler.compile import CompileResult, bucket_ranges, compile_model
from neuron_rtd.compiler.errors import CompileError

__all__ = ["CompileError", "CompileResult", "bucket_ranges", "compile_model"]
