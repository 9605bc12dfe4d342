"""Sequence models for the tests, built from ONNX graphs by the project's compiler, with
Triton's names, datatypes and shapes where Triton has the model:

- `simple_sequence` (Triton's example): INPUT, START and READY, INT32 [batch, 1];
  OUTPUT = (INPUT + START) * READY.
- `simple_dyna_sequence` (Triton's example): START, END, READY INT32 and CORRID UINT64;
  OUTPUT = (INPUT + START + END * CORRID) * READY.
- `accumulator`: implicit state STATE_IN -> STATE_OUT (INT32 [batch, 1]) and a START
  control; OUTPUT = INPUT at START, else STATE_IN + INPUT; STATE_OUT = OUTPUT.
- `simple_string_dyna_sequence` (the examples' `-d` mode): START, END, READY INT32, a
  string CORRID (a decimal number) and implicit state INPUT_STATE -> OUTPUT_STATE; the
  running sum of INPUT, plus the CORRID at END, times READY; the state kept while READY.

Each compiled with batch buckets 1..8 (`max_batch_size` 8), and the config.pbtxt text
that serves it (`config`)."""

from __future__ import annotations

from pathlib import Path

from onnx import ModelProto, TensorProto, helper

from neuron_rtd.compiler import bucket_ranges, compile_model

INT32 = TensorProto.INT32


def _io(name: str, kind: int = INT32) -> object:
    return helper.make_tensor_value_info(name, kind, ["batch", 1])


def _model(
    name: str, inputs: list[object], outputs: list[object], nodes: list[object]
) -> ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)  # type: ignore[arg-type]
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def simple_sequence() -> ModelProto:
    return _model(
        "simple_sequence",
        [_io("INPUT"), _io("START"), _io("READY")],
        [_io("OUTPUT")],
        [
            helper.make_node("Add", ["INPUT", "START"], ["sum"]),
            helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
        ],
    )


def simple_dyna_sequence() -> ModelProto:
    return _model(
        "simple_dyna_sequence",
        [_io("INPUT"), _io("START"), _io("END"), _io("READY"), _io("CORRID", TensorProto.UINT64)],
        [_io("OUTPUT")],
        [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
            helper.make_node("Mul", ["END", "corrid"], ["ending"]),
            helper.make_node("Add", ["INPUT", "START"], ["started"]),
            helper.make_node("Add", ["started", "ending"], ["sum"]),
            helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
        ],
    )


def accumulator() -> ModelProto:
    one = helper.make_tensor("one", INT32, [], [1])
    model = _model(
        "accumulator",
        [_io("INPUT"), _io("START"), _io("STATE_IN")],
        [_io("OUTPUT"), _io("STATE_OUT")],
        [
            helper.make_node("Constant", [], ["ONE"], value=one),
            helper.make_node("Sub", ["ONE", "START"], ["going_on"]),
            helper.make_node("Mul", ["STATE_IN", "going_on"], ["kept"]),
            helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        ],
    )
    return model


def simple_string_dyna_sequence() -> ModelProto:
    one = helper.make_tensor("one", INT32, [], [1])
    return _model(
        "simple_string_dyna_sequence",
        [
            _io("INPUT"),
            _io("START"),
            _io("END"),
            _io("READY"),
            _io("CORRID", TensorProto.STRING),
            _io("INPUT_STATE"),
        ],
        [_io("OUTPUT"), _io("OUTPUT_STATE")],
        [
            helper.make_node("Constant", [], ["ONE"], value=one),
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
            helper.make_node("Sub", ["ONE", "START"], ["going_on"]),
            helper.make_node("Mul", ["INPUT_STATE", "going_on"], ["before"]),
            helper.make_node("Add", ["INPUT", "before"], ["total"]),
            helper.make_node("Mul", ["END", "corrid"], ["at_end"]),
            helper.make_node("Add", ["total", "at_end"], ["answer"]),
            helper.make_node("Mul", ["READY", "answer"], ["OUTPUT"]),
            helper.make_node("Sub", ["total", "INPUT_STATE"], ["change"]),
            helper.make_node("Mul", ["READY", "change"], ["kept_change"]),
            helper.make_node("Add", ["INPUT_STATE", "kept_change"], ["OUTPUT_STATE"]),
        ],
    )


def flag(name: str, kind: str) -> str:
    return (
        f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} '
        "int32_false_true: [ 0, 1 ] } ] }"
    )


CORRID_CONTROL = (
    '{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }'
)
STRING_CORRID_CONTROL = CORRID_CONTROL.replace("TYPE_UINT64", "TYPE_STRING")
DYNA_FLAGS = [flag("START", "START"), flag("END", "END"), flag("READY", "READY")]
IO = (
    'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)


def config(name: str, strategy: str = "", idle_us: int = 0, count: int = 1) -> str:
    """The config.pbtxt of model `name` (one of the four), Triton's for those of its
    examples; `strategy` a strategy block ("direct { }", "oldest { ... }")."""
    controls = {
        "simple_sequence": [flag("START", "START"), flag("READY", "READY")],
        "simple_dyna_sequence": [*DYNA_FLAGS, CORRID_CONTROL],
        "simple_string_dyna_sequence": [*DYNA_FLAGS, STRING_CORRID_CONTROL],
        "accumulator": [flag("START", "START")],
    }[name]
    state = ""
    if name == "accumulator":
        state = (
            'state [ { input_name: "STATE_IN" output_name: "STATE_OUT" '
            "data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
        )
    elif name == "simple_string_dyna_sequence":
        state = (
            'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" '
            "data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
        )
    idle = f"max_sequence_idle_microseconds: {idle_us}\n" if idle_us else ""
    return (
        f'name: "{name}"\nmax_batch_size: 8\n'
        f"sequence_batching {{\n{idle}{strategy}\n"
        f"control_input [ {', '.join(controls)} ]\n{state}}}\n"
        f"{IO}instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    )


BUILDERS = {
    "simple_sequence": simple_sequence,
    "simple_dyna_sequence": simple_dyna_sequence,
    "accumulator": accumulator,
    "simple_string_dyna_sequence": simple_string_dyna_sequence,
}


def neff(name: str, batched: bool = True) -> bytes:
    """Model `name` compiled with batch buckets 1..8, or (not `batched`) for one fixed
    shape, [1, 1] every tensor (max_batch_size 0)."""
    model = BUILDERS[name]()
    if batched:
        return compile_model(model, dynamic_batch=bucket_ranges(1, 8), name=name).neff
    shapes = {i.name: [1, 1] for i in model.graph.input}
    return compile_model(model, input_shapes=shapes, name=name).neff


def write_model(root: Path, served_as: str, name: str, text: str) -> None:
    """Model `name`'s NEFF and config `text` in `root/served_as/`."""
    (root / served_as / "1").mkdir(parents=True, exist_ok=True)
    (root / served_as / "1" / "model.neff").write_bytes(neff(name))
    (root / served_as / "config.pbtxt").write_text(
        text.replace(f'name: "{name}"', f'name: "{served_as}"')
    )
