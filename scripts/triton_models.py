"""A model repository holding the models Triton's own client examples use, made here.

    python scripts/triton_models.py OUT_DIR [--neff] [--only NAME ...]

Triton's example programs (`src/python/examples/` of triton-inference-server/client) each
name the model they call and check what it answers. This writes, for each, a folder of
Triton's layout under OUT_DIR: the config Triton's own repository gives the model (its
name, platform, dtypes, dims, max_batch_size, reshape, label file, sequence batching,
transaction policy), written here, and a small ONNX model built with onnx.helper that
answers as the examples check (`simple` adds and subtracts, the sequence models add the
control inputs as Triton's do, `densenet_onnx` is a small stand-in network of the same
input and output names and shapes). Its version folder holds `model.onnx`.

`--neff` compiles each model with the project's compiler into `1/model.neff` instead (its
config then names no platform: the daemon completes it from the NEFF), so the repository
serves on a daemon that does not yet compile ONNX on load. Left as ONNX, said on the
output: the image networks whose Triton name says ONNX (`densenet_onnx`,
`inception_onnx`), and a model the compiler refuses, with its reason.

Not made: `preprocess_inception_ensemble` (ensemble_image_client.py's default), whose
first step decodes JPEG bytes with DALI, which no ONNX operator does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.onnx_ml_pb2 import ValueInfoProto

from neuron_rtd.compiler import CompileError, bucket_ranges, compile_model

T = TensorProto
ONNX_TYPES = {"TYPE_INT32": T.INT32, "TYPE_INT8": T.INT8, "TYPE_UINT32": T.UINT32}
ONNX_TYPES |= {"TYPE_UINT64": T.UINT64, "TYPE_FP32": T.FLOAT, "TYPE_STRING": T.STRING}
OPSET = 17


@dataclass(frozen=True)
class Tensor:
    """One input or output as the config names it; `shape` is the ONNX model's own shape
    when the config reshapes it (no batch axis: only unbatched models reshape here)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    shape: tuple[int, ...] | None = None
    extra: str = ""

    def pbtxt(self) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        lines = [f'    name: "{self.name}"', f"    data_type: {self.dtype}"]
        lines.append(f"    dims: [ {dims} ]")
        if self.shape is not None:
            lines.append(f"    reshape {{ shape: [ {', '.join(str(d) for d in self.shape)} ] }}")
        lines += [f"    {line}" for line in self.extra.splitlines()]
        return "  {\n" + "\n".join(lines) + "\n  }"


@dataclass(frozen=True)
class Model:
    """One model of the repository: its config and the ONNX graph's nodes. Control and
    state tensors of a sequence model are ONNX inputs (and outputs) that the config names
    in `sequence_batching`, not in `input`: `hidden_inputs`, `hidden_outputs`."""

    name: str
    max_batch_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    nodes: Callable[[], list[onnx.NodeProto]]
    initializers: Callable[[], list[onnx.TensorProto]] = list
    hidden_inputs: tuple[Tensor, ...] = ()
    hidden_outputs: tuple[Tensor, ...] = ()
    config_extra: str = ""
    labels: tuple[str, int] | None = None  # the label file's name, its number of lines
    neff_batch: int = 0  # the NEFF's largest batch bucket (0: max_batch_size)
    keep_onnx: bool = False  # --neff leaves it ONNX (Triton's ONNX image networks)

    def config(self, platform: str | None) -> str:
        head = [f'name: "{self.name}"']
        if platform:
            head.append(f'platform: "{platform}"')
        head.append(f"max_batch_size: {self.max_batch_size}")
        parts = ["\n".join(head)]
        parts.append("input [\n" + ",\n".join(t.pbtxt() for t in self.inputs) + "\n]")
        parts.append("output [\n" + ",\n".join(t.pbtxt() for t in self.outputs) + "\n]")
        if self.config_extra:
            parts.append(self.config_extra.strip())
        return "\n".join(parts) + "\n"

    def onnx(self, fixed: int = 0) -> onnx.ModelProto:
        """The ONNX model; `fixed`: a -1 axis's size instead of a symbol."""
        graph = helper.make_graph(
            self.nodes(),
            self.name,
            [self._value(t, fixed) for t in (*self.inputs, *self.hidden_inputs)],
            [self._value(t, fixed) for t in (*self.outputs, *self.hidden_outputs)],
            self.initializers(),
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model

    def _value(self, tensor: Tensor, fixed: int) -> ValueInfoProto:
        """The ONNX shape: the config's dims (a -1 a symbol per tensor, or `fixed`) after
        a batch axis when the model batches, or the reshape's shape."""
        dims: list[int | str] = [
            (fixed or f"{tensor.name}_{axis}") if d < 0 else d for axis, d in enumerate(tensor.dims)
        ]
        if tensor.shape is not None:
            dims = list(tensor.shape)
        elif self.max_batch_size > 0:
            dims = ["batch", *dims]
        return helper.make_tensor_value_info(tensor.name, ONNX_TYPES[tensor.dtype], dims)

    def neff(self) -> bytes:
        """The model compiled: batch buckets up to `neff_batch`, a -1 axis left free (the
        compiler puts what touches it on CPU nodes, which take any size), as the daemon
        compiles the ONNX model on load."""
        batch = self.neff_batch or self.max_batch_size
        free = any(d < 0 for t in (*self.inputs, *self.hidden_inputs) for d in t.dims)
        shapes = None
        if free:  # each input's sizes: 1 for the batch axis (bucketed), -1 where free
            lead = [1] if batch > 0 else []
            shapes = {t.name: [*lead, *t.dims] for t in (*self.inputs, *self.hidden_inputs)}
        ranges = bucket_ranges(1, batch) if batch > 0 else None
        return compile_model(
            self.onnx(), input_shapes=shapes, dynamic_batch=ranges, name=self.name
        ).neff


def node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def _int(name: str, value: int, dtype: type = np.int32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], dtype=dtype), name)


def sum_and_difference(name: str, dtype: str) -> Model:
    """Triton's `simple` family: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, 16
    elements, batches up to 8; strings are decimal numbers, added as INT32."""
    io = [Tensor(n, dtype, (16,)) for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    if dtype == "TYPE_STRING":

        def nodes() -> list[onnx.NodeProto]:
            return [
                node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
                node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
                node("Add", ["a", "b"], ["sum"]),
                node("Sub", ["a", "b"], ["difference"]),
                node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
                node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
            ]
    else:

        def nodes() -> list[onnx.NodeProto]:
            return [
                node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
            ]

    # simple_grpc_model_control.py loads `simple` again with max_batch_size 16
    return Model(name, 8, (io[0], io[1]), (io[2], io[3]), nodes, neff_batch=16)


def control(name: str, kind: str, dtype: str = "") -> str:
    value = f"data_type: {dtype}" if dtype else "int32_false_true: [ 0, 1 ]"
    return f'    {{ name: "{name}" control [ {{ kind: {kind} {value} }} ] }}'


START = control("START", "CONTROL_SEQUENCE_START")
END = control("END", "CONTROL_SEQUENCE_END")
READY = control("READY", "CONTROL_SEQUENCE_READY")
OLDEST = """  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
"""


def sequence_batching(controls: Sequence[str], head: str = "", tail: str = "") -> str:
    return (
        "sequence_batching {\n"
        + head
        + "  control_input [\n"
        + ",\n".join(controls)
        + "\n  ]\n"
        + tail
        + "}"
    )


def flag(name: str) -> Tensor:
    return Tensor(name, "TYPE_INT32", (1,))


VALUE_IN, VALUE_OUT = Tensor("INPUT", "TYPE_INT32", (1,)), Tensor("OUTPUT", "TYPE_INT32", (1,))


def sequence_model(name: str, nodes: Callable[[], list[onnx.NodeProto]], **more: Any) -> Model:
    """A sequence model of the examples: INT32 INPUT [1] to OUTPUT [1], batches of 8."""
    return Model(name, 8, (VALUE_IN,), (VALUE_OUT,), nodes, **more)


def simple_sequence() -> Model:
    """Triton's `simple_sequence`: OUTPUT = READY * (INPUT + START), no state: the
    examples expect 1 + the first value, then each value as it is."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("Add", ["INPUT", "START"], ["value"]),
            node("Mul", ["READY", "value"], ["OUTPUT"]),
        ]

    config = sequence_batching([START, READY]) + "\ninstance_group [ { count: 1 } ]"
    hidden = (flag("START"), flag("READY"))
    return sequence_model("simple_sequence", nodes, hidden_inputs=hidden, config_extra=config)


def simple_dyna_sequence() -> Model:
    """Triton's `simple_dyna_sequence` (the `oldest` strategy, two instances): as
    `simple_sequence`, and the last request of a sequence (END) adds its correlation id,
    which the examples check."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            node("Add", ["INPUT", "START"], ["value"]),
            node("Mul", ["END", "corrid"], ["at_end"]),
            node("Add", ["value", "at_end"], ["answer"]),
            node("Mul", ["READY", "answer"], ["OUTPUT"]),
        ]

    corrid = control("CORRID", "CONTROL_SEQUENCE_CORRID", "TYPE_UINT64")
    config = sequence_batching([START, END, READY, corrid], head=OLDEST)
    config += "\ninstance_group [ { count: 2 } ]"
    hidden = (flag("START"), flag("END"), flag("READY"), Tensor("CORRID", "TYPE_UINT64", (1,)))
    name = "simple_dyna_sequence"
    return sequence_model(name, nodes, hidden_inputs=hidden, config_extra=config)


def simple_string_dyna_sequence() -> Model:
    """The examples' `--dyna` string-id sequences: an accumulator whose running sum is
    implicit state (the config's `state` pair, kept per sequence by the server), with a
    string correlation id (a decimal number) added by the last request. The examples
    expect the first value, then the running sum, plus the id at the end."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            node("Sub", ["one", "START"], ["going_on"]),
            node("Mul", ["INPUT_STATE", "going_on"], ["before"]),
            node("Add", ["INPUT", "before"], ["total"]),
            node("Mul", ["END", "corrid"], ["at_end"]),
            node("Add", ["total", "at_end"], ["answer"]),
            node("Mul", ["READY", "answer"], ["OUTPUT"]),
            node("Sub", ["total", "INPUT_STATE"], ["change"]),
            node("Mul", ["READY", "change"], ["kept_change"]),
            node("Add", ["INPUT_STATE", "kept_change"], ["OUTPUT_STATE"]),
        ]

    corrid = control("CORRID", "CONTROL_SEQUENCE_CORRID", "TYPE_STRING")
    state = (
        '  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE"'
        " data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
    )
    config = sequence_batching([START, END, READY, corrid], head=OLDEST, tail=state)
    hidden = (
        flag("START"),
        flag("END"),
        flag("READY"),
        Tensor("CORRID", "TYPE_STRING", (1,)),
        flag("INPUT_STATE"),
    )
    return sequence_model(
        "simple_string_dyna_sequence",
        nodes,
        initializers=lambda: [_int("one", 1)],
        hidden_inputs=hidden,
        hidden_outputs=(flag("OUTPUT_STATE"),),
        config_extra=config,
    )


def _weights(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def densenet_onnx() -> Model:
    """A stand-in for Triton's densenet_onnx: data_0 [3, 224, 224] (the ONNX model's [1,
    3, 224, 224]) to fc6_1 [1000] ([1, 1000, 1, 1]), 1000 labels: a strided convolution,
    Relu, global average pooling and a 1x1 convolution to 1000 scores."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("Conv", ["data_0", "w1"], ["features"], kernel_shape=[8, 8], strides=[8, 8]),
            node("Relu", ["features"], ["active"]),
            node("GlobalAveragePool", ["active"], ["pooled"]),
            node("Conv", ["pooled", "w2"], ["fc6_1"], kernel_shape=[1, 1]),
        ]

    data = Tensor("data_0", "TYPE_FP32", (3, 224, 224), (1, 3, 224, 224), "format: FORMAT_NCHW")
    labels = 'label_filename: "densenet_labels.txt"'
    scores = Tensor("fc6_1", "TYPE_FP32", (1000,), (1, 1000, 1, 1), labels)
    return Model(
        "densenet_onnx",
        0,
        (data,),
        (scores,),
        nodes,
        lambda: [_weights("w1", (8, 3, 8, 8), 1), _weights("w2", (1000, 8, 1, 1), 2)],
        labels=("densenet_labels.txt", 1000),
        keep_onnx=True,
    )


def inception_onnx() -> Model:
    """A stand-in for Triton's inception_onnx: NHWC "input:0" [299, 299, 3] to 1001
    softmax scores, 1001 labels: a mean over the image, a dense layer, a softmax."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("ReduceMean", ["input:0"], ["mean"], axes=[1, 2], keepdims=0),
            node("MatMul", ["mean", "w"], ["scores"]),
            node("Softmax", ["scores"], ["InceptionV3/Predictions/Softmax:0"], axis=1),
        ]

    image = Tensor("input:0", "TYPE_FP32", (299, 299, 3), (1, 299, 299, 3), "format: FORMAT_NHWC")
    labels = 'label_filename: "inception_labels.txt"'
    out = Tensor("InceptionV3/Predictions/Softmax:0", "TYPE_FP32", (1001,), (1, 1001), labels)
    return Model(
        "inception_onnx",
        0,
        (image,),
        (out,),
        nodes,
        lambda: [_weights("w", (3, 1001), 3)],
        labels=("inception_labels.txt", 1001),
        keep_onnx=True,
    )


def simple_identity() -> Model:
    """Triton's `simple_identity` (a Python model there): strings of any count back."""
    given, back = Tensor("INPUT0", "TYPE_STRING", (-1,)), Tensor("OUTPUT0", "TYPE_STRING", (-1,))
    return Model(
        "simple_identity", 8, (given,), (back,), lambda: [node("Identity", ["INPUT0"], ["OUTPUT0"])]
    )


def custom_identity_int32() -> Model:
    """Triton's `custom_identity_int32` (memory_growth_test.py): INT32 [-1] back, batches
    up to 1024."""
    given, back = Tensor("INPUT0", "TYPE_INT32", (-1,)), Tensor("OUTPUT0", "TYPE_INT32", (-1,))
    config = "version_policy: { latest { num_versions: 1 } }"
    return Model(
        "custom_identity_int32",
        1024,
        (given,),
        (back,),
        lambda: [node("Identity", ["INPUT0"], ["OUTPUT0"])],
        config_extra=config,
    )


def repeat_int32() -> Model:
    """Triton's decoupled `repeat_int32` (simple_grpc_custom_repeat.py): a decoupled model
    answers a request many times, which no NEFF does; the daemon should refuse its load.
    The graph (OUT the first of IN, IDX zero) only gives it Triton's inputs and outputs."""

    def nodes() -> list[onnx.NodeProto]:
        return [
            node("Slice", ["IN", "zero", "one"], ["OUT"]),
            node("Sub", ["WAIT", "WAIT"], ["IDX"]),
        ]

    ins = (
        Tensor("IN", "TYPE_INT32", (-1,)),
        Tensor("DELAY", "TYPE_UINT32", (-1,)),
        Tensor("WAIT", "TYPE_UINT32", (1,)),
    )
    outs = (Tensor("OUT", "TYPE_INT32", (1,)), Tensor("IDX", "TYPE_UINT32", (1,)))
    return Model(
        "repeat_int32",
        0,
        ins,
        outs,
        nodes,
        lambda: [_int("zero", 0, np.int64), _int("one", 1, np.int64)],
        config_extra="model_transaction_policy { decoupled: true }",
    )


def models() -> dict[str, Model]:
    every = [
        sum_and_difference("simple", "TYPE_INT32"),
        sum_and_difference("simple_int8", "TYPE_INT8"),
        sum_and_difference("simple_string", "TYPE_STRING"),
        simple_identity(),
        simple_sequence(),
        simple_dyna_sequence(),
        simple_string_dyna_sequence(),
        densenet_onnx(),
        inception_onnx(),
        custom_identity_int32(),
        repeat_int32(),
    ]
    return {m.name: m for m in every}


# The eight models of Triton's docs/examples/model_repository, which the model-control
# examples count in the repository index.
TRITON_EXAMPLE_REPOSITORY = (
    "densenet_onnx",
    "inception_onnx",
    "simple",
    "simple_dyna_sequence",
    "simple_identity",
    "simple_int8",
    "simple_sequence",
    "simple_string",
)


def write(model: Model, root: Path, *, neff: bool) -> str:
    """`model`'s folder under `root`: config.pbtxt, labels, 1/model.onnx or 1/model.neff;
    says what it wrote."""
    folder = root / model.name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    if model.labels is not None:
        label_file, count = model.labels
        (folder / label_file).write_text("".join(f"CLASS {i}\n" for i in range(count)))
    note = "model.onnx"
    compiled = None
    if neff and model.keep_onnx:
        note = "model.onnx (Triton's is an ONNX network: kept ONNX)"
    elif neff:
        try:
            compiled = model.neff()
        except CompileError as exc:
            note = f"model.onnx (does not compile: {exc})"
    if compiled is not None:
        (folder / "1" / "model.neff").write_bytes(compiled)
        note = "model.neff"
    else:
        onnx.save(model.onnx(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(model.config(None if compiled else "onnxruntime_onnx"))
    return note


def build(root: Path, *, neff: bool = False, only: Sequence[str] = ()) -> dict[str, str]:
    """The repository under `root` (the models named in `only`, else all); each model's
    note."""
    every = models()
    unknown = sorted(set(only) - set(every))
    if unknown:
        raise SystemExit(
            f"triton_models: no model {', '.join(unknown)}; there are {', '.join(every)}"
        )
    root.mkdir(parents=True, exist_ok=True)
    return {name: write(every[name], root, neff=neff) for name in (only or every)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/triton_models.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out_dir", type=Path, help="the repository's folder (made if absent)")
    parser.add_argument("--neff", action="store_true", help="compile each model into 1/model.neff")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these models")
    args = parser.parse_args(argv)
    for name, note in build(args.out_dir, neff=args.neff, only=args.only).items():
        print(f"{name}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
