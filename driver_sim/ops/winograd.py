"""WinogradConv: a 3x3, stride-1 Conv by Winograd's minimal filtering F(2x2, 3x3).

An internal NeuronCore instruction (not an ONNX op): the compiler rewrites an eligible
Conv (float32, 3x3 kernel, stride 1, dilation 1, group 1, explicit pads) into it where
`winograd_pays` says so, with the Conv weights W replaced by `winograd_weights(W)`,
computed once at compile time.

The algorithm (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015):
the output is cut into 2x2 tiles; output tile (i, j) reads the 4x4 input tile d at rows
2i.., columns 2j.. of the padded input, and for one (output, input) channel pair

    Y = A^T [(G g G^T) * (B^T d B)] A          (* elementwise over the 4x4 tile)

with g the 3x3 filter and

    B^T = [[1,  0, -1,  0],   G = [[1,    0,   0  ],   A^T = [[1, 1,  1,  0],
           [0,  1,  1,  0],        [1/2,  1/2, 1/2],          [0, 1, -1, -1]]
           [0, -1,  1,  0],        [1/2, -1/2, 1/2],
           [0,  1,  0, -1]]        [0,    0,   1  ]]

Summed over input channels the elementwise product becomes, per tile element k (16 of
them), a matrix product M[k] (Cout, P) = U[k] (Cout, Cin) @ V[k] (Cin, P), where
U = G g G^T (the transformed weights), V = B^T d B (the transformed input tiles) and P
counts the tiles of all images: 16 * Cout * Cin multiplies per 2x2 output tile where the
direct convolution does 36 * Cout * Cin, 2.25x fewer, for transforms that only add.

Layout: everything is whole-array numpy (no Python loop over tiles or elements), and the
transforms are flat, one long contiguous run per operand, because numpy pays ~20 ns for
every inner run of an operation and the rows of a tile grid are short (4 to 28 tiles):

- The input is zero-padded to the tile grid in 4 copies that also split its rows and its
  columns by parity: plane (column parity, row parity) holds, per input channel and
  image, the (th + 1) x (tw + 1) pixels of that parity, th x tw being the output tiles.
  A tile's 4 rows are then rows 0 and 1 of the two row-parity planes at tile row i and
  at tile row i + 1: the same flat plane shifted by one plane row; likewise for columns.
- B^T d B is separable: 4 adds/subtracts of the shifted row-parity planes, then 4 of the
  shifted column-parity planes of the result, straight into V (16, Cin, P), contiguous.
  Shifted flat planes make a (th + 1) x (tw + 1) grid of tiles per image, one junk tile
  row and column beyond the output (reading pixels of the next row or channel, finite;
  the last ones a zero tail). The GEMMs compute them too: 7% more work at 56x56, 31% at
  14x14, 56% at 7x7 (where the rewrite does not pay: see `winograd_pays`); dropping
  them instead would take transform steps of inner runs of tw, which cost more.
- One np.matmul does the 16 GEMMs (16, Cout, Cin) @ (16, Cin, P) -> M (16, Cout, P); the
  bias joins M's centre element (A^T e A is all ones for the unit matrix e at (1, 1)).
- A^T M A likewise: 4 flat adds/subtracts over the tile rows, then per output column
  parity c one flat and one that writes z[r, ..., c], the tile's two output pixels side
  by side, so that each output row 2 i + r is a run of z, copied in one step per r (cut
  to the output size).
- Images go through in chunks whose scratch stays in the L3 cache, one allocation
  reused chunk to chunk (and kept in the C heap between calls); the output transform's
  intermediates reuse V's memory.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import Attr, Shape, check_dtypes, dtype_set, ints_attr, kernel

_FLOAT32 = dtype_set("float32")
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
# The scratch (parity planes, V and M) one chunk of images may take, in float32 elements
# (24 MiB): it then stays in the 32 MiB L3 cache of the hosts measured. At batch 8, of
# 6, 12, 18, 24, 36, 48 MiB and no limit, 24 MiB was the fastest or within 3% of it on
# 64@56, 128@28 and 256@14, and 36 MiB and more ran 64@56 1.7x slower.
_SCRATCH_ELEMENTS = 6 << 20
# winograd_pays: the fewest channels (input and output) and tiles per GEMM where the
# rewrite paid throughout (see its docstring).
_PAYS_CHANNELS = 16
_PAYS_TILES = 32


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """The compile-time transform of a Conv weight W (Cout, Cin, 3, 3): U (16, Cout, Cin)
    float32, contiguous, with U[4 * a + b, o, c] = (G W[o, c] G^T)[a, b], computed in
    float64 and rounded once."""
    weights = np.asarray(w)
    if weights.ndim != 4 or weights.shape[2:] != (3, 3):
        raise ValueError(f"WinogradConv weights must be (Cout, Cin, 3, 3), got {weights.shape}")
    u = np.einsum("ak,ockl,bl->aboc", _G, weights.astype(np.float64), _G)  # (4, 4, Cout, Cin)
    return np.ascontiguousarray(u.reshape(16, *weights.shape[:2]), dtype=np.float32)


@dataclass(frozen=True)
class _Grid:
    """The tiles of one image: th x tw output tiles, computed as a `rows` x `cols` grid
    (one junk row and column more)."""

    th: int
    tw: int

    @property
    def rows(self) -> int:
        return self.th + 1

    @property
    def cols(self) -> int:
        return self.tw + 1

    @property
    def tiles(self) -> int:
        return self.rows * self.cols


def _grid(out_rows: int, out_cols: int) -> _Grid:
    return _Grid(-(-out_rows // 2), -(-out_cols // 2))


def _chunk(n: int, cin: int, cout: int, grid: _Grid) -> int:
    """Images per chunk: as many as keep the scratch within `_SCRATCH_ELEMENTS` (at
    least one), spread evenly over the chunks."""
    per_image = (20 * cin + 16 * cout) * grid.tiles
    most = max(1, min(n, _SCRATCH_ELEMENTS // max(1, per_image)))
    chunks = -(-n // most)
    return max(1, -(-n // max(1, chunks)))


def _winograd_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """The GEMMs' multiplies: 16 * Cout * Cin per tile computed (junk tiles included)."""
    n, cout, out_rows, out_cols = outputs[0]
    return 16 * cout * inputs[1][2] * n * _grid(out_rows, out_cols).tiles


def _check_pads(pads: Sequence[int]) -> None:
    if len(pads) != 4 or any(p < 0 for p in pads):
        raise ValueError(f"pads must be 4 non-negative integers, got {list(pads)}")


def _winograd_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, [_FLOAT32])
    _check_pads(values["pads"])


def _output_size(
    x: np.ndarray, u: np.ndarray, b: np.ndarray | None, pads: Sequence[int]
) -> tuple[int, int]:
    """(output rows, output columns); ValueError unless X, U, B and pads fit."""
    _check_pads(pads)
    if x.ndim != 4 or u.ndim != 3 or u.shape[0] != 16 or u.shape[2] != x.shape[1]:
        raise ValueError(
            f"WinogradConv needs X (N, Cin, H, W) and U (16, Cout, Cin), "
            f"got {x.shape} and {u.shape}"
        )
    if b is not None and b.shape != (u.shape[1],):
        raise ValueError(f"B has shape {b.shape}, expected ({u.shape[1]},)")
    top, left, bottom, right = pads
    rows, cols = x.shape[2] + top + bottom - 2, x.shape[3] + left + right - 2
    if rows < 1 or cols < 1:
        raise ValueError(f"the 3x3 kernel exceeds the input {x.shape[2:]} padded by {pads}")
    return rows, cols


def _take(buffer: np.ndarray, *shape: int) -> np.ndarray:
    """The first prod(shape) elements of flat `buffer` as an array of `shape`."""
    return buffer[: math.prod(shape)].reshape(shape)


@kernel(
    "WinogradConv",
    Engine.PE,
    inputs=(2, 3),
    attrs={"pads": Attr(ints_attr, (0, 0, 0, 0))},
    macs=_winograd_macs,
    since=None,
    check=_winograd_check,
)
def _winograd_conv(
    x: np.ndarray, u: np.ndarray, b: np.ndarray | None = None, *, pads: tuple[int, ...]
) -> np.ndarray:
    """Y = Conv(X, W, B) for a 3x3 W given as U = winograd_weights(W), stride 1, zero
    padding `pads` [top, left, bottom, right]: X (N, Cin, H, W) float32 ->
    Y (N, Cout, H + top + bottom - 2, W + left + right - 2)."""
    out_rows, out_cols = _output_size(x, u, b, pads)
    n, cin = x.shape[:2]
    cout = u.shape[1]
    grid = _grid(out_rows, out_cols)
    chunk = _chunk(n, cin, cout, grid)
    y = np.empty((n, cout, out_rows, out_cols), dtype=np.float32)
    # One allocation for all the scratch, reused chunk to chunk: a single block stays in
    # the C heap between calls where several would be handed back and faulted in anew.
    plane = chunk * grid.tiles  # one channel's tiles, or pixels of one parity plane
    sizes = [
        4 * (cin * plane + grid.cols),  # the padded input's parity planes, with a tail
        16 * cin * plane,  # V; then the output transform's intermediates
        16 * cout * plane,  # M
        8 * (cin * plane + 1),  # the input transform's intermediate
    ]
    sizes[1] = max(sizes[1], 14 * cout * plane)
    sizes = [-(-size // 16) * 16 for size in sizes]  # 64-byte boundaries
    scratch = np.empty(sum(sizes), dtype=np.float32)
    padded, v, m, rowed = np.split(scratch, list(itertools.accumulate(sizes[:-1])))
    bias = None if b is None else b.astype(np.float32, copy=False)[:, None]
    for first in range(0, n, chunk):
        images = x[first : first + chunk]
        count = images.shape[0]
        planes = _parity_planes(images, pads, grid, padded)
        vk = _input_transform(planes, cin, count, grid, v, rowed)
        mk = _take(m, 16, cout, count * grid.tiles)
        np.matmul(u, vk, out=mk)
        if bias is not None:
            mk[5] += bias
        _output_transform(mk, grid, v, y[first : first + count])
    return y


def _parity_planes(
    x: np.ndarray, pads: Sequence[int], grid: _Grid, buffer: np.ndarray
) -> np.ndarray:
    """X zero-padded to the tile grid, split by parity: (2, 2, Cin * N * rows * cols +
    cols) where [cp, rp] holds pixel (2 r + rp, 2 k + cp) of the padded input at flat
    position ((c * N + n) * rows + r) * cols + k, followed by a tail of zeros (read by the
    last junk tiles)."""
    n, cin, height, width = x.shape
    length = cin * n * grid.tiles
    padded = _take(buffer, 2, 2, length + grid.cols)
    padded[:, :, length:] = 0
    planes = padded[:, :, :length].reshape(2, 2, cin, n, grid.rows, grid.cols)
    row_spans = [_parity_span(pads[0], height, parity) for parity in (0, 1)]
    col_spans = [_parity_span(pads[1], width, parity) for parity in (0, 1)]
    for parity, (_, start, stop) in enumerate(row_spans):
        planes[:, parity, :, :, :start] = 0
        planes[:, parity, :, :, stop:] = 0
    for parity, (_, start, stop) in enumerate(col_spans):
        planes[parity, :, :, :, :, :start] = 0
        planes[parity, :, :, :, :, stop:] = 0
    by_channel = x.swapaxes(0, 1)
    for (rp, (row_first, r0, r1)), (cp, (col_first, k0, k1)) in itertools.product(
        enumerate(row_spans), enumerate(col_spans)
    ):
        planes[cp, rp, :, :, r0:r1, k0:k1] = by_channel[:, :, row_first::2, col_first::2]
    return padded


def _parity_span(before: int, size: int, parity: int) -> tuple[int, int, int]:
    """Where the input's pixels of padded parity `parity` along one axis lie: (first
    input index with that parity, start and stop in the parity plane)."""
    first = (parity - before) % 2
    start = (first + before) // 2
    return first, start, start + max(0, (size - first + 1) // 2)


def _input_transform(
    padded: np.ndarray, cin: int, n: int, grid: _Grid, v_buffer: np.ndarray, scratch: np.ndarray
) -> np.ndarray:
    """V (16, Cin, N * tiles) = B^T d B for every 4x4 tile d of the parity planes."""
    size = cin * n * grid.tiles
    shift = grid.cols
    # rows: t[a] = (B^T d)[a] over a tile's 4 rows: plane rp, then plane rp one row on
    d0, d1 = padded[:, 0, :size], padded[:, 1, :size]
    d2, d3 = padded[:, 0, shift : shift + size], padded[:, 1, shift : shift + size]
    t = _take(scratch, 4, 2, size + 1)  # (a, column parity, ...), a junk tail
    t[:, :, size] = 0
    np.subtract(d0, d2, out=t[0, :, :size])
    np.add(d1, d2, out=t[1, :, :size])
    np.subtract(d2, d1, out=t[2, :, :size])
    np.subtract(d1, d3, out=t[3, :, :size])
    # columns: v[a, b] = (t[a] B)[b] over a tile's 4 columns: parity cp, then one on
    even, odd = t[:, 0], t[:, 1]
    c0, c1, c2, c3 = even[:, :size], odd[:, :size], even[:, 1:], odd[:, 1:]
    v = _take(v_buffer, 4, 4, size)  # (a, b, ...)
    np.subtract(c0, c2, out=v[:, 0])
    np.add(c1, c2, out=v[:, 1])
    np.subtract(c2, c1, out=v[:, 2])
    np.subtract(c1, c3, out=v[:, 3])
    return v.reshape(16, cin, n * grid.tiles)


def _output_transform(m: np.ndarray, grid: _Grid, scratch: np.ndarray, y: np.ndarray) -> None:
    """y (N, Cout, rows, cols) = A^T M A per tile, from M (16, Cout, N * tiles)."""
    n, cout, out_rows, out_cols = y.shape
    size = cout * n * grid.tiles
    rows = m.reshape(4, 4, size)  # (tile row a, tile column b, ...)
    # s[r] = (A^T M)[r], per tile column
    s = _take(scratch, 2, 4, size)
    np.add(rows[0], rows[1], out=s[0])
    s[0] += rows[2]
    np.subtract(rows[1], rows[2], out=s[1])
    s[1] -= rows[3]
    # z[r, ..., c] = (A^T M A)[r, c]: per output row parity r, a tile's two pixels side
    # by side, so that rows 2 i + r of the output are runs of z
    z = _take(scratch[s.size :], 2, size, 2)
    part = _take(scratch[s.size + z.size :], 2, size)
    np.add(s[:, 0], s[:, 1], out=part)
    np.add(part, s[:, 2], out=z[..., 0])  # s[r, 0] + s[r, 1] + s[r, 2]
    np.subtract(s[:, 1], s[:, 2], out=part)
    np.subtract(part, s[:, 3], out=z[..., 1])  # s[r, 1] - s[r, 2] - s[r, 3]
    for row in (0, 1):
        pixels = z[row].reshape(cout, n, grid.rows, 2 * grid.cols)
        pixels = pixels[:, :, : (out_rows - row + 1) // 2, :out_cols]
        y[:, :, row::2] = pixels.swapaxes(0, 1)


def winograd_pays(n: int, cin: int, cout: int, h_out: int, w_out: int) -> bool:
    """Whether WinogradConv beats the Conv kernel on a 3x3 stride-1 conv of `n` images,
    `cin` -> `cout` channels, output h_out x w_out. Three conditions, with T the tiles the
    GEMMs compute per image, (ceil(h_out / 2) + 1) * (ceil(w_out / 2) + 1) (junk row and
    column included):

    - the GEMMs do at most 80% of the direct convolution's multiplies:
      9 * h_out * w_out >= 1.25 * 16 * T. Square outputs pass at 6x6 (1.27x fewer) and
      from 8x8 on (1.44x at 8x8, 1.27x at 9x9, 1.7-2.1x from 12x12 on), and fail at 7x7
      (1.10x) and under 6x6;
    - at least 32 tiles per GEMM, n * T >= 32: thinner GEMMs lose to BLAS overheads (at
      batch 1 this leaves out 8x8, where 128 channels lost);
    - at least 16 channels in and out.

    Measured (bench/winograd.py, 2 cores, medians; Conv time / WinogradConv time at
    batch 1 | batch 8; Cin = Cout unless given; * = the rule says no; the shared host
    moves these by about 0.1-0.2 run to run):

        ResNet-18:   64@56 1.39 | 1.32   128@28 1.39 | 1.37   256@14 1.78 | 1.61
                     512@7 0.83* | 1.04*
        7x7:         64 0.94* | 1.11*    256 0.96* | 1.00*    (512 above)
        6x6, 8x8:    64@6 1.12* | 1.35   256@6 1.06* | 1.28   512@6 1.09* | 1.22
                     64@8 1.38*          128@8 0.85* | 1.30   256@8 1.14* | 1.28
        9x9 - 12x12: 128@9 1.18 | 1.15   128@10 1.13 | 1.35   256@10 1.20 | 1.30
                     64@11 1.22 | 1.17   128@12 1.12 | 1.30   512@12 1.22 | 1.36
        larger:      64@14 1.48 | 1.26   128@14 1.35 | 1.19   512@14 1.20 | 1.45
                     64@28 1.08 | 1.34   256@28 1.44 | 1.39   96->48@33 1.28 | 1.45
        channels:    32@56 1.37 | 1.18   32@28 1.35 | 1.50    16@56 1.50 | 1.24
                     16@28 1.28 | 1.71   8->16@28 1.00* | 1.40*  8@56 1.30* | 0.81*
        4x4:         256@4 0.74* | 1.11*
    """
    if min(cin, cout) < _PAYS_CHANNELS:
        return False
    tiles = _grid(h_out, w_out).tiles
    return n * tiles >= _PAYS_TILES and 4 * 9 * h_out * w_out >= 5 * 16 * tiles
