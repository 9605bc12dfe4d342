"""The sequence scheduler in process (the serving core over a local runtime): the request
parameters read, configs refused at load with their reason, initial state, a sequence
kept on one copy, the backlog, idle sequences ended (their slot going to the backlog),
models without a batch axis, and requests waiting at an unload failed."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper
from sequence_models import CORRID_CONTROL, IO, config, flag, neff, write_model
from test_serving_repository import refusal, serve
from waiting import wait_until

from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.serving import InferRequest, Serving, ServingError, Status
from neuron_rtd.serving.sequence import sequence_flags
from neuron_rtd.serving.served import ServedVersion


@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


def ask(serving: Serving, model: str, x: int, sid: int | str, **flags: bool) -> int:
    parameters: dict[str, object] = {"sequence_id": sid}
    parameters.update({f"sequence_{k}": v for k, v in flags.items()})
    shape = (1, 1)
    response = serving.infer(
        InferRequest(model, {"INPUT": np.full(shape, x, np.int32)}, parameters=parameters)
    )
    return int(response.outputs["OUTPUT"].reshape(-1)[0])


def refused(call: Any) -> ServingError:
    with pytest.raises(ServingError) as caught:
        call()
    return caught.value


# --- the parameters ------------------------------------------------------------------------
def test_sequence_parameters_are_read_as_triton_reads_them() -> None:
    assert sequence_flags({}) == (0, False, False)
    assert sequence_flags({"sequence_id": 7, "sequence_start": True}) == (7, True, False)
    assert sequence_flags({"sequence_id": "u-1", "sequence_end": True}) == ("u-1", False, True)
    assert sequence_flags({"sequence_id": -1}) == ((1 << 64) - 1, False, False)  # int64 wraps
    assert sequence_flags({"sequence_id": (1 << 64) - 1})[0] == (1 << 64) - 1
    for bad in (1.5, True, None, [1]):
        error = refused(lambda bad=bad: sequence_flags({"sequence_id": bad}))
        assert error.status is Status.INVALID_ARGUMENT
        assert "invalid value type for 'sequence_id' parameter" in error.message
    assert "64-bit" in refused(lambda: sequence_flags({"sequence_id": 1 << 64})).message
    error = refused(lambda: sequence_flags({"sequence_id": 1, "sequence_start": 1}))
    assert "invalid value type for 'sequence_start' parameter, expected a boolean" in error.message


# --- configs refused at load -----------------------------------------------------------------
def accumulator_config(sequence: str, extra: str = "") -> str:
    return f"max_batch_size: 8\nsequence_batching {{ {sequence} }}\n{IO}{extra}"


START_CONTROL = f"control_input [ {flag('START', 'START')} ]"


def state(dims: str, initial: str = "") -> str:
    """The accumulator's state entry, of `dims`, with an `initial` initial_state block."""
    return (
        'state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 '
        f"dims: [ {dims} ] {initial} }} ]"
    )


@pytest.mark.parametrize(
    ("sequence", "extra", "reason"),
    [
        (
            f"control_input [ {CORRID_CONTROL.replace('TYPE_UINT64', 'TYPE_STRING')} ]",
            "",
            "(CONTROL_SEQUENCE_CORRID): its NEFF has no input 'CORRID'",
        ),
        (
            'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START '
            "fp32_false_true: [ 0, 1 ] } ] } ]",
            "",
            "(CONTROL_SEQUENCE_START) is TYPE_FP32, but its NEFF's input 'START' is TYPE_INT32",
        ),
        (
            'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "",
            "give exactly one of int32_false_true, fp32_false_true or bool_false_true",
        ),
        (
            f"control_input [ {flag('START', 'START')}, {flag('START', 'START')} ]",
            "",
            "more than one control_input is CONTROL_SEQUENCE_START",
        ),
        (
            f"{START_CONTROL} {state('2')}",
            "",
            "state 'STATE_IN': dims [2], but its NEFF's input 'STATE_IN' takes [1]",
        ),
        (
            f"iterative_sequence: true {START_CONTROL} {state('1')}",
            "",
            "iterative_sequence is not supported",
        ),
        (
            START_CONTROL
            + state("1", 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "init" }'),
            "",
            "cannot read its initial_state file",
        ),
    ],
)
def test_a_sequence_config_the_neff_contradicts_is_refused(
    local: LocalRuntime, tmp_path: Path, sequence: str, extra: str, reason: str
) -> None:
    text = accumulator_config(sequence, extra)
    write_model(tmp_path, "m", "accumulator", text)
    serving = serve(local, tmp_path)
    why = refusal(serving, "m")
    assert why.startswith("config.pbtxt of model 'm': "), why
    assert reason in why
    assert local.runtime.models() == []  # refused before any copy was loaded
    serving.close()


def test_a_control_input_listed_among_the_inputs_is_refused(
    local: LocalRuntime, tmp_path: Path
) -> None:
    text = config("simple_sequence") + 'input [ { name: "START" data_type: TYPE_INT32 dims: 1 } ]'
    write_model(tmp_path, "m", "simple_sequence", text.replace('name: "simple_sequence"', ""))
    serving = serve(local, tmp_path)
    assert "input 'START' is a sequence_batching control input" in refusal(serving, "m")
    serving.close()


def test_initial_state_from_a_file_and_from_zeros(local: LocalRuntime, tmp_path: Path) -> None:
    """START is a client's input here (not mapped as a control): 0 keeps adding to the
    state, which starts from the initial_state file's 100."""
    initial = 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" }'
    io = IO.replace("input [ ", 'input [ { name: "START" data_type: TYPE_INT32 dims: [ 1 ] }, ')
    text = f"max_batch_size: 8\nsequence_batching {{ {state('1', initial)} }}\n{io}"
    write_model(tmp_path, "m", "accumulator", text)
    (tmp_path / "m" / "initial_state").mkdir()
    (tmp_path / "m" / "initial_state" / "hundred").write_bytes(np.int32(100).tobytes())
    serving = serve(local, tmp_path)

    def add(x: int, **flags: bool) -> int:
        inputs = {"INPUT": np.full((1, 1), x, np.int32), "START": np.zeros((1, 1), np.int32)}
        parameters = {"sequence_id": 9, **{f"sequence_{k}": v for k, v in flags.items()}}
        response = serving.infer(InferRequest("m", inputs, parameters=parameters))
        return int(response.outputs["OUTPUT"][0, 0])

    assert [add(1, start=True), add(2), add(3, end=True)] == [101, 103, 106]
    assert add(5, start=True) == 105  # a new sequence starts from the file again
    serving.close()


# --- copies, the backlog, idle sequences, unloads ---------------------------------------------
def test_a_sequence_stays_on_one_copy_and_sequences_spread(
    local: LocalRuntime, tmp_path: Path
) -> None:
    write_model(tmp_path, "d", "simple_dyna_sequence", config("simple_dyna_sequence", count=2))
    serving = serve(local, tmp_path)
    seen: dict[int, set[int]] = {}
    infer = local.runtime.infer

    def noted(model_id: int, inputs: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        corrid = np.asarray(inputs["CORRID"]).reshape(-1)
        seen.setdefault(model_id, set()).update(int(c) for c in corrid if c)
        return infer(model_id, inputs, *args, **kwargs)

    local.runtime.infer = noted  # type: ignore[method-assign]
    for step in range(4):
        for sid in (11, 12):
            ask(serving, "d", step, sid, start=step == 0, end=step == 3)
    assert sorted(map(sorted, seen.values())) == [[11], [12]]  # one copy each, both copies
    serving.close()


def one_slot(tmp_path: Path, idle_us: int = 0) -> str:
    """An accumulator whose one copy holds one sequence at a time."""
    strategy = "oldest { max_candidate_sequences: 1 }"
    write_model(tmp_path, "one", "accumulator", config("accumulator", strategy, idle_us=idle_us))
    return "one"


def backlogged(serving: Serving, model: str, sid: int) -> tuple[threading.Thread, list[object]]:
    """A START of sequence `sid` on a thread of its own, which waits in the backlog."""
    got: list[object] = []

    def run() -> None:
        try:
            got.append(ask(serving, model, 40, sid, start=True))
        except ServingError as error:
            got.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    version = serving._version(model, "")
    assert isinstance(version, ServedVersion)
    sequencer = version.sequencer
    assert sequencer is not None
    wait_until(lambda: len(sequencer._backlog) == 1, 30, "the sequence in the backlog")
    return thread, got


def test_a_new_sequence_waits_for_a_slot_in_the_backlog(
    local: LocalRuntime, tmp_path: Path
) -> None:
    serving = serve(local, _repo(tmp_path, one_slot))
    assert ask(serving, "one", 1, 1, start=True) == 1
    thread, got = backlogged(serving, "one", 2)
    assert got == []
    assert ask(serving, "one", 2, 1, end=True) == 3  # sequence 1 ends: 2 takes its slot
    thread.join()
    assert got == [40]
    serving.close()


def test_an_idle_sequence_gives_its_slot_to_the_backlog(
    local: LocalRuntime, tmp_path: Path
) -> None:
    serving = serve(local, _repo(tmp_path, lambda root: one_slot(root, idle_us=200_000)))
    assert ask(serving, "one", 1, 1, start=True) == 1
    thread, got = backlogged(serving, "one", 2)
    thread.join()  # sequence 1 idle for 200 ms is ended: 2 runs
    assert got == [40]
    error = refused(lambda: ask(serving, "one", 1, 1))
    assert error.status is Status.INVALID_ARGUMENT
    assert "must specify the START flag on the first request of the sequence" in error.message
    serving.close()


def test_an_unload_fails_the_requests_waiting_their_turn(
    local: LocalRuntime, tmp_path: Path
) -> None:
    serving = serve(local, _repo(tmp_path, one_slot))
    ask(serving, "one", 1, 1, start=True)
    thread, got = backlogged(serving, "one", 2)
    serving.close()
    thread.join()
    (error,) = got
    assert isinstance(error, ServingError) and error.status is Status.UNAVAILABLE
    assert "being unloaded" in error.message


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 2 }"])
def test_a_model_without_a_batch_axis(local: LocalRuntime, tmp_path: Path, strategy: str) -> None:
    text = config("accumulator", strategy).replace("max_batch_size: 8", "max_batch_size: 0")
    text = text.replace("dims: [ 1 ]", "dims: [ 1, 1 ]")
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.neff").write_bytes(neff("accumulator", batched=False))
    (tmp_path / "m" / "config.pbtxt").write_text(text.replace('name: "accumulator"', ""))
    serving = serve(local, tmp_path)
    assert serving.model_config("m").max_batch_size == 0
    assert [ask(serving, "m", x, "a", start=x == 1, end=x == 3) for x in (1, 2, 3)] == [1, 3, 6]
    assert [ask(serving, "m", x, 2, start=x == 4, end=x == 5) for x in (4, 5)] == [4, 9]
    serving.close()


def _repo(tmp_path: Path, make: Any) -> Path:
    make(tmp_path)
    return tmp_path


# --- a string CORRID ---------------------------------------------------------------------------
STRING_DYNA = "simple_string_dyna_sequence"


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
def test_a_string_corrid_carries_each_sequence_s_string_id(
    local: LocalRuntime, tmp_path: Path, strategy: str
) -> None:
    """Two sequences interleaved, their string ids (decimal numbers, which the model adds
    at END) in their rows' CORRID; under `direct` the second's requests alone run beside
    a filler row in slot 0, which a model casting the id to a number takes."""
    write_model(tmp_path, "s", STRING_DYNA, config(STRING_DYNA, strategy))
    serving = serve(local, tmp_path)
    seen: list[list[object]] = []
    infer = local.runtime.infer

    def noted(model_id: int, inputs: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(list(np.asarray(inputs["CORRID"]).reshape(-1)))
        return infer(model_id, inputs, *args, **kwargs)

    local.runtime.infer = noted  # type: ignore[method-assign]
    assert ask(serving, "s", 1, "300", start=True) == 1
    assert ask(serving, "s", 2, "4000", start=True) == 2
    assert ask(serving, "s", 3, "4000") == 5
    assert ask(serving, "s", 10, "300") == 11
    assert ask(serving, "s", 1, "4000", end=True) == 6 + 4000
    assert ask(serving, "s", 1, "300", end=True) == 12 + 300
    assert {c for row in seen for c in row} == {b"300", b"4000"}  # UTF-8 bytes, as a client's
    if strategy.startswith("direct"):
        assert [b"4000", b"4000"] in seen  # slot 0's filler row: a copy of the real row's
    serving.close()


def test_a_string_corrid_model_refuses_an_integer_id_and_vice_versa(
    local: LocalRuntime, tmp_path: Path
) -> None:
    write_model(tmp_path, "s", STRING_DYNA, config(STRING_DYNA))
    write_model(tmp_path, "d", "simple_dyna_sequence", config("simple_dyna_sequence"))
    serving = serve(local, tmp_path)
    error = refused(lambda: ask(serving, "s", 1, 12, start=True))
    assert error.status is Status.INVALID_ARGUMENT
    assert (
        "sequence batching control 'CORRID' data-type is 'UINT64', but model 's' expects 'BYTES'"
    ) in error.message
    error = refused(lambda: ask(serving, "d", 1, "12", start=True))
    assert "data-type is 'BYTES', but model 'd' expects 'UINT64'" in error.message
    error = refused(lambda: ask(serving, "s", 1, "\ud800", start=True))
    assert "'sequence_id' is no UTF-8 text" in error.message
    assert ask(serving, "s", 7, "1", start=True, end=True) == 8  # refusals took no slot
    serving.close()


def test_a_string_corrid_the_neff_types_otherwise_is_refused(
    local: LocalRuntime, tmp_path: Path
) -> None:
    text = config("simple_dyna_sequence").replace("TYPE_UINT64", "TYPE_STRING")
    write_model(tmp_path, "m", "simple_dyna_sequence", text)
    serving = serve(local, tmp_path)
    why = refusal(serving, "m")
    assert "(CONTROL_SEQUENCE_CORRID) is TYPE_STRING, but its NEFF's input 'CORRID' is" in why
    assert "TYPE_UINT64" in why
    serving.close()


def _string_echo(root: Path, state_extra: str = "") -> None:
    """A model whose string state holds the request before's INPUT: OUTPUT = STATE_IN,
    STATE_OUT = INPUT (strings, [batch, 1])."""
    text = TensorProto.STRING
    io = [helper.make_tensor_value_info(n, text, ["batch", 1]) for n in ("INPUT", "STATE_IN")]
    out = [helper.make_tensor_value_info(n, text, ["batch", 1]) for n in ("OUTPUT", "STATE_OUT")]
    nodes = [
        helper.make_node("Identity", ["STATE_IN"], ["OUTPUT"]),
        helper.make_node("Identity", ["INPUT"], ["STATE_OUT"]),
    ]
    graph = helper.make_graph(nodes, "echo", io, out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (root / "e" / "1").mkdir(parents=True)
    compiled = compile_model(model, dynamic_batch=bucket_ranges(1, 8), name="echo").neff
    (root / "e" / "1" / "model.neff").write_bytes(compiled)
    (root / "e" / "config.pbtxt").write_text(
        'max_batch_size: 8\nsequence_batching { state [ { input_name: "STATE_IN" '
        f'output_name: "STATE_OUT" data_type: TYPE_STRING dims: [ 1 ] {state_extra} }} ] }}\n'
        'input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )


def test_a_string_state_starts_empty_and_is_kept(local: LocalRuntime, tmp_path: Path) -> None:
    _string_echo(tmp_path)
    serving = serve(local, tmp_path)

    def echo(word: bytes, **flags: bool) -> object:
        parameters = {"sequence_id": "w", **{f"sequence_{k}": v for k, v in flags.items()}}
        inputs = {"INPUT": np.array([[word]], object)}
        return serving.infer(InferRequest("e", inputs, parameters=parameters)).outputs["OUTPUT"][
            0, 0
        ]

    assert [echo(b"a", start=True), echo(b"b"), echo(b"c", end=True)] == [b"", b"a", b"b"]
    serving.close()


def test_a_string_state_s_data_file_is_refused(local: LocalRuntime, tmp_path: Path) -> None:
    _string_echo(tmp_path, 'initial_state { data_type: TYPE_STRING dims: [ 1 ] data_file: "x" }')
    serving = serve(local, tmp_path)
    assert "data_file is not read for a TYPE_STRING state; give zero_data" in refusal(serving, "e")
    serving.close()
