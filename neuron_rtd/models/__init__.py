"""Test models written in code as ONNX exports: what the compiler turns into NEFFs.

Three families, each `build(...) -> onnx.ModelProto` with deterministic weights from a seed
(default-domain opset 17, IR version 8; every model passes the full ONNX checker and runs
in onnxruntime):

- `resnet`: a ResNet-18-style classifier (Conv/BatchNormalization/Relu/MaxPool, residual
  Adds, GlobalAveragePool, Gemm, Softmax), batch dim symbolic by default.
- `bert`: a BERT-style encoder (Gather embeddings, Shape/Range positions,
  LayerNormalization, multi-head attention with Reshape/Transpose/MatMul/Softmax and an
  additive padding mask, Erf GELU, Tanh pooler), batch and sequence dims symbolic.
- `ssd`: an SSD-style detector with post-processing in the graph (Resize, box decoding,
  TopK, NonMaxSuppression, Gather, Where, If, Loop) and a data-dependent output length.

`random_inputs(model, seed, **dims)` makes valid inputs for any of them;
`python -m neuron_rtd.models NAME -o FILE [--set key=value ...]` writes one to a file.
Each module has a `SMALL` dict of build arguments for a fast variant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from neuron_rtd.models import bert, resnet, ssd

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet": resnet.build,
    "bert": bert.build,
    "ssd": ssd.build,
}

SMALL: dict[str, dict[str, Any]] = {
    "resnet": resnet.SMALL,
    "bert": bert.SMALL,
    "ssd": ssd.SMALL,
}


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The model's metadata_props (family, sizes, seed, ...) as a dict."""
    return {p.key: p.value for p in model.metadata_props}


def op_types(model: onnx.ModelProto | onnx.GraphProto) -> set[str]:
    """Every node op type in the model, subgraphs (If branches, Loop bodies) included."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    found: set[str] = set()
    for node in graph.node:
        found.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= op_types(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    found |= op_types(g)
    return found


def count_parameters(model: onnx.ModelProto) -> int:
    """Elements in the main graph's floating-point weights.

    Weights are the initializers with module-path names (`layer1.0.conv1.weight`, BN running
    statistics and ssd's anchors included); exported constants (`/scope/..._output_0`) are
    not.
    """
    total = 0
    for init in model.graph.initializer:
        if init.name.startswith("/"):
            continue
        if helper.tensor_dtype_to_np_dtype(init.data_type).kind == "f":
            total += int(np.prod(init.dims, dtype=np.int64))
    return total


def _index_range(model: onnx.ModelProto, name: str) -> int:
    """How many rows the table that `name` indexes has (vocab size for token ids)."""
    meta = metadata(model)
    if "vocab_size" in meta:
        return int(meta["vocab_size"])
    tables = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == name and node.input[0] in tables:
            return int(tables[node.input[0]].dims[0])
    return 2


def _shape(value: onnx.ValueInfoProto, dims: dict[str, int]) -> list[int]:
    shape = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        elif d.dim_param and d.dim_param in dims:
            shape.append(int(dims[d.dim_param]))
        else:
            what = d.dim_param or "an unnamed dim"
            raise ValueError(
                f"input {value.name!r} has symbolic dim {what}: pass it, e.g. {what}=1"
            )
    return shape


def random_inputs(
    model: onnx.ModelProto,
    seed: int = 0,
    *,
    valid_lengths: int | Sequence[int] | None = None,
    **dims: int,
) -> dict[str, np.ndarray]:
    """Valid random inputs for `model`, by graph input, resolving symbolic dims from `dims`.

    Token ids (int inputs that index an embedding table) are uniform in [0, vocab);
    an "attention_mask" is all ones, or ones then zeros past `valid_lengths` (one length
    for every row, or one per row); images are uniform pixels in [0, 1), ImageNet-normalised
    when the model says it expects that (resnet). e.g. random_inputs(bert_model, N=..., B=2,
    S=128). An unknown dim name is an error, so is a symbolic dim left unresolved.
    """
    rng = np.random.default_rng(seed)
    meta = metadata(model)
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in initializers]
    known = {d.dim_param for v in graph_inputs for d in v.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise ValueError(f"unknown dims {unknown}; this model's symbolic dims: {sorted(known)}")
    out: dict[str, np.ndarray] = {}
    for value in graph_inputs:
        shape = _shape(value, dims)
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        array: np.ndarray
        if "mask" in value.name and dtype.kind in "iub":
            array = np.ones(shape, dtype)
            if valid_lengths is not None:
                lengths = np.broadcast_to(np.asarray(valid_lengths), shape[:1])
                for row, n in enumerate(lengths):
                    array[row, int(n) :] = 0
        elif dtype.kind in "iu":
            array = rng.integers(0, _index_range(model, value.name), shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.random(shape) < 0.5
        else:
            array = rng.random(shape, dtype=np.float32)
            if meta.get("input_preprocess") == "imagenet":
                array = resnet.normalise(array)
            array = array.astype(dtype)
        out[value.name] = array
    return out


def build(name: str, **kwargs: Any) -> onnx.ModelProto:
    """MODELS[name](**kwargs), with a clear error for an unknown family."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name](**kwargs)


def initializer_array(model: onnx.ModelProto, name: str) -> np.ndarray:
    """An initializer of the main graph as a numpy array."""
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    raise KeyError(name)


__all__ = [
    "MODELS",
    "SMALL",
    "bert",
    "build",
    "count_parameters",
    "initializer_array",
    "metadata",
    "op_types",
    "random_inputs",
    "resnet",
    "ssd",
]
