"""The registry of the ops a NeuronCore executes, with ONNX (opset 13+) semantics, as
numpy kernels; the op modules of `driver_sim.ops` register them, this module imports none.

Each op is a `Kernel`: its compute function (arrays in, array out; attributes as keyword
arguments), its engine, how many inputs and outputs it takes, its attributes (each with a
parser that validates and a default), the ONNX op versions whose semantics it implements,
an optional check of input dtypes and attribute combinations, its MAC count, and any
work it does on other engines than its own (`SideWork`). A kernel with more than one
possible output returns a tuple of all of them (a step keeps the first ones it names).
An absent optional input arrives as None. Adding an op is a function plus a decorator,
in the op module of its concept:

    @kernel("Neg", Engine.POOL)
    def _neg(x: np.ndarray) -> np.ndarray:
        return np.negative(x)

Kernels never write to their inputs, and keep the input dtype (float32 stays float32).
Besides the registry, this module holds what the op modules share: the attribute parsers,
the dtype sets and support checks, and a few helpers (float16 via float32, integer tensor
inputs, axes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from driver_sim.cost import Engine

Shape = tuple[int, ...]
MacCount = Callable[[Sequence[Shape], Sequence[Shape], Mapping[str, Any]], int]
# What an op runs besides its own instruction, per engine: (instructions, elements
# written), from its input and output shapes (a recurrent layer's per-step products on
# PE and gate work on ACT and POOL). Most ops have none.
SideWork = Callable[
    [Sequence[Shape], Sequence[Shape], Mapping[str, Any]], Mapping[Engine, tuple[int, int]]
]
ComputeFn = Callable[..., Any]
# Raises ValueError (the reason) when the kernel cannot run inputs of these dtypes with
# these parsed attributes; the compiler then leaves the op to a CPU node.
SupportCheck = Callable[[Sequence[np.dtype], Mapping[str, Any]], None]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Attr:
    """An attribute: `parse` validates and converts a value (ValueError if bad)."""

    parse: Callable[[Any], Any]
    default: Any = REQUIRED


def no_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    return 0


@dataclass(frozen=True)
class Kernel:
    """One op: what it computes, where, with how many inputs/outputs and attributes."""

    op: str
    engine: Engine
    compute: ComputeFn
    min_inputs: int
    max_inputs: int
    min_outputs: int = 1
    max_outputs: int = 1
    attrs: Mapping[str, Attr] = field(default_factory=dict)
    macs: MacCount = no_macs
    read_modify_write: bool = False
    since: tuple[int, ...] | None = None  # ONNX op versions implemented (None: any)
    check: SupportCheck | None = None
    side_work: SideWork | None = None

    @property
    def multi_output(self) -> bool:
        return self.max_outputs > 1

    def check_support(self, dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        """ValueError naming why the kernel cannot run these input dtypes and parsed
        attribute values; None when it can."""
        if self.check is not None:
            self.check(dtypes, values)

    def parse_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every attribute's value (defaults filled in); ValueError naming a bad one."""
        unknown = sorted(set(given) - set(self.attrs))
        if unknown:
            raise ValueError(f"unknown attribute(s) {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, spec in self.attrs.items():
            if name in given:
                try:
                    values[name] = spec.parse(given[name])
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"attribute {name}: {exc}") from None
            elif spec.default is REQUIRED:
                raise ValueError(f"missing required attribute {name}")
            else:
                values[name] = spec.default
        return values

    def bind(self, values: Mapping[str, Any]) -> ComputeFn:
        """The compute function with parsed attribute values bound."""
        if not values:
            return self.compute
        return functools.partial(self.compute, **values)


KERNELS: dict[str, Kernel] = {}


def kernel(
    op: str,
    engine: Engine,
    *,
    inputs: tuple[int, int] = (1, 1),
    outputs: int | tuple[int, int] = 1,
    attrs: Mapping[str, Attr] | None = None,
    macs: MacCount = no_macs,
    read_modify_write: bool = False,
    since: tuple[int, ...] | None = None,
    check: SupportCheck | None = None,
    side_work: SideWork | None = None,
) -> Callable[[ComputeFn], ComputeFn]:
    """Register the decorated function as the compute function of `op`. `outputs` is a
    count or a (min, max) range; with max > 1 the function returns a tuple."""
    low, high = (outputs, outputs) if isinstance(outputs, int) else outputs

    def register(compute: ComputeFn) -> ComputeFn:
        if op in KERNELS:
            raise ValueError(f"kernel {op!r} is registered twice")
        KERNELS[op] = Kernel(
            op=op,
            engine=engine,
            compute=compute,
            min_inputs=inputs[0],
            max_inputs=inputs[1],
            min_outputs=low,
            max_outputs=high,
            attrs=attrs or {},
            macs=macs,
            read_modify_write=read_modify_write,
            since=since,
            check=check,
            side_work=side_work,
        )
        return compute

    return register


def supported_ops() -> frozenset[str]:
    """Every op name the NeuronCore can execute."""
    return frozenset(KERNELS)


# ---- attribute parsers -------------------------------------------------------------


def int_attr(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"must be an integer, got {value!r}")
    return int(value)


def flag_attr(value: Any) -> int:
    number = int_attr(value)
    if number not in (0, 1):
        raise ValueError(f"must be 0 or 1, got {number}")
    return number


def positive_attr(value: Any) -> int:
    number = int_attr(value)
    if number < 1:
        raise ValueError(f"must be positive, got {number}")
    return number


def positive_ints_attr(value: Any) -> tuple[int, ...]:
    numbers = ints_attr(value)
    if any(n < 1 for n in numbers):
        raise ValueError(f"must all be positive, got {list(numbers)}")
    return numbers


def non_negative_ints_attr(value: Any) -> tuple[int, ...]:
    numbers = ints_attr(value)
    if any(n < 0 for n in numbers):
        raise ValueError(f"must not be negative, got {list(numbers)}")
    return numbers


def float_attr(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"must be a number, got {value!r}")
    return float(value)


def ints_attr(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of integers, got {value!r}")
    return tuple(int_attr(v) for v in value)


def floats_attr(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of numbers, got {value!r}")
    return tuple(float_attr(v) for v in value)


def str_attr(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    return value


def choice_attr(*choices: str) -> Callable[[Any], str]:
    """A parser for a string attribute that must be one of `choices`."""

    def parse(value: Any) -> str:
        text = str_attr(value)
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def tensor_attr(value: Any) -> np.ndarray:
    """A tensor-valued attribute, as the compiler writes it:
    {"dtype": "float32", "shape": [...], "data": [...flat values...]}."""
    if not isinstance(value, Mapping) or set(value) != {"dtype", "shape", "data"}:
        raise ValueError(f"must be a tensor {{dtype, shape, data}}, got {value!r}")
    try:
        dtype = np.dtype(value["dtype"])
        array = np.asarray(value["data"], dtype=dtype).reshape(tuple(value["shape"]))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad tensor: {exc}") from None
    return array


# ---- input dtypes the op kernels implement (support checks) ---------------------------


def dtype_set(*names: str) -> frozenset[np.dtype]:
    return frozenset(np.dtype(name) for name in names)


FLOATS = dtype_set("float16", "float32", "float64")
SIGNED = dtype_set("int8", "int16", "int32", "int64")
UNSIGNED = dtype_set("uint8", "uint16", "uint32", "uint64")
INTEGERS = SIGNED | UNSIGNED
NUMBERS = FLOATS | INTEGERS
BOOL = dtype_set("bool")
ALL_DTYPES = NUMBERS | BOOL  # the kernels that compute take numpy's numbers (and bool)
# ml_dtypes' narrow types: the NC holds them and converts them (Cast, BitCast); few
# kernels compute in them. Strings and complex numbers it does not hold.
NARROW_FLOATS = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
    )
)
NARROW_INTEGERS = frozenset(
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
)
NARROW = NARROW_FLOATS | NARROW_INTEGERS
HELD_DTYPES = ALL_DTYPES | NARROW  # every element type the NC holds
VARIADIC = (1, 1 << 16)  # the input count range of ops taking any number of inputs
INDICES = dtype_set("int32", "int64")


def check_dtypes(
    dtypes: Sequence[np.dtype], allowed: Sequence[frozenset[np.dtype]], same: Sequence[int] = ()
) -> None:
    """ValueError unless input k's dtype is in allowed[k] (the last set also covers every
    later input) and the inputs at positions `same` (those present) share one dtype."""
    for index, dtype in enumerate(dtypes):
        if np.dtype(dtype) not in allowed[min(index, len(allowed) - 1)]:
            raise ValueError(
                f"input {index} has dtype {dtype}, which the kernel does not implement"
            )
    shared = {np.dtype(dtypes[i]) for i in same if i < len(dtypes)}
    if len(shared) > 1:
        names = ", ".join(sorted(str(d) for d in shared))
        raise ValueError(f"inputs must share one dtype, got {names}")


def dtype_check(*allowed: frozenset[np.dtype], same: Sequence[int] = ()) -> SupportCheck:
    """A support check of input dtypes only (see `check_dtypes`)."""

    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        check_dtypes(dtypes, allowed, same)

    return check


FLOAT_CHECK = dtype_check(FLOATS)  # the support check of float-only ops

# ONNX TensorProto element types the NeuronCore holds (others: string, complex).
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("float32"),
    2: np.dtype("uint8"),
    3: np.dtype("int8"),
    4: np.dtype("uint16"),
    5: np.dtype("int16"),
    6: np.dtype("int32"),
    7: np.dtype("int64"),
    9: np.dtype("bool"),
    10: np.dtype("float16"),
    11: np.dtype("float64"),
    12: np.dtype("uint32"),
    13: np.dtype("uint64"),
    16: np.dtype(ml_dtypes.bfloat16),
    17: np.dtype(ml_dtypes.float8_e4m3fn),
    18: np.dtype(ml_dtypes.float8_e4m3fnuz),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e5m2fnuz),
    21: np.dtype(ml_dtypes.uint4),
    22: np.dtype(ml_dtypes.int4),
    23: np.dtype(ml_dtypes.float4_e2m1fn),
    24: np.dtype(ml_dtypes.float8_e8m0fnu),
    25: np.dtype(ml_dtypes.uint2),
    26: np.dtype(ml_dtypes.int2),
}


def onnx_dtype_attr(value: Any) -> np.dtype:
    """An element type attribute (Cast's `to`): an ONNX TensorProto type the NC holds."""
    code = int_attr(value)
    if code not in ONNX_DTYPES:
        raise ValueError(f"element type {code} is not implemented (strings, complex numbers)")
    return ONNX_DTYPES[code]


# ---- helpers shared by the op modules ----------------------------------------------


def via_float32(fn: Callable[..., Any], *arrays: np.ndarray, **kwargs: Any) -> np.ndarray:
    """fn(*arrays, **kwargs); float16 arrays are computed in float32 (one rounding at
    the end rather than one per step) and the result rounded back to float16."""
    if arrays[0].dtype != np.float16:
        return np.asarray(fn(*arrays, **kwargs))
    widened = [a.astype(np.float32) for a in arrays]
    return np.asarray(fn(*widened, **kwargs)).astype(np.float16)


def int_values(tensor: np.ndarray, what: str | None = None) -> list[int]:
    """The values of an integer tensor input (shape, axes, starts, pads...) as Python
    ints; ValueError (naming the input `what`, when given) for another dtype."""
    array = np.asarray(tensor)
    if array.dtype.kind not in "iu":
        expected = "expected an" if what is None else f"{what} must be an"
        raise ValueError(f"{expected} integer tensor, got dtype {array.dtype}")
    return [int(v) for v in array.reshape(-1).tolist()]


def scalar(tensor: np.ndarray, what: str) -> np.ndarray:
    """A one-element tensor input as a 0-d array."""
    array = np.asarray(tensor)
    if array.size != 1:
        raise ValueError(f"{what} must have one element, got shape {array.shape}")
    return array.reshape(())


def axis_index(axis: int, rank: int) -> int:
    """`axis` in [-rank, rank) made non-negative."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def axis_indices(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """Distinct axes, each in [-rank, rank), made non-negative."""
    result = tuple(axis_index(a, rank) for a in axes)
    if len(set(result)) != len(result):
        raise ValueError(f"repeated axis in {list(axes)}")
    return result


def scratch_like(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A new array shaped like `x` (an array even when `x` is a numpy scalar)."""
    return np.empty_like(x, dtype=dtype)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a float kernel computes in: float32 for float16, else the dtype itself."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def as_compute(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array` in `dtype` (no copy when it already is)."""
    return np.asarray(array, dtype=dtype)
