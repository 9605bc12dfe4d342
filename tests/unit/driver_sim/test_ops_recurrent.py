"""The recurrent kernels (driver_sim.ops.recurrent: LSTM, GRU, RNN): every ONNX backend
node case, the kernels against onnxruntime across their attributes, both NC engines and
their counters, the compiler's placement (sequence_lens inputs, buckets, bounds), and
PyTorch's exported layers compiled into one Neuron node."""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from kernel_cases import node_cases, run_case
from onnx import TensorProto, helper, numpy_helper

import driver_sim
from driver_sim import KERNELS
from driver_sim.fast import FastProgram
from neuron_rtd import onnxrt
from neuron_rtd.compiler import compile_model
from neuron_rtd.neff import read_neff
from neuron_rtd.runtime import LocalRuntime

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
WEIGHTS = {"W", "R", "B", "P"}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
DIRECTIONS = ["forward", "reverse", "bidirectional"]
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
RUNS = 3  # inferences per compiled model (each run's outputs alike)


@pytest.mark.parametrize("op", sorted(GATES))
def test_onnx_node_cases(op: str) -> None:
    """Every case passes on the kernel, the batch-first (layout 1) ones included."""
    cases = node_cases(op)
    assert len(cases) == 6
    assert {case.name: run_case(case) for case in cases} == {case.name: None for case in cases}


# ---- helpers ------------------------------------------------------------------------------


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def layer_inputs(
    op: str,
    direction: str,
    *,
    seed: int = 0,
    bias: bool = True,
    lengths: Sequence[int] | None = None,
    initial: bool = True,
    peepholes: bool = False,
) -> list[np.ndarray | None]:
    """X, W, R and the optional inputs of `op` (None where left out), in ONNX order."""
    rng = np.random.default_rng(seed)
    d, rows = 2 if direction == "bidirectional" else 1, GATES[op] * HIDDEN
    inputs: list[np.ndarray | None] = [
        rand(rng, SEQ, BATCH, INPUT),
        rand(rng, d, rows, INPUT) * 0.5,
        rand(rng, d, rows, HIDDEN) * 0.5,
        rand(rng, d, 2 * rows) if bias else None,
        None if lengths is None else np.array(lengths, np.int32),
        rand(rng, d, BATCH, HIDDEN) if initial else None,
    ]
    if op == "LSTM":
        inputs += [rand(rng, d, BATCH, HIDDEN) if initial else None]
        inputs += [rand(rng, d, 3 * HIDDEN) if peepholes else None]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def node_model(
    op: str,
    inputs: Sequence[np.ndarray | None],
    outputs: Sequence[str] | None = None,
    *,
    constants: Sequence[str] = (),
    opset: int = 22,
    **attrs: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model of `op` (the inputs named in `constants` as initializers) and its
    feeds; `outputs` may leave some out ("")."""
    names = [name if value is not None else "" for name, value in zip(INPUTS, inputs, strict=False)]
    outputs = list(OUTPUTS[op] if outputs is None else outputs)
    node = helper.make_node(op, names, outputs, **attrs)
    given = {n: v for n, v in zip(INPUTS, inputs, strict=False) if v is not None}
    feeds = {n: v for n, v in given.items() if n not in constants}
    graph = helper.make_graph(
        [node],
        op.lower(),
        [helper.make_tensor_value_info(n, _elem(v), v.shape) for n, v in feeds.items()],
        [  # Y is 4-D, Y_h and Y_c 3-D; shape inference works out their sizes
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (4 if n == "Y" else 3))
            for n in outputs
            if n
        ],
        [numpy_helper.from_array(given[n], n) for n in constants],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, feeds


def _elem(value: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(value.dtype)


def kernel(op: str, inputs: Sequence[np.ndarray | None], **attrs: Any) -> tuple[np.ndarray, ...]:
    """The kernel of `op` as the runtime calls it (after parsing and its support check)."""
    kern = KERNELS[op]
    values = kern.parse_attrs(attrs)
    kern.check_support([a.dtype for a in inputs if a is not None], values)
    result = kern.bind(values)(*inputs)
    assert isinstance(result, tuple) and len(result) == len(OUTPUTS[op])
    return result


def refusal(op: str, dtypes: Sequence[str] = ("float32",) * 3, **attrs: Any) -> str:
    """Why the kernel refuses these attributes (or input dtypes)."""
    kern = KERNELS[op]
    with pytest.raises(ValueError) as info:
        kern.check_support([np.dtype(d) for d in dtypes], kern.parse_attrs(attrs))
    return str(info.value)


def ort_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return onnxrt.run(onnxrt.session(model, log_severity=onnxrt.LOG_SILENT), feeds)


def assert_matches_ort(op: str, inputs: Sequence[np.ndarray | None], **attrs: Any) -> None:
    got = kernel(op, inputs, **attrs)
    want = ort_outputs(*node_model(op, inputs, **attrs))
    for name, value in zip(OUTPUTS[op], got, strict=True):
        assert value.dtype == np.float32 and value.shape == want[name].shape, name
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-5, err_msg=name)


# ---- the kernels against onnxruntime ------------------------------------------------------


@pytest.mark.parametrize("op", sorted(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lengths", [None, [5, 2, 3], [0, 5, 1]])
@pytest.mark.parametrize("full", [False, True])
def test_kernels_match_onnxruntime(
    op: str, direction: str, lengths: list[int] | None, full: bool
) -> None:
    """Directions, sequence lengths (an empty sequence too), with and without the
    optional inputs (B, initial states, LSTM peepholes)."""
    inputs = layer_inputs(op, direction, bias=full, lengths=lengths, initial=full, peepholes=full)
    assert_matches_ort(op, inputs, hidden_size=HIDDEN, direction=direction)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("LSTM", {"clip": 0.4}),
        ("LSTM", {"input_forget": 1}),
        ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "Softsign"]}),
        (
            "LSTM",  # alpha and beta taken in order by the activations that use one
            {
                "activations": ["Sigmoid", "LeakyRelu", "Affine"],
                "activation_alpha": [0.3, 1.5],
                "activation_beta": [0.2],
            },
        ),
        ("LSTM", {"activations": ["HardSigmoid", "ScaledTanh", "Elu"]}),  # defaults
        (
            "GRU",
            {
                "activations": ["HardSigmoid", "ScaledTanh", "Sigmoid", "Softplus"],
                "activation_alpha": [0.25, 0.9],
                "activation_beta": [0.4, 1.2],
                "direction": "bidirectional",
            },
        ),
        ("GRU", {"linear_before_reset": 1}),
        ("GRU", {"linear_before_reset": 1, "clip": 0.3, "direction": "reverse"}),
        ("RNN", {"activations": ["Relu"], "clip": 2.0}),
        ("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}),
        ("RNN", {"activations": ["Elu", "Tanh"], "direction": "bidirectional"}),
    ],
)
def test_attributes_match_onnxruntime(op: str, attrs: dict[str, Any]) -> None:
    direction = attrs.get("direction", "forward")
    inputs = layer_inputs(op, direction, lengths=[5, 3, 4], peepholes=True)
    assert_matches_ort(op, inputs, hidden_size=HIDDEN, **attrs)


@pytest.mark.parametrize("op", sorted(GATES))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_batch_first_layout_is_the_transposed_time_major_one(op: str, direction: str) -> None:
    """onnxruntime has no layout 1: its results are those of layout 0 on the transposed
    inputs, transposed back."""
    inputs = layer_inputs(op, direction, lengths=[5, 2, 4])
    time_major = kernel(op, inputs, direction=direction)
    swapped = [
        a.swapaxes(0, 1) if k in (0, 5, 6) and a is not None else a for k, a in enumerate(inputs)
    ]
    batch_first = kernel(op, swapped, direction=direction, layout=1)
    np.testing.assert_array_equal(batch_first[0], time_major[0].transpose(2, 0, 1, 3))
    for got, want in zip(batch_first[1:], time_major[1:], strict=True):
        np.testing.assert_array_equal(got, want.swapaxes(0, 1))


def test_float16_and_float64_keep_their_dtype() -> None:
    inputs = layer_inputs("GRU", "forward", lengths=[5, 1, 2])
    want = kernel("GRU", inputs)
    for dtype, tolerance in ((np.float16, 2e-2), (np.float64, 1e-5)):
        cast = [a if a is None or a.dtype == np.int32 else a.astype(dtype) for a in inputs]
        got = kernel("GRU", cast)
        assert [a.dtype for a in got] == [dtype, dtype]
        np.testing.assert_allclose(got[0], want[0], atol=tolerance)


def test_inputs_stay_unmodified() -> None:
    inputs = layer_inputs("LSTM", "bidirectional", lengths=[5, 2, 3], peepholes=True)
    frozen = [a if a is None else a.copy() for a in inputs]
    for array in inputs:
        if array is not None:
            array.flags.writeable = False
    kernel("LSTM", inputs, direction="bidirectional", clip=1.0)
    for before, after in zip(frozen, inputs, strict=True):
        np.testing.assert_array_equal(before, after)


def test_refusals_name_what_is_wrong() -> None:
    assert "(3 in all), got 6" in refusal("LSTM", activations=["Sigmoid", "Tanh", "Tanh"] * 2)
    assert "3 activations per direction (6 in all), got 3" in refusal(
        "LSTM", direction="bidirectional", activations=["Sigmoid", "Tanh", "Tanh"]
    )
    with pytest.raises(ValueError, match="'Swish' is not one of"):
        KERNELS["RNN"].parse_attrs({"activations": ["Swish"]})
    with pytest.raises(ValueError, match="clip: must be positive"):
        KERNELS["GRU"].parse_attrs({"clip": 0.0})
    with pytest.raises(ValueError, match="direction: must be one of"):
        KERNELS["GRU"].parse_attrs({"direction": "sideways"})
    assert "share one dtype" in refusal("RNN", ["float32", "float16", "float32"])
    assert "int64" in refusal("RNN", ["float32", "float32", "float32", "float32", "int64"])
    assert KERNELS["LSTM"].since == KERNELS["GRU"].since == KERNELS["RNN"].since == (7, 14, 22)
    inputs = layer_inputs("RNN", "forward")
    with pytest.raises(ValueError, match="hidden_size 5 but R is"):
        kernel("RNN", inputs, hidden_size=5)
    with pytest.raises(ValueError, match=r"sequence_lens must be within 0\.\.5"):
        kernel("RNN", layer_inputs("RNN", "forward", lengths=[6, 1, 1]))
    with pytest.raises(ValueError, match="initial_h must be"):
        kernel("RNN", [*inputs[:5], inputs[5][:, :2]])  # type: ignore[index]


# ---- compiled: both engines, counters, the compiler's planning --------------------------


def weights_of(op: str, inputs: Sequence[np.ndarray | None]) -> list[str]:
    """The inputs a model holds as initializers: the weights (and LSTM peepholes)."""
    return [n for n, a in zip(INPUTS, inputs, strict=False) if a is not None and n in WEIGHTS]


def nc_runs(
    neff: bytes, feeds: Mapping[str, np.ndarray], engine: str
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The outputs of three runs on `engine` (all alike) and what the NCs counted per run."""
    with LocalRuntime("inf1.xlarge", engine=engine) as rt:
        model = rt.load(neff)
        runs = [rt.infer(model, feeds) for _ in range(RUNS)]
        counters = [rt.runtime.nc_counters(vnc) for vnc in range(4)]
    for later in runs[1:]:
        for name, value in later.items():
            np.testing.assert_array_equal(value, runs[0][name])
    fields = ["pe_num_executed_instr", "act_num_executed_instr", "pool_num_executed_instr"]
    counted = {f: sum(getattr(c, f) for c in counters) // RUNS for f in [*fields, "macs_count"]}
    return runs[0], counted


def only_neuron_nodes(neff: bytes) -> list[driver_sim.NcProgram]:
    """The NC programs of a NEFF that has no CPU node."""
    nodes = read_neff(neff).nodes
    assert [node.kind for node in nodes] == ["neuron"] * len(nodes)
    return [
        driver_sim.NcProgram(
            [driver_sim.Instr(i.op, i.inputs, i.outputs, i.attrs) for i in stage.instructions],
            dict(stage.weights),
            list(stage.inputs),
            list(stage.outputs),
            opset=stage.opset,
        )
        for node in nodes
        for stage in node.stages
    ]


ENGINE_CASES = [
    ("LSTM", {"direction": "bidirectional", "clip": 3.0}, None),
    ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Softsign"]}, ["", "", "Y_c"]),
    (
        "GRU",
        {
            "linear_before_reset": 1,
            "activations": ["Sigmoid", "LeakyRelu"],
            "activation_alpha": [0.2],
        },
        ["Y"],
    ),
    ("GRU", {"direction": "reverse"}, ["", "Y_h"]),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}, None),
]


@pytest.mark.parametrize(("op", "attrs", "outputs"), ENGINE_CASES)
def test_engines_agree_with_onnxruntime_and_count_alike(
    op: str, attrs: dict[str, Any], outputs: list[str] | None
) -> None:
    """A compiled layer (some outputs left out, ragged sequence_lens as a model input)
    runs wholly on the NC; the fast engine runs it on onnxruntime, not the reference
    kernels; both engines give onnxruntime's numbers and count the same."""
    direction = attrs.get("direction", "forward")
    inputs = layer_inputs(op, direction, lengths=[4, 5, 1], peepholes=True)
    model, feeds = node_model(
        op, inputs, outputs, constants=weights_of(op, inputs), hidden_size=HIDDEN, **attrs
    )
    neff = compile_model(model).neff
    (program,) = only_neuron_nodes(neff)
    loaded = driver_sim.load_program("test", program)
    fast = FastProgram.of(loaded, threads=1, opset=program.opset)
    assert fast is not None
    want = ort_outputs(model, feeds)
    slots = {name: np.empty_like(want[name]) for name in program.outputs}
    assert fast.run({name: feeds[name] for name in program.inputs}, slots) is not None
    reference, counted = nc_runs(neff, feeds, "reference")
    fast_outputs, fast_counted = nc_runs(neff, feeds, "fast")
    assert fast_counted == counted
    assert set(reference) == set(want) == {name for name in outputs or OUTPUTS[op] if name}
    for name, value in want.items():
        np.testing.assert_allclose(reference[name], value, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast_outputs[name], value, rtol=1e-5, atol=1e-5)


def test_counters_count_the_projections_and_the_gates() -> None:
    """MACs: every step's input and recurrent projections in each direction; PE: the
    input projection, then a product per step and direction; ACT and POOL the gates."""
    inputs = layer_inputs("LSTM", "bidirectional", bias=False, initial=False)
    model, feeds = node_model(
        "LSTM", inputs, constants=["W", "R"], hidden_size=HIDDEN, direction="bidirectional"
    )
    _, counted = nc_runs(compile_model(model).neff, feeds, "reference")
    steps = SEQ * 2
    assert counted == {
        "macs_count": SEQ * BATCH * 2 * 4 * HIDDEN * (INPUT + HIDDEN),
        "pe_num_executed_instr": 1 + steps,
        "act_num_executed_instr": 4 * steps,
        "pool_num_executed_instr": 2 * steps,
    }
    work = KERNELS["GRU"].side_work
    assert work is not None
    shapes = [(SEQ, BATCH, INPUT), (1, 18, INPUT), (1, 18, HIDDEN)]
    attrs = KERNELS["GRU"].parse_attrs({})
    assert work(shapes, [], attrs)[driver_sim.Engine.PE] == (2 * SEQ, 0)  # reset first
    attrs = KERNELS["GRU"].parse_attrs({"linear_before_reset": 1, "layout": 1})
    batch_first = [(BATCH, SEQ, INPUT), *shapes[1:]]
    assert work(batch_first, [], attrs)[driver_sim.Engine.ACT] == (
        2 * SEQ,
        3 * SEQ * BATCH * HIDDEN,
    )


@pytest.mark.parametrize("mode", ["matmult", "all"])
def test_auto_cast_rounds_alike_on_both_engines(mode: str) -> None:
    """The recurrent layers are not cast with the matrix multiplies (their per-step
    products read the fp32 state); `all` rounds their inputs, on both engines alike."""
    inputs = layer_inputs("GRU", "forward", lengths=[5, 3, 2])
    model, feeds = node_model("GRU", inputs, constants=weights_of("GRU", inputs))
    plain, _ = nc_runs(compile_model(model).neff, feeds, "reference")
    neff = compile_model(model, auto_cast=mode).neff
    reference, _ = nc_runs(neff, feeds, "reference")
    fast, _ = nc_runs(neff, feeds, "fast")
    for name, value in reference.items():
        np.testing.assert_allclose(fast[name], value, rtol=1e-5, atol=1e-5)
        if mode == "matmult":
            np.testing.assert_array_equal(value, plain[name])
        else:
            assert not np.array_equal(value, plain[name])
            np.testing.assert_allclose(value, plain[name], atol=5e-2)


def test_dynamic_batch_buckets_pad_rows_the_layer_keeps_apart() -> None:
    """A batch axis bucketed (padded with zero rows, sequence_lens with zeros) gives each
    row its own numbers."""
    inputs = layer_inputs("LSTM", "bidirectional", lengths=[5, 2, 3])
    model, feeds = node_model(
        "LSTM",
        inputs,
        constants=weights_of("LSTM", inputs),
        direction="bidirectional",
        hidden_size=HIDDEN,
    )
    dims = {"X": (SEQ, "N", INPUT), "sequence_lens": ("N",)}
    dims |= {"initial_h": (2, "N", HIDDEN), "initial_c": (2, "N", HIDDEN)}
    for declared in model.graph.input:
        shape = declared.type.tensor_type.shape
        for dim, size in zip(shape.dim, dims[declared.name], strict=True):  # N for the batch
            if isinstance(size, str):
                dim.dim_param = size
    neff = compile_model(model, dynamic={"N": [(1, 2), (3, 4)]}).neff
    only_neuron_nodes(neff)
    got, _ = nc_runs(neff, feeds, "fast")
    for name, value in ort_outputs(model, feeds).items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


def test_a_sequence_cut_at_run_time_is_planned_at_its_bound() -> None:
    """X's sequence axis known only at run time (a Slice to a run-time end): Y is
    planned at X's bound, its sequence axis dynamic."""
    rng = np.random.default_rng(5)
    w, r = rand(rng, 1, 4 * HIDDEN, INPUT), rand(rng, 1, 4 * HIDDEN, HIDDEN)
    nodes = [
        helper.make_node("Slice", ["x", "zero", "end", "zero"], ["X"]),
        helper.make_node("LSTM", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=HIDDEN),
    ]
    graph = helper.make_graph(
        nodes,
        "cut",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, BATCH, INPUT]),
            helper.make_tensor_value_info("end", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1, BATCH, HIDDEN]),
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, BATCH, HIDDEN]),
        ],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(r, "R"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    neff = compile_model(model).neff
    only_neuron_nodes(neff)
    specs = {spec.name: spec for spec in read_neff(neff).outputs}
    assert (specs["Y"].shape, specs["Y"].dynamic) == ((SEQ, 1, BATCH, HIDDEN), (0,))
    feeds = {"x": rand(rng, SEQ, BATCH, INPUT), "end": np.array([3], np.int64)}
    got, _ = nc_runs(neff, feeds, "fast")
    want = ort_outputs(model, feeds)
    assert got["Y"].shape == (3, 1, BATCH, HIDDEN)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


# ---- PyTorch's layers ---------------------------------------------------------------------


def exported(layer: Any, x: Any) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            layer.eval(), (x,), buffer, dynamo=False, input_names=["x"], output_names=["y", "h"]
        )
    return onnx.load_model_from_string(buffer.getvalue())


def torch_layers() -> list[Any]:
    torch = pytest.importorskip("torch")
    nn = torch.nn
    return [
        nn.LSTM(64, 128, num_layers=2, batch_first=True),
        nn.GRU(64, 128, batch_first=True),
        nn.RNN(64, 128, num_layers=2, nonlinearity="relu"),
        nn.LSTM(64, 128, bidirectional=True, batch_first=True),
        nn.GRU(64, 32, num_layers=2, bidirectional=True),
    ]


@pytest.mark.parametrize("index", range(5))
def test_torch_layers_compile_into_one_neuron_node(index: int) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(index)
    layer = torch_layers()[index]
    x = torch.randn(4, 7, 64)
    model = exported(layer, x)
    assert {node.op_type for node in model.graph.node} & {"LSTM", "GRU", "RNN"}
    neff = compile_model(model).neff
    assert len(read_neff(neff).nodes) == 1
    only_neuron_nodes(neff)
    feeds = {"x": x.numpy()}
    want = ort_outputs(model, feeds)
    for engine in ("fast", "reference"):
        got, counted = nc_runs(neff, feeds, engine)
        assert counted["macs_count"] > 0
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4, err_msg=name)
