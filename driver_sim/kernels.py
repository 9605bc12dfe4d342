"""The ops a NeuronCore executes, with ONNX (opset 13+) semantics, as numpy kernels.

Each op is a `Kernel`: its compute function (arrays in, array out; attributes as keyword
arguments), its engine, how many inputs and outputs it takes, its attributes (each with a
parser that validates and a default), the ONNX op versions whose semantics it implements,
an optional check of input dtypes and attribute combinations, and its MAC count. A kernel
with more than one possible output returns a tuple of all of them (a step keeps the first
ones it names). An absent optional input arrives as None. Adding an op is a function plus
a decorator:

    @kernel("Neg", Engine.POOL)
    def _neg(x: np.ndarray) -> np.ndarray:
        return np.negative(x)

Kernels never write to their inputs, and keep the input dtype (float32 stays float32).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from driver_sim.cost import Engine

Shape = tuple[int, ...]
MacCount = Callable[[Sequence[Shape], Sequence[Shape], Mapping[str, Any]], int]
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


# ---- MAC counts (see driver_sim.cost) ------------------------------------------------


def _matmul_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    contraction = inputs[0][-1]
    return math.prod(outputs[0]) * contraction


def _gemm_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    a = inputs[0]
    contraction = a[0] if attrs["transA"] else a[1]
    return math.prod(outputs[0]) * contraction


# ---- input dtypes the op kernels implement (support checks) ---------------------------


def dtype_set(*names: str) -> frozenset[np.dtype]:
    return frozenset(np.dtype(name) for name in names)


FLOATS = dtype_set("float16", "float32", "float64")
SIGNED = dtype_set("int8", "int16", "int32", "int64")
UNSIGNED = dtype_set("uint8", "uint16", "uint32", "uint64")
INTEGERS = SIGNED | UNSIGNED
NUMBERS = FLOATS | INTEGERS
BOOL = dtype_set("bool")
ALL_DTYPES = NUMBERS | BOOL  # strings, bfloat16, float8, 4-bit and complex are refused
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


# ---- PE: matmul-type ops ---------------------------------------------------------------


def via_float32(fn: Callable[..., Any], *arrays: np.ndarray, **kwargs: Any) -> np.ndarray:
    """fn(*arrays, **kwargs); float16 arrays are computed in float32 (one rounding at
    the end rather than one per step) and the result rounded back to float16."""
    if arrays[0].dtype != np.float16:
        return np.asarray(fn(*arrays, **kwargs))
    widened = [a.astype(np.float32) for a in arrays]
    return np.asarray(fn(*widened, **kwargs)).astype(np.float16)


@kernel(
    "MatMul",
    Engine.PE,
    inputs=(2, 2),
    macs=_matmul_macs,
    since=(1, 9, 13),
    check=dtype_check(FLOATS | dtype_set("int32", "int64", "uint32", "uint64"), same=(0, 1)),
)
def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Y = A @ B with numpy.matmul broadcasting (1-D operands promoted and dropped)."""
    return via_float32(_stacked_matmul, a, b)


def _stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul, with a stack of rows times one matrix (B, S, K) @ (K, N) done as one
    (B*S, K) @ (K, N) GEMM: numpy would make it B separate ones."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:
        flat = np.matmul(a.reshape(-1, a.shape[-1]), b)
        return flat.reshape(*a.shape[:-1], b.shape[-1])
    return np.matmul(a, b)


@kernel(
    "MatMulBias",
    Engine.PE,
    inputs=(3, 3),
    macs=_matmul_macs,
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _matmul_bias(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Y = A @ B + bias (bias along the last axis), the bias added in place into the
    product. Not an ONNX op: the compiler fuses MatMul + Add of a constant into it."""
    if a.dtype == np.float16:
        return via_float32(_matmul_bias, a, b, bias)
    product = _stacked_matmul(a, b)
    np.add(product, bias, out=product)
    return product


@kernel(
    "Gemm",
    Engine.PE,
    inputs=(2, 3),
    attrs={
        "alpha": Attr(float_attr, 1.0),
        "beta": Attr(float_attr, 1.0),
        "transA": Attr(flag_attr, 0),
        "transB": Attr(flag_attr, 0),
    },
    macs=_gemm_macs,
    since=(7, 9, 11, 13),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float,
    beta: float,
    transA: int,  # the ONNX attribute names
    transB: int,
) -> np.ndarray:
    """Y = alpha * A' @ B' + beta * C, C unidirectionally broadcast to Y."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got shapes {a.shape} and {b.shape}")
    a = a.T if transA else a
    b = b.T if transB else b
    if c is None or beta == 0.0:
        return via_float32(_scaled_product, a, b, alpha=alpha, beta=beta)
    return via_float32(_scaled_product, a, b, c, alpha=alpha, beta=beta)


def _scaled_product(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, alpha: float, beta: float
) -> np.ndarray:
    y = np.matmul(a, b)
    if alpha != 1.0:
        y *= alpha
    if c is not None:
        y += c if beta == 1.0 else c * beta
    return y


# ---- ACT: activations --------------------------------------------------------------------


@kernel("Relu", Engine.ACT, since=(6, 13, 14), check=dtype_check(FLOATS | SIGNED))
def _relu(x: np.ndarray) -> np.ndarray:
    """Y = max(X, 0)."""
    return np.maximum(x, 0)


@kernel("Sigmoid", Engine.ACT, since=(6, 13), check=dtype_check(FLOATS))
def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Y = 1 / (1 + exp(-X)), from exp(-|X|) so that nothing overflows."""
    return via_float32(_stable_sigmoid, x)


def _stable_sigmoid(x: np.ndarray) -> np.ndarray:
    y = np.abs(x, out=np.empty_like(x))
    np.negative(y, out=y)
    np.exp(y, out=y)  # e = exp(-|x|), in (0, 1]
    np.divide(y, y + 1, out=y)  # sigmoid(-|x|) = e / (1 + e)
    np.subtract(1, y, out=y, where=np.greater_equal(x, 0))  # sigmoid(|x|) = 1 - that
    return y


@kernel("Tanh", Engine.ACT, since=(6, 13), check=dtype_check(FLOATS))
def _tanh(x: np.ndarray) -> np.ndarray:
    """Y = tanh(X)."""
    return np.tanh(x)


@kernel(
    "Softmax",
    Engine.ACT,
    attrs={"axis": Attr(int_attr, -1)},
    since=(13,),  # versions 1 and 11 coerce the input to 2-D around `axis` (default 1)
    check=dtype_check(FLOATS),
)
def _softmax(x: np.ndarray, *, axis: int) -> np.ndarray:
    """Y = exp(X - max) / sum(exp(X - max)) along `axis`, in one temporary."""
    return via_float32(_shifted_softmax, x, axis=axis)


def _shifted_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = np.subtract(x, np.max(x, axis=axis, keepdims=True), out=np.empty_like(x))
    np.exp(shifted, out=shifted)
    shifted /= np.sum(shifted, axis=axis, keepdims=True)
    return shifted


# ---- POOL: elementwise and data movement ---------------------------------------------------

_BINARY_SINCE = (7, 13, 14)  # version 6 and older broadcast only by attribute
_BINARY_CHECK = dtype_check(NUMBERS, same=(0, 1))


@kernel(
    "Add",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A + B (integers wrap)."""
    return np.add(a, b)


@kernel(
    "Sub",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A - B (integers wrap)."""
    return np.subtract(a, b)


@kernel(
    "Mul",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A * B (integers wrap)."""
    return np.multiply(a, b)


@kernel(
    "Div",
    Engine.POOL,
    inputs=(2, 2),
    read_modify_write=True,
    since=_BINARY_SINCE,
    check=_BINARY_CHECK,
)
def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A / B; integer division truncates toward zero, as in C."""
    if a.dtype.kind == "f":
        return np.divide(a, b)
    quotient = np.floor_divide(a, b)
    if a.dtype.kind == "u":
        return quotient
    # floor and truncation differ where the division is inexact and the signs differ
    inexact = np.remainder(a, b) != 0
    fix = inexact & (np.less(a, 0) != np.less(b, 0))
    return np.add(quotient, fix, dtype=quotient.dtype)


@kernel("Identity", Engine.POOL, since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def _identity(x: np.ndarray) -> np.ndarray:
    """Y = X (the same array: kernels never write their inputs)."""
    return x


# The rest of the op library registers itself on import.
from driver_sim import ops_more, ops_nn, ops_random, ops_tensor, ops_winograd  # noqa: E402, F401
