"""The plugin's exceptions, one tree under `NeuronTorchError` (a RuntimeError, as PyTorch's
own failures are): each message is one line that says what was wrong and what to do."""

from __future__ import annotations


class NeuronTorchError(RuntimeError):
    """Something the PyTorch plugin could not do."""


class UnsupportedOperatorError(NeuronTorchError):
    """torch's ONNX exporter cannot express an operator of the module: `operator` names it
    (`aten::kthvalue`), `module_path` the submodule calling it ("" for the top module)."""

    def __init__(self, message: str, operator: str, module_path: str) -> None:
        super().__init__(message)
        self.operator = operator
        self.module_path = module_path


class ExportError(NeuronTorchError):
    """torch's ONNX exporter failed for another reason (its message is kept)."""


class CompileFailed(NeuronTorchError):
    """neuron-cc refused the exported model or the compiler_args."""


class InputMismatch(NeuronTorchError, ValueError):
    """A call's inputs are not what the module was traced with (structure, shape, dtype,
    device): the message names what was expected."""


class RuntimeUnavailable(NeuronTorchError):
    """No neuron-rtd answers at the address (`NEURON_RTD_ADDRESS`)."""


class NeuronRuntimeError(NeuronTorchError):
    """neuron-rtd refused a load or an inference; `code` is its nerr code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
