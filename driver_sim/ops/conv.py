"""Convolutions of the NeuronCore (PE engine): Conv, ConvTranspose and
CausalConvWithState, on whole arrays, one Python step per kernel tap (the windows:
`driver_sim.ops.window`):

- Conv gathers the taps of all channels into one column buffer (a copy per tap; strided
  axes are first split into stride phases so that every copy reads contiguous runs) and
  runs one BLAS matmul per image (per few images when they are small); a 1x1 conv with
  stride 1 and no padding is a matmul on the input itself; a depthwise conv is a
  multiply-accumulate of whole shifted windows, tap by tap, in cache-sized blocks.
- ConvTranspose is one matmul (every input pixel times every tap) followed by a strided
  add per tap into the full output, which is then cut or zero-extended to the output.
- CausalConvWithState, a stateful causal depthwise 1-D conv, is one product of the
  sliding windows of its input (after the carried state) with the taps.
- Col2Im (on POOL: no products) undoes im2col, adding each tap's columns back into the
  image with one strided add per tap.

float16 is computed in float32 and rounded back once at the end. Where ONNX
implementations disagree on a corner (a negative automatic padding, ConvTranspose's
padding split) the kernels refuse it rather than pick one. The compiler rewrites the 3x3
convolutions where it pays into WinogradConv (`driver_sim.ops.winograd`).
"""

from __future__ import annotations

import itertools
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
    as_compute,
    check_dtypes,
    choice_attr,
    compute_dtype,
    kernel,
    non_negative_ints_attr,
    positive_attr,
    positive_ints_attr,
)
from driver_sim.ops.window import (
    AUTO_PADS,
    SAME_AUTO_PADS,
    Window,
    check_auto_pad,
    conv_window,
    explicit_pads,
    kernel_extents,
    pad_spatial,
    per_axis,
)

# Conv: the output pixels one matmul covers, at most (unless one image has more).
_MATMUL_PIXELS = 2048
# Depthwise conv: the output elements accumulated at a time (512 KiB of float32).
_DEPTHWISE_BLOCK = 1 << 17


def _tap_sources(x: np.ndarray, window: Window) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """(source, taps): `x` (N, C, *spatial) zero-padded, as an array the kernel taps copy
    from with contiguous reads, and per tap (row-major) its spatial index there. An axis
    with stride s > 1 and more than one tap is split into s phases (one copy of the
    input): tap offset o then reads phase o % s from o // s on, a contiguous run."""
    split = [s > 1 and k > 1 for s, k in zip(window.strides, window.kernel, strict=True)]
    if not any(split):
        return window.padded(x, 0), list(window.taps())
    return _phase_split(x, window, split), _phase_taps(window, split)


def _phase_split(x: np.ndarray, window: Window, split: Sequence[bool]) -> np.ndarray:
    """`x` zero-padded to `window.extent` (rounded up to the stride on split axes), each
    split axis (..., e, ...) turned into (..., s, e / s, ...): phase, then position."""
    extent = [
        -(-e // s) * s if cut else e
        for e, s, cut in zip(window.extent, window.strides, split, strict=True)
    ]
    padded = pad_spatial(x, window.begin, extent, 0)
    shape, order = list(x.shape[:2]), [0, 1]
    for e, s, cut in zip(extent, window.strides, split, strict=True):
        if cut:
            order += [len(shape) + 1, len(shape)]
            shape += [e // s, s]
        else:
            order.append(len(shape))
            shape.append(e)
    return np.ascontiguousarray(padded.reshape(shape).transpose(order))


def _phase_taps(window: Window, split: Sequence[bool]) -> list[tuple[Any, ...]]:
    """Per kernel tap, its spatial index into `_phase_split`'s array."""
    taps = []
    for offsets in itertools.product(*(range(k) for k in window.kernel)):
        index: list[Any] = []
        for axis, (tap, cut) in enumerate(zip(offsets, split, strict=True)):
            if cut:
                offset, stride = tap * window.dilations[axis], window.strides[axis]
                first = offset // stride
                index += [offset % stride, slice(first, first + window.out[axis])]
            else:
                index.append(window.tap_slice(axis, tap))
        taps.append(tuple(index))
    return taps


def _conv_macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """Output elements x input channels per group x kernel taps."""
    weights = inputs[1]
    return math.prod(outputs[0]) * weights[1] * math.prod(weights[2:])


def _conv_transpose_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """Input elements x output channels per group x kernel taps (each input pixel is
    multiplied by every tap of every output channel of its group)."""
    weights = inputs[1]
    return math.prod(inputs[0]) * weights[1] * math.prod(weights[2:])


def _conv_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [FLOATS], same=(0, 1, 2))
    check_auto_pad(values)


_CONV_ATTRS = {
    "auto_pad": Attr(choice_attr(*AUTO_PADS), "NOTSET"),
    "dilations": Attr(positive_ints_attr, None),
    "group": Attr(positive_attr, 1),
    "kernel_shape": Attr(positive_ints_attr, None),
    "pads": Attr(non_negative_ints_attr, None),
    "strides": Attr(positive_ints_attr, None),
}


def _conv_shapes(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    group: int,
    kernel_shape: Sequence[int] | None,
) -> None:
    """ValueError unless X (N, C, *S), W (M, C/group, *K) and B (M,) fit together."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"X and W need the same rank >= 3, got {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"X {x.shape} and W {w.shape} do not fit group={group}")
    if kernel_shape is not None and tuple(kernel_shape) != w.shape[2:]:
        raise ValueError(f"kernel_shape {list(kernel_shape)} differs from W {w.shape}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"B has shape {b.shape}, expected ({w.shape[0]},)")


@kernel(
    "Conv",
    Engine.PE,
    inputs=(2, 3),
    attrs=_CONV_ATTRS,
    macs=_conv_macs,
    since=(1, 11, 22),
    check=_conv_check,
)
def _conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str,
    dilations: tuple[int, ...] | None,
    group: int,
    kernel_shape: tuple[int, ...] | None,
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """Y = X (*) W + B: cross-correlation of X (N, C, *S) with W (M, C/group, *K) in
    `group` groups of channels, with strides, dilations and zero padding."""
    _conv_shapes(x, w, b, group, kernel_shape)
    dtype = compute_dtype(x.dtype)
    xc, wc = as_compute(x, dtype), as_compute(w, dtype)
    window = conv_window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    if group > 1 and group == x.shape[1] and w.shape[1] == 1:
        y = _depthwise_conv(xc, wc, window)
    elif _is_pointwise(window):
        y = _pointwise_conv(xc, wc, group)
    else:
        y = _gathered_conv(xc, wc, group, window)
    if b is not None:
        y += as_compute(b, dtype).reshape(-1, *[1] * (y.ndim - 2))
    return y.astype(x.dtype, copy=False)


def _is_pointwise(window: Window) -> bool:
    """A 1x1 kernel with stride 1 and no padding: the conv is a plain matmul."""
    return (
        all(k == 1 for k in window.kernel)
        and all(s == 1 for s in window.strides)
        and not any(window.begin + window.end)
    )


def _pointwise_conv(x: np.ndarray, w: np.ndarray, group: int) -> np.ndarray:
    """1x1 conv: per image and group, W (M/g, C/g) @ X (C/g, pixels), X read in place."""
    n, c = x.shape[:2]
    m = w.shape[0]
    pixels = math.prod(x.shape[2:])
    weights = w.reshape(group, m // group, c // group)
    y = np.matmul(weights, x.reshape(n, group, c // group, pixels))
    return y.reshape(n, m, *x.shape[2:])


def _gathered_conv(x: np.ndarray, w: np.ndarray, group: int, window: Window) -> np.ndarray:
    """Conv as matmuls: the taps of all channels gathered into columns (C * taps, pixels)
    by one strided copy per tap, then per group W (M/g, C/g * taps) @ columns. Small
    images share a matmul (up to `_MATMUL_PIXELS` columns), large ones get one each."""
    n, c = x.shape[:2]
    m = w.shape[0]
    taps = math.prod(window.kernel)
    pixels = math.prod(window.out)
    source, tap_index = _tap_sources(x, window)
    by_channel = source.swapaxes(0, 1)  # (C, N, ...)
    weights = w.reshape(group, m // group, (c // group) * taps)
    y = np.empty((n, m, pixels), dtype=x.dtype)
    chunk = max(1, min(n, _MATMUL_PIXELS // pixels))
    buffer = np.empty(c * taps * chunk * pixels, dtype=x.dtype)
    for first in range(0, n, chunk):
        images = slice(first, min(n, first + chunk))
        count = images.stop - first
        columns = buffer[: c * taps * count * pixels].reshape(c, taps, count, *window.out)
        for tap, where in enumerate(tap_index):
            columns[:, tap] = by_channel[(slice(None), images, *where)]
        grouped = columns.reshape(group, (c // group) * taps, count * pixels)
        if count == 1:  # the matmul writes the image's output in place
            np.matmul(weights, grouped, out=y[first].reshape(group, m // group, pixels))
        else:
            product = np.matmul(weights, grouped).reshape(m, count, pixels)
            y[images] = product.swapaxes(0, 1)
    return y.reshape(n, m, *window.out)


def _depthwise_conv(x: np.ndarray, w: np.ndarray, window: Window) -> np.ndarray:
    """Conv with one input channel per group (M = C * multiplier): per tap, the shifted
    window of every channel times that channel's tap weights, accumulated; image by image
    and in blocks of channels that stay in cache."""
    n, c = x.shape[:2]
    multiplier = w.shape[0] // c
    source, tap_index = _tap_sources(x, window)
    weights = w.reshape(c, multiplier, -1)
    trailing = (1,) * len(window.out)
    block = max(1, _DEPTHWISE_BLOCK // (math.prod(window.out) * multiplier))
    y = np.empty((n, c, multiplier, *window.out), dtype=x.dtype)
    product = np.empty((min(block, c), multiplier, *window.out), dtype=x.dtype)
    for image, first in itertools.product(range(n), range(0, c, block)):
        channels = slice(first, min(c, first + block))
        acc, part = y[image, channels], product[: channels.stop - first]
        for tap, where in enumerate(tap_index):
            view = source[image][(channels, *where)][:, None]  # broadcasts over multiplier
            tap_weights = weights[channels, :, tap].reshape(-1, multiplier, *trailing)
            if tap == 0:
                np.multiply(view, tap_weights, out=acc)
            else:
                np.multiply(view, tap_weights, out=part)
                acc += part
    return y.reshape(n, c * multiplier, *window.out)


_CONV_TRANSPOSE_ATTRS = {
    **_CONV_ATTRS,
    "output_padding": Attr(non_negative_ints_attr, None),
    "output_shape": Attr(positive_ints_attr, None),
}


def _conv_transpose_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [FLOATS], same=(0, 1, 2))
    auto_pad = values["auto_pad"]
    if auto_pad != "NOTSET" and values["pads"] is not None and any(values["pads"]):
        raise ValueError("auto_pad together with non-zero pads is not implemented")
    # SAME makes size * stride outputs: a total padding of extent + output_padding - stride
    sizes_by_stride = auto_pad in SAME_AUTO_PADS and values["output_shape"] is None
    if sizes_by_stride and any(e + extra < s for e, s, extra in kernel_extents(values)):
        raise ValueError("auto_pad SAME with a stride over kernel extent + output_padding")


def _conv_transpose_pads(full: int, out: int, extra: int, auto_pad: str, given: bool) -> int:
    """The padding before the output when its length `out` is set (by output_shape, when
    `given`, else by auto_pad SAME) and the computed one (with output_padding `extra`) is
    `full`: the total split evenly, the odd one at the end for SAME_UPPER, else at the
    start. A negative total is implemented only where onnxruntime and the ONNX reference
    agree (-1 with output_shape and no SAME_UPPER: one zero row at the end)."""
    total = full + extra - out
    if total < 0 and (total < -1 or not given or auto_pad == "SAME_UPPER"):
        raise ValueError(f"a negative total padding ({total}) is not implemented")
    return total // 2 if auto_pad == "SAME_UPPER" else total - total // 2


def _conv_transpose_output(
    sizes: Sequence[int],
    full: Sequence[int],
    strides: Sequence[int],
    auto_pad: str,
    output_padding: Sequence[int] | None,
    output_shape: Sequence[int] | None,
    pads: Sequence[int] | None,
) -> tuple[list[int], list[int]]:
    """(begin, out) per axis: where ConvTranspose's output starts in the `full` result and
    how long it is. `pads` cut the full result (output_padding adds to its end), unless
    output_shape or auto_pad SAME (size * stride) set the length and so the padding."""
    rank = len(sizes)
    extra = per_axis(output_padding, rank, 0, "output_padding")
    if output_shape is None and auto_pad not in SAME_AUTO_PADS:
        begin, end = explicit_pads(None if auto_pad == "VALID" else pads, rank)
        out = [f + e - b0 - e0 for f, e, b0, e0 in zip(full, extra, begin, end, strict=True)]
    else:
        if output_shape is not None:
            out = per_axis(output_shape, rank, 0, "output_shape")
        else:
            out = [size * stride for size, stride in zip(sizes, strides, strict=True)]
        begin = [
            _conv_transpose_pads(f, o, e, auto_pad, output_shape is not None)
            for f, o, e in zip(full, out, extra, strict=True)
        ]
    if any(o < 1 for o in out):
        raise ValueError(f"the output would have spatial shape {out}")
    return begin, out


@kernel(
    "ConvTranspose",
    Engine.PE,
    inputs=(2, 3),
    attrs=_CONV_TRANSPOSE_ATTRS,
    macs=_conv_transpose_macs,
    since=(11, 22),  # version 1 splits an odd total padding the other way round
    check=_conv_transpose_check,
)
def _conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str,
    dilations: tuple[int, ...] | None,
    group: int,
    kernel_shape: tuple[int, ...] | None,
    output_padding: tuple[int, ...] | None,
    output_shape: tuple[int, ...] | None,
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """The gradient of Conv: every input pixel of X (N, C, *S) scatters W (C, M/group, *K)
    times itself to output positions pixel * stride + tap * dilation, then the full result
    is cut by `pads` (or to `output_shape`/auto_pad SAME) and extended by output_padding."""
    if x.ndim < 3 or w.ndim != x.ndim or x.shape[1] != w.shape[0] or w.shape[0] % group:
        raise ValueError(f"X {x.shape} and W {w.shape} do not fit group={group}")
    if kernel_shape is not None and tuple(kernel_shape) != w.shape[2:]:
        raise ValueError(f"kernel_shape {list(kernel_shape)} differs from W {w.shape}")
    n, c, *sizes = x.shape
    m = w.shape[1] * group
    if b is not None and b.shape != (m,):
        raise ValueError(f"B has shape {b.shape}, expected ({m},)")
    kernel = w.shape[2:]
    rank = len(sizes)
    stride = per_axis(strides, rank, 1, "strides")
    dilation = per_axis(dilations, rank, 1, "dilations")
    full = [
        (s - 1) * st + (k - 1) * d + 1
        for s, st, k, d in zip(sizes, stride, kernel, dilation, strict=True)
    ]
    begin, out = _conv_transpose_output(
        sizes, full, stride, auto_pad, output_padding, output_shape, pads
    )

    dtype = compute_dtype(x.dtype)
    xc, wc = as_compute(x, dtype), as_compute(w, dtype)
    cg, mg, taps = c // group, m // group, math.prod(kernel)
    # every input pixel times every tap: (N, G, M/g * taps, pixels) = (N, M, taps, *S)
    weights = wc.reshape(group, cg, mg * taps).transpose(0, 2, 1)
    products = np.matmul(weights, xc.reshape(n, group, cg, -1)).reshape(n, m, taps, *sizes)
    result = np.zeros((n, m, *full), dtype=dtype)
    for tap, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        where = tuple(
            slice(t * d, t * d + (s - 1) * st + 1, st)
            for t, d, s, st in zip(offsets, dilation, sizes, stride, strict=True)
        )
        result[(slice(None), slice(None), *where)] += products[:, :, tap]
    y = pad_spatial(result, [-p for p in begin], out, 0)  # cut or zero-extended
    if b is not None:
        y += as_compute(b, dtype).reshape(-1, *[1] * rank)
    return y.astype(x.dtype, copy=False)


def _causal_conv_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """A k-tap product per output element."""
    return math.prod(outputs[0]) * inputs[1][-1]


@kernel(
    "CausalConvWithState",
    Engine.PE,
    inputs=(2, 4),
    outputs=(1, 2),
    attrs={"activation": Attr(choice_attr("none", "silu", "swish"), "none")},
    macs=_causal_conv_macs,
    since=(27,),
    check=lambda dtypes, values: check_dtypes(dtypes, [FLOATS], same=range(len(dtypes))),
)
def _causal_conv_with_state(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    past_state: np.ndarray | None = None,
    *,
    activation: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(output, present_state): the depthwise causal convolution of X (B, C, L) with
    weight (C, 1, k), X preceded by past_state (B, C, k - 1; default zeros), plus bias,
    then SiLU (silu, swish) when asked; present_state is the last k - 1 positions read."""
    if x.ndim != 3 or weight.ndim != 3 or weight.shape[:2] != (x.shape[1], 1):
        raise ValueError(f"input {x.shape} and weight {weight.shape} are not (B, C, L), (C, 1, k)")
    taps = weight.shape[2]
    carry = (x.shape[0], x.shape[1], taps - 1)
    if past_state is not None and past_state.shape != carry:
        raise ValueError(f"past_state of shape {past_state.shape}, expected {carry}")
    dtype = compute_dtype(x.dtype)
    before = np.zeros(carry, x.dtype) if past_state is None else past_state
    padded = np.concatenate([before, x], axis=2)
    windows = np.lib.stride_tricks.sliding_window_view(as_compute(padded, dtype), taps, axis=2)
    y = np.einsum("bclk,ck->bcl", windows, as_compute(weight[:, 0], dtype))
    if bias is not None:
        y += as_compute(bias, dtype)[:, None]
    if activation != "none":
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, padded.shape[2] - (taps - 1) :]


@kernel(
    "Col2Im",
    Engine.POOL,
    inputs=(3, 3),
    attrs={
        "dilations": Attr(positive_ints_attr, None),
        "pads": Attr(non_negative_ints_attr, None),
        "strides": Attr(positive_ints_attr, None),
    },
    since=(18,),
    check=lambda dtypes, values: check_dtypes(dtypes, [FLOATS, INDICES, INDICES]),
)
def _col2im(
    x: np.ndarray,
    image_shape: np.ndarray,
    block_shape: np.ndarray,
    *,
    dilations: tuple[int, ...] | None,
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """The image (N, C, *image_shape) whose sliding blocks (columns of X, (N, C * block
    elements, blocks)) these are, im2col undone: each column's values are added back
    where its block lies (overlaps add up; padding is dropped)."""
    image = [int(v) for v in image_shape.reshape(-1)]
    block = [int(v) for v in block_shape.reshape(-1)]
    rank = len(image)
    if len(block) != rank or x.ndim != 3 or x.shape[1] % max(math.prod(block), 1):
        raise ValueError(f"input {x.shape} does not fit image {image} and block {block}")
    dilation = list(dilations or [1] * rank)
    stride = list(strides or [1] * rank)
    pad = list(pads or [0] * (2 * rank))
    if not len(dilation) == len(stride) == rank or len(pad) != 2 * rank:
        raise ValueError(f"dilations, strides and pads do not fit {rank} spatial axes")
    extent = [size + pad[i] + pad[i + rank] for i, size in enumerate(image)]
    counts = [(extent[i] - dilation[i] * (block[i] - 1) - 1) // stride[i] + 1 for i in range(rank)]
    if min(counts) < 1 or math.prod(counts) != x.shape[2]:
        raise ValueError(f"{x.shape[2]} blocks, the geometry gives {counts}")
    n, channels = x.shape[0], x.shape[1] // math.prod(block)
    dtype = compute_dtype(x.dtype)
    columns = as_compute(x, dtype).reshape(n, channels, *block, *counts)
    padded = np.zeros((n, channels, *extent), dtype=dtype)
    for tap in itertools.product(*(range(b) for b in block)):
        where = tuple(
            slice(t * d, t * d + (c - 1) * s + 1, s)
            for t, d, c, s in zip(tap, dilation, counts, stride, strict=True)
        )
        source: tuple[Any, ...] = (slice(None), slice(None), *tap)
        padded[(slice(None), slice(None), *where)] += columns[source]
    crop = tuple(slice(pad[i], pad[i] + image[i]) for i in range(rank))
    return padded[(slice(None), slice(None), *crop)].astype(x.dtype)
