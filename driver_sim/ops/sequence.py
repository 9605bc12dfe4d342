"""The geometry of a recurrent layer's call (LSTM, GRU, RNN: `driver_sim.ops.recurrent`):
its inputs checked and seen time-major whatever their layout, the sequence lengths as a
mask of the steps that count, the initial states, and the scan of a cell over the steps
of each direction, after one GEMM for every step's input projection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from driver_sim.ops.registry import as_compute, compute_dtype

# A cell's step: the step's input projection and the states (H first) -> the new states.
Step = Callable[..., tuple[np.ndarray, ...]]
# Per direction attribute: whether each direction runs from the last step to the first.
_REVERSE = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


@dataclass(frozen=True)
class Layer:
    """One call's inputs in time-major form, in the dtype the kernel computes in."""

    x: np.ndarray  # (seq, batch, input), possibly a transposed view
    w: np.ndarray  # (directions, gates*hidden, input)
    r: np.ndarray  # (directions, gates*hidden, hidden)
    bias: np.ndarray  # (directions, 2, gates*hidden): Wb, Rb (zeros when absent)
    active: np.ndarray | None  # (seq, batch): step t counts for batch b; None: every one
    reverse: tuple[bool, ...]  # per direction: whether it runs from the last step
    hidden: int
    layout: int
    dtype: np.dtype  # of the outputs

    @property
    def directions(self) -> int:
        return len(self.reverse)


def layer_of(
    gates: int,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    lens: np.ndarray | None,
    values: Mapping[str, Any],
) -> Layer:
    """The inputs checked against each other (ValueError naming the mismatch)."""
    if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
        raise ValueError(f"X, W and R must be 3-D, got {x.shape}, {w.shape} and {r.shape}")
    reverse = _REVERSE[values["direction"]]
    directions = len(reverse)
    hidden = r.shape[-1]
    if values["hidden_size"] not in (None, hidden):
        raise ValueError(f"hidden_size {values['hidden_size']} but R is {r.shape}")
    rows = gates * hidden
    if w.shape != (directions, rows, x.shape[-1]) or r.shape != (directions, rows, hidden):
        raise ValueError(
            f"W {w.shape} and R {r.shape} do not fit X {x.shape} with {directions} "
            f"direction(s) of {gates} gate(s) of {hidden}"
        )
    dtype = compute_dtype(x.dtype)
    bias = np.zeros((directions, 2, rows), dtype)
    if b is not None:
        if b.shape != (directions, 2 * rows):
            raise ValueError(f"B must be {(directions, 2 * rows)}, got {b.shape}")
        bias = as_compute(b, dtype).reshape(directions, 2, rows)
    time_major = x.swapaxes(0, 1) if values["layout"] else x
    return Layer(
        x=as_compute(time_major, dtype),
        w=as_compute(w, dtype),
        r=as_compute(r, dtype),
        bias=bias,
        active=_active(lens, *time_major.shape[:2]),
        reverse=reverse,
        hidden=hidden,
        layout=values["layout"],
        dtype=x.dtype,
    )


def _active(lens: np.ndarray | None, seq: int, batch: int) -> np.ndarray | None:
    """Which (step, batch) pairs are within their sequence; None when all are."""
    if lens is None:
        return None
    lengths = np.asarray(lens)
    if lengths.dtype.kind not in "iu" or lengths.shape != (batch,):
        raise ValueError(
            f"sequence_lens must be {batch} integers, got {lengths.dtype} {lengths.shape}"
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > seq):
        raise ValueError(f"sequence_lens must be within 0..{seq}, got {lengths.tolist()}")
    if np.all(lengths == seq):
        return None
    return np.arange(seq)[:, None] < lengths[None, :]


def initial_state(layer: Layer, initial: np.ndarray | None, what: str) -> np.ndarray:
    """An initial state as (directions, batch, hidden), zeros when absent."""
    want = (layer.directions, layer.x.shape[1], layer.hidden)
    if initial is None:
        return np.zeros(want, layer.x.dtype)
    state = initial.swapaxes(0, 1) if layer.layout else initial
    if state.shape != want:
        raise ValueError(f"{what} must be {want} in layout {layer.layout}, got {initial.shape}")
    return as_compute(state, layer.x.dtype)


def _projection(layer: Layer, d: int, bias: np.ndarray) -> np.ndarray:
    """X·W^T + bias for every step of direction d at once: (seq, batch, gates*hidden)."""
    x = layer.x
    flat = x.reshape(-1, x.shape[-1]) if x.flags.c_contiguous else None
    if flat is None:  # a batch-major X: multiply it as it lies, then view it time-major
        batch_major = x.swapaxes(0, 1)
        product = batch_major.reshape(-1, x.shape[-1]) @ layer.w[d].T
        product = product.reshape(*batch_major.shape[:2], -1).swapaxes(0, 1)
    else:
        product = (flat @ layer.w[d].T).reshape(*x.shape[:2], -1)
    product += bias
    return product


def _scan(
    step: Step,
    projection: np.ndarray,
    states: tuple[np.ndarray, ...],
    active: np.ndarray | None,
    reverse: bool,
    y: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Run `step` over the sequence (backwards when `reverse`), writing each step's H into
    y[t] (zero where the step is past a sequence's end, whose state stays as it was); the
    final states."""
    seq = projection.shape[0]
    for t in range(seq - 1, -1, -1) if reverse else range(seq):
        new = step(projection[t], *states)
        if active is None:
            states = new
            y[t] = new[0]
            continue
        keep = active[t][:, None]
        states = tuple(np.where(keep, n, s) for n, s in zip(new, states, strict=True))
        y[t] = np.where(keep, new[0], 0)
    return states


def run_directions(
    layer: Layer,
    cells: Sequence[Step],
    biases: Sequence[np.ndarray],
    initial: Sequence[np.ndarray],
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every direction's scan, `cells[d]` after the input projection plus `biases[d]`
    from `initial` states (each (directions, batch, hidden)): Y (seq, directions, batch,
    hidden) and the final states, those of an empty sequence zero (as onnxruntime has
    them), not the initial ones."""
    seq, batch = layer.x.shape[:2]
    y = np.zeros((seq, len(cells), batch, layer.hidden), layer.x.dtype)
    finals: list[list[np.ndarray]] = [[] for _ in initial]
    for d, cell in enumerate(cells):
        projection = _projection(layer, d, biases[d])
        states = tuple(state[d] for state in initial)
        ends = _scan(cell, projection, states, layer.active, layer.reverse[d], y[:, d])
        for k, end in enumerate(ends):
            finals[k].append(end)
    stacked = [np.stack(ends) for ends in finals]
    if layer.active is not None and seq:
        empty = ~layer.active.any(axis=0)
        for final in stacked:
            final[:, empty] = 0
    return y, stacked


def outputs(layer: Layer, y: np.ndarray, states: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Y, Y_h (and Y_c) in the layer's layout and dtype."""
    if layer.layout:
        y = y.transpose(2, 0, 1, 3)
        states = [state.swapaxes(0, 1) for state in states]
    return tuple(np.ascontiguousarray(a, dtype=layer.dtype) for a in (y, *states))
