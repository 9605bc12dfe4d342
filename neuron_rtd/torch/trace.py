"""`trace(module, example_inputs)`: a PyTorch module compiled for neuron-rtd, as
`torch.neuron.trace` made one for Inferentia: exported to ONNX, compiled by neuron-cc in
this process, and returned as a `NeuronModule` that runs on the daemon."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import nn

from neuron_rtd.torch.compiling import compile_exported, compiler_options
from neuron_rtd.torch.errors import NeuronTorchError
from neuron_rtd.torch.export import as_args, batch_size, export
from neuron_rtd.torch.module import NeuronModule
from neuron_rtd.torch.runtime import Package


def trace(
    module: nn.Module,
    example_inputs: Any,
    *,
    compiler_args: Sequence[str] | None = None,
    dynamic_batch_size: bool = False,
    verbose: bool = False,
) -> NeuronModule:
    """`module` compiled for the NeuronCores, called as `module(*example_inputs)` was.

    `example_inputs`: one tensor, or a tuple of the module's positional arguments
    (tensors, or tuples, lists and dicts of them); the result takes arguments of the same
    structure, dtypes and shapes, and answers its outputs in the module's structure.
    `compiler_args`: options of `neuron-cc compile` (e.g. ["--auto-cast", "matmult"]).
    `dynamic_batch_size`: axis 0 of every input and output may be any size: compiled with
    `--dynamic-batch` buckets (default 1..max(8, the traced batch); `compiler_args` may
    give others), a larger batch run in parts. `verbose`: print neuron-cc's summary (what
    runs on the NC and what on CPU nodes) to stderr.

    Raises UnsupportedOperatorError (the exporter cannot express an operator: named, with
    its submodule), ExportError, CompileFailed (neuron-cc's reason), InputMismatch."""
    if isinstance(module, NeuronModule):
        raise NeuronTorchError("this module is traced already: call it, or trace the original")
    if not isinstance(module, nn.Module):
        raise NeuronTorchError(
            f"trace takes a torch.nn.Module, got a {type(module).__name__}: wrap a function "
            "in a module whose forward calls it"
        )
    args = as_args(example_inputs)
    name = type(module).__name__
    options = compiler_options(
        compiler_args, name=name, dynamic_batch=dynamic_batch_size, batch=batch_size(args)
    )
    exported = export(module, args, dynamic_batch=dynamic_batch_size)
    result = compile_exported(exported.onnx, options)
    if verbose:
        print(result.summary, file=sys.stderr)
    package = Package.of(np.frombuffer(result.neff, np.uint8).copy())
    return NeuronModule(package, exported.in_spec, exported.out_spec, name=name)
