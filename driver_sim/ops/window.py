"""The geometry of the sliding-window ops, which `conv` and `pool` share (it registers no
kernel): per-axis attributes, explicit and automatic (SAME) padding, and `Window`, where
each output position reads.

Where ONNX implementations disagree on a corner (a negative automatic padding, say) the
kernels refuse it rather than pick one: `check_auto_pad` in their support checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
SAME_AUTO_PADS = ("SAME_UPPER", "SAME_LOWER")


def per_axis(values: Sequence[int] | None, rank: int, default: int, what: str) -> list[int]:
    """A per-spatial-axis attribute (strides, dilations...) with its default filled in."""
    if values is None:
        return [default] * rank
    if len(values) != rank:
        raise ValueError(f"{what} has {len(values)} values for {rank} spatial axes")
    return list(values)


def explicit_pads(pads: Sequence[int] | None, rank: int) -> tuple[list[int], list[int]]:
    """(begin, end) from ONNX `pads` [x1_begin, x2_begin, ..., x1_end, x2_end, ...]."""
    if pads is None:
        return [0] * rank, [0] * rank
    if len(pads) != 2 * rank:
        raise ValueError(f"pads has {len(pads)} values for {rank} spatial axes")
    return list(pads[:rank]), list(pads[rank:])


def pad_spatial(
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


@dataclass(frozen=True)
class Window:
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
        return pad_spatial(x, self.begin, self.extent, fill)


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


def conv_window(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
    auto_pad: str,
) -> Window:
    """The windows of a Conv (or of pooling with ceil_mode 0) over input `sizes`."""
    rank = len(sizes)
    stride = per_axis(strides, rank, 1, "strides")
    dilation = per_axis(dilations, rank, 1, "dilations")
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    begin, end = explicit_pads(pads, rank)
    out = []
    for axis, size in enumerate(sizes):
        if auto_pad in SAME_AUTO_PADS:
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
    return Window(
        tuple(kernel), tuple(stride), tuple(dilation), tuple(begin), tuple(end), tuple(out)
    )


def kernel_extents(values: Mapping[str, Any]) -> list[tuple[int, int, int]]:
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


def check_auto_pad(values: Mapping[str, Any]) -> None:
    """auto_pad and explicit pads are exclusive (ONNX: "cannot be used simultaneously"),
    and SAME with a stride over the kernel extent + 1 pads negatively (see `_same_pads`)."""
    auto_pad = values["auto_pad"]
    if auto_pad != "NOTSET" and values["pads"] is not None and any(values["pads"]):
        raise ValueError("auto_pad together with non-zero pads is not implemented")
    if auto_pad in SAME_AUTO_PADS and any(s > e + 1 for e, s, _ in kernel_extents(values)):
        raise ValueError(f"auto_pad {auto_pad} with a stride over the kernel extent + 1")
