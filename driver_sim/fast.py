"""The fast engine of a NeuronCore: a loaded program's arithmetic done by one onnxruntime
session, built from the program itself (its instructions as ONNX nodes, its weights as
initializers), which runs with the GIL released on the threads the engine is given.

What the NC is does not change: the program was checked and resolved by `load_program`
exactly as for the reference engine (the numpy kernels), and a run counts the same
counters, which come from the program and the shapes it ran on, not from the execution.
The first run of each set of input shapes also runs the reference kernels, only to
measure those counters (its outputs are the fast engine's, as every run's); later runs of
the same shapes take them from there.

A model's slots are the same arrays at every run, so from its second run on a slot's
arrays are bound to the session (onnxruntime's IOBinding): it reads the inputs and writes
the outputs in place, with no feed dictionary and no output copy.

Under the runtime's thread policy (WHILE_BUSY, `neuron_rtd.onnxrt`) a program's threads
spin a while after its run, for the next run of the same program. When another program ran
last (models taking turns, a pipeline's stages, DataParallel's copies), that spinning only
takes the cores the other program computes on: such a run goes to a session of the same
program that sleeps the moment its run ends (IN_RUNS), made in the background the first
time it is wanted (4 small CNNs called in turn on 2 cores: 0.76 ms a call, 1.25 spinning).

The engine's threads go only where they pay: each set of input shapes of a program whose
runs are short is run on all of them and on one over its first runs, and keeps one unless
all are clearly faster (a graph too small or too sequential to split; see `_Threads`).
On a busy host long runs are tried too, and a choice of all threads that slows is tried again.

A program runs on the reference kernels when its shapes cannot be told from its input
shapes (an op whose output shape depends on values computed from the inputs, such as
NonZero or a Reshape to a shape read from an input), when it draws random numbers (the
NC's own generator), when its inputs or outputs are of ml_dtypes' narrow types (which
onnxruntime's Python binding cannot exchange), or when onnxruntime does not take the
graph it makes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import resource
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from driver_sim import blas
from driver_sim.errors import KernelError
from driver_sim.execute import store_output
from driver_sim.onnx_graph import InputTypes, declared_types, run_types, to_onnx
from driver_sim.ops.random import RANDOM_OPS
from driver_sim.ops.registry import NARROW
from driver_sim.program import VALUE_SHAPED_OPS, Instr, LoadedProgram, Shape
from neuron_rtd import onnxrt
from neuron_rtd.onnxrt import IN_RUNS, WHILE_BUSY

if TYPE_CHECKING:
    from driver_sim.core import RunCounts

ENGINES = ("reference", "fast")
DEFAULT_OPSET = 17  # for programs that name none (hand-built ones)
# Ops whose output shape depends on values however they are fed.
DATA_SHAPED_OPS = frozenset({"NonZero", "NonMaxSuppression", "Compress", "Unique"})


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise ValueError(f"unknown NC engine {name!r}: use one of {', '.join(ENGINES)}")
    return name


Key = tuple[Shape, ...]  # the input shapes of a run
Kind = tuple[int, str]  # a session's intra-op threads and how they wait (onnxrt's spinning)
_UNBUILT = object()  # no session (yet) for these types and threads


MAX_BINDINGS = 64  # per program: slots times thread counts, in any real use
_last_run = 0  # id() of the program whose run began last in this process (see the doc)
# The trial of a set of shapes times no run before TRIAL_SETTLE_NS after its first, nor
# before TRIAL_WARMUP runs: a session's first runs are slower, and what loading left behind
# (BLAS threads spinning ~0.1 s) takes a core: ResNet-18 took 33-47 ms then, 17-20 after.
TRIAL_SETTLE_NS = 500_000_000
TRIAL_WARMUP = 8
TRIAL_RUNS = 8  # timed runs each way before the runs of a set of shapes get their threads
# Runs this long keep all threads untried: the spinning after such a run costs little
# beside it, and a one-thread session would hold the program's weights once more. So do
# programs of weights this large (an embedding table's lookups are short runs).
TRIAL_LONGEST_NS = 2_000_000
TRIAL_MOST_WEIGHTS = 64 << 20
# All threads are kept when their fastest run beats one thread's by more than 3% and by
# more than 20 us (a wake of a sleeping thread costs 20-70 us, see neuron_rtd.onnxrt): the
# other threads must earn the cores they take. An MLP 784-128-10: 7.5 us on two threads,
# 11 on one; the daemon serving it took 901 us of CPU a call on two, 506 on one.
ONE_THREAD_SLACK = 1.03
ONE_THREAD_SLACK_NS = 20_000
# One thread, once chosen, is tried again after RETRY_FIRST_NS, then twice as long each
# time it wins, up to RETRY_LONGEST_NS: a choice made on a busy host must not outlive it.
RETRY_FIRST_NS = 2_000_000_000
RETRY_LONGEST_NS = 8_000_000_000
# All threads, chosen (or kept untried), are tried again when BUSY_RUNS runs in a row take
# over BUSY_SLOWER times their fastest, preempted as often as on a busy host (below): beside
# a busy loop ResNet-18 took 10-26 ms a run on both threads (8-9 quiet), 16-17 on one.
BUSY_SLOWER = 1.5
BUSY_RUNS = 8
# Runs on all threads preempted (getrusage's involuntary context switches) this often on
# average waited for cores another process had: the host is busy. On 2 cores, MobileNetV2's
# and EfficientNet-B0's trial runs: 0-1 preemptions a run quiet, 1-6 beside a busy loop.
PREEMPTED_PER_RUN = 2


class _Threads:
    """How many threads the runs of one set of input shapes take, chosen by trial: all
    the engine's, unless one thread runs them as fast. A graph too small or too
    sequential to split leaves the other threads waiting, spinning, on cores the rest of
    the host wants (a daemon's gRPC threads, its clients): measured on 2 cores, an MLP
    784-128-10 through the daemon took 1230 us of its CPU a call with both threads, 540 with
    one, and answered sooner.

    The trial times bound runs that had the engine to themselves (no other NC run in
    progress): once settled (TRIAL_SETTLE_NS, the first trial only, and TRIAL_WARMUP
    runs), TRIAL_RUNS on all threads and, unless those take over TRIAL_LONGEST_NS,
    TRIAL_RUNS on one (a session of one thread, made in the background), in turn; and it
    compares the fastest run of each way (the host's noise only ever adds time), or when
    the trial's threads waited for cores (PREEMPTED_PER_RUN), the median run of each way. A
    program of weights over TRIAL_MOST_WEIGHTS keeps all threads untried. One thread,
    once chosen, is tried again later (RETRY_FIRST_NS); all threads, once chosen, are
    tried again when their runs slow down (BUSY_SLOWER: the host got busy)."""

    def __init__(self) -> None:
        self.one: bool | None = None  # the choice, once made
        self._took: tuple[list[int], list[int]] = ([], [])  # ns a run: all threads, one
        self._first = 0  # when the first trial run ended (monotonic ns)
        self._seen = 0  # trial runs on all threads so far, settling ones too
        self._settle = TRIAL_SETTLE_NS  # the first trial's; a later one's is none
        self._again = 0  # when a choice may be tried again (monotonic ns)
        self._retry = RETRY_FIRST_NS  # the back-off after the next choice
        self._fastest = 0  # the fastest all-threads run timed so far (ns)
        self._slow = 0  # runs in a row, on all threads chosen, over BUSY_SLOWER * _fastest
        self._long = False  # this trial tries long runs too, by the median (busy host, retry)
        self._starved = self._trials = 0  # preemptions (a trial's, slow runs'); choices made

    def pick(self, most: int) -> int:
        """The threads of a run that may take `most` (> 1): in a trial, all and one in turn
        once runs on all are timed and short (both ways then see the host alike)."""
        one = self.one
        if one is None:
            every, alone = self._took
            if len(every) >= TRIAL_RUNS:
                return 1
            if not every or (not self._long and min(every) > TRIAL_LONGEST_NS):
                return most
            return 1 if len(alone) < len(every) else most
        if one and time.monotonic_ns() >= self._again:
            self._try_again()
            return most
        return 1 if one else most

    def took(self, threads: int, ns: int, preempted: int = 0) -> None:
        """A trial run on `threads` took `ns`, its threads `preempted` that many times
        (often: another process had the cores, and long runs are tried too)."""
        every, one = self._took
        if threads == 1:
            one.append(ns)
        else:
            now = time.monotonic_ns()
            self._first = self._first or now
            self._seen += 1
            if self._seen > TRIAL_WARMUP and now - self._first >= self._settle:
                every.append(ns)
                self._starved += preempted
                self._long = self._long or self._starved >= PREEMPTED_PER_RUN * TRIAL_RUNS
            if len(every) == TRIAL_RUNS and min(every) > TRIAL_LONGEST_NS and not self._long:
                self._chose(one=False)
        if len(one) >= TRIAL_RUNS:
            # a busy host slows runs on all threads unevenly: some find the cores free
            typical = statistics.median if self._long else min
            alone, together = typical(one), typical(every)
            self._chose(
                alone <= together * ONE_THREAD_SLACK or alone - together <= ONE_THREAD_SLACK_NS
            )

    @property
    def slowing(self) -> bool:  # runs on all threads, chosen, have begun to slow down
        return self._slow > 0

    def watch(self, ns: int, preempted: int = 0) -> None:
        """A run on all threads, chosen, took `ns`, preempted that often (counted while
        `slowing`). Runs slowed alike on any threads (the machine's own clock: every side
        here from 3.7 to 5.5 ms a run for a while) are not preempted: no trial."""
        if ns <= self._fastest * BUSY_SLOWER:
            self._fastest = min(self._fastest, ns)
            self._slow = self._starved = 0
            return
        self._slow += 1
        self._starved += preempted
        if (
            self._slow >= BUSY_RUNS
            and self._starved >= PREEMPTED_PER_RUN * (self._slow - 1)  # the first uncounted
            and time.monotonic_ns() >= self._again
        ):
            self._try_again()

    def _chose(self, one: bool) -> None:
        """The trial's choice; after the back-off, one thread (or all, chosen again) is
        tried again."""
        every = self._took[0]
        self._fastest = min(self._fastest or every[0], *every)
        self.one, self._slow, self._starved, self._long = one, 0, 0, False
        self._trials += 1
        if one or self._trials > 1:
            self._again = time.monotonic_ns() + self._retry
            self._retry = min(2 * self._retry, RETRY_LONGEST_NS)

    def _try_again(self) -> None:
        """Start another trial of this choice, of long runs too, by the median run (the
        host was or is busy; a dropped one-thread session is rebuilt)."""
        self._took = ([], [])
        self._first = self._seen = self._settle = self._starved = 0
        self.one, self._long = None, True


@dataclass(frozen=True)
class _Bound:
    session: Any
    binding: Any  # onnxruntime's IOBinding of `arrays`
    arrays: list[np.ndarray]
    key: Key
    run: Callable[[], Any]  # runs `session` on `binding` (see `_binding_run`)


def _run(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # onnxruntime's own exception types
        raise KernelError(f"fast engine: {exc}") from None


def _binding_run(session: Any, binding: Any) -> Callable[[], Any]:
    """What runs `session` on `binding`: onnxruntime's compiled `run_with_iobinding`
    itself when its Python wrapper would only check, at every run, what holds for good
    here (the binding is of this session; no WebGPU graph capture, which a CPU session
    never does); the wrapper otherwise, or where its internals are not those of the
    onnxruntime this was written for (1.31: `_sess`, `_iobinding`, `_session`)."""
    try:
        compiled, raw = session._sess, binding._iobinding
        direct = binding._session is compiled and not compiled.is_webgpu_graph_capture_enabled()
    except AttributeError:
        direct = False
    if direct:
        return functools.partial(compiled.run_with_iobinding, raw, None)
    return functools.partial(session.run_with_iobinding, binding)


class FastProgram:
    """A loaded program's onnxruntime sessions: one per input types and thread count.
    The session of all the engine's threads is made when the program loads (when its
    input types are declared) or at its first run; a session of fewer threads, for NC
    runs side by side, is made in the background when first wanted, the full one serving
    meanwhile, so that no run waits for a session to be built but the very first."""

    def __init__(
        self, loaded: LoadedProgram, threads: int, opset: int, *, spinning: str = WHILE_BUSY
    ) -> None:
        # Weakly: the loaded program holds this (`LoadedProgram.fast`), and a cycle would
        # keep the sessions (their memory and threads) until a full garbage collection,
        # not free them as the program is unloaded.
        self._loaded = weakref.ref(loaded)
        self.threads = threads
        weights = sum(np.asarray(w).nbytes for w in loaded.program.weights.values())
        self._tried = weights <= TRIAL_MOST_WEIGHTS  # its threads chosen by trial (_Threads)
        self.spinning = spinning
        self.opset = opset
        # What a run adds to the NC's counters, per input shapes (kept by the NC).
        self.counts: dict[Key, RunCounts] = {}
        self._declared = declared_types(loaded.program.input_types)
        self._input_names = [name for name, _ in loaded.input_slots]
        self._output_names = [name for name, _, _ in loaded.output_slots]
        self.default: Kind = (threads, spinning)  # the session a first run makes
        self._sessions: dict[tuple[InputTypes, Kind], Any] = {}  # None: refused
        self._building: set[tuple[InputTypes, Kind]] = set()
        # Bindings by session kind and the ids of the arrays they bind (kept alive there).
        self._bound: dict[tuple[object, ...], _Bound] = {}
        # The thread choice per input shapes, and per bound arrays (theirs).
        self._threads_for: dict[Key, _Threads] = {}
        self._threads_of: dict[tuple[int, ...], _Threads] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls, loaded: LoadedProgram, threads: int, opset: int | None, *, spinning: str = WHILE_BUSY
    ) -> FastProgram | None:
        """The fast form of `loaded`, or None when it runs on the reference kernels. With
        its input types declared (`NcProgram.input_types`) its session is made now."""
        if not _shapes_follow_input_shapes(loaded.program.instructions, loaded.program.weights):
            return None
        fast = cls(loaded, threads, opset or DEFAULT_OPSET, spinning=spinning)
        if (types := fast._declared) is not None:
            fast._sessions[types, fast.default] = fast._build(types, fast.default)
        return fast

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> Key | None:
        """Run on onnxruntime into `outputs`; the input shapes (which key the run's
        cost), or None (nothing written) when onnxruntime refused this program for
        inputs of these types. The engine's threads are shared by the NC runs in
        progress (`blas.run_starts`).

        Arrays seen again (a model's slots are the same arrays every run) run on their
        binding: onnxruntime reads the inputs and writes the outputs in place."""
        ins = [inputs[name] for name in self._input_names]
        outs = [outputs[name] for name in self._output_names]
        most = blas.run_starts(self.threads)
        try:
            arrays = (*map(id, ins), *map(id, outs))
            chooser = self._threads_of.get(arrays) if most > 1 and self._tried else None
            threads = most if chooser is None else chooser.pick(most)
            kind = (threads, self._spinning(threads))
            key = (*kind, *arrays)
            bound = self._bound.get(key)
            if bound is not None:
                if chooser is None or chooser.one or most < self.threads:
                    _run(bound.run)
                elif chooser.one is False:  # all threads chosen: watched
                    slowing = chooser.slowing
                    preempted = _preempted() if slowing else 0
                    began = time.perf_counter_ns()
                    _run(bound.run)
                    took = time.perf_counter_ns() - began
                    chooser.watch(took, _preempted() - preempted if slowing else 0)
                else:  # a trial run, the engine to itself
                    began, preempted = time.perf_counter_ns(), _preempted()
                    _run(bound.run)
                    took = time.perf_counter_ns() - began
                    chooser.took(threads, took, _preempted() - preempted)
                    if chooser.one is False:
                        self._drop_one_thread_sessions()
                return bound.key
            feeds = {name: np.asarray(a) for name, a in zip(self._input_names, ins, strict=True)}
            if not _exchangeable([*feeds.values(), *outs]):
                return None
            types = run_types(self._declared, list(feeds.values()))
            session = self._sessions.get((types, kind), _UNBUILT)
            if session is _UNBUILT:
                session = self._session(types, kind)
            if session is None:
                return None
            values = _run(session.run, self._output_names, feeds)
            if self._sessions.get((types, kind)) is session:
                self._bind(key, session, ins, outs, values)
        finally:
            blas.run_ends()
        for name, value in zip(self._output_names, values, strict=True):
            store_output(name, value, outputs[name])
        return tuple(a.shape for a in feeds.values())

    def _bind(
        self,
        key: tuple[object, ...],
        session: Any,
        ins: list[Any],
        outs: list[Any],
        values: list[Any],
    ) -> None:
        """Bind these arrays for their next runs, when they can be used in place: plain
        C-contiguous arrays, outputs of the very dtype and shape onnxruntime gave."""
        arrays = ins + outs
        if len(self._bound) >= MAX_BINDINGS or not all(
            isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays
        ):
            return
        if not all(
            isinstance(v, np.ndarray) and v.dtype == a.dtype and v.shape == a.shape
            for v, a in zip(values, outs, strict=True)
        ):
            return
        binding = session.io_binding()
        for name, array in zip(self._input_names, ins, strict=True):
            binding.bind_cpu_input(name, array)
        for name, array in zip(self._output_names, outs, strict=True):
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        shapes = tuple(a.shape for a in ins)
        self._bound[key] = _Bound(session, binding, arrays, shapes, _binding_run(session, binding))
        ids = tuple(map(id, arrays))  # the key's arrays: their shapes' thread choice
        self._threads_of[ids] = self._threads_for.setdefault(shapes, _Threads())

    def _drop_one_thread_sessions(self) -> None:
        """A trial chose all threads: the one-thread sessions go, with their bindings (a
        session holds the weights once more: ResNet-18's, 200 MiB), unless runs of other
        shapes take or may take one thread. NC runs side by side make them again when they
        want them. The heap is trimmed only when a session went (a trial of long runs made
        none, and the daemon keeps its freed heap for its requests)."""
        with self._lock:
            if any(choice.one is not False for choice in self._threads_for.values()):
                return
            dropped = [made for made in self._sessions if made[1][0] == 1]
            for made in dropped:
                del self._sessions[made]
                self._building.discard(made)
            for bound in [bound for bound in self._bound if bound[0] == 1]:
                del self._bound[bound]
        if dropped:
            threading.Thread(target=_give_back_freed_memory, daemon=True).start()

    def _spinning(self, threads: int) -> str:
        """How this run's threads wait once it ends: as the engine says, but not spinning
        after it (IN_RUNS) when another program's run began last, whose next run those
        spinning threads would slow (see the module doc). A run of one thread has no
        threads to wait."""
        global _last_run
        previous, _last_run = _last_run, id(self)
        if self.spinning != WHILE_BUSY or threads == 1 or previous in (0, id(self)):
            return self.spinning
        return IN_RUNS

    def _session(self, types: InputTypes, kind: Kind) -> Any:
        """The session of this kind (threads, spinning) for these types once built;
        meanwhile the default one (all the engine's threads, its spinning; built now, at
        the very first run)."""
        with self._lock:
            if (types, kind) in self._sessions:
                return self._sessions[types, kind]
            if (types, self.default) not in self._sessions:  # the first run: made now
                self._sessions[types, self.default] = self._build(types, self.default)
            if (types, kind) not in self._building:
                self._building.add((types, kind))
                threading.Thread(target=self._build_later, args=(types, kind), daemon=True).start()
            return self._sessions[types, self.default]

    def _build_later(self, types: InputTypes, kind: Kind) -> None:
        session = self._build(types, kind)
        with self._lock:
            self._sessions[types, kind] = session

    def _build(self, types: InputTypes, kind: Kind) -> Any:
        loaded = self._loaded()
        if loaded is None:  # unloaded while a session was being built for it
            return None
        try:
            model = to_onnx(loaded, types, self.opset)
        except (KeyError, TypeError, ValueError):
            return None
        try:
            threads, spinning = kind
            return onnxrt.session(model, threads=threads, spinning=spinning, **_SESSION)
        except Exception:  # onnxruntime refuses the graph: the reference kernels run it
            return None


# Quiet; the graph's quantized steps are the NC's, not fused into onnxruntime's kernels.
_SESSION: dict[str, Any] = {"log_severity": onnxrt.LOG_SILENT, "fuse_qdq": False}


def _preempted() -> int:
    """Times this process's threads were preempted (involuntary context switches)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def _give_back_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim): a dropped
    session's memory otherwise stays in the process's RSS (ResNet-18's one-thread session:
    RSS 498 MiB after its drop, 302 after this). Elsewhere, nothing."""
    # the process's own symbols: find_library("c") would run ldconfig, a child process
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _exchangeable(arrays: Sequence[Any]) -> bool:
    """Whether onnxruntime's Python binding takes and gives arrays of these dtypes: not
    of ml_dtypes' narrow ones (bfloat16, float8, 4-bit...), which it cannot convert (it
    gives float8 as uint8); a program with such inputs or outputs runs on the reference
    kernels (inside it, onnxruntime computes in them)."""
    return not any(np.asarray(a).dtype in NARROW for a in arrays)


# --- which programs ---------------------------------------------------------------------
# For each value-shaped op, the inputs whose values decide its output shape.
_SHAPE_INPUTS: Mapping[str, slice] = {"Range": slice(0, None), "ConstantOfShape": slice(0, None)}


def _shapes_follow_input_shapes(instructions: Sequence[Instr], weights: Mapping[str, Any]) -> bool:
    """Whether every tensor's shape follows from the program's input shapes: each value
    that shapes an output (a Reshape's shape, a Slice's bounds...) is a constant, or is
    computed from constants and input shapes only."""
    known = set(weights) | {""}  # tensors whose values follow from the input shapes
    for raw in instructions:
        instr = Instr(*raw)
        if instr.op in RANDOM_OPS or instr.op in DATA_SHAPED_OPS:
            return False
        if instr.op in VALUE_SHAPED_OPS:
            deciding = instr.inputs[_SHAPE_INPUTS.get(instr.op, slice(1, None))]
            if not all(name in known for name in deciding):
                return False
        if instr.op == "Shape" or all(name in known for name in instr.inputs):
            known.update(instr.outputs)
    return True
