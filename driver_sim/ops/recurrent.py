"""Recurrent layers of the NeuronCore: LSTM, GRU and RNN (ONNX versions 7, 14 and 22),
a whole sequence in one instruction.

The PE engine does the products: the input projection X·W^T of every step at once (one
GEMM over seq x batch rows, with both biases folded in where the equations allow), then
per step only the recurrent projection H·R^T, which has to wait for the step before. The
gates' activations (ACT) and their elementwise combination (POOL) are the instruction's
side work, counted on those engines (`_side_work`).

What the spec leaves to the runtime is done as onnxruntime does it, so that the fast
engine (an onnxruntime session) gives the same numbers: past a sequence's length
(`sequence_lens`) its outputs are zero and its state stays as it was, so Y_h and Y_c are
the state at its last valid step (zero for an empty sequence) and the reverse direction
starts at that step; `clip` bounds every gate's input to its activation (not the cell
state fed to `h`); the `activation_alpha`/`activation_beta` values are taken in order by
the activations that use one, the others falling back to a default (`_Function`).
`hidden_size` may be left out (R's shape says it). float16 is computed in float32 and
rounded back once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops import sequence
from driver_sim.ops.registry import (
    FLOATS,
    Attr,
    Shape,
    as_compute,
    choice_attr,
    dtype_set,
    flag_attr,
    float_attr,
    floats_attr,
    kernel,
    positive_attr,
    str_attr,
)

Activation = Callable[[np.ndarray], np.ndarray]  # applied in place, returns its input

# ---- activations -----------------------------------------------------------------------


def _sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    # 1/(1+e^-x) as 0.5*tanh(x/2)+0.5: no exp to overflow for large |x|
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


def _elu(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    negative = np.expm1(np.minimum(x, 0))
    negative *= alpha
    np.copyto(x, negative, where=x < 0)
    return x


@dataclass(frozen=True)
class _Function:
    """An activation the recurrent ops name, with the defaults for the alpha and beta it
    takes (None: it takes none): its ONNX operator's for LeakyRelu, HardSigmoid and Elu;
    0 for the others, as onnxruntime has them (Affine and ScaledTanh are operators no
    more, and ThresholdedRelu's 1.0 is not what onnxruntime takes)."""

    compute: Callable[[np.ndarray, float, float], np.ndarray]
    alpha: float | None = None
    beta: float | None = None


_FUNCTIONS: dict[str, _Function] = {
    "Relu": _Function(lambda x, a, b: np.maximum(x, 0, out=x)),
    "Tanh": _Function(lambda x, a, b: np.tanh(x, out=x)),
    "Sigmoid": _Function(_sigmoid),
    "Affine": _Function(lambda x, a, b: np.add(np.multiply(x, a, out=x), b, out=x), 0.0, 0.0),
    "LeakyRelu": _Function(lambda x, a, b: np.multiply(x, a, out=x, where=x < 0), 0.01),
    "ThresholdedRelu": _Function(lambda x, a, b: np.multiply(x, x >= a, out=x), 0.0),
    "ScaledTanh": _Function(
        lambda x, a, b: np.multiply(np.tanh(np.multiply(x, b, out=x), out=x), a, out=x), 0.0, 0.0
    ),
    "HardSigmoid": _Function(
        lambda x, a, b: np.clip(np.add(np.multiply(x, a, out=x), b, out=x), 0, 1, out=x),
        0.2,
        0.5,
    ),
    "Elu": _Function(_elu, 1.0),
    "Softsign": _Function(lambda x, a, b: np.divide(x, np.abs(x) + 1, out=x)),
    "Softplus": _Function(lambda x, a, b: np.logaddexp(x, 0, out=x)),
}
# Names are taken whatever their case, as onnxruntime's LSTM and GRU take them.
_BY_LOWER = {name.lower(): name for name in _FUNCTIONS}


def _names_attr(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of activation names, got {value!r}")
    names = []
    for item in value:
        name = _BY_LOWER.get(str_attr(item).lower())
        if name is None:
            raise ValueError(f"{item!r} is not one of {', '.join(_FUNCTIONS)}")
        names.append(name)
    return tuple(names)


def _clip_attr(value: Any) -> float:
    threshold = float_attr(value)
    if not threshold > 0:
        raise ValueError(f"must be positive, got {threshold}")
    return threshold


@dataclass(frozen=True)
class _Op:
    """What differs between LSTM, GRU and RNN: gates per weight row block and default
    activations (one direction's)."""

    name: str
    gates: int
    defaults: tuple[str, ...]


_LSTM = _Op("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"))  # f, g, h; gates i, o, f, c
_GRU = _Op("GRU", 3, ("Sigmoid", "Tanh"))  # f, g; gates z, r, h
_RNN = _Op("RNN", 1, ("Tanh",))  # f


def _activations(op: _Op, values: Mapping[str, Any]) -> list[list[Activation]]:
    """Per direction, its activations with their alpha and beta bound; ValueError for a
    list of the wrong length."""
    per = len(op.defaults)
    directions = 2 if values["direction"] == "bidirectional" else 1
    names = values["activations"] or op.defaults * directions
    if len(names) != per * directions:
        raise ValueError(
            f"{op.name} takes {per} activations per direction ({per * directions} in all), "
            f"got {len(names)}"
        )
    alphas, betas = list(values["activation_alpha"]), list(values["activation_beta"])
    bound: list[Activation] = []
    for name in names:
        function = _FUNCTIONS[name]
        alpha = alphas.pop(0) if function.alpha is not None and alphas else function.alpha
        beta = betas.pop(0) if function.beta is not None and betas else function.beta
        bound.append(_bind(function, alpha or 0.0, beta or 0.0))
    return [bound[d * per : (d + 1) * per] for d in range(directions)]


def _bind(function: _Function, alpha: float, beta: float) -> Activation:
    return lambda x: function.compute(x, alpha, beta)


def _clipper(clip: float | None) -> Activation:
    if clip is None:
        return lambda x: x
    return lambda x: np.clip(x, -clip, clip, out=x)


# ---- the cells: one step of each op ------------------------------------------------------


def _lstm_cell(
    r: np.ndarray,
    peephole: np.ndarray | None,
    activations: Sequence[Activation],
    clip: Activation,
    input_forget: int,
) -> sequence.Step:
    """i, o, f, c gates (rows of R in that order); `peephole` is P[iof] as (3, hidden)."""
    act_f, act_g, act_h = activations
    hidden = r.shape[-1]
    r_t = r.T

    def step(xp: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
        gates = h @ r_t
        gates += xp
        i, o = gates[:, :hidden], gates[:, hidden : 2 * hidden]
        f, cell = gates[:, 2 * hidden : 3 * hidden], gates[:, 3 * hidden :]
        if peephole is not None:
            i += peephole[0] * c
            f += peephole[2] * c
        act_f(clip(i))
        if input_forget:  # the forget gate coupled to the input gate
            np.subtract(1, i, out=f)
        else:
            act_f(clip(f))
        act_g(clip(cell))
        c_new = f * c
        c_new += i * cell
        if peephole is not None:
            o += peephole[1] * c_new
        act_f(clip(o))
        h_new = act_h(c_new.copy())
        h_new *= o
        return h_new, c_new

    return step


def _gru_cell(
    r: np.ndarray,
    reset_bias: np.ndarray,
    activations: Sequence[Activation],
    clip: Activation,
    linear_before_reset: int,
) -> sequence.Step:
    """z, r, h gates. Before the reset gate applies, the candidate's recurrent product is
    either taken of the reset state (two products a step) or of the state itself, with
    its bias `reset_bias` (one product of all three gates)."""
    act_f, act_g = activations
    hidden = r.shape[-1]
    r_all, r_zr, r_h = r.T, r[: 2 * hidden].T, r[2 * hidden :].T

    def step(xp: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, ...]:
        if linear_before_reset:
            product = h @ r_all
            zr, candidate = product[:, : 2 * hidden], product[:, 2 * hidden :]
            zr += xp[:, : 2 * hidden]
            act_f(clip(zr))
            candidate += reset_bias
            candidate *= zr[:, hidden:]
        else:
            zr = h @ r_zr
            zr += xp[:, : 2 * hidden]
            act_f(clip(zr))
            candidate = (zr[:, hidden:] * h) @ r_h
        candidate += xp[:, 2 * hidden :]
        act_g(clip(candidate))
        h_new = h - candidate  # (1 - z) * candidate + z * h, in one temporary
        h_new *= zr[:, :hidden]
        h_new += candidate
        return (h_new,)

    return step


def _rnn_cell(r: np.ndarray, activations: Sequence[Activation], clip: Activation) -> sequence.Step:
    (act_f,) = activations
    r_t = r.T

    def step(xp: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, ...]:
        pre = h @ r_t
        pre += xp
        return (act_f(clip(pre)),)

    return step


# ---- the kernels -------------------------------------------------------------------------


def _macs(inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]) -> int:
    """Every step's input and recurrent projections, in each direction: seq x batch rows
    times W (directions, gates*hidden, input) and R (..., hidden)."""
    x, w, r = inputs[0], inputs[1], inputs[2]
    return x[0] * x[1] * w[0] * w[1] * (w[2] + r[2])


# Per step and direction: (PE products, ACT instructions, ACT elements per hidden unit and
# batch row, POOL instructions, POOL elements per hidden unit and batch row). LSTM: f on
# i|f and on o, g on c, h on C; C and H combined. GRU: f on z|r, g on the candidate; the
# reset product and the blend. RNN: f.
_PER_STEP: dict[str, tuple[int, int, int, int, int]] = {
    "LSTM": (1, 4, 5, 2, 2),
    "GRU": (1, 2, 3, 2, 2),
    "GRU/reset first": (2, 2, 3, 2, 2),  # linear_before_reset 0: two products a step
    "RNN": (1, 1, 1, 0, 0),
}


def _side_work(op: str) -> Callable[..., dict[Engine, tuple[int, int]]]:
    """The instructions and written elements the op runs per engine besides its own one
    (the input projection on PE): per step and direction, the recurrent product on PE,
    the activations on ACT and their combination on POOL."""

    def work(
        inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
    ) -> dict[Engine, tuple[int, int]]:
        x, w, r = inputs[0], inputs[1], inputs[2]
        key = "GRU/reset first" if op == "GRU" and not attrs["linear_before_reset"] else op
        pe, act, act_elements, pool, pool_elements = _PER_STEP[key]
        seq, batch = (x[1], x[0]) if attrs["layout"] else (x[0], x[1])
        steps, units = seq * w[0], batch * r[2]
        return {
            Engine.PE: (pe * steps, 0),
            Engine.ACT: (act * steps, act_elements * steps * units),
            Engine.POOL: (pool * steps, pool_elements * steps * units),
        }

    return work


def _check(op: _Op) -> Callable[[Sequence[np.dtype], Mapping[str, Any]], None]:
    """Floats of one dtype (and int32 sequence_lens); the activations fit the direction."""

    def check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
        floats = {np.dtype(d) for d in dtypes if np.dtype(d) in FLOATS}
        others = {np.dtype(d) for d in dtypes if np.dtype(d) not in FLOATS}
        if dtypes and np.dtype(dtypes[0]) not in FLOATS:
            raise ValueError(f"X has dtype {dtypes[0]}, which the kernel does not implement")
        if len(floats) > 1:
            raise ValueError(f"inputs must share one dtype, got {', '.join(map(str, floats))}")
        if others - _LENGTHS:
            bad = ", ".join(sorted(map(str, others - _LENGTHS)))
            raise ValueError(f"an input has dtype {bad}, which the kernel does not implement")
        _activations(op, values)

    return check


_LENGTHS = dtype_set("int32")  # sequence_lens, as the spec types it
_ATTRS = {
    "activation_alpha": Attr(floats_attr, ()),
    "activation_beta": Attr(floats_attr, ()),
    "activations": Attr(_names_attr, ()),
    "clip": Attr(_clip_attr, None),
    "direction": Attr(choice_attr("forward", "reverse", "bidirectional"), "forward"),
    "hidden_size": Attr(positive_attr, None),
    "layout": Attr(flag_attr, 0),  # versions 14 and 22
}
_VERSIONS = (7, 14, 22)


@kernel(
    "LSTM",
    Engine.PE,
    inputs=(3, 8),
    outputs=(0, 3),
    attrs={**_ATTRS, "input_forget": Attr(flag_attr, 0)},
    macs=_macs,
    side_work=_side_work("LSTM"),
    since=_VERSIONS,
    check=_check(_LSTM),
)
def _lstm(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    p: np.ndarray | None = None,
    **values: Any,
) -> tuple[np.ndarray, ...]:
    """(Y, Y_h, Y_c) of a one-layer LSTM (f=Sigmoid, g=Tanh, h=Tanh by default):
    i = f(Xt·Wi^T + H·Ri^T + Pi*C + Wbi + Rbi), f likewise, c = g(Xt·Wc^T + H·Rc^T + Wbc
    + Rbc), C' = f*C + i*c, o = f(Xt·Wo^T + H·Ro^T + Po*C' + Wbo + Rbo), H' = o*h(C')."""
    layer = sequence.layer_of(_LSTM.gates, x, w, r, b, sequence_lens, values)
    directions = layer.directions
    peepholes: list[np.ndarray | None] = [None] * directions
    if p is not None:
        if p.shape != (directions, 3 * layer.hidden):
            raise ValueError(f"P must be {(directions, 3 * layer.hidden)}, got {p.shape}")
        peepholes = list(as_compute(p, layer.x.dtype).reshape(directions, 3, layer.hidden))
    activations, clip = _activations(_LSTM, values), _clipper(values["clip"])
    cells = [
        _lstm_cell(layer.r[d], peepholes[d], activations[d], clip, values["input_forget"])
        for d in range(directions)
    ]
    biases = [layer.bias[d].sum(axis=0) for d in range(directions)]
    initial = [
        sequence.initial_state(layer, initial_h, "initial_h"),
        sequence.initial_state(layer, initial_c, "initial_c"),
    ]
    y, states = sequence.run_directions(layer, cells, biases, initial)
    return sequence.outputs(layer, y, states)


@kernel(
    "GRU",
    Engine.PE,
    inputs=(3, 6),
    outputs=(0, 2),
    attrs={**_ATTRS, "linear_before_reset": Attr(flag_attr, 0)},
    macs=_macs,
    side_work=_side_work("GRU"),
    since=_VERSIONS,
    check=_check(_GRU),
)
def _gru(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    **values: Any,
) -> tuple[np.ndarray, ...]:
    """(Y, Y_h) of a one-layer GRU (f=Sigmoid, g=Tanh by default): z = f(Xt·Wz^T + H·Rz^T
    + Wbz + Rbz), r likewise, h = g(Xt·Wh^T + (r*H)·Rh^T + Rbh + Wbh), or with
    linear_before_reset g(Xt·Wh^T + r*(H·Rh^T + Rbh) + Wbh); H' = (1-z)*h + z*H."""
    layer = sequence.layer_of(_GRU.gates, x, w, r, b, sequence_lens, values)
    directions, hidden = layer.directions, layer.hidden
    linear = values["linear_before_reset"]
    activations, clip = _activations(_GRU, values), _clipper(values["clip"])
    biases, cells = [], []
    for d in range(directions):
        input_bias, recurrent_bias = layer.bias[d]
        folded = recurrent_bias.copy()
        if linear:  # Rbh is added before the reset gate multiplies: not foldable
            folded[2 * hidden :] = 0
        biases.append(input_bias + folded)
        reset_bias = recurrent_bias[2 * hidden :]
        cells.append(_gru_cell(layer.r[d], reset_bias, activations[d], clip, linear))
    initial = [sequence.initial_state(layer, initial_h, "initial_h")]
    y, states = sequence.run_directions(layer, cells, biases, initial)
    return sequence.outputs(layer, y, states)


@kernel(
    "RNN",
    Engine.PE,
    inputs=(3, 6),
    outputs=(0, 2),
    attrs=_ATTRS,
    macs=_macs,
    side_work=_side_work("RNN"),
    since=_VERSIONS,
    check=_check(_RNN),
)
def _rnn(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    **values: Any,
) -> tuple[np.ndarray, ...]:
    """(Y, Y_h) of a one-layer simple RNN: H' = f(Xt·Wi^T + H·Ri^T + Wbi + Rbi), f=Tanh by
    default."""
    layer = sequence.layer_of(_RNN.gates, x, w, r, b, sequence_lens, values)
    directions = layer.directions
    activations, clip = _activations(_RNN, values), _clipper(values["clip"])
    cells = [_rnn_cell(layer.r[d], activations[d], clip) for d in range(directions)]
    biases = [layer.bias[d].sum(axis=0) for d in range(directions)]
    initial = [sequence.initial_state(layer, initial_h, "initial_h")]
    y, states = sequence.run_directions(layer, cells, biases, initial)
    return sequence.outputs(layer, y, states)
