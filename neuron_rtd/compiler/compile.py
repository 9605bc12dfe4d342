"""The compiler's flow: ONNX model in, NEFF bytes and a summary out.

1. Load and check the model (onnx checker), fix input shapes (`input_shapes`), and find
   the dynamic dimensions: symbolic input axes given ranges in `dynamic` (or axis 0 of
   every input with `dynamic_batch`). An axis `input_shapes` gives as -1 is left free:
   any size per inference, with no buckets; every op on a tensor whose size follows it
   goes to a CPU node (onnxruntime takes any shape), so the NC parts stay fixed. Any
   other unknown input axis is an error.
2. Per bucket (every combination of the dynamic dimensions' ranges; a single static graph
   when there are none): fix the inputs at the bucket's largest sizes, infer shapes, fold
   constants and BatchNormalization, place ops on the NC or CPU, order and cut them into
   nodes (fitted into the NCs the NEFF may take, `nc_limit`), split the Neuron part into
   stages, give them NCs, and emit.
3. Read the NEFF back (the builder does) so nothing invalid is ever returned.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from neuron_rtd.compiler.buckets import Range, declare_bucketed_output, symbolic_outputs
from neuron_rtd.compiler.emit import Emitted, Emitter, MovedOp, split_by_cost
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.compiler.fuse import fuse
from neuron_rtd.compiler.onnx_graph import (
    Dim,
    Graph,
    build_graph,
    check_model,
    graph_inputs,
    input_dims,
    load_model,
    value_type,
    with_input_shapes,
)
from neuron_rtd.compiler.partition import (
    LARGEST_MACHINE_NCS,
    NC,
    SMALLEST_MACHINE_NCS,
    IslandCosts,
    fit_islands,
    nc_refusal,
    place,
)
from neuron_rtd.compiler.qfunctions import fuse_quantized_functions
from neuron_rtd.compiler.qoperator import expand_qoperator
from neuron_rtd.compiler.summary import Summary
from neuron_rtd.errors import NrtError
from neuron_rtd.neff import NeffBuilder, read_neff
from neuron_rtd.neff.dtypes import TENSOR_DTYPES, dtype_name
from neuron_rtd.neff.program import AUTO_CAST_MODES, AUTO_CAST_TYPES

BATCH = "batch"  # the symbol --dynamic-batch gives axis 0 of every input
FREE = "free:"  # the start of the symbol an input axis left free (-1) takes in planning
MAX_BUCKETS = 64

# Told of the compile's progress: (what is being done, steps done, steps in all). The steps
# are: load and check the model, each bucket (one when there are none), write the NEFF.
Progress = Callable[[str, int, int], None]  # told (what, done, total) as work goes on


def _no_progress(what: str, done: int, total: int) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class CompileResult:
    neff: bytes
    summary: Summary


def compile_model(
    source: str | Path | bytes | onnx.ModelProto,
    *,
    num_neuroncores: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dynamic: Mapping[str, Sequence[Range]] | None = None,
    dynamic_batch: Sequence[Range] | None = None,
    name: str | None = None,
    gzip: bool = False,
    auto_cast: str = "none",
    auto_cast_type: str = "bf16",
    progress: Progress | None = None,
) -> CompileResult:
    """Compile an ONNX model to NEFF bytes. `dynamic` maps a symbolic input dimension
    (its dim_param) to its bucket ranges; `dynamic_batch` does so for axis 0 of every
    input; a -1 in `input_shapes` leaves that axis free (any size per inference, on CPU
    nodes only). `num_neuroncores` splits the Neuron part into that many pipeline stages and
    bounds the NCs the NEFF takes (None: 1 stage, at most `nc_limit(None)` NCs).
    CompileError names what cannot be compiled; every option is checked against the model
    before any bucket is compiled."""
    limit = nc_limit(num_neuroncores)
    if auto_cast not in AUTO_CAST_MODES or auto_cast_type not in AUTO_CAST_TYPES:
        raise CompileError(
            f"--auto-cast must be one of {', '.join(AUTO_CAST_MODES)} and --auto-cast-type one "
            f"of {', '.join(AUTO_CAST_TYPES)}, got {auto_cast} and {auto_cast_type}"
        )
    cast = (auto_cast, auto_cast_type)
    progress = progress or _no_progress
    progress("loading and checking the model", 0, 1)
    model = load_model(source)
    check_model(model)
    axes = _input_axes(model, dict(input_shapes or {}), dynamic_batch is not None)
    ranges: dict[str, Sequence[Range]] = dict(dynamic or {})
    if dynamic_batch is not None:
        ranges[BATCH] = dynamic_batch
    axes = _fix_single_sizes(axes, ranges)
    symbols = sorted(
        {d for dims in axes.values() for d in dims if isinstance(d, str) and not is_free(d)}
    )
    for symbol in symbols:
        if symbol not in ranges:
            where = [
                f"{n}[{a}]" for n, dims in axes.items() for a, d in enumerate(dims) if d == symbol
            ]
            raise CompileError(
                f"input dimension {symbol!r} ({', '.join(where)}) is not fixed: give it a size "
                f"with --input-shape or buckets with --dynamic {symbol}=LOW:HIGH"
            )
    unused = sorted(set(ranges) - set(symbols))
    if unused:
        free = ", ".join(symbols) or "none"
        raise CompileError(
            f"--dynamic names {', '.join(unused)}, which is no free dimension of any input "
            f"(free: {free}; --input-shape fixes every axis of its input)"
        )
    combos = list(itertools.product(*(ranges[s] for s in symbols)))
    if len(combos) > MAX_BUCKETS:
        raise CompileError(f"{len(combos)} buckets is too many (at most {MAX_BUCKETS})")
    if symbols:
        _check_outputs_vary_once(model, axes, symbols)
    if dynamic_batch is not None:
        _check_outputs_follow_the_batch(model, axes)
    model_name = name or model.graph.name or "model"
    builder = NeffBuilder(model_name)
    summary = Summary(model_name)
    steps = len(combos) + 2
    try:
        if not symbols:
            progress("compiling", 1, steps)
            graph = _graph_for(model, axes, {}, cast)
            emitted = _emit(graph, builder, num_neuroncores, "")
            summary.add(None, emitted)
        else:

            def bucket_done(label: str, index: int) -> None:
                progress(f"compiling bucket {label}", 1 + index, steps)

            _compile_buckets(
                model, axes, symbols, combos, builder, summary, num_neuroncores, cast, bucket_done
            )
        progress("writing the NEFF", steps - 1, steps)
        neff = builder.build(gzip=gzip, shared_weights=True)
    except NrtError as exc:  # the NEFF the builder made does not read back
        raise CompileError(f"internal error: the NEFF written is invalid: {exc}") from exc
    written = read_neff(neff)
    summary.nc_count, summary.shared_nc_count = written.nc_count, written.max_node_ncs
    summary.requested_ncs = num_neuroncores or 1
    summary.nc_limit = limit
    summary.neff_bytes = len(neff)
    summary.stored_weight_bytes = written.stored_weight_bytes
    progress("done", steps, steps)
    return CompileResult(neff=neff, summary=summary)


def _check_outputs_follow_the_batch(
    model: onnx.ModelProto, axes: Mapping[str, tuple[Dim, ...]]
) -> None:
    """Refuse `--dynamic-batch` on a model whose batch size is fixed inside it: an output
    of a fixed shape (a Reshape to a constant shape, say) could not be cut back per
    batch, and every bucket would answer the one size."""
    fixed = {
        output: dims
        for output, dims in symbolic_outputs(model, axes).items()
        if not any(isinstance(d, str) for d in dims)
    }
    if fixed:
        which = ", ".join(f"{name!r} {tuple(dims)}" for name, dims in fixed.items())
        raise CompileError(
            f"--dynamic-batch: model output(s) {which} keep a fixed shape whatever the batch "
            "size, so the model fixes its batch inside (a Reshape to a constant shape, a "
            "batch of 1 exported as a constant): export it with a symbolic batch dimension "
            "(torch.onnx.export's dynamic_axes), or compile it without --dynamic-batch"
        )


def _check_outputs_vary_once(
    model: onnx.ModelProto, axes: Mapping[str, tuple[Dim, ...]], symbols: Sequence[str]
) -> None:
    """Refuse, before compiling, an output that shape inference says follows two dynamic
    dimensions (the check after the buckets stays, for what inference cannot see)."""
    for output, dims in symbolic_outputs(model, axes).items():
        varying = [(axis, d) for axis, d in enumerate(dims) if isinstance(d, str) and d in symbols]
        if len(varying) > 1:
            which = ", ".join(f"axis {axis} follows {d}" for axis, d in varying)
            raise CompileError(
                f"model output {output!r} would vary along {len(varying)} axes ({which}); the "
                "wire carries bytes only, so at most one may vary: fix all but one of "
                f"{', '.join(sorted({d for _, d in varying}))} with --input-shape or a "
                "single size (--dynamic SYMBOL=N:N)"
            )


def _fix_single_sizes(
    axes: dict[str, tuple[Dim, ...]], ranges: dict[str, Sequence[Range]]
) -> dict[str, tuple[Dim, ...]]:
    """A symbol given one size only (a single range LOW..LOW) is no dynamic dimension:
    fix it at that size."""
    fixed = {s: r[0][0] for s, r in ranges.items() if len(r) == 1 and r[0][0] == r[0][1]}
    for symbol in fixed:
        del ranges[symbol]
    return {
        name: tuple(fixed.get(d, d) if isinstance(d, str) else d for d in dims)
        for name, dims in axes.items()
    }


def _check_io_types(model: onnx.ModelProto) -> None:
    """Model inputs and outputs must be tensors of a dtype a NEFF carries."""
    for what, values in (("input", graph_inputs(model)), ("output", model.graph.output)):
        for vi in values:
            kind = value_type(vi)
            if kind is None:
                which = vi.type.WhichOneof("value")
                raise CompileError(
                    f"unsupported: model {what} {vi.name!r} is a {which}, not a tensor; "
                    "a NEFF carries tensors only"
                )
            if dtype_name(kind.dtype) not in TENSOR_DTYPES:
                raise CompileError(
                    f"unsupported: model {what} {vi.name!r} is {_type_name(vi)}, which a NEFF "
                    f"does not carry (it carries {', '.join(TENSOR_DTYPES)})"
                )


def _type_name(vi: onnx.ValueInfoProto) -> str:
    elem = vi.type.tensor_type.elem_type
    return onnx.TensorProto.DataType.Name(elem).lower()


def _input_axes(
    model: onnx.ModelProto, shapes: dict[str, Sequence[int]], batch: bool
) -> dict[str, tuple[Dim, ...]]:
    """Each input's axes: a fixed size or the symbol it follows."""
    _check_io_types(model)
    declared = input_dims(model)
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise CompileError(
            f"--input-shape names {', '.join(unknown)}; the inputs are {', '.join(declared)}"
        )
    axes: dict[str, tuple[Dim, ...]] = {}
    for name, dims in declared.items():
        if name in shapes:
            given = tuple(int(d) for d in shapes[name])
            if len(given) != len(dims) or any(d < -1 for d in given):
                raise CompileError(
                    f"--input-shape {name}: {list(given)} does not fit its {len(dims)} axes "
                    "(sizes must not be negative; -1 leaves an axis free)"
                )
            dims = tuple(f"{FREE}{name}[{axis}]" if d == -1 else d for axis, d in enumerate(given))
        if batch and dims:
            dims = (BATCH, *dims[1:])
        for axis, dim in enumerate(dims):
            if dim is None or (isinstance(dim, int) and dim < 0):
                raise CompileError(
                    f"input {name!r} axis {axis} has no size: give one with --input-shape"
                )
        axes[name] = dims
    return axes


def _graph_for(
    model: onnx.ModelProto,
    axes: Mapping[str, tuple[Dim, ...]],
    sizes: Mapping[str, int],
    cast: tuple[str, str],
) -> Graph:
    shapes: dict[str, list[int | str]] = {
        name: [d if isinstance(d, str) and is_free(d) else _size(d, sizes) for d in dims]
        for name, dims in axes.items()
    }
    graph = build_graph(with_input_shapes(expand_qoperator(model), shapes))
    graph.auto_cast = cast
    graph.free = any(is_free(d) for dims in axes.values() for d in dims)
    return graph


def is_free(dim: Dim) -> bool:
    """Whether `dim` is an input axis left free (-1 in `input_shapes`)."""
    return isinstance(dim, str) and dim.startswith(FREE)


def _size(dim: Dim, sizes: Mapping[str, int]) -> int:
    """A fixed axis's size, or the size `sizes` gives its symbol (0 for a free axis: it
    has no bound)."""
    if is_free(dim):
        return 0
    if isinstance(dim, str):
        return sizes[dim]
    if dim is None:
        raise CompileError("internal error: an input axis without a size reached planning")
    return dim


def nc_limit(num_neuroncores: int | None) -> int:
    """The most NCs a NEFF may take: `--num-neuroncores` when given, else the smallest
    machine's (so that it loads on any); never more than the largest machine has."""
    if num_neuroncores is None:
        return SMALLEST_MACHINE_NCS
    if not 1 <= num_neuroncores <= LARGEST_MACHINE_NCS:
        raise CompileError(
            f"--num-neuroncores must be 1 to {LARGEST_MACHINE_NCS} (the NCs of the largest "
            f"machine), got {num_neuroncores}"
        )
    return num_neuroncores


def _emit(graph: Graph, builder: NeffBuilder, num_nc: int | None, prefix: str) -> Emitted:
    _add_output_copies(graph)
    fuse(graph, lambda node: nc_refusal(node, graph) is None)
    fuse_quantized_functions(graph, lambda node: nc_refusal(node, graph) is None)
    refusals = place(graph)
    emitter = Emitter(graph, builder, refusals, prefix)
    limit = nc_limit(num_nc)
    island_costs = IslandCosts(cost=emitter.cost, macs=emitter.macs, on_host=emitter.on_host)
    runs, moved = fit_islands(graph, refusals, limit, island_costs)
    nc_runs = [run for run in runs if run.kind == NC]
    costs = [sum(emitter.cost(node) for node in run.nodes) for run in nc_runs]
    counts = stages_per_node(costs, num_nc or 1, [len(r.nodes) for r in nc_runs])
    firsts = shared_ncs(costs, limit) if sum(counts) > limit else None
    if firsts is not None:
        counts = [1] * len(nc_runs)
    emitted = emitter.emit(runs, counts, firsts)
    emitted.nc_limit = limit
    emitted.moved = [MovedOp(n.name, n.op_type, refusals[n.name] or "") for n in moved]
    return emitted


def stages_per_node(costs: Sequence[int], num_nc: int, sizes: Sequence[int]) -> list[int]:
    """NCs for each Neuron node: at least one each, the rest of `num_nc` shared out by
    cost (never more stages than a node has ops)."""
    counts = [1] * len(costs)
    for _ in range(max(0, num_nc - len(costs))):
        open_nodes = [i for i in range(len(costs)) if counts[i] < sizes[i]]
        if not open_nodes:
            break
        best = max(open_nodes, key=lambda i: costs[i] / counts[i])
        counts[best] += 1
    return counts


def shared_ncs(costs: Sequence[int], limit: int) -> list[int]:
    """The NC of each of more Neuron nodes than `limit` NCs, one stage each: runs of
    consecutive nodes share an NC, cut where their work balances (a pipeline of `limit`
    stages, each running its nodes' programs one at a time)."""
    cuts = split_by_cost(costs, limit)
    return [nc for nc, (lo, hi) in enumerate(itertools.pairwise(cuts)) for _ in range(lo, hi)]


def _add_output_copies(graph: Graph) -> None:
    """A model output that no node produces (a constant, or an input passed through)
    gets an Identity node, so that some node produces every output."""
    produced = {out for node in graph.nodes for out in node.output}
    for name in graph.outputs:
        if name in produced:
            continue
        if name in graph.inputs:
            raise CompileError(f"model output {name!r} is the model input itself")
        if name not in graph.consts:
            raise CompileError(f"model output {name!r} is produced by no node")
        source = f"{name}.constant"
        graph.consts[source] = graph.consts.pop(name)
        graph.types[source] = graph.types[name]
        graph.nodes.append(onnx.helper.make_node("Identity", [source], [name], name=f"{name}.copy"))


def _compile_buckets(
    model: onnx.ModelProto,
    axes: Mapping[str, tuple[Dim, ...]],
    symbols: Sequence[str],
    combos: Sequence[tuple[Range, ...]],
    builder: NeffBuilder,
    summary: Summary,
    num_nc: int | None,
    cast: tuple[str, str],
    starting: Callable[[str, int], None],
) -> None:
    tops = {s: max(combo[i][1] for combo in combos) for i, s in enumerate(symbols)}
    results: list[tuple[dict[str, int], Emitted]] = []
    for index, combo in enumerate(combos):
        bounds = dict(zip(symbols, combo, strict=True))
        label = ",".join(f"{s}={lo}..{hi}" for s, (lo, hi) in bounds.items())
        starting(label, index)
        bucket = builder.add_bucket(label, bounds)
        sizes = {s: hi for s, (_, hi) in bounds.items()}
        graph = _graph_for(model, axes, sizes, cast)
        emitted = _emit(graph, bucket, num_nc, f"b{index}.")
        summary.add(label, emitted)
        results.append((sizes, emitted))
    for name, dims in axes.items():
        dtype = _input_dtype(model, name)
        shape = [_size(d, tops) for d in dims]
        builder.add_input(
            name,
            dtype,
            shape,
            symbols=[d if isinstance(d, str) and not is_free(d) else None for d in dims],
            dynamic=[axis for axis, d in enumerate(dims) if is_free(d)],
        )
    named = symbolic_outputs(model, axes)
    free = any(is_free(d) for dims in axes.values() for d in dims)
    for out in model.graph.output:
        declare_bucketed_output(builder, out.name, results, named.get(out.name, ()), tops, free)


def _input_dtype(model: onnx.ModelProto, name: str) -> np.dtype:
    vi = next(v for v in model.graph.input if v.name == name)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
