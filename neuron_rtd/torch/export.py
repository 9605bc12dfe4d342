"""A PyTorch module to ONNX, with torch's TorchScript-based exporter (`dynamo=False`, as
bench/real_models.py exports), its inputs and outputs flattened: the module's own
structure (tensors in tuples, lists, dicts) is recorded as pytree specs and rebuilt
around the compiled model at every call.

The exporter's failures are said in a PyTorch user's terms: an operator it cannot express
is named with the submodule that calls it (found on a trace of the module), and the IR
dump it writes to stdout on failure is kept off the user's screen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from neuron_rtd.torch.errors import ExportError, InputMismatch, UnsupportedOperatorError

OPSET = 17  # what bench/real_models.py exports at, and the compiler reads
BATCH = "batch"  # the symbolic axis 0 of every input and output with a dynamic batch


@dataclasses.dataclass(frozen=True)
class Exported:
    """A module exported: the ONNX model, the pytree specs of its arguments and of its
    outputs."""

    onnx: bytes
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec


def as_args(example_inputs: Any) -> tuple[Any, ...]:
    """The positional arguments `example_inputs` stands for, as torch.neuron.trace takes
    them: one tensor, or a tuple (or list) of arguments."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs)
    raise InputMismatch(
        f"example_inputs is a {type(example_inputs).__name__}: give a tensor or a tuple of "
        "the module's positional arguments (tensors, or tuples, lists and dicts of tensors)"
    )


def batch_size(args: tuple[Any, ...]) -> int:
    """Axis 0 of the first input tensor (1 when it has no axes)."""
    leaves, _ = pytree.tree_flatten(args)
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim()), None)
    return int(first.shape[0]) if first is not None else 1


def flat_tensors(values: Sequence[Any], what: str) -> list[torch.Tensor]:
    """`values` (leaves of a pytree), each checked to be a tensor."""
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise InputMismatch(
                f"{what} {index} is a {type(value).__name__}: a traced module takes and "
                "returns tensors only (in tuples, lists and dicts)"
            )
    return list(values)


class FlatCall(nn.Module):
    """`module` called with its arguments given flat, answering its outputs flat: the
    form the exporter sees (inputs `input0..`, outputs `output0..`)."""

    def __init__(self, module: nn.Module, in_spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.model = module
        self.in_spec = in_spec
        # in the module's own mode: the exporter puts the wrapper back in its mode after,
        # and with it the module (a new wrapper's, training, would leave it training)
        self.train(module.training)

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = pytree.tree_unflatten(list(flat), self.in_spec)
        outputs, _ = pytree.tree_flatten(self.model(*args))
        return tuple(outputs)


def export(module: nn.Module, args: tuple[Any, ...], *, dynamic_batch: bool) -> Exported:
    """Export `module` called as `module(*args)`; with `dynamic_batch`, axis 0 of every
    input and output is symbolic (BATCH)."""
    leaves, in_spec = pytree.tree_flatten(args)
    inputs = flat_tensors(leaves, "example input")
    with torch.no_grad():
        out_leaves, out_spec = pytree.tree_flatten(module(*args))
    outputs = flat_tensors(out_leaves, "output")
    if not outputs:
        raise ExportError(f"{_name(module)} returns no tensor: there is nothing to compile")
    input_names = [f"input{i}" for i in range(len(inputs))]
    output_names = [f"output{i}" for i in range(len(outputs))]
    axes = {name: {0: BATCH} for name in [*input_names, *output_names]} if dynamic_batch else None
    flat = FlatCall(module, in_spec)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="neuron-trace-") as folder,
            _stdout_kept_unless_failed(),
            warnings.catch_warnings(),
            torch.no_grad(),
            _no_fused_attention(),
        ):
            warnings.simplefilter("ignore")
            path = Path(folder) / "model.onnx"
            torch.onnx.export(
                flat,
                tuple(inputs),
                path,
                dynamo=False,
                opset_version=OPSET,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=axes,
            )
            onnx_model = path.read_bytes()
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        raise _unsupported(module, flat, inputs, str(exc)) from None
    except Exception as exc:  # the exporter's own failure, said in its words
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"torch.onnx.export could not export {_name(module)}: {first}") from None
    return Exported(onnx_model, in_spec, out_spec)


def _name(module: nn.Module) -> str:
    return type(module).__name__


def _unsupported(
    module: nn.Module, flat: FlatCall, inputs: list[torch.Tensor], message: str
) -> UnsupportedOperatorError:
    """The exporter's refusal of an operator, with the submodule that calls it."""
    found = re.search(r"'(\w+::\w+)'", message)
    operator = found.group(1) if found else "an operator"
    path = _caller_of(flat, inputs, operator) if found else None
    where = f"in submodule {path!r} ({module_path_type(module, path)})" if path else ""
    where = where or f"in {_name(module)}.forward"
    return UnsupportedOperatorError(
        f"torch's ONNX exporter (opset {OPSET}) cannot export {operator} {where}: rewrite that "
        "part with operators ONNX has, or keep it outside the traced module and run it in "
        "PyTorch on the traced module's outputs",
        operator,
        path or "",
    )


def module_path_type(module: nn.Module, path: str) -> str:
    """The class name of the submodule at `path` ("?" when there is none)."""
    try:
        return type(module.get_submodule(path)).__name__
    except AttributeError:
        return "?"


def _caller_of(flat: FlatCall, inputs: list[torch.Tensor], operator: str) -> str | None:
    """The dotted path of the submodule whose forward calls `operator` (None: the top
    module's own forward, or the trace did not find it)."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(flat, tuple(inputs), check_trace=False, strict=False)
    except Exception:  # the module does not trace: the operator is named without a place
        return None
    for node in traced.inlined_graph.nodes():
        if node.kind() == operator:
            return module_path(node.scopeName())
    return None


def module_path(scope: str) -> str | None:
    """A dotted submodule path from a TorchScript scope or an ONNX node name exported
    through `FlatCall`: "__module.model/__module.model.enc.layers.0" and
    "/model/enc/layers.0/self_attn/MatMul" are "enc.layers.0" and "enc.layers.0.self_attn"
    (None: the top module itself). In an ONNX name a container's child is named with the
    container ("head/head.0/head.0.0" is "head.0.0")."""
    if "__module." in scope:
        parts = scope.rsplit("/", 1)[-1].removeprefix("__module.").split(".")
        return ".".join(parts[1:] if parts[:1] == ["model"] else parts) or None
    path: list[str] = []
    for part in [p for p in scope.split("/")[:-1] if p]:  # the last part names the node
        if path and part.startswith(f"{path[-1]}."):
            path[-1] = part
        else:
            path.append(part)
    if path[:1] == ["model"]:
        path = path[1:]
    return ".".join(path) or None


@contextlib.contextmanager
def _no_fused_attention() -> Iterator[None]:
    """nn.TransformerEncoder and nn.MultiheadAttention off their fused fast path (one
    aten::_transformer_encoder_layer_fwd, which no ONNX operator expresses) in the block,
    so the exporter sees their matmuls and softmax."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


@contextlib.contextmanager
def _stdout_kept_unless_failed() -> Iterator[None]:
    """What is written to file descriptor 1 in the block (the exporter dumps its IR graph
    there from C++ when it fails), written out afterwards only if the block succeeds."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to guard
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            if not failed:
                captured.seek(0)
                text = captured.read().decode(errors="replace")
                if text:
                    sys.stdout.write(text)
