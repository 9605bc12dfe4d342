"""The NC's two engines: the reference numpy kernels and the fast one (onnxruntime per NC
program) give the same outputs within fp32 rounding and the very same counters, on the
three model families; the fast engine really runs them, and keeps to the reference
kernels where it must."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import driver_sim
from driver_sim.fast import FastProgram
from neuron_rtd import models
from neuron_rtd.compiler import compile_model
from neuron_rtd.neff import Stage, read_neff
from neuron_rtd.runtime import LocalRuntime, NcCounters

COUNTED = [
    "pe_num_executed_instr",
    "pe_matmul_num_executed_instr",
    "pool_num_executed_instr",
    "act_num_executed_instr",
    "sb_rmw_count",
    "macs_count",
]
SHAPES: dict[str, dict[str, int]] = {"resnet": {"N": 2}, "bert": {"B": 1, "S": 16}, "ssd": {}}


def compiled(family: str) -> tuple[bytes, dict[str, np.ndarray]]:
    onnx_model = models.MODELS[family](**models.SMALL[family], seed=7)
    dims = SHAPES[family]
    shapes = {
        i.name: [dims.get(d.dim_param, d.dim_value) for d in i.type.tensor_type.shape.dim]
        for i in onnx_model.graph.input
    }
    neff = compile_model(onnx_model, input_shapes=shapes).neff
    return neff, models.random_inputs(onnx_model, seed=8, **dims)


def counted(counters: NcCounters) -> dict[str, int]:
    """The counters a run adds from its program (busy time and idle cycles are the
    host's)."""
    return {name: getattr(counters, name) for name in COUNTED}


def run(engine: str, neff: bytes, feeds: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    with LocalRuntime("inf1.xlarge", engine=engine) as rt:
        model = rt.load(neff)
        outputs = [rt.infer(model, feeds) for _ in range(3)]
        counters = [counted(rt.runtime.nc_counters(vnc)) for vnc in range(4)]
    for later in outputs[1:]:  # every run of an engine gives the same bits
        for name, value in later.items():
            np.testing.assert_array_equal(value, outputs[0][name])
    return outputs[0], counters


@pytest.mark.parametrize("family", ["resnet", "bert", "ssd"])
def test_engines_agree_on_outputs_and_counters(family: str) -> None:
    neff, feeds = compiled(family)
    reference, ref_counters = run("reference", neff, feeds)
    fast, fast_counters = run("fast", neff, feeds)
    assert fast_counters == ref_counters
    assert sum(c["macs_count"] for c in ref_counters) > 0
    for name, want in reference.items():
        got = fast[name]
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def stages(neff: bytes) -> Iterator[Stage]:
    for node in read_neff(neff).nodes:
        if node.kind == "neuron":
            yield from node.stages


def nc_program(stage: Stage) -> driver_sim.NcProgram:
    return driver_sim.NcProgram(
        [driver_sim.Instr(i.op, i.inputs, i.outputs, i.attrs) for i in stage.instructions],
        dict(stage.weights),
        list(stage.inputs),
        list(stage.outputs),
        opset=stage.opset,
    )


@pytest.mark.parametrize("family", ["resnet", "bert"])
def test_the_fast_engine_takes_whole_programs(family: str) -> None:
    """Every NC program of these families runs on onnxruntime (none is left to the
    reference kernels), its fused instructions mapped to ONNX ops."""
    neff, feeds = compiled(family)
    tensors = read_neff(neff).tensors
    (stage,) = stages(neff)  # one NC, fed by the model's inputs
    loaded = driver_sim.load_program("test", nc_program(stage))
    assert loaded.program.opset == 17
    fast = FastProgram.of(loaded, threads=1, opset=loaded.program.opset)
    assert fast is not None
    outputs = {name: np.empty(tensors[name].shape, tensors[name].dtype) for name in stage.outputs}
    assert fast.run({name: feeds[name] for name in stage.inputs}, outputs)
    want = {name: np.empty_like(value) for name, value in outputs.items()}
    driver_sim.execute_program(loaded, {name: feeds[name] for name in stage.inputs}, want)
    for name, value in outputs.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5)


def test_programs_whose_shapes_follow_computed_values_stay_on_the_reference_kernels() -> None:
    def program(*instructions: driver_sim.Instr) -> Any:
        return driver_sim.load_program(
            "test", driver_sim.NcProgram(list(instructions), {}, ["x"], ["y"])
        )

    shaped_by_input = program(driver_sim.Instr("Reshape", ("x", "x"), ("y",)))
    random = program(driver_sim.Instr("RandomUniformLike", ("x",), ("y",)))
    shaped_by_shape = program(
        driver_sim.Instr("Shape", ("x",), ("s",)), driver_sim.Instr("Reshape", ("x", "s"), ("y",))
    )
    assert FastProgram.of(shaped_by_input, 1, None) is None
    assert FastProgram.of(random, 1, None) is None
    assert FastProgram.of(shaped_by_shape, 1, None) is not None


def test_arrays_seen_again_run_in_place_with_their_new_values() -> None:
    """A model's slots are the same arrays every run: from the second run on they are
    bound to onnxruntime, which must read what is in them now and write into them."""
    rng = np.random.default_rng(3)
    program = driver_sim.NcProgram(
        [driver_sim.Instr("MatMul", ("x", "w"), ("h",)), driver_sim.Instr("Relu", ("h",), ("y",))],
        {"w": rng.standard_normal((8, 5)).astype(np.float32)},
        ["x"],
        ["y"],
    )
    loaded = driver_sim.load_program("test", program)
    fast = FastProgram.of(loaded, threads=1, opset=None)
    assert fast is not None
    x, y = np.empty((3, 8), np.float32), np.empty((3, 5), np.float32)
    for _ in range(4):
        x[...] = rng.standard_normal(x.shape)
        assert fast.run({"x": x}, {"y": y}) == ((3, 8),)
        want = {"y": np.empty_like(y)}
        driver_sim.execute_program(loaded, {"x": x}, want)
        np.testing.assert_allclose(y, want["y"], rtol=1e-5, atol=1e-6)
    other = np.empty_like(y)  # another output array: its own run, no stale binding
    assert fast.run({"x": x}, {"y": other})
    np.testing.assert_array_equal(other, y)


# Run in a process of its own: threads of other tests (a channel's, a pool's) may come
# and go in this one while it counts.
_UNLOAD_CYCLES = """
import gc, os, time
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.runtime import LocalRuntime

def threads():
    return len(os.listdir("/proc/self/task"))

sample = build_mlp((16, 32, 4), batch=1, seed=0)
with LocalRuntime("inf1.xlarge", engine="fast") as rt:
    model = rt.load(sample.neff)  # the first load starts what stays (a pool or two)
    rt.infer(model, sample.random_inputs())
    rt.unload(model)
    gc.collect()
    before = threads()
    gc.disable()
    for _ in range(5):
        model = rt.load(sample.neff)
        rt.infer(model, sample.random_inputs())
        rt.unload(model)
    deadline = time.monotonic() + 5  # a thread that ends as it is counted
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    print(before, threads())
"""


def test_an_unloaded_models_sessions_and_threads_go_with_it() -> None:
    """Nothing holds a fast program's sessions in a cycle: they (and their onnxruntime
    threads) are freed as the model unloads, not at some later garbage collection (which
    is off while the models come and go)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _UNLOAD_CYCLES], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    before, after = map(int, run.stdout.split())
    assert after <= before, f"{after - before} threads more after 5 loads and unloads"


def _alternating(ways: dict[int, int], threads: int, n: int) -> int:
    """The nth run of a way: its time, and 1.5 times that every other run."""
    return ways[threads] * (2 + n % 2) // 2


def _preempted_on_all(often: tuple[int, int], threads: int, n: int) -> int:
    """Preemptions of the nth run: alternately often[0] and often[1] on all threads."""
    return often[n % 2] if threads == 2 else 0


def _trial(
    choice: Any,
    took: Callable[[int, int], int],
    preempted: Callable[[int, int], int] = lambda threads, n: 0,
) -> list[int]:
    """Runs on the threads `choice.pick(2)` gives until it chooses, the nth run of a way
    taking took(threads, n) ns, preempted preempted(threads, n) times: each run's threads."""
    runs: list[int] = []
    counts = {1: 0, 2: 0}
    while choice.one is None and len(runs) < 1000:
        threads = choice.pick(2)
        choice.took(threads, took(threads, counts[threads]), preempted(threads, counts[threads]))
        counts[threads] += 1
        runs.append(threads)
    return runs


def test_one_thread_is_chosen_only_when_it_runs_as_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread choice of a set of shapes: the first trial runs take all the engine's
    threads (the warm-up's not counted), then one thread and all take turns; one thread is
    kept unless all threads' fastest run beats its fastest by more than the slack,
    relative and absolute."""
    from driver_sim.fast import (
        ONE_THREAD_SLACK,
        ONE_THREAD_SLACK_NS,
        TRIAL_RUNS,
        TRIAL_WARMUP,
        _Threads,
    )

    monkeypatch.setattr("driver_sim.fast.TRIAL_SETTLE_NS", 0)  # settled by runs alone
    us = 1000
    slack = round(1000 * us * ONE_THREAD_SLACK)  # all threads' fastest: 1 ms
    cases = [  # (one thread's fastest run, all threads' fastest, one chosen)
        (900 * us, 1000 * us, True),
        (slack, 1000 * us, True),
        (slack + 1, 1000 * us, False),
        (1500 * us, 1000 * us, False),
        (100 * us + ONE_THREAD_SLACK_NS, 100 * us, True),  # 20% faster, by one wake only
        (100 * us + ONE_THREAD_SLACK_NS + 1, 100 * us, False),
        (16 * us + ONE_THREAD_SLACK_NS // 2, 16 * us, True),  # by a lot, but a few us
    ]
    for one_ns, all_ns, chosen in cases:
        choice = _Threads()
        for _ in range(TRIAL_WARMUP):  # slow first runs: not counted
            assert choice.pick(2) == 2 and choice.one is None
            choice.took(2, 10 * all_ns)
        ways = {2: all_ns, 1: one_ns}  # each way's runs alternately as long and 1.5x
        runs = _trial(choice, functools.partial(_alternating, ways))
        assert runs == [2, 1] * TRIAL_RUNS  # in turn: both ways see the host alike
        assert choice.one is chosen
        assert choice.pick(4) == (1 if chosen else 4)


def test_a_trial_waits_for_the_host_to_settle_and_long_runs_keep_all_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs in the first TRIAL_SETTLE_NS are not timed (what loading left behind takes a
    core from them); runs longer than TRIAL_LONGEST_NS on all threads keep them, with no
    run on one thread."""
    from driver_sim.fast import TRIAL_LONGEST_NS, TRIAL_RUNS, TRIAL_WARMUP, _Threads

    clock = [0]
    monkeypatch.setattr("driver_sim.fast.time.monotonic_ns", lambda: clock[0])
    choice = _Threads()
    for _ in range(10 * TRIAL_WARMUP):  # many runs, but within the settling time
        choice.took(2, 1000)
        clock[0] += 1000
    assert choice.pick(2) == 2 and choice._took == ([], [])
    clock[0] += 10**9
    for _ in range(TRIAL_RUNS):
        assert choice.pick(2) == 2 and choice.one is None
        choice.took(2, TRIAL_LONGEST_NS + 1)
    assert choice.one is False and choice.pick(2) == 2


def test_one_thread_is_tried_again_later_and_gives_way_when_all_threads_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A choice of one thread made while the host was busy must not stand for good: it is
    tried again RETRY_FIRST_NS later (warm-up runs, no settling time), then after twice as
    long each time one thread wins again, and all threads take over when they win."""
    from driver_sim.fast import RETRY_FIRST_NS, TRIAL_RUNS, TRIAL_WARMUP, _Threads

    monkeypatch.setattr("driver_sim.fast.TRIAL_SETTLE_NS", 0)
    clock = [10**12]
    monkeypatch.setattr("driver_sim.fast.time.monotonic_ns", lambda: clock[0])
    us = 1000

    def trial(choice: _Threads, all_ns: int, one_ns: int) -> None:
        runs = []
        if choice.one is not None:  # the back-off is past: this run starts the trial
            assert choice.pick(2) == 2 and choice.one is None
            choice.took(2, all_ns)
            runs.append(2)
        runs += _trial(choice, lambda threads, n: all_ns if threads == 2 else one_ns)
        assert runs == [2] * (TRIAL_WARMUP + 1) + [1, 2] * (TRIAL_RUNS - 1) + [1]

    choice = _Threads()
    trial(choice, all_ns=400 * us, one_ns=400 * us)  # all threads slowed by a busy host
    assert choice.one is True
    for wait in (RETRY_FIRST_NS, 2 * RETRY_FIRST_NS):
        clock[0] += wait - 1
        assert choice.pick(2) == 1 and choice.one is True  # not yet
        clock[0] += 1
        trial(choice, all_ns=400 * us, one_ns=400 * us)  # still no faster: one again
        assert choice.one is True
    clock[0] += 4 * RETRY_FIRST_NS
    trial(choice, all_ns=200 * us, one_ns=400 * us)  # the host is quiet now
    assert choice.one is False
    clock[0] += 100 * RETRY_FIRST_NS
    assert choice.pick(2) == 2 and choice.one is False  # all threads stand


def test_a_trial_on_a_busy_host_tries_long_runs_and_compares_typical_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the trial's runs on all threads waited for cores (starved: another process had
    them), long runs are tried on one thread too, and the median run of each way decides:
    beside a busy loop some runs on all threads find the cores free, most do not."""
    from driver_sim.fast import TRIAL_LONGEST_NS, TRIAL_RUNS, TRIAL_WARMUP, _Threads

    monkeypatch.setattr("driver_sim.fast.TRIAL_SETTLE_NS", 0)
    ms = 1_000_000
    assert 10 * ms > TRIAL_LONGEST_NS
    # preempted a run, alternately: a busy host, a quiet one (however busy the warm-up)
    for preempted, chosen in (((2, 3), True), ((0, 1), False)):
        choice = _Threads()
        for _ in range(TRIAL_WARMUP):
            choice.took(2, 30 * ms, 5)
        runs = _trial(  # one lucky run of 10 ms on all threads, the others 16-26
            choice,
            lambda threads, n: (
                (10 * ms if n == 0 else (16 + n) * ms) if threads == 2 else 16 * ms + n * 1000
            ),
            functools.partial(_preempted_on_all, preempted),
        )
        if not chosen:  # a quiet host: long runs keep all threads untried
            assert runs == [2] * TRIAL_RUNS and choice.one is False and choice.pick(2) == 2
            continue
        assert runs.count(1) == TRIAL_RUNS and runs[-2:] == [2, 1]  # in turn once found busy
        assert choice.one is chosen  # by the fastest run, all threads would have won


def test_all_threads_chosen_are_tried_again_when_their_runs_slow_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A choice of all threads is watched: BUSY_RUNS runs in a row over BUSY_SLOWER times
    the fastest, preempted, start another trial, long runs tried too; one slow run does
    not, nor runs slowed without preemption, and once all threads win again the next such
    trial waits for the back-off."""
    from driver_sim.fast import (
        BUSY_RUNS,
        BUSY_SLOWER,
        PREEMPTED_PER_RUN,
        RETRY_FIRST_NS,
        TRIAL_LONGEST_NS,
        TRIAL_RUNS,
        TRIAL_WARMUP,
        _Threads,
    )

    monkeypatch.setattr("driver_sim.fast.TRIAL_SETTLE_NS", 0)
    clock = [10**12]
    monkeypatch.setattr("driver_sim.fast.time.monotonic_ns", lambda: clock[0])
    fast = 2 * TRIAL_LONGEST_NS  # long runs: all threads kept untried
    slow = int(fast * BUSY_SLOWER) + 1
    choice = _Threads()
    for _ in range(TRIAL_WARMUP + TRIAL_RUNS):
        choice.took(2, fast)
    assert choice.one is False

    def slowed(runs: int, preempted: int = PREEMPTED_PER_RUN) -> None:
        for _ in range(runs):
            assert choice.pick(2) == 2
            choice.watch(slow, preempted if choice.slowing else 0)

    slowed(BUSY_RUNS - 1)
    choice.watch(fast)  # the host's noise: one slow run, or a few, change nothing
    slowed(4 * BUSY_RUNS, preempted=PREEMPTED_PER_RUN - 1)  # slowed alike (the clock)
    choice.watch(fast)
    slowed(BUSY_RUNS - 1)
    assert choice.one is False
    slowed(1)  # BUSY_RUNS in a row, preempted: the host got busy, a trial of long runs too
    assert choice.one is None
    runs = _trial(choice, lambda threads, n: slow if threads == 2 else 2 * slow)
    assert runs.count(1) == TRIAL_RUNS  # tried on one thread (in turn), though long
    assert runs[: TRIAL_WARMUP + 1] == [2] * (TRIAL_WARMUP + 1)
    assert choice.one is False  # all threads still win, slowed as they are
    slowed(4 * BUSY_RUNS)
    assert choice.one is False  # within the back-off: no trial
    clock[0] += RETRY_FIRST_NS
    choice.watch(slow, PREEMPTED_PER_RUN)  # slow still, the back-off past: tried again
    assert choice.one is None


def test_a_program_runs_on_the_threads_its_trial_chose_with_the_same_bits() -> None:
    """Through the trial (all threads and one in turn, one on a session made in the
    background) to the choice: every run writes the same bits, and the runs after the
    choice are bound to a session of the threads chosen."""
    import time

    from driver_sim.fast import TRIAL_RUNS

    rng = np.random.default_rng(5)
    program = driver_sim.NcProgram(
        [
            driver_sim.Instr("MatMul", ("x", "w"), ("h",)),
            driver_sim.Instr("Relu", ("h",), ("r",)),
            driver_sim.Instr("MatMul", ("r", "v"), ("y",)),
        ],
        {
            "w": rng.standard_normal((64, 256)).astype(np.float32),
            "v": rng.standard_normal((256, 16)).astype(np.float32),
        },
        ["x"],
        ["y"],
    )
    loaded = driver_sim.load_program("test", program)
    fast = FastProgram.of(loaded, threads=2, opset=None)
    assert fast is not None
    x, y = rng.standard_normal((4, 64)).astype(np.float32), np.empty((4, 16), np.float32)
    assert fast.run({"x": x}, {"y": y})
    first = y.copy()
    deadline = time.monotonic() + 60
    choice = None
    while choice is None or choice.one is None:
        assert time.monotonic() < deadline, "no thread choice after a minute of runs"
        y[...] = 0
        fast.run({"x": x}, {"y": y})
        np.testing.assert_array_equal(y, first)
        choice = fast._threads_for.get(((4, 64),))
    one_thread_sessions = [kind for _, kind in fast._sessions if kind[0] == 1]
    assert bool(one_thread_sessions) is choice.one  # all threads chosen: the trial's went
    ran: list[int] = []  # the threads of each bound run from now on
    for key, bound in list(fast._bound.items()):

        def counted(run: Any = bound.run, threads: Any = key[0]) -> Any:
            ran.append(threads)
            return run()

        fast._bound[key] = dataclasses.replace(bound, run=counted)
    for _ in range(TRIAL_RUNS):
        fast.run({"x": x}, {"y": y})
        np.testing.assert_array_equal(y, first)
    assert ran == [1 if choice.one else 2] * TRIAL_RUNS


def test_choosing_all_threads_drops_the_trials_one_thread_session() -> None:
    """The session of one thread a trial made goes when all threads are chosen (it holds
    the weights once more), not while runs of other shapes take, or may take, one."""
    from driver_sim.fast import _Threads

    rng = np.random.default_rng(6)
    program = driver_sim.NcProgram(
        [driver_sim.Instr("MatMul", ("x", "w"), ("y",))],
        {"w": rng.standard_normal((8, 4)).astype(np.float32)},
        ["x"],
        ["y"],
    )
    loaded = driver_sim.load_program("test", program)  # (the fast form holds it weakly)
    fast = FastProgram.of(loaded, threads=2, opset=None)
    assert fast is not None
    types = ((np.dtype(np.float32).str, 2),)
    fast._sessions[types, (1, fast.spinning)] = fast._build(types, (1, fast.spinning))
    x, y = np.ones((2, 8), np.float32), np.empty((2, 4), np.float32)
    for _ in range(2):  # (the first may follow another program's run: not bound)
        fast.run({"x": x}, {"y": y})  # bound on all threads: its shapes' choice made
    decided, other = fast._threads_for[((2, 8),)], _Threads()
    decided.one, other.one = False, True
    fast._threads_for[((5, 8),)] = other  # other shapes run on one thread: kept
    fast._drop_one_thread_sessions()
    assert (types, (1, fast.spinning)) in fast._sessions
    other.one = False
    fast._drop_one_thread_sessions()
    assert not [kind for _, kind in fast._sessions if kind[0] == 1]
    fast.run({"x": x}, {"y": y})
    np.testing.assert_allclose(y, x @ program.weights["w"], rtol=1e-5)


def test_a_program_of_large_weights_keeps_all_threads_untried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No trial (so no second session of its weights) for a program whose weights pass
    TRIAL_MOST_WEIGHTS: its runs are bound on all threads, with no thread choice."""
    monkeypatch.setattr("driver_sim.fast.TRIAL_MOST_WEIGHTS", 8 * 4 - 1)  # under one (8, 4)
    program = driver_sim.NcProgram(
        [driver_sim.Instr("MatMul", ("x", "w"), ("y",))],
        {"w": np.ones((8, 4), np.float32)},
        ["x"],
        ["y"],
    )
    loaded = driver_sim.load_program("test", program)  # (the fast form holds it weakly)
    fast = FastProgram.of(loaded, threads=2, opset=None)
    assert fast is not None
    x, y = np.ones((2, 8), np.float32), np.empty((2, 4), np.float32)
    for _ in range(3):
        fast.run({"x": x}, {"y": y})
    np.testing.assert_array_equal(y, np.full((2, 4), 8, np.float32))
    assert fast._bound and all(key[0] == 2 for key in fast._bound)
    assert fast._threads_of.get(tuple(id(a) for a in (x, y))) is not None  # bound, and
    assert all(choice._seen == 0 for choice in fast._threads_for.values())  # never tried
