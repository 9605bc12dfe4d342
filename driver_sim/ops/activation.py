"""The activations of the NeuronCore (ACT engine), all in one place: Relu, LeakyRelu,
PRelu, ThresholdedRelu, Sigmoid, HardSigmoid, HardSwish, Swish, SwiGLU, Tanh, Softplus, Softsign,
Mish, Elu, Celu, Selu, Shrink, Gelu, Softmax, LogSoftmax and Hardmax; and Erf, whose
float32 approximation Gelu's exact form shares.
float16 inputs of the multi-step ones are computed in float32 and rounded back once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOAT_CHECK,
    FLOATS,
    SIGNED,
    Attr,
    axis_index,
    choice_attr,
    compute_dtype,
    dtype_check,
    dtype_set,
    float_attr,
    int_attr,
    kernel,
    scratch_like,
    via_float32,
)


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


# float32 erf as tanh(g): g(x) = atanh(erf(x)) = x * (2/sqrt(pi) + t * P(t) / Q(t)) with
# t = min(x^2, 16), P/Q a weighted least-squares rational fit (made for this kernel) of
# (atanh(erf(x)) / x - 2/sqrt(pi)) / x^2 on |x| <= 4, off by < 1e-8 in g; beyond, erf and
# tanh(g) both round to +-1. Computed in float32 it is within 4 ulp of the correctly
# rounded erf (10x faster than scipy's, which float64 inputs still use).
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_ERF_P = (  # highest degree first
    7.358234151912113e-06,
    0.0004250050004916922,
    0.005113689960044026,
    0.031611841749435085,
    0.10277249288157864,
)
_ERF_Q = (
    6.356201055698896e-07,
    0.000180400075748132,
    0.005392289657053264,
    0.056138304119491604,
    0.3096204924702246,
    1.0,
)


def _polynomial(t: np.ndarray, coefficients: Sequence[float]) -> np.ndarray:
    """sum(c * t^k) by Horner's rule, in t's dtype (a new array)."""
    y = np.multiply(t, coefficients[0], out=scratch_like(t))
    y += coefficients[1]
    for coefficient in coefficients[2:]:
        y *= t
        y += coefficient
    return y


def _erf_atanh(x: np.ndarray) -> np.ndarray:
    """atanh(erf(x)) for float32 x (a new float32 array; see above)."""
    t = np.multiply(x, x, out=scratch_like(x))
    np.minimum(t, 16.0, out=t)
    g = _polynomial(t, _ERF_P)
    g /= _polynomial(t, _ERF_Q)
    g *= t
    g += _TWO_OVER_SQRT_PI
    g *= x
    return g


def _erf32(x: np.ndarray) -> np.ndarray:
    g = _erf_atanh(x)
    return np.tanh(g, out=g)


@kernel("Erf", Engine.ACT, since=(9, 13), check=FLOAT_CHECK)
def _erf(x: np.ndarray) -> np.ndarray:
    """Y = erf(X)."""
    if x.dtype == np.float64:
        return special.erf(x)
    return via_float32(_erf32, x)


@kernel(
    "LeakyRelu",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 0.01)},
    since=(6, 16),
    check=FLOAT_CHECK,
)
def _leaky_relu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X where X >= 0, alpha * X elsewhere."""
    y = np.multiply(x, alpha, out=scratch_like(x))
    np.copyto(y, x, where=np.greater_equal(x, 0))
    return y


@kernel(
    "PRelu",
    Engine.ACT,
    inputs=(2, 2),
    since=(7, 9, 16),
    check=dtype_check(FLOATS | dtype_set("int32", "int64", "uint32", "uint64"), same=(0, 1)),
)
def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """Y = X where X >= 0, slope * X elsewhere (slope broadcast to X)."""
    y = np.asarray(np.multiply(x, slope))
    if y.shape != np.shape(x):
        raise ValueError(f"slope of shape {slope.shape} does not broadcast to {np.shape(x)}")
    np.copyto(y, x, where=np.greater_equal(x, 0))
    return y


@kernel(
    "HardSigmoid",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 0.2), "beta": Attr(float_attr, 0.5)},
    since=(6, 22),
    check=FLOAT_CHECK,
)
def _hard_sigmoid(x: np.ndarray, *, alpha: float, beta: float) -> np.ndarray:
    """Y = max(0, min(1, alpha * X + beta))."""
    return via_float32(_hard_sigmoid_of, x, alpha=alpha, beta=beta)


def _hard_sigmoid_of(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = np.multiply(x, alpha, out=scratch_like(x))
    y += beta
    return np.clip(y, 0, 1, out=y)


@kernel("Softplus", Engine.ACT, since=(1, 22), check=FLOAT_CHECK)
def _softplus(x: np.ndarray) -> np.ndarray:
    """Y = ln(exp(X) + 1), without overflow."""
    return np.logaddexp(x, 0)


_SQRT_HALF = math.sqrt(0.5)
_MINUS_2_SQRT_TWO_OVER_PI = -2.0 * math.sqrt(2.0 / math.pi)


def _gelu_erf32(x: np.ndarray) -> np.ndarray:
    # Phi(x) = (1 + erf(z)) / 2 = (1 + tanh(g)) / 2 = 1 / (1 + exp(-2g)), z = x / sqrt 2,
    # g = atanh(erf(z)): no cancellation where erf(z) is near -1
    z = np.multiply(x, _SQRT_HALF, out=scratch_like(x))
    g = _erf_atanh(z)
    g *= -2.0
    np.exp(g, out=g)
    g += 1
    y = np.divide(x, g, out=g)
    tail = z < -4.0  # where g is clamped, Phi < 1e-8: take the float64 formula there
    if tail.any():
        y[tail] = _gelu_erf64(np.asarray(x)[tail].astype(np.float64))
    return y


def _gelu_erf64(x: np.ndarray) -> np.ndarray:
    # Phi(x) = erfc(-x / sqrt 2) / 2
    y = np.multiply(x, -_SQRT_HALF, out=scratch_like(x))
    special.erfc(y, out=y)
    y *= x
    y *= 0.5
    return y


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # x * (1 + tanh(u)) / 2 as x / (1 + exp(-2u)): no cancellation for x < 0
    y = np.multiply(x, x, out=scratch_like(x))
    y *= 0.044715
    y += 1
    y *= x
    y *= _MINUS_2_SQRT_TWO_OVER_PI  # -2u
    np.exp(y, out=y)
    y += 1
    return np.divide(x, y, out=y)


@kernel(
    "Gelu",
    Engine.ACT,
    attrs={"approximate": Attr(choice_attr("none", "tanh"), "none")},
    since=(20,),
    check=FLOAT_CHECK,
)
def _gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    """Y = X * Phi(X); approximate="tanh": Phi(x) ~ (1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))/2."""
    if approximate == "tanh":
        return via_float32(_gelu_tanh, x)
    return _gelu_erf64(x) if x.dtype == np.float64 else via_float32(_gelu_erf32, x)


@kernel(
    "LogSoftmax",
    Engine.ACT,
    attrs={"axis": Attr(int_attr, -1)},
    since=(13,),  # versions 1 and 11 coerce the input to 2-D around `axis` (default 1)
    check=FLOAT_CHECK,
)
def _log_softmax(x: np.ndarray, *, axis: int) -> np.ndarray:
    """Y = X - max - ln(sum(exp(X - max))) along `axis`, in one temporary."""
    return via_float32(log_softmax, x, axis=axis)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """ln(softmax(X)) along `axis`, in X's dtype (SoftmaxCrossEntropyLoss's too)."""
    peak = np.max(x, axis=axis, keepdims=True)
    y = np.subtract(x, peak, out=scratch_like(x))
    np.exp(y, out=y)
    total = np.log(np.sum(y, axis=axis, keepdims=True))
    np.subtract(x, peak, out=y)
    y -= total
    return y


def _keep_dtype(fn: Any) -> Any:
    """fn's result in its input's float dtype (numpy may widen a float16 on the way)."""

    @functools.wraps(fn)
    def wrapped(x: np.ndarray, **attrs: Any) -> np.ndarray:
        return np.asarray(fn(x, **attrs)).astype(x.dtype, copy=False)

    return wrapped


@kernel("Elu", Engine.ACT, attrs={"alpha": Attr(float_attr, 1.0)}, since=(6, 22), check=FLOAT_CHECK)
@_keep_dtype
def _elu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X for X > 0, alpha * (exp(X) - 1) otherwise."""
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel(
    "Selu",
    Engine.ACT,
    attrs={
        "alpha": Attr(float_attr, 1.67326319217681884765625),
        "gamma": Attr(float_attr, 1.05070102214813232421875),
    },
    since=(6, 22),
    check=FLOAT_CHECK,
)
@_keep_dtype
def _selu(x: np.ndarray, *, alpha: float, gamma: float) -> np.ndarray:
    """Y = gamma * X for X > 0, gamma * alpha * (exp(X) - 1) otherwise."""
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel("Softsign", Engine.ACT, since=(1, 22), check=FLOAT_CHECK)
@_keep_dtype
def _softsign(x: np.ndarray) -> np.ndarray:
    """Y = X / (1 + |X|)."""
    return x / (1 + np.abs(x))


@kernel("HardSwish", Engine.ACT, since=(14, 22), check=FLOAT_CHECK)
@_keep_dtype
def _hard_swish(x: np.ndarray) -> np.ndarray:
    """Y = X * max(0, min(1, X / 6 + 1 / 2))."""
    return x * np.clip(x / 6 + 0.5, 0, 1)


@kernel(
    "ThresholdedRelu",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 1.0)},
    since=(10, 22),
    check=FLOAT_CHECK,
)
def _thresholded_relu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X where X > alpha, 0 elsewhere."""
    return np.where(x > alpha, x, np.zeros((), dtype=x.dtype))


@kernel(
    "Shrink",
    Engine.ACT,
    attrs={"bias": Attr(float_attr, 0.0), "lambd": Attr(float_attr, 0.5)},
    since=(9,),
    check=dtype_check(FLOATS | SIGNED),
)
@_keep_dtype
def _shrink(x: np.ndarray, *, bias: float, lambd: float) -> np.ndarray:
    """Y = X + bias where X < -lambd, X - bias where X > lambd, 0 elsewhere."""
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


@kernel("Mish", Engine.ACT, since=(18, 22), check=FLOAT_CHECK)
@_keep_dtype
def _mish(x: np.ndarray) -> np.ndarray:
    """Y = X * tanh(softplus(X))."""
    return x * np.tanh(np.logaddexp(np.asarray(x, dtype=compute_dtype(x.dtype)), 0))


@kernel(
    "Celu",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 1.0)},
    since=(12, 28),
    check=FLOAT_CHECK,
)
@_keep_dtype
def _celu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = max(0, X) + min(0, alpha * (exp(X / alpha) - 1))."""
    wide = np.asarray(x, dtype=compute_dtype(x.dtype))
    return np.maximum(wide, 0) + np.minimum(0, alpha * np.expm1(np.minimum(wide, 0) / alpha))


@kernel(
    "Swish",
    Engine.ACT,
    attrs={"alpha": Attr(float_attr, 1.0)},
    since=(24,),
    check=FLOAT_CHECK,
)
def _swish(x: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = X * sigmoid(alpha * X)."""
    return via_float32(lambda v: v * _stable_sigmoid(v * alpha), x)


@kernel(
    "Hardmax",
    Engine.ACT,
    attrs={"axis": Attr(int_attr, -1)},
    since=(13,),  # versions 1 and 11 coerce the input to 2-D around `axis` (default 1)
    check=FLOAT_CHECK,
)
def _hardmax(x: np.ndarray, *, axis: int) -> np.ndarray:
    """Y = 1 at the first largest element along `axis`, 0 elsewhere."""
    axis = axis_index(axis, x.ndim)
    y = np.zeros_like(x)
    if x.shape[axis]:
        first = np.expand_dims(np.argmax(x, axis=axis), axis)
        np.put_along_axis(y, first, 1, axis=axis)
    return y


@kernel(
    "SwiGLU",
    Engine.ACT,
    inputs=(2, 2),
    attrs={"alpha": Attr(float_attr, 1.0)},
    since=(28,),
    check=dtype_check(FLOATS, same=(0, 1)),
)
def _swiglu(a: np.ndarray, b: np.ndarray, *, alpha: float) -> np.ndarray:
    """Y = Swish_alpha(A) * B = A * sigmoid(alpha * A) * B (A and B of one shape)."""
    if a.shape != b.shape:
        raise ValueError(f"A {a.shape} and B {b.shape} differ in shape")
    return via_float32(lambda x, y: x * _stable_sigmoid(x * alpha) * y, a, b)
