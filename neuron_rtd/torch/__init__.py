"""neuron-rtd's PyTorch plugin, modelled on torch-neuron (`torch.neuron`):

- `trace(module, example_inputs, compiler_args=..., dynamic_batch_size=...)`: the module
  exported to ONNX, compiled by neuron-cc, returned as a `NeuronModule` run by the daemon
  at `NEURON_RTD_ADDRESS` on the groups of `NEURONCORE_GROUP_SIZES`;
- `DataParallel(traced)`: one copy per NeuronCore Group, a batch split between them;
- `analyze_model(module, example_inputs)`: which operators run on the NeuronCores, which
  on CPU nodes, and why.

Importing it registers `torch.ops.neuron.run_neff`, which a traced module saved with
`torch.jit.save` calls once `torch.jit.load` has read it back (`load(path)` reads it back
as the `NeuronModule` it was).
"""

from neuron_rtd.torch.analyze import Analysis, OperatorUse, analyze_model
from neuron_rtd.torch.errors import (
    CompileFailed,
    ExportError,
    InputMismatch,
    NeuronRuntimeError,
    NeuronTorchError,
    RuntimeUnavailable,
    UnsupportedOperatorError,
)
from neuron_rtd.torch.module import NeuronModule, load
from neuron_rtd.torch.parallel import DataParallel
from neuron_rtd.torch.trace import trace

__all__ = [
    "Analysis",
    "CompileFailed",
    "DataParallel",
    "ExportError",
    "InputMismatch",
    "NeuronModule",
    "NeuronRuntimeError",
    "NeuronTorchError",
    "OperatorUse",
    "RuntimeUnavailable",
    "UnsupportedOperatorError",
    "analyze_model",
    "load",
    "trace",
]
