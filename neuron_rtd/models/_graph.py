"""A small graph writer that names things the way an exporter does.

Nodes get scoped names (`/encoder/layer.0/attention/self/query/MatMul`) and their outputs
`<node name>_output_<i>`, weights are named initializers (`encoder.layer.0....weight`), and
small constants (shapes, axes, scalars) are initializers in the main graph and `Constant`
nodes inside subgraphs (If branches, Loop bodies), as torch.onnx writes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "neuron_rtd.models"
PRODUCER_VERSION = "0.1.0"

Dim = int | str | None


class GraphBuilder:
    """Collects the nodes, initializers, inputs and outputs of one ONNX graph."""

    def __init__(self, name: str, *, parent: GraphBuilder | None = None) -> None:
        self.name = name
        self.parent = parent
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        # one namespace for a graph and all its subgraphs: ONNX forbids shadowing
        self._names: set[str] = parent._names if parent is not None else set()
        self._scope: list[str] = list(parent._scope) if parent is not None else []

    # -- names -------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """`base`, or `base_<k>` with the first k that is not taken yet."""
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    @contextmanager
    def scope(self, *parts: str) -> Iterator[None]:
        """Nodes made inside get names under `/<parts>/` (module paths, as torch writes)."""
        self._scope.extend(parts)
        try:
            yield
        finally:
            del self._scope[len(self._scope) - len(parts) :]

    def _scoped(self, leaf: str) -> str:
        return "/" + "/".join([*self._scope, leaf])

    # -- values --------------------------------------------------------------------------

    def initializer(self, name: str, array: np.ndarray) -> str:
        """A named weight; the name must be new."""
        if name in self._names:
            raise ValueError(f"initializer name {name!r} is taken")
        self._names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value: Any, dtype: Any = None, *, hint: str = "Constant") -> str:
        """A small constant: an initializer in the main graph, a Constant node in a subgraph."""
        array = np.array(value, dtype=dtype)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        if self.parent is None:
            name = self.fresh(self._scoped(hint) + "_output_0")
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        node_name = self.fresh(self._scoped(hint))
        out = self.fresh(node_name + "_output_0")
        self.nodes.append(
            helper.make_node(
                "Constant", [], [out], name=node_name, value=numpy_helper.from_array(array)
            )
        )
        return out

    def op(
        self, op_type: str, inputs: Sequence[str], *, leaf: str | None = None, **attrs: Any
    ) -> str:
        """One node with one output; returns the output's name."""
        (out,) = self.ops(op_type, inputs, 1, leaf=leaf, **attrs)
        return out

    def ops(
        self,
        op_type: str,
        inputs: Sequence[str],
        n_outputs: int,
        *,
        leaf: str | None = None,
        **attrs: Any,
    ) -> list[str]:
        """One node with `n_outputs` outputs; returns their names."""
        name = self.fresh(self._scoped(leaf or op_type))
        outs = [self.fresh(f"{name}_output_{i}") for i in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def rename_output(self, value: str, name: str) -> str:
        """Make the node that writes `value` write `name` instead (for graph outputs)."""
        for node in self.nodes:
            for i, out in enumerate(node.output):
                if out == value:
                    self._names.add(name)
                    node.output[i] = name
                    return name
        raise KeyError(value)

    # -- interface -----------------------------------------------------------------------

    def add_input(self, name: str, elem_type: int, shape: Sequence[Dim] | None) -> str:
        self._names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def add_output(self, name: str, elem_type: int, shape: Sequence[Dim] | None) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def subgraph(self, name: str) -> GraphBuilder:
        """A builder for an If branch or a Loop body; it shares this graph's namespace."""
        return GraphBuilder(name, parent=self)

    def graph(self, doc: str = "") -> onnx.GraphProto:
        return helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            self.outputs,
            initializer=self.initializers,
            doc_string=doc,
        )


def make_model(
    builder: GraphBuilder, doc: str, metadata: Mapping[str, str | int | float]
) -> onnx.ModelProto:
    """The model proto an exporter would write: opset 17 default domain, IR version 8."""
    model = helper.make_model(
        helper.make_graph([], builder.name, [], []),
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version=PRODUCER_VERSION,
        doc_string=doc.strip(),
    )
    # fill the model's own graph: one copy of the weights, not two
    graph = model.graph
    graph.node.extend(builder.nodes)
    graph.initializer.extend(builder.initializers)
    graph.input.extend(builder.inputs)
    graph.output.extend(builder.outputs)
    helper.set_model_props(model, {k: str(v) for k, v in metadata.items()})
    return model


def as_dim(value: int | str, what: str) -> Dim:
    """Check a batch/sequence argument: a positive int (static) or a name (symbolic)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{what} must be an int or a dim name, not {value!r}")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    if isinstance(value, str) and not value.isidentifier():
        raise ValueError(f"{what} must be an identifier-like dim name, got {value!r}")
    return value


def normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    """float32 N(0, std**2) samples."""
    samples = rng.standard_normal(tuple(shape), dtype=np.float32)
    samples *= np.float32(std)
    return samples


def uniform(rng: np.random.Generator, shape: Sequence[int], low: float, high: float) -> np.ndarray:
    """float32 U(low, high) samples."""
    return rng.uniform(low, high, tuple(shape)).astype(np.float32)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL
