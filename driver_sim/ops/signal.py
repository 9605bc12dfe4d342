"""Signal processing of the NeuronCore: the window functions HannWindow, HammingWindow
and BlackmanWindow (POOL), and the Fourier transforms DFT and STFT (PE: as products with
the transform's matrix, which their MAC counts are).

A complex tensor is a real one with a last axis of 2 (real, imaginary); a real signal
may come with a last axis of 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOATS,
    INDICES,
    Attr,
    Shape,
    axis_index,
    dtype_check,
    flag_attr,
    int_attr,
    int_values,
    kernel,
    onnx_dtype_attr,
    scalar,
)

# ---- windows ---------------------------------------------------------------------------


def _window(op: str, terms: Sequence[float], doc: str) -> None:
    """Register `op`: the generalized cosine window sum_k (-1)^k terms[k] cos(2 pi k n / N)
    of `size` points, N = size (periodic) or size - 1 (symmetric)."""

    def compute(size: np.ndarray, *, output_datatype: np.dtype, periodic: int) -> np.ndarray:
        count = int(int_values(scalar(size, "size"), "size")[0])
        if count < 0:
            raise ValueError(f"a window of {count} points")
        period = count if periodic else count - 1
        phase = 2 * np.pi * np.arange(count) / max(period, 1)
        y = np.zeros(count)
        for k, term in enumerate(terms):
            y += (-1) ** k * term * np.cos(k * phase)
        return y.astype(output_datatype)

    compute.__doc__ = doc
    kernel(
        op,
        Engine.POOL,
        attrs={
            "output_datatype": Attr(onnx_dtype_attr, np.dtype("float32")),
            "periodic": Attr(flag_attr, 1),
        },
        since=(17,),
        check=dtype_check(INDICES),
    )(compute)


_window("HannWindow", (0.5, 0.5), "Y[n] = 0.5 - 0.5 cos(2 pi n / N).")
_window("HammingWindow", (25 / 46, 21 / 46), "Y[n] = 25/46 - 21/46 cos(2 pi n / N).")
_window(
    "BlackmanWindow",
    (0.42, 0.5, 0.08),
    "Y[n] = 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N).",
)

# ---- Fourier transforms ---------------------------------------------------------------


def _complex(x: np.ndarray) -> np.ndarray:
    """A tensor with a last axis of 1 (real) or 2 (real, imaginary) as complex numbers."""
    if x.shape[-1] == 1:
        return x[..., 0].astype(np.complex128)
    if x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1].astype(np.float64)
    raise ValueError(f"the last axis must be 1 (real) or 2 (complex), got shape {x.shape}")


def _pairs(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack((z.real, z.imag), axis=-1).astype(dtype)


def _dft_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """A complex product with the transform's matrix: 4 real MACs per output value per
    input point on the transformed axis."""
    return 0 if not outputs or not outputs[0] else 2 * math.prod(outputs[0]) * _length(inputs)


def _length(inputs: Sequence[Shape]) -> int:
    """The longest axis of the signal but its last: a bound on the transform length."""
    return max(inputs[0][:-1], default=1)


def _transform(
    x: np.ndarray, length: int | None, axis: int, inverse: int, onesided: int
) -> np.ndarray:
    """The DFT (or inverse) of x (..., 1 or 2) along `axis` (not the last), zero-padded
    or cut to `length`; onesided: the first length // 2 + 1 bins only (or, inverse,
    from those bins the real signal of `length`, default 2 * (bins - 1))."""
    rank = x.ndim - 1
    axis = axis_index(axis, x.ndim)
    if axis == rank:
        raise ValueError("the transform cannot run along the complex axis")
    z = _complex(x)
    if inverse and onesided:  # the bins of a real signal's spectrum: a real signal back
        n = 2 * (z.shape[axis] - 1) if length is None else length
        return np.fft.irfft(z, n=n, axis=axis)[..., None].astype(x.dtype)
    n = z.shape[axis] if length is None else length
    y = np.fft.ifft(z, n=n, axis=axis) if inverse else np.fft.fft(z, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return _pairs(y, x.dtype)


def _dft_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    dtype_check(FLOATS, INDICES)(dtypes, values)


@kernel(
    "DFT",
    Engine.PE,
    inputs=(1, 3),
    attrs={
        "axis": Attr(int_attr, None),  # version 17 (default 1); an input from version 20
        "inverse": Attr(flag_attr, 0),
        "onesided": Attr(flag_attr, 0),
    },
    macs=_dft_macs,
    since=(17, 20),
    check=_dft_check,
)
def _dft(
    x: np.ndarray,
    dft_length: np.ndarray | None = None,
    axis_input: np.ndarray | None = None,
    *,
    axis: int | None,
    inverse: int,
    onesided: int,
) -> np.ndarray:
    """Y[..., k, ..., :] = sum_n exp(-+2 pi i k n / N) X[..., n, ..., :] along `axis`
    (the inverse divides by N), X zero-padded or cut to dft_length. The axis input
    (version 20, default -2) replaces the attribute (version 17, default 1); without
    either, only a (B, N, 1 or 2) signal is unambiguous."""
    length = None
    if dft_length is not None and dft_length.size:
        length = int(scalar(dft_length, "dft_length"))
    if axis_input is not None and axis_input.size:
        axis = int(scalar(axis_input, "axis"))
    if axis is None:
        if x.ndim != 3:
            raise ValueError("no axis for a signal of rank > 3: the default differs by version")
        axis = 1
    return _transform(x, length, axis, inverse, onesided)


def _stft_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    """signal float, frame_step an integer, then a float window and/or an integer
    frame_length (the absent inputs are not in `dtypes`)."""
    dtype_check(FLOATS, INDICES)(dtypes[:2], values)
    for index, dtype in enumerate(dtypes[2:], start=2):
        if dtype not in FLOATS | INDICES:
            raise ValueError(
                f"input {index} has dtype {dtype}, which the kernel does not implement"
            )


@kernel(
    "STFT",
    Engine.PE,
    inputs=(2, 4),
    attrs={"onesided": Attr(flag_attr, 1)},
    macs=_dft_macs,
    since=(17,),
    check=_stft_check,
)
def _stft(
    signal: np.ndarray,
    frame_step: np.ndarray,
    window: np.ndarray | None = None,
    frame_length: np.ndarray | None = None,
    *,
    onesided: int,
) -> np.ndarray:
    """Y[b, f, k, :]: the DFT of frame f of signal (B, length, 1 or 2) (frame_length
    points from f * frame_step, times the window), onesided: k < length // 2 + 1."""
    step = int(scalar(frame_step, "frame_step"))
    z = _complex(signal)
    if frame_length is not None:
        size = int(scalar(frame_length, "frame_length"))
    else:
        size = z.shape[1] if window is None else window.shape[0]
    if step < 1 or size < 1 or size > z.shape[1]:
        raise ValueError(f"frames of {size} every {step} in a signal of {z.shape[1]}")
    if window is not None and window.shape != (size,):
        raise ValueError(f"window of shape {window.shape} for frames of {size}")
    frames = (z.shape[1] - size) // step + 1
    starts = np.arange(frames) * step
    framed = z[:, starts[:, None] + np.arange(size)]  # (B, frames, size)
    if window is not None:
        framed = framed * window.astype(np.float64)
    y = np.fft.fft(framed, axis=-1)
    if onesided:
        y = y[..., : size // 2 + 1]
    return _pairs(y, signal.dtype)
