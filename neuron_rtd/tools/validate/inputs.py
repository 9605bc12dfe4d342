"""The inputs of `neuron-cli validate`: shapes fitted to the NEFF's declared ones, random
values drawn from a seed, or arrays read from an npz."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from neuron_rtd.arguments import unreadable
from neuron_rtd.errors import BadInput
from neuron_rtd.neff import TensorSpec, as_input
from neuron_rtd.records.npz import NpzUnreadable, npz_arrays
from neuron_rtd.tools.validate.errors import UsageError


def _check_shape(spec: TensorSpec, shape: Sequence[int], where: str) -> None:
    """`shape` fits `spec`: same rank, fixed axes equal, varying axes within their bound."""
    if len(shape) != len(spec.shape):
        raise UsageError(
            f"{where}: input {spec.name!r} has shape {tuple(shape)}; the NEFF declares "
            f"{spec.describe()} ({len(spec.shape)} axes)"
        )
    varying = set(spec.varying_axes)
    for axis, (size, declared) in enumerate(zip(shape, spec.shape, strict=True)):
        if axis in varying:
            if size < 1 or (declared and size > declared):
                raise UsageError(
                    f"{where}: input {spec.name!r} axis {axis} is {size}; the NEFF declares "
                    f"{spec.describe()} (1 to {declared or 'any'} there)"
                )
        elif size != declared:
            raise UsageError(
                f"{where}: input {spec.name!r} has shape {tuple(shape)}; the NEFF declares "
                f"{spec.describe()}"
            )


def given_shapes(
    npz: str | None, input_shape: Sequence[tuple[str, tuple[int, ...]]]
) -> dict[str, tuple[int, ...]]:
    """--input-shape's shapes by input name, for random inputs; UsageError when an npz is
    given too (`--inputs`: it gives the shapes) or an input is named twice."""
    if npz is not None and input_shape:
        raise UsageError("--input-shape does not apply with --inputs (the npz gives shapes)")
    given = dict(input_shape)
    if len(given) != len(input_shape):
        raise UsageError("--input-shape names an input more than once")
    return given


def input_shapes(
    specs: Sequence[TensorSpec], given: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """Each input's shape for random inputs: `given` (checked against the spec), else
    the declared size, where a varying axis follows a size given for its symbol on
    another input."""
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise UsageError(
            f"--input-shape names {', '.join(unknown)}; the NEFF's inputs are {', '.join(by_name)}"
        )
    symbol_sizes: dict[str, tuple[int, str]] = {}
    for name, shape in given.items():
        spec = by_name[name]
        _check_shape(spec, shape, "--input-shape")
        for axis, symbol in enumerate(spec.symbols):
            if symbol is None:
                continue
            seen = symbol_sizes.setdefault(symbol, (shape[axis], name))
            if seen[0] != shape[axis]:
                raise UsageError(
                    f"--input-shape gives dimension {symbol!r} size {seen[0]} for {seen[1]!r} "
                    f"but {shape[axis]} for {name!r}"
                )
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.name in given:
            shapes[spec.name] = tuple(given[spec.name])
            continue
        shape = list(spec.shape)
        for axis, symbol in enumerate(spec.symbols):
            if symbol is not None and symbol in symbol_sizes:
                shape[axis] = symbol_sizes[symbol][0]
        if spec.unbounded:
            raise UsageError(
                f"input {spec.name!r} ({spec.describe()}) has an axis without a bound: "
                "give its shape with --input-shape"
            )
        shapes[spec.name] = tuple(shape)
    return shapes


DEFAULT_FLOAT_RANGE = (0.0, 1.0)


def int_ranges(
    specs: Sequence[TensorSpec],
    implied: Mapping[str, tuple[int, int]],
    value_range: tuple[float, float] | None,
) -> dict[str, tuple[int, int]]:
    """Each integer input's random values' [low, high): what the model implies for it,
    else `value_range`'s integers (--range), which must then be given and fit."""
    ranges: dict[str, tuple[int, int]] = {}
    for spec in specs:
        if spec.dtype.kind not in "iu":
            continue
        if spec.name in implied:
            ranges[spec.name] = implied[spec.name]
            continue
        if value_range is None:
            raise UsageError(
                f"input {spec.name!r} ({spec.dtype.name}): the model implies no range for its "
                "values; give one with --range LOW:HIGH (integers drawn from [LOW, HIGH)) or "
                "the inputs with --inputs FILE.npz"
            )
        low, high = value_range
        lo, hi = math.ceil(low), math.ceil(high)
        info = np.iinfo(spec.dtype)
        if lo >= hi:
            raise UsageError(
                f"--range {low:g}:{high:g} holds no integer for input {spec.name!r} "
                f"({spec.dtype.name}): integers are drawn from [LOW, HIGH)"
            )
        if lo < info.min or hi - 1 > info.max:
            raise UsageError(
                f"--range {low:g}:{high:g} does not fit input {spec.name!r} "
                f"({spec.dtype.name}: {info.min} to {info.max})"
            )
        ranges[spec.name] = (lo, hi)
    return ranges


def random_inputs(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]],
    value_range: tuple[float, float] | None,
    seed: int,
    integer_ranges: Mapping[str, tuple[int, int]],
) -> dict[str, np.ndarray]:
    """Random inputs in the NEFF's dtypes: floats uniform in `value_range` (default
    [0, 1]), integers uniform in their [low, high) of `integer_ranges` (`int_ranges`),
    bools fair coins."""
    rng = np.random.default_rng(seed)
    low, high = value_range or DEFAULT_FLOAT_RANGE
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(shapes[spec.name])
        dtype = spec.dtype
        if dtype.kind == "b":
            arrays[spec.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            lo, hi = integer_ranges[spec.name]
            values = rng.integers(lo, hi, size=shape, dtype=np.int64, endpoint=False)
            arrays[spec.name] = values.astype(dtype)
        elif dtype.kind == "f":
            arrays[spec.name] = rng.uniform(low, high, size=shape).astype(dtype)
        else:
            raise UsageError(f"input {spec.name!r} has dtype {dtype.name}: no random values")
    return arrays


def npz_inputs(path: str, specs: Sequence[TensorSpec], cast: bool = False) -> dict[str, np.ndarray]:
    """The inputs in an npz file, each checked against its spec and converted to its dtype
    under the one dtype policy (`neuron_rtd.neff.casting`; `cast`: numpy's unsafe cast)."""
    why = unreadable(path)
    if why:
        raise UsageError(f"--inputs {path}: {why}")
    try:
        arrays = npz_arrays(path)
    except NpzUnreadable as exc:
        if exc.cause is None:
            raise UsageError(f"--inputs {path}: not an npz archive (np.savez writes one)") from None
        raise UsageError(
            f"--inputs {path}: cannot read it as an npz archive: {exc.cause}"
        ) from None
    names = [spec.name for spec in specs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing key(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unknown key(s) {', '.join(map(repr, extra))}")
        raise UsageError(
            f"--inputs {path}: {'; '.join(parts)} (the NEFF's inputs are {', '.join(names)})"
        )
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        array = arrays[spec.name]
        _check_shape(spec, array.shape, f"--inputs {path}")
        if array.dtype.kind not in "biuf":
            raise UsageError(
                f"--inputs {path}: key {spec.name!r} has dtype {array.dtype}, not a number"
            )
        try:
            array = as_input(array, spec.dtype, spec.name, cast=cast, option="--cast")
        except BadInput as exc:
            raise UsageError(f"--inputs {path}: {exc}") from None
        out[spec.name] = np.ascontiguousarray(array)
    return out
