"""NN ops of the NeuronCore: convolutions, pooling, normalizations, resizing.

Every kernel follows the ONNX semantics of the op versions in its `since`; where ONNX
implementations disagree on a corner (a negative automatic padding, ConvTranspose's
padding split, pooling's "SAME" padding with dilations) the kernel refuses it rather than
pick one. Sliding-window ops work on whole arrays, one Python step per kernel tap:

- Conv gathers the taps of all channels into one column buffer (a copy per tap; strided
  axes are first split into stride phases so that every copy reads contiguous runs) and
  runs one BLAS matmul per image (per few images when they are small); a 1x1 conv with
  stride 1 and no padding is a matmul on the input itself; a depthwise conv is a
  multiply-accumulate of whole shifted windows, tap by tap, in cache-sized blocks.
- ConvTranspose is one matmul (every input pixel times every tap) followed by a strided
  add per tap into the full output, which is then cut or zero-extended to the output.
- Pooling is separable: max and sum reduce one spatial axis at a time over strided views,
  and the average divides by per-axis window counts multiplied together.
- Resize is separable too: per resized axis a table of source indices and weights.

float16 is computed in float32 and rounded back once at the end.

Resize follows the spec's formulas as the ONNX reference implementation (and so the
ONNX test data) reads them, where onnxruntime differs: align_corners and
pytorch_half_pixel use the unrounded output length (scale * size), and an axis that keeps
its length is still transformed (tf_crop_and_resize's roi, tf_half_pixel_for_nn's half
pixel shift), which onnxruntime skips. Likewise LRN takes even sizes, as the spec allows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.kernels import (
    ALL_DTYPES,
    FLOAT_CHECK,
    FLOATS,
    INDICES,
    Attr,
    Shape,
    check_dtypes,
    choice_attr,
    dtype_check,
    dtype_set,
    flag_attr,
    float_attr,
    int_attr,
    ints_attr,
    kernel,
    non_negative_ints_attr,
    positive_attr,
    positive_ints_attr,
)

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_SAME = ("SAME_UPPER", "SAME_LOWER")
_MAX_POOL_DTYPES = FLOATS | dtype_set("int8", "uint8")
# Conv: the output pixels one matmul covers, at most (unless one image has more).
_MATMUL_PIXELS = 2048
# Depthwise conv: the output elements accumulated at a time (512 KiB of float32).
_DEPTHWISE_BLOCK = 1 << 17


# ---- helpers -----------------------------------------------------------------------------


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a float kernel computes in: float32 for float16, else the dtype itself."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _as_compute(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array` in `dtype` (no copy when it already is)."""
    return np.asarray(array, dtype=dtype)


def _per_axis(values: Sequence[int] | None, rank: int, default: int, what: str) -> list[int]:
    """A per-spatial-axis attribute (strides, dilations...) with its default filled in."""
    if values is None:
        return [default] * rank
    if len(values) != rank:
        raise ValueError(f"{what} has {len(values)} values for {rank} spatial axes")
    return list(values)


def _explicit_pads(pads: Sequence[int] | None, rank: int) -> tuple[list[int], list[int]]:
    """(begin, end) from ONNX `pads` [x1_begin, x2_begin, ..., x1_end, x2_end, ...]."""
    if pads is None:
        return [0] * rank, [0] * rank
    if len(pads) != 2 * rank:
        raise ValueError(f"pads has {len(pads)} values for {rank} spatial axes")
    return list(pads[:rank]), list(pads[rank:])


def _pad_spatial(
    x: np.ndarray, begin: Sequence[int], extent: Sequence[int], fill: Any
) -> np.ndarray:
    """`x` (N, C, *spatial) placed at offset `begin` of a (N, C, *extent) array of `fill`
    (parts of `x` beyond `extent` are cut off); `x` itself when that changes nothing."""
    spatial = x.shape[2:]
    if all(b == 0 for b in begin) and tuple(extent) == spatial:
        return x
    out = np.empty((*x.shape[:2], *extent), dtype=x.dtype)
    src: list[slice] = [slice(None), slice(None)]
    dst: list[slice] = [slice(None), slice(None)]
    for size, start, length in zip(spatial, begin, extent, strict=True):
        first = max(0, -start)  # first input element inside the extent
        stop = max(first, min(size, length - start))
        src.append(slice(first, stop))
        dst.append(slice(first + start, stop + start))
    out[tuple(dst)] = x[tuple(src)]
    for axis, kept in enumerate(dst[2:], start=2):  # fill what is left, slab by slab
        before = [slice(None)] * out.ndim
        before[axis] = slice(0, kept.start)
        after = [slice(None)] * out.ndim
        after[axis] = slice(kept.stop, None)
        out[tuple(before)] = fill
        out[tuple(after)] = fill
    return out


def _zero_attr(what: str) -> Callable[[Any], int]:
    """A flag attribute of which only 0 is implemented."""

    def parse(value: Any) -> int:
        if flag_attr(value):
            raise ValueError(f"{what} is not implemented")
        return 0

    return parse


def _one_attr(what: str) -> Callable[[Any], int]:
    """An int attribute of which only 1 is implemented."""

    def parse(value: Any) -> int:
        if int_attr(value) != 1:
            raise ValueError(f"{what}: only 1 is implemented, got {value}")
        return 1

    return parse


def _ints(tensor: np.ndarray, what: str) -> list[int]:
    """The values of an integer tensor input as Python ints."""
    array = np.asarray(tensor)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{what} must be an integer tensor, got dtype {array.dtype}")
    return [int(v) for v in array.reshape(-1).tolist()]


class _LazyOutputs:
    """The outputs of a multi-output kernel, each made when first read: a step that names
    only the first output never pays for the others (steps unpack with zip)."""

    def __init__(self, *makers: Callable[[], np.ndarray]) -> None:
        self._makers = makers
        self._made: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._makers)

    def __getitem__(self, index: int) -> np.ndarray:
        index = range(len(self._makers))[index]
        if index not in self._made:
            self._made[index] = self._makers[index]()
        return self._made[index]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self._makers)))


# ---- sliding windows ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """Where a sliding-window op reads, per spatial axis: output position o reads input
    positions o * stride - begin + j * dilation for the taps j in range(kernel)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]  # padding before the input
    end: tuple[int, ...]  # padding after it (explicit or automatic)
    out: tuple[int, ...]

    @property
    def extent(self) -> tuple[int, ...]:
        """The padded length each axis must have for every window to fit."""
        return tuple(
            (o - 1) * s + (k - 1) * d + 1
            for o, s, k, d in zip(self.out, self.strides, self.kernel, self.dilations, strict=True)
        )

    def tap_slice(self, axis: int, tap: int) -> slice:
        """The positions of the padded input that tap `tap` of `axis` reads."""
        start = tap * self.dilations[axis]
        return slice(
            start, start + (self.out[axis] - 1) * self.strides[axis] + 1, self.strides[axis]
        )

    def taps(self) -> Iterator[tuple[slice, ...]]:
        """Per kernel tap (row-major order), the spatial slices of the padded input."""
        for offsets in itertools.product(*(range(k) for k in self.kernel)):
            yield tuple(self.tap_slice(axis, t) for axis, t in enumerate(offsets))

    def padded(self, x: np.ndarray, fill: Any) -> np.ndarray:
        """`x` (N, C, *spatial) padded with `fill` to `extent`."""
        return _pad_spatial(x, self.begin, self.extent, fill)


def _tap_sources(x: np.ndarray, window: _Window) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """(source, taps): `x` (N, C, *spatial) zero-padded, as an array the kernel taps copy
    from with contiguous reads, and per tap (row-major) its spatial index there. An axis
    with stride s > 1 and more than one tap is split into s phases (one copy of the
    input): tap offset o then reads phase o % s from o // s on, a contiguous run."""
    split = [s > 1 and k > 1 for s, k in zip(window.strides, window.kernel, strict=True)]
    if not any(split):
        return window.padded(x, 0), list(window.taps())
    return _phase_split(x, window, split), _phase_taps(window, split)


def _phase_split(x: np.ndarray, window: _Window, split: Sequence[bool]) -> np.ndarray:
    """`x` zero-padded to `window.extent` (rounded up to the stride on split axes), each
    split axis (..., e, ...) turned into (..., s, e / s, ...): phase, then position."""
    extent = [
        -(-e // s) * s if cut else e
        for e, s, cut in zip(window.extent, window.strides, split, strict=True)
    ]
    padded = _pad_spatial(x, window.begin, extent, 0)
    shape, order = list(x.shape[:2]), [0, 1]
    for e, s, cut in zip(extent, window.strides, split, strict=True):
        if cut:
            order += [len(shape) + 1, len(shape)]
            shape += [e // s, s]
        else:
            order.append(len(shape))
            shape.append(e)
    return np.ascontiguousarray(padded.reshape(shape).transpose(order))


def _phase_taps(window: _Window, split: Sequence[bool]) -> list[tuple[Any, ...]]:
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


def _same_pads(size: int, out: int, stride: int, extent: int, upper: bool) -> tuple[int, int]:
    """(begin, end) of auto_pad SAME_UPPER/SAME_LOWER: the padding that makes `out` windows
    of `extent` fit, split evenly with the odd one at the end (UPPER) or start (LOWER).
    A padding of -1 (the windows stop short of the end) is none; below that, ONNX
    implementations disagree on where the windows start."""
    needed = (out - 1) * stride + extent - size
    if needed < -1:
        raise ValueError(f"auto_pad SAME with a negative padding ({needed}) is not implemented")
    needed = max(0, needed)
    begin = needed // 2 if upper else needed - needed // 2
    return begin, needed - begin


def _conv_window(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
    auto_pad: str,
) -> _Window:
    """The windows of a Conv (or of pooling with ceil_mode 0) over input `sizes`."""
    rank = len(sizes)
    stride = _per_axis(strides, rank, 1, "strides")
    dilation = _per_axis(dilations, rank, 1, "dilations")
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    begin, end = _explicit_pads(pads, rank)
    out = []
    for axis, size in enumerate(sizes):
        if auto_pad in _SAME:
            count = -(-size // stride[axis])
            begin[axis], end[axis] = _same_pads(
                size, count, stride[axis], extents[axis], auto_pad == "SAME_UPPER"
            )
        elif auto_pad == "VALID":
            begin[axis] = end[axis] = 0
        span = size + begin[axis] + end[axis] - extents[axis]
        if span < 0:
            raise ValueError(f"kernel extent {extents[axis]} exceeds the padded input {size}")
        out.append(span // stride[axis] + 1)
    return _Window(
        tuple(kernel), tuple(stride), tuple(dilation), tuple(begin), tuple(end), tuple(out)
    )


def _pool_window(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
    auto_pad: str,
    ceil_mode: int,
) -> _Window:
    """The windows of MaxPool/AveragePool: as Conv's, except that ceil_mode 1 rounds the
    output count up, dropping a last window that would start in the end padding."""
    if len(kernel) != len(sizes):
        raise ValueError(f"kernel_shape has {len(kernel)} values for {len(sizes)} spatial axes")
    window = _conv_window(sizes, kernel, strides, dilations, pads, auto_pad)
    if not ceil_mode or auto_pad != "NOTSET":  # SAME gives ceil(size / stride) either way
        return window
    out = []
    for axis, size in enumerate(sizes):
        stride = window.strides[axis]
        span = size + window.begin[axis] + window.end[axis]
        span -= (window.kernel[axis] - 1) * window.dilations[axis] + 1
        count = -(-span // stride) + 1
        if (count - 1) * stride >= size + window.begin[axis]:
            count -= 1
        out.append(count)
    return _Window(
        window.kernel, window.strides, window.dilations, window.begin, window.end, tuple(out)
    )


def _kernel_extents(values: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """Per axis (kernel extent, stride, output_padding) when the attributes give the
    kernel shape and strides ([] when not: then only the run can tell)."""
    kernel, strides = values["kernel_shape"], values["strides"]
    if kernel is None or strides is None:
        return []
    dilations = values["dilations"] or [1] * len(kernel)
    extra = values.get("output_padding") or [0] * len(kernel)
    return [
        ((k - 1) * d + 1, s, e)
        for k, s, d, e in zip(kernel, strides, dilations, extra, strict=False)
    ]


def _check_auto_pad(values: Mapping[str, Any]) -> None:
    """auto_pad and explicit pads are exclusive (ONNX: "cannot be used simultaneously"),
    and SAME with a stride over the kernel extent + 1 pads negatively (see `_same_pads`)."""
    auto_pad = values["auto_pad"]
    if auto_pad != "NOTSET" and values["pads"] is not None and any(values["pads"]):
        raise ValueError("auto_pad together with non-zero pads is not implemented")
    if auto_pad in _SAME and any(s > e + 1 for e, s, _ in _kernel_extents(values)):
        raise ValueError(f"auto_pad {auto_pad} with a stride over the kernel extent + 1")


# ---- PE: convolutions --------------------------------------------------------------------


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
    _check_auto_pad(values)


_CONV_ATTRS = {
    "auto_pad": Attr(choice_attr(*_AUTO_PADS), "NOTSET"),
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
    dtype = _compute_dtype(x.dtype)
    xc, wc = _as_compute(x, dtype), _as_compute(w, dtype)
    window = _conv_window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    if group > 1 and group == x.shape[1] and w.shape[1] == 1:
        y = _depthwise_conv(xc, wc, window)
    elif _is_pointwise(window):
        y = _pointwise_conv(xc, wc, group)
    else:
        y = _gathered_conv(xc, wc, group, window)
    if b is not None:
        y += _as_compute(b, dtype).reshape(-1, *[1] * (y.ndim - 2))
    return y.astype(x.dtype, copy=False)


def _is_pointwise(window: _Window) -> bool:
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


def _gathered_conv(x: np.ndarray, w: np.ndarray, group: int, window: _Window) -> np.ndarray:
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


def _depthwise_conv(x: np.ndarray, w: np.ndarray, window: _Window) -> np.ndarray:
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
    sizes_by_stride = auto_pad in _SAME and values["output_shape"] is None
    if sizes_by_stride and any(e + extra < s for e, s, extra in _kernel_extents(values)):
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
    extra = _per_axis(output_padding, rank, 0, "output_padding")
    if output_shape is None and auto_pad not in _SAME:
        begin, end = _explicit_pads(None if auto_pad == "VALID" else pads, rank)
        out = [f + e - b0 - e0 for f, e, b0, e0 in zip(full, extra, begin, end, strict=True)]
    else:
        if output_shape is not None:
            out = _per_axis(output_shape, rank, 0, "output_shape")
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
    stride = _per_axis(strides, rank, 1, "strides")
    dilation = _per_axis(dilations, rank, 1, "dilations")
    full = [
        (s - 1) * st + (k - 1) * d + 1
        for s, st, k, d in zip(sizes, stride, kernel, dilation, strict=True)
    ]
    begin, out = _conv_transpose_output(
        sizes, full, stride, auto_pad, output_padding, output_shape, pads
    )

    dtype = _compute_dtype(x.dtype)
    xc, wc = _as_compute(x, dtype), _as_compute(w, dtype)
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
    y = _pad_spatial(result, [-p for p in begin], out, 0)  # cut or zero-extended
    if b is not None:
        y += _as_compute(b, dtype).reshape(-1, *[1] * rank)
    return y.astype(x.dtype, copy=False)


# ---- POOL: pooling -----------------------------------------------------------------------


def _axis_views(
    a: np.ndarray, axis: int, window: _Window, spatial_axis: int
) -> Iterator[np.ndarray]:
    """Per tap of `spatial_axis`, the strided view of `a` along array axis `axis`."""
    for tap in range(window.kernel[spatial_axis]):
        index = [slice(None)] * a.ndim
        index[axis] = window.tap_slice(spatial_axis, tap)
        yield a[tuple(index)]


def _reduce_windows(padded: np.ndarray, window: _Window, ufunc: np.ufunc) -> np.ndarray:
    """`ufunc` (maximum or add) over each window of `padded` (N, C, *extent), one spatial
    axis at a time, the last axis first."""
    y = padded
    for spatial_axis in reversed(range(len(window.kernel))):
        views = list(_axis_views(y, 2 + spatial_axis, window, spatial_axis))
        acc = ufunc(views[0], views[1]) if len(views) > 1 else np.array(views[0])
        for view in views[2:]:
            ufunc(acc, view, out=acc)
        y = acc
    return y


def _lowest(dtype: np.dtype) -> Any:
    """The padding value of max pooling: -inf, or the smallest integer."""
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _pool_check(values: Mapping[str, Any]) -> None:
    _check_auto_pad(values)
    auto_pad = values["auto_pad"]
    if auto_pad == "VALID" and values.get("ceil_mode"):
        # the spec's formula and onnxruntime's give different output sizes
        raise ValueError("auto_pad VALID with ceil_mode 1 is not implemented")
    dilations = values.get("dilations")
    if auto_pad in _SAME and dilations is not None and any(d != 1 for d in dilations):
        # the spec pads for the dilated kernel, onnxruntime and the reference for the plain one
        raise ValueError(f"auto_pad {auto_pad} with dilations is not implemented")


def _max_pool_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [_MAX_POOL_DTYPES])
    _pool_check(values)


def _avg_pool_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [FLOATS])
    _pool_check(values)


_POOL_ATTRS = {
    "auto_pad": Attr(choice_attr(*_AUTO_PADS), "NOTSET"),
    "ceil_mode": Attr(flag_attr, 0),
    "dilations": Attr(positive_ints_attr, None),
    "kernel_shape": Attr(positive_ints_attr),
    "pads": Attr(non_negative_ints_attr, None),
    "strides": Attr(positive_ints_attr, None),
}


@kernel(
    "MaxPool",
    Engine.POOL,
    outputs=(1, 2),
    attrs={**_POOL_ATTRS, "storage_order": Attr(flag_attr, 0)},
    since=(1, 8, 10, 11, 12, 22),
    check=_max_pool_check,
)
def _max_pool(
    x: np.ndarray,
    *,
    auto_pad: str,
    ceil_mode: int,
    dilations: tuple[int, ...] | None,
    kernel_shape: tuple[int, ...],
    pads: tuple[int, ...] | None,
    storage_order: int,
    strides: tuple[int, ...] | None,
) -> _LazyOutputs:
    """(Y, Indices): the max of each window (padding never wins), and where it is, as a
    flat index into X (row-major, or column-major over the spatial axes when
    storage_order is 1); the first of equal maxima in row-major order. Indices is only
    computed when read."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    window = _pool_window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = window.padded(x, _lowest(x.dtype))
    return _LazyOutputs(
        lambda: _reduce_windows(padded, window, np.maximum),
        lambda: _max_pool_indices(x, padded, window, storage_order),
    )


def _max_pool_indices(
    x: np.ndarray, padded: np.ndarray, window: _Window, storage_order: int
) -> np.ndarray:
    """MaxPool's Indices: the max is carried along with its flat input index, one spatial
    axis at a time from the last (so ties go to the row-major first)."""
    sizes = x.shape[2:]
    flat = np.arange(math.prod(sizes), dtype=np.int64)
    position = flat.reshape(sizes[::-1]).T if storage_order else flat.reshape(sizes)
    index = window.padded(position[None, None], -1)  # -1 marks padding
    values, indices = padded, np.broadcast_to(index, padded.shape)
    for spatial_axis in reversed(range(len(sizes))):
        axis = 2 + spatial_axis
        value_views = _axis_views(values, axis, window, spatial_axis)
        index_views = _axis_views(indices, axis, window, spatial_axis)
        best, best_index = np.array(next(value_views)), np.array(next(index_views))
        for value, where in zip(value_views, index_views, strict=True):
            better = (value > best) | ((best_index < 0) & (where >= 0))
            np.copyto(best, value, where=better)
            np.copyto(best_index, where, where=better)
        values, indices = best, best_index
    n, c = x.shape[:2]
    image_offset = np.arange(n * c, dtype=np.int64).reshape(n, c, *[1] * len(sizes))
    return np.add(indices, image_offset * math.prod(sizes), where=indices >= 0, out=indices)


def _window_counts(size: int, window: _Window, axis: int, include_pad: bool) -> np.ndarray:
    """Per output position of `axis`, how many taps of its window fall inside the input
    (or inside input and explicit padding, with `include_pad`)."""
    starts = np.arange(window.out[axis]) * window.strides[axis] - window.begin[axis]
    taps = starts[:, None] + np.arange(window.kernel[axis]) * window.dilations[axis]
    low, high = (-window.begin[axis], size + window.end[axis]) if include_pad else (0, size)
    return np.count_nonzero((taps >= low) & (taps < high), axis=1)


@kernel(
    "AveragePool",
    Engine.POOL,
    attrs={**_POOL_ATTRS, "count_include_pad": Attr(flag_attr, 0)},
    since=(1, 7, 10, 11, 19, 22),
    check=_avg_pool_check,
)
def _average_pool(
    x: np.ndarray,
    *,
    auto_pad: str,
    ceil_mode: int,
    count_include_pad: int,
    dilations: tuple[int, ...] | None,
    kernel_shape: tuple[int, ...],
    pads: tuple[int, ...] | None,
    strides: tuple[int, ...] | None,
) -> np.ndarray:
    """The mean of each window over its taps inside the input (count_include_pad 0) or
    inside input and padding (1; the extra windows of ceil_mode count only up to the end
    padding)."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    sizes = x.shape[2:]
    window = _pool_window(sizes, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = _compute_dtype(x.dtype)
    padded = window.padded(_as_compute(x, dtype), 0)
    sums = _reduce_windows(padded, window, np.add)
    counts = np.ones((), dtype=dtype)
    for axis, size in enumerate(sizes):
        per_axis = _window_counts(size, window, axis, bool(count_include_pad))
        shape = [1] * len(sizes)
        shape[axis] = -1
        counts = counts * per_axis.astype(dtype).reshape(shape)
    sums /= counts
    return sums.astype(x.dtype, copy=False)


@kernel("GlobalAveragePool", Engine.POOL, since=(1, 22), check=FLOAT_CHECK)
def _global_average_pool(x: np.ndarray) -> np.ndarray:
    """The mean over all spatial axes, kept as size-1 axes."""
    axes = tuple(range(2, x.ndim))
    return np.mean(x, axis=axes, keepdims=True, dtype=_compute_dtype(x.dtype)).astype(x.dtype)


@kernel("GlobalMaxPool", Engine.POOL, since=(1, 22), check=FLOAT_CHECK)
def _global_max_pool(x: np.ndarray) -> np.ndarray:
    """The max over all spatial axes, kept as size-1 axes."""
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


# ---- ACT: normalizations -----------------------------------------------------------------


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """The shape that broadcasts a per-channel (C,) vector over X (N, C, *S)."""
    return (-1, *[1] * (x.ndim - 2))


@kernel(
    "BatchNormalization",
    Engine.ACT,
    inputs=(5, 5),
    attrs={
        "epsilon": Attr(float_attr, 1e-5),
        "momentum": Attr(float_attr, 0.9),  # used by training only
        "spatial": Attr(flag_attr, 1),  # version 7
        "training_mode": Attr(_zero_attr("training_mode 1"), 0),
    },
    since=(7, 9, 14, 15),  # inference form (one output)
    check=dtype_check(FLOATS),
)
def _batch_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    *,
    epsilon: float,
    momentum: float,
    spatial: int,
    training_mode: int,
) -> np.ndarray:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B with per-channel statistics (or,
    version 7 with spatial 0, per channel and position), folded into Y = X * a + c."""
    if x.ndim < 2:
        raise ValueError(f"X needs rank >= 2, got shape {x.shape}")
    shape = _channel_shape(x) if spatial else x.shape[1:]
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    shift = bias.astype(np.float64) - mean.astype(np.float64) * factor
    dtype = _compute_dtype(x.dtype)
    y = np.multiply(x, factor.astype(dtype).reshape(shape), dtype=dtype)
    y += shift.astype(dtype).reshape(shape)
    return y.astype(x.dtype, copy=False)


@kernel(
    "InstanceNormalization",
    Engine.ACT,
    inputs=(3, 3),
    attrs={"epsilon": Attr(float_attr, 1e-5)},
    since=(1, 6, 22),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _instance_normalization(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, *, epsilon: float
) -> np.ndarray:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B, mean and (population) variance
    over the spatial axes of each image and channel."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    dtype = _compute_dtype(x.dtype)
    axes = tuple(range(2, x.ndim))
    centered = np.subtract(x, np.mean(x, axis=axes, keepdims=True, dtype=dtype), dtype=dtype)
    var = np.mean(np.square(centered), axis=axes, keepdims=True)
    factor = _as_compute(scale, dtype).reshape(_channel_shape(x)) / np.sqrt(var + epsilon)
    centered *= factor
    centered += _as_compute(bias, dtype).reshape(_channel_shape(x))
    return centered.astype(x.dtype, copy=False)


@kernel(
    "LayerNormalization",
    Engine.ACT,
    inputs=(2, 3),
    outputs=(1, 3),
    attrs={
        "axis": Attr(int_attr, -1),
        "epsilon": Attr(float_attr, 1e-5),
        "stash_type": Attr(_one_attr("stash_type"), 1),
    },
    since=(17,),
    check=dtype_check(FLOATS, same=(0, 1, 2)),
)
def _layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    axis: int,
    epsilon: float,
    stash_type: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, Mean, InvStdDev), as the ONNX function body: over axes [axis, rank), in float32
    (stash_type 1), D = X - Mean, InvStdDev = 1 / sqrt(mean(D^2) + epsilon); then back in
    X's dtype, Y = D * InvStdDev * Scale + B. Mean and InvStdDev are float32, with the
    normalized axes kept as size 1."""
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axes = tuple(range(axis % x.ndim, x.ndim))
    stash = np.asarray(x, dtype=np.float32)
    mean = np.mean(stash, axis=axes, keepdims=True)
    centered = np.subtract(stash, mean)
    inv_std = np.mean(np.square(centered), axis=axes, keepdims=True)
    inv_std += np.float32(epsilon)
    np.sqrt(inv_std, out=inv_std)
    np.reciprocal(inv_std, out=inv_std)
    centered *= inv_std
    y = centered.astype(x.dtype, copy=False)
    y *= scale
    if bias is not None:
        y += bias
    return y, mean, inv_std


@kernel(
    "LRN",
    Engine.ACT,
    attrs={
        "alpha": Attr(float_attr, 1e-4),
        "beta": Attr(float_attr, 0.75),
        "bias": Attr(float_attr, 1.0),
        "size": Attr(positive_attr),
    },
    since=(1, 13),
    check=FLOAT_CHECK,
)
def _lrn(x: np.ndarray, *, alpha: float, beta: float, bias: float, size: int) -> np.ndarray:
    """Y = X / (bias + alpha / size * square_sum) ^ beta, the square sum over channels
    c - floor((size-1)/2) .. c + ceil((size-1)/2) (clipped to the channels there are)."""
    if x.ndim < 3:
        raise ValueError(f"X needs rank >= 3, got shape {x.shape}")
    dtype = _compute_dtype(x.dtype)
    channels = x.shape[1]
    before = (size - 1) // 2
    squares = np.zeros((x.shape[0], channels + size - 1, *x.shape[2:]), dtype=dtype)
    np.square(x, out=squares[:, before : before + channels], dtype=dtype)
    square_sum = np.array(squares[:, :channels])
    for offset in range(1, size):
        square_sum += squares[:, offset : offset + channels]
    square_sum *= alpha / size
    square_sum += bias
    np.power(square_sum, beta, out=square_sum)
    return np.divide(x, square_sum, dtype=dtype).astype(x.dtype, copy=False)


# ---- POOL: Resize ------------------------------------------------------------------------

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",  # version 11 only
)


def _resize_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    interpolates = values["mode"] != "nearest"
    check_dtypes(dtypes[:1], [FLOATS if interpolates else ALL_DTYPES])
    for dtype in dtypes[1:]:  # roi (floats), scales (float32), sizes (int64)
        if np.dtype(dtype) not in FLOATS | INDICES:
            raise ValueError(f"roi/scales/sizes of dtype {dtype} are not implemented")
    if values["antialias"] and not interpolates:
        raise ValueError("antialias with mode nearest is not implemented")
    if values["exclude_outside"] and not interpolates:
        # the reference zeroes a nearest pixel outside the input, onnxruntime clamps it
        raise ValueError("exclude_outside with mode nearest is not implemented")
    if values["coordinate_transformation_mode"] == "tf_half_pixel_for_nn" and interpolates:
        raise ValueError("tf_half_pixel_for_nn is a nearest-mode transformation")


@dataclass(frozen=True)
class _AxisResize:
    """How one axis is resized: input and output length, the scale, the output length
    before rounding (scale * input, or the asked size) and the roi of that axis."""

    size: int
    out: int
    scale: float
    width: float
    roi: tuple[float, float] | None


def _resize_axes(
    shape: Sequence[int],
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    axes: Sequence[int] | None,
    policy: str,
) -> dict[int, _AxisResize]:
    """Per axis named by `axes` (all by default), its `_AxisResize`."""
    rank = len(shape)
    chosen = list(range(rank)) if axes is None else [a % rank for a in axes]
    if axes is not None and (
        any(not -rank <= a < rank for a in axes) or len(set(chosen)) != len(chosen)
    ):
        raise ValueError(f"axes {list(axes)} are not distinct axes of rank {rank}")
    count = len(chosen)
    boxes: list[tuple[float, float] | None] = [None] * count
    if roi is not None:
        bounds = np.asarray(roi, dtype=np.float64).reshape(-1)
        if bounds.size != 2 * count:
            raise ValueError(f"roi has {bounds.size} values for {count} axes")
        boxes = [(float(bounds[i]), float(bounds[count + i])) for i in range(count)]
    if sizes is not None:
        asked = _ints(sizes, "sizes")
        if len(asked) != count or any(s < 0 for s in asked):
            raise ValueError(f"sizes {asked} do not fit {count} axes")
        ratios = [s / shape[a] for s, a in zip(asked, chosen, strict=True)]
        if policy == "stretch":
            plans = [(s, r, float(s)) for s, r in zip(asked, ratios, strict=True)]
        else:
            common = min(ratios) if policy == "not_larger" else max(ratios)
            plans = [(int(common * shape[a] + 0.5), common, common * shape[a]) for a in chosen]
    elif scales is not None:
        factors = np.asarray(scales, dtype=np.float64).reshape(-1)
        if factors.size != count or np.any(factors <= 0):
            raise ValueError(f"scales {factors.tolist()} do not fit {count} axes")
        plans = [
            (int(f * shape[a]), float(f), f * shape[a])
            for f, a in zip(factors, chosen, strict=True)
        ]
    else:
        raise ValueError("Resize needs scales or sizes")
    return {
        axis: _AxisResize(shape[axis], out, scale, width, box)
        for axis, (out, scale, width), box in zip(chosen, plans, boxes, strict=True)
    }


def _keeps_axis(plan: _AxisResize, mode: str) -> bool:
    """Whether resizing by `plan` maps every output position onto the same input one
    (then the axis is left alone)."""
    same = plan.out == plan.size and plan.scale == 1.0 and plan.roi in (None, (0.0, 1.0))
    return same and mode != "tf_half_pixel_for_nn"  # that one shifts by half a pixel


def _source_coordinates(plan: _AxisResize, mode: str) -> np.ndarray:
    """Per output position, the input coordinate it samples (ONNX
    coordinate_transformation_mode)."""
    y = np.arange(plan.out, dtype=np.float64)
    size, scale, width = plan.size, plan.scale, plan.width
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - plan.out / width)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if width != 1 else np.full(plan.out, -0.5)
    if mode == "align_corners":
        return y * (size - 1) / (width - 1) if width != 1 else np.zeros(plan.out)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if plan.roi is None:
        raise ValueError("tf_crop_and_resize needs the roi input")
    start, end = plan.roi
    if width == 1:
        return np.full(plan.out, (end - start) * (size - 1) / 2 + start * (size - 1))
    return y * (end - start) * (size - 1) / (width - 1) + start * (size - 1)


def _nearest_indices(x: np.ndarray, size: int, nearest_mode: str) -> np.ndarray:
    """The input index nearest to each coordinate (ONNX nearest_mode), clamped."""
    if nearest_mode == "round_prefer_floor":
        index = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        index = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        index = np.floor(x)
    else:
        index = np.ceil(x)
    return np.clip(index, 0, size - 1).astype(np.intp)


def _cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel (Keys) with coefficient `a`."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _interpolation_taps(
    x: np.ndarray,
    plan: _AxisResize,
    mode: str,
    cubic_a: float,
    antialias: int,
    exclude_outside: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (out, taps): the input positions each output position
    mixes and how much of each (linear or cubic, stretched by 1 / scale when antialiasing
    a downscale), edge-clamped or, with exclude_outside, renormalized without outside taps."""
    support = 1 if mode == "linear" else 2
    stretch = min(plan.scale, 1.0) if antialias else 1.0
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 1 - first + 1)  # relative to base, 2 - 2 * first taps
    floor = np.floor(x)
    base = np.where(x == floor, floor - 1, floor)  # an exact hit weighs the right tap by 1
    ratio = x - base
    distance = (offsets[None, :] - ratio[:, None]) * stretch
    linear = mode == "linear"
    weights = np.clip(1 - np.abs(distance), 0, 1) if linear else _cubic(distance, cubic_a)
    if antialias:
        weights /= weights.sum(axis=1, keepdims=True)
    indices = base.astype(np.intp)[:, None] + offsets[None, :]
    if exclude_outside:
        weights = np.where((indices < 0) | (indices >= plan.size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights /= np.where(total == 0, 1.0, total)
    return np.clip(indices, 0, plan.size - 1), weights


def _resample_axis(
    data: np.ndarray, axis: int, indices: np.ndarray, weights: np.ndarray | None
) -> np.ndarray:
    """`data` resampled along `axis`: out[..., o, ...] = sum_j weights[o, j] *
    data[..., indices[o, j], ...] (a plain gather when `weights` is None)."""
    if weights is None:
        return np.take(data, indices, axis=axis)
    shape = [1] * data.ndim
    shape[axis] = -1
    result = None
    for tap in range(indices.shape[1]):
        term = np.take(data, indices[:, tap], axis=axis)
        term *= weights[:, tap].astype(data.dtype).reshape(shape)
        if result is None:
            result = term
        else:
            result += term
    assert result is not None
    return result


@kernel(
    "Resize",
    Engine.POOL,
    inputs=(1, 4),
    attrs={
        "antialias": Attr(flag_attr, 0),
        "axes": Attr(ints_attr, None),
        "coordinate_transformation_mode": Attr(choice_attr(*_COORDINATE_MODES), "half_pixel"),
        "cubic_coeff_a": Attr(float_attr, -0.75),
        "exclude_outside": Attr(flag_attr, 0),
        "extrapolation_value": Attr(float_attr, 0.0),
        "keep_aspect_ratio_policy": Attr(
            choice_attr("stretch", "not_larger", "not_smaller"), "stretch"
        ),
        "mode": Attr(choice_attr("nearest", "linear", "cubic"), "nearest"),
        "nearest_mode": Attr(
            choice_attr("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
            "round_prefer_floor",
        ),
    },
    since=(11, 13, 18, 19),  # version 10 takes (X, scales) and has other semantics
    check=_resize_check,
)
def _resize(
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int,
    axes: tuple[int, ...] | None,
    coordinate_transformation_mode: str,
    cubic_coeff_a: float,
    exclude_outside: int,
    extrapolation_value: float,
    keep_aspect_ratio_policy: str,
    mode: str,
    nearest_mode: str,
) -> np.ndarray:
    """X resized axis by axis to `sizes` (or floor(size * scale)): each output position
    maps to an input coordinate and takes the nearest input element or interpolates
    (linear, cubic); with tf_crop_and_resize, positions mapping outside the input are
    `extrapolation_value`. Empty roi/scales/sizes tensors count as absent."""
    roi, scales, sizes = (None if t is None or np.size(t) == 0 else t for t in (roi, scales, sizes))
    if scales is not None and sizes is not None:
        raise ValueError("Resize takes scales or sizes, not both")
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    if crop and sizes is None:
        # the spec's output size counts the roi, onnxruntime and the reference do not
        raise ValueError("tf_crop_and_resize with scales is not implemented")
    policy = keep_aspect_ratio_policy if sizes is not None else "stretch"
    plans = _resize_axes(x.shape, roi if crop else None, scales, sizes, axes, policy)
    dtype = x.dtype if mode == "nearest" else _compute_dtype(x.dtype)
    y = _as_compute(x, dtype)
    for axis, plan in plans.items():
        if _keeps_axis(plan, coordinate_transformation_mode):
            continue
        coords = _source_coordinates(plan, coordinate_transformation_mode)
        if mode == "nearest":
            y = _resample_axis(y, axis, _nearest_indices(coords, plan.size, nearest_mode), None)
        else:
            indices, weights = _interpolation_taps(
                coords, plan, mode, cubic_coeff_a, antialias, exclude_outside
            )
            y = _resample_axis(y, axis, indices, weights)
        if crop:
            outside = (coords < 0) | (coords > plan.size - 1)
            if outside.any():
                shape = [1] * y.ndim
                shape[axis] = -1
                y = np.where(outside.reshape(shape), np.array(extrapolation_value).astype(dtype), y)
    if y is x:
        y = x.copy()
    return y.astype(x.dtype, copy=False)


# ---- POOL: Pad, DepthToSpace, SpaceToDepth -----------------------------------------------


def _pad_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes[:1], [ALL_DTYPES])  # constant_value is cast to the data's dtype
    if values["pads"] is not None and len(dtypes) > 1:
        raise ValueError("pads given both as attribute and as input")


@kernel(
    "Pad",
    Engine.POOL,
    inputs=(1, 4),
    attrs={
        "mode": Attr(choice_attr("constant", "reflect", "edge", "wrap"), "constant"),
        "pads": Attr(ints_attr, None),  # version 2
        "value": Attr(float_attr, 0.0),  # version 2
    },
    since=(2, 11, 13, 18, 19, 21, 23, 24, 25),
    check=_pad_check,
)
def _pad(
    data: np.ndarray,
    pads_input: np.ndarray | None = None,
    constant_value: np.ndarray | None = None,
    axes_input: np.ndarray | None = None,
    *,
    mode: str,
    pads: tuple[int, ...] | None,
    value: float,
) -> np.ndarray:
    """`data` with pads[i] elements added before and pads[i + n] after axis axes[i]
    (negative counts remove elements first): a constant, the reflection about the edge
    element, the edge element repeated, or the data wrapped around."""
    rank = data.ndim
    if pads is None:
        if pads_input is None:
            raise ValueError("Pad needs pads")
        counts = _ints(pads_input, "pads")
    else:
        counts = list(pads)
    axes = list(range(rank)) if axes_input is None else _ints(axes_input, "axes")
    if any(not -rank <= a < rank for a in axes) or len(counts) != 2 * len(axes):
        raise ValueError(f"pads {counts} do not fit axes {axes} of rank {rank}")
    before, after = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        before[axis % rank], after[axis % rank] = counts[i], counts[len(axes) + i]
    cropped = data[
        tuple(
            slice(max(0, -b), s - max(0, -a))
            for b, a, s in zip(before, after, data.shape, strict=True)
        )
    ]
    widths = [(max(0, b), max(0, a)) for b, a in zip(before, after, strict=True)]
    if mode != "constant":
        return np.pad(cropped, widths, mode=mode)  # type: ignore[call-overload]
    fill: Any = value if pads is not None else 0
    if constant_value is not None:
        fill = np.asarray(constant_value).reshape(-1)[0] if np.size(constant_value) else 0
    return np.pad(
        cropped, widths, mode="constant", constant_values=np.array(fill).astype(data.dtype)
    )


def _block_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [ALL_DTYPES])


@kernel(
    "DepthToSpace",
    Engine.POOL,
    attrs={"blocksize": Attr(positive_attr), "mode": Attr(choice_attr("DCR", "CRD"), "DCR")},
    since=(1, 11, 13, 28),
    check=_block_check,
)
def _depth_to_space(x: np.ndarray, *, blocksize: int, mode: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C / b^2, H * b, W * b): each pixel's channels spread over a
    b x b block; the channel index is (row, column, depth) in DCR, (depth, row, column)
    in CRD."""
    if x.ndim != 4 or x.shape[1] % (blocksize * blocksize):
        raise ValueError(f"input {x.shape} does not fit blocksize {blocksize}")
    n, c, h, w = x.shape
    depth = c // (blocksize * blocksize)
    if mode == "DCR":
        blocks = x.reshape(n, blocksize, blocksize, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = x.reshape(n, depth, blocksize, blocksize, h, w).transpose(0, 1, 4, 2, 5, 3)
    return blocks.reshape(n, depth, h * blocksize, w * blocksize)


@kernel(
    "SpaceToDepth",
    Engine.POOL,
    attrs={"blocksize": Attr(positive_attr), "mode": Attr(choice_attr("DCR", "CRD"), "DCR")},
    since=(1, 13, 28),
    check=_block_check,
)
def _space_to_depth(x: np.ndarray, *, blocksize: int, mode: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C * b^2, H / b, W / b), the inverse of DepthToSpace: each
    b x b block goes to the channels, ordered (row, column, depth) in DCR, (depth, row,
    column) in CRD."""
    if x.ndim != 4 or x.shape[2] % blocksize or x.shape[3] % blocksize:
        raise ValueError(f"input {x.shape} does not fit blocksize {blocksize}")
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // blocksize, blocksize, w // blocksize, blocksize)
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return blocks.transpose(order).reshape(
        n, c * blocksize * blocksize, h // blocksize, w // blocksize
    )
