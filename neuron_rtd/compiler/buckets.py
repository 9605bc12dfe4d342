"""Shape buckets: the ranges a dynamic dimension is cut into (`bucket_ranges`: log2,
uniform, single or explicit bounds), and a model output declared over all of a NEFF's
buckets, each axis fixed, following one dynamic dimension (cut to an inference's size) or
dynamic (value-dependent). The compile of each bucket is `compile.py`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from neuron_rtd.compiler.emit import Emitted
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.compiler.onnx_graph import Dim, infer_types, with_input_shapes
from neuron_rtd.neff import NeffBuilder

Range = tuple[int, int]


def bucket_ranges(low: int, high: int, scheme: str = "log2") -> list[Range]:
    """Ranges covering low..high: `log2` (1, 2, 3-4, 5-8, ...), `uniform:K` (K equal
    ranges), `single` (one range), or explicit upper bounds `8,32,128`."""
    if not 1 <= low <= high:
        raise CompileError(f"a dynamic range needs 1 <= low <= high, got {low}..{high}")
    if scheme == "single":
        return [(low, high)]
    if scheme == "log2":
        tops, top = [], 1
        while top < high:
            if top >= low:
                tops.append(top)
            top *= 2
        return _ranges(low, [*tops, high])
    if scheme.startswith("uniform:"):
        count = _positive(scheme.split(":", 1)[1], scheme)
        step = -(-(high - low + 1) // count)
        return _ranges(low, [min(high, low - 1 + step * (i + 1)) for i in range(count)])
    tops = [_positive(part, scheme) for part in scheme.split(",")]
    if tops != sorted(set(tops)) or tops[-1] < high or tops[0] < low:
        raise CompileError(f"explicit bucket bounds {scheme!r} must rise and cover {low}..{high}")
    return _ranges(low, [t for t in tops if t < high] + [high])


def _positive(text: str, scheme: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise CompileError(f"bad bucket scheme {scheme!r}: {text!r} is not a positive integer")
    return int(text)


def _ranges(low: int, tops: Sequence[int]) -> list[Range]:
    ranges: list[Range] = []
    start = low
    for top in sorted(set(tops)):
        if top >= start:
            ranges.append((start, top))
            start = top + 1
    return ranges


def symbolic_outputs(
    model: onnx.ModelProto, axes: Mapping[str, tuple[Dim, ...]]
) -> dict[str, tuple[Dim, ...]]:
    """Each output's dims with the input symbols carried through by shape inference."""
    copy = with_input_shapes(
        model, {name: [d for d in dims if d is not None] for name, dims in axes.items()}
    )
    try:
        _, types = infer_types(copy)
    except CompileError:
        return {}
    return {o.name: types[o.name].shape or () for o in model.graph.output if o.name in types}


def declare_bucketed_output(
    builder: NeffBuilder,
    name: str,
    results: Sequence[tuple[dict[str, int], Emitted]],
    named: tuple[Dim, ...],
    tops: Mapping[str, int],
    free: bool = False,
) -> None:
    """The model output over all buckets: each axis fixed, following one symbol (cut to
    its size), or dynamic (value-dependent). A model with input axes left free (`free`)
    answers with arrays of their own shapes, so its outputs may vary along several axes."""
    shapes = [emitted.output_shapes[name] for _, emitted in results]
    dynamic = sorted({a for _, e in results for a in e.dynamic_outputs[name]})
    rank = len(shapes[0])
    symbols: list[str | None] = []
    shape: list[int] = []
    for axis in range(rank):
        sizes = [s[axis] for s in shapes]
        symbol = _follows(axis, sizes, results, named, tops)
        symbols.append(symbol)
        shape.append(tops[symbol] if symbol else max(sizes))
        if symbol is None and axis not in dynamic and len(set(sizes)) > 1:
            raise CompileError(
                f"model output {name!r} axis {axis} changes with the bucket ({sizes}) but does "
                "not follow one dynamic dimension, so it cannot be cut to an inference's size"
            )
    varying = {a for a in dynamic} | {a for a, s in enumerate(symbols) if s}
    if len(varying) > 1 and not free:
        raise CompileError(
            f"model output {name!r} varies along axes {sorted(varying)}; the wire carries bytes "
            "only, so at most one may vary"
        )
    dtype = results[0][1].output_dtypes[name]
    builder.add_output(name, dtype, shape, dynamic=dynamic, symbols=symbols)


def _follows(
    axis: int,
    sizes: Sequence[int],
    results: Sequence[tuple[dict[str, int], Emitted]],
    named: tuple[Dim, ...],
    tops: Mapping[str, int],
) -> str | None:
    if axis < len(named) and isinstance(named[axis], str) and named[axis] in tops:
        return str(named[axis])
    candidates = [
        s
        for s in tops
        if all(size == bucket[s] for size, (bucket, _) in zip(sizes, results, strict=True))
    ]
    if len(set(sizes)) > 1 and len(candidates) == 1:
        return candidates[0]
    return None
