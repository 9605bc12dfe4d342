"""Attention of the NeuronCore: scaled dot-product Attention (versions 23-25: masks,
causal and sliding-window masking, grouped-query heads, a key/value cache, soft capping)
with its products on PE, computed in Q's precision (softmax too, unless softmax_precision
says otherwise) as the op's function body is; LinearAttention (PE: the recurrent linear,
gated and delta rules, in float32); and RotaryEmbedding (ACT), whose float16 is computed
in float32 and rounded back once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    BOOL,
    FLOATS,
    INDICES,
    Attr,
    Shape,
    check_dtypes,
    choice_attr,
    compute_dtype,
    dtype_check,
    flag_attr,
    float_attr,
    int_attr,
    int_values,
    kernel,
)

# softmax_precision: the ONNX element types a softmax may be computed in (0: Q's own)
_SOFTMAX_PRECISIONS = {
    0: None,
    1: np.dtype("float32"),
    10: np.dtype("float16"),
    11: np.dtype("float64"),
}


def _precision_attr(value: Any) -> int:
    code = int_attr(value)
    if code not in _SOFTMAX_PRECISIONS:
        raise ValueError(f"softmax precision {code} is not implemented")
    return code


def _mode_attr(value: Any) -> int:
    mode = int_attr(value)
    if not 0 <= mode <= 3:
        raise ValueError(f"must be 0..3, got {mode}")
    return mode


def _window_attr(value: Any) -> int:
    size = int_attr(value)
    if size < -1:
        raise ValueError(f"must be -1 or more, got {size}")
    return size


def _attention_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    """Q, K, V (and the caches) float, attn_mask float or bool, nonpad_kv_seqlen (the
    last present input when given) an integer; the absent inputs are not in `dtypes`."""
    check_dtypes(dtypes[:3], (FLOATS,), same=(0, 1))
    for index, dtype in enumerate(dtypes[3:], start=3):
        last = index == len(dtypes) - 1
        if dtype not in (FLOATS | BOOL | (INDICES if last else frozenset())):
            raise ValueError(
                f"input {index} has dtype {dtype}, which the kernel does not implement"
            )


def _attention_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """Q K^T and P V: (Q elements + Y elements) * total key length."""
    key = inputs[1]
    length = key[-2] if len(key) == 4 else key[1]
    if len(inputs) > 4 and len(inputs[4]) == 4:
        length += inputs[4][2]
    return (math.prod(inputs[0]) + math.prod(outputs[0])) * length


def _heads(x: np.ndarray, count: int, what: str) -> np.ndarray:
    """(B, S, H * D) as (B, H, S, D)."""
    if count < 1 or x.shape[2] % count:
        raise ValueError(f"{what} of shape {x.shape} does not split into {count} heads")
    return x.reshape(x.shape[0], x.shape[1], count, -1).transpose(0, 2, 1, 3)


def _window_bias(
    q_len: int, kv_len: int, offset: np.ndarray, causal: int, left: int, right: int
) -> np.ndarray:
    """The allowed (True) query/key pairs, (batch or 1, 1, q, kv): query i (at absolute
    position i + offset) sees key j iff j <= i + offset (causal) and within the window."""
    position = np.arange(q_len).reshape(1, 1, -1, 1) + offset.reshape(-1, 1, 1, 1)
    distance = position - np.arange(kv_len).reshape(1, 1, 1, -1)  # query minus key
    allowed = np.ones(distance.shape, dtype=bool)
    if causal:
        allowed &= distance >= 0
    if left >= 0:
        allowed &= distance <= left
    if right >= 0:
        allowed &= -distance <= right
    return allowed


@kernel(
    "Attention",
    Engine.PE,
    inputs=(3, 7),
    outputs=(1, 4),
    attrs={
        "is_causal": Attr(flag_attr, 0),
        "kv_num_heads": Attr(int_attr, 0),
        "q_num_heads": Attr(int_attr, 0),
        "qk_matmul_output_mode": Attr(_mode_attr, 0),
        "scale": Attr(float_attr, None),
        "softcap": Attr(float_attr, 0.0),
        "softmax_precision": Attr(_precision_attr, 0),
        "left_window_size": Attr(_window_attr, -1),  # version 25
        "right_window_size": Attr(_window_attr, -1),  # version 25
    },
    macs=_attention_macs,
    since=(23, 24, 25),
    check=_attention_check,
)
def _attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    nonpad_kv_seqlen: np.ndarray | None = None,
    *,
    is_causal: int,
    kv_num_heads: int,
    q_num_heads: int,
    qk_matmul_output_mode: int,
    scale: float | None,
    softcap: float,
    softmax_precision: int,
    left_window_size: int,
    right_window_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Y, present_key, present_value, qk_matmul_output): Y = softmax(Q K^T * scale
    (soft-capped) + bias) V per head, the bias from attn_mask (additive, or boolean:
    True attends), causal and window masks (offset by the cached keys) and the padding
    of nonpad_kv_seqlen; a query row with every key masked gives 0. 3-D inputs
    (B, S, heads * size) take their head counts from q_num_heads and kv_num_heads; each
    K/V head serves q_heads / kv_heads query heads in turn. qk_matmul_output is by
    qk_matmul_output_mode the scaled product (0), soft-capped (1), with the bias (2),
    or the softmax (3)."""
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value come together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise ValueError("nonpad_kv_seqlen cannot be used with a past cache")
    rank = q.ndim
    if not rank == k.ndim == v.ndim or rank not in (3, 4):
        raise ValueError(f"Q, K, V must all be 3-D or 4-D, got {q.shape}, {k.shape}, {v.shape}")
    dtype = q.dtype
    if rank == 3:
        q4 = _heads(q, q_num_heads, "Q")
        k4, v4 = _heads(k, kv_num_heads, "K"), _heads(v, kv_num_heads, "V")
    else:
        q4, k4, v4 = q, k, v
    if past_key is not None and past_value is not None:
        k4 = np.concatenate((past_key, k4.astype(past_key.dtype, copy=False)), axis=2)
        v4 = np.concatenate((past_value, v4.astype(past_value.dtype, copy=False)), axis=2)
    present_key, present_value = k4, v4
    batch, heads, q_len, head_size = q4.shape
    kv_heads, kv_len = k4.shape[1], k4.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} key/value heads")
    factor = math.sqrt(1 / math.sqrt(head_size) if scale is None else scale)
    root = np.asarray(factor, dtype=q.dtype)  # rounded to Q's dtype, as the function body
    qs = np.multiply(_as(q4, dtype), root.astype(dtype))
    ks = np.multiply(_as(k4, dtype), root.astype(dtype))
    group = heads // kv_heads
    qs = qs.reshape(batch, kv_heads, group, q_len, head_size)
    scores = np.matmul(qs, np.swapaxes(ks, -1, -2)[:, :, None])  # (B, Hkv, G, q, kv)
    scores = scores.reshape(batch, heads, q_len, kv_len)
    qk_output = scores  # mode 0: the product itself
    if softcap > 0:
        scores = np.tanh(scores / softcap) * softcap
    if qk_matmul_output_mode == 1:
        qk_output = scores

    bias = np.zeros((1, 1, q_len, kv_len), dtype=dtype)
    if attn_mask is not None:
        mask = attn_mask
        if mask.shape[-1] < kv_len:  # a short mask: the missing keys are masked
            fill: Any = False if mask.dtype == bool else -np.inf
            widths = [(0, 0)] * (mask.ndim - 1) + [(0, kv_len - mask.shape[-1])]
            mask = np.pad(mask, widths, constant_values=fill)
        if mask.dtype == bool:
            mask = np.where(mask, 0.0, -np.inf)
        bias = bias + _as(mask, dtype)
    if nonpad_kv_seqlen is not None:
        lengths = np.asarray(int_values(nonpad_kv_seqlen, "nonpad_kv_seqlen")).reshape(-1)
        offset = lengths - q_len
    else:
        offset = np.array([0 if past_key is None else past_key.shape[2]])
    if is_causal or left_window_size >= 0 or right_window_size >= 0:
        allowed = _window_bias(
            q_len, kv_len, offset, is_causal, left_window_size, right_window_size
        )
        bias = bias + np.where(allowed, 0.0, -np.inf).astype(dtype)
    if nonpad_kv_seqlen is not None:
        padded = np.arange(kv_len) >= lengths.reshape(-1, 1, 1, 1)
        bias = bias + np.where(padded, -np.inf, 0.0).astype(dtype)
    logits = scores + bias
    if qk_matmul_output_mode == 2:
        qk_output = logits
    precision = _SOFTMAX_PRECISIONS[softmax_precision]
    probs = _masked_softmax(logits.astype(precision or dtype, copy=False))
    probs[np.broadcast_to(np.isneginf(bias.max(axis=-1, keepdims=True)), probs.shape)] = 0
    probs = probs.astype(q.dtype).astype(dtype, copy=False)
    if qk_matmul_output_mode == 3:
        qk_output = probs
    values = _as(v4, dtype).reshape(batch, kv_heads, 1, kv_len, -1)
    y = np.matmul(probs.reshape(batch, kv_heads, group, q_len, kv_len), values)
    y = y.reshape(batch, heads, q_len, -1)
    if rank == 3:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, -1)
    qk_output = np.broadcast_to(qk_output, (batch, heads, q_len, kv_len))
    return (
        y.astype(q.dtype, copy=False),
        present_key,
        present_value,
        np.array(qk_output, dtype=q.dtype),
    )


def _as(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`x` in `dtype` (no copy when it already is)."""
    return np.asarray(x, dtype=dtype)


def _masked_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row of -inf only gives zeros (not NaN)."""
    peak = np.max(x, axis=-1, keepdims=True)
    peak = np.where(np.isneginf(peak), 0, peak)
    y = np.exp(x - peak)
    total = np.sum(y, axis=-1, keepdims=True)
    total[total == 0] = 1
    y /= total
    return y


@kernel(
    "RotaryEmbedding",
    Engine.ACT,
    inputs=(3, 4),
    attrs={
        "interleaved": Attr(flag_attr, 0),
        "num_heads": Attr(int_attr, 0),
        "rotary_embedding_dim": Attr(int_attr, 0),
    },
    since=(23,),
    check=lambda dtypes, values: check_dtypes(
        dtypes, (FLOATS, FLOATS, FLOATS, INDICES), same=(0, 1, 2)
    ),
)
def _rotary_embedding(
    x: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    position_ids: np.ndarray | None = None,
    *,
    interleaved: int,
    num_heads: int,
    rotary_embedding_dim: int,
) -> np.ndarray:
    """The first rotary_embedding_dim (default: all) features of each head rotated in
    pairs (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2): the pairs are the two halves,
    or (interleaved) neighbours. X is (B, H, S, D), or (B, S, H * D) with num_heads;
    the caches are (B, S, dim / 2), or (positions, dim / 2) read at position_ids."""
    dtype = compute_dtype(x.dtype)
    if x.ndim == 4:
        heads = np.asarray(x, dtype=dtype).transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif x.ndim == 3:
        heads = np.asarray(x, dtype=dtype).reshape(x.shape[0], x.shape[1], num_heads, -1)
    else:
        raise ValueError(f"X must be 3-D or 4-D, got shape {x.shape}")
    dim = rotary_embedding_dim or heads.shape[3]
    cos, sin = np.asarray(cos_cache, dtype=dtype), np.asarray(sin_cache, dtype=dtype)
    if position_ids is not None:
        index = np.asarray(position_ids)
        cos, sin = cos[index], sin[index]
    if cos.shape[-1] != dim // 2 or sin.shape[-1] != dim // 2:
        raise ValueError(f"the caches' last dimension must be {dim // 2}, got {cos.shape[-1]}")
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    y = heads.copy()
    if interleaved:
        first, second = heads[..., 0:dim:2], heads[..., 1:dim:2]
        y[..., 0:dim:2] = cos * first - sin * second
        y[..., 1:dim:2] = sin * first + cos * second
    else:
        half = dim // 2
        first, second = heads[..., :half], heads[..., half:dim]
        y[..., :half] = cos * first - sin * second
        y[..., half:dim] = sin * first + cos * second
    y = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)
    return y.astype(x.dtype, copy=False)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_attention_macs(
    inputs: Sequence[Shape], outputs: Sequence[Shape], attrs: Mapping[str, Any]
) -> int:
    """Per token: the state update (an outer product per K/V head; the delta rules also
    read the state with the key) and each query head's read of the state."""
    query, value = inputs[0], inputs[2]
    q_heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
    batch, steps = query[0], query[1]
    d_k, d_v = query[2] // max(q_heads, 1), value[2] // max(kv_heads, 1)
    updates = 2 if "delta" in attrs["update_rule"] else 1
    return batch * steps * d_k * d_v * (updates * kv_heads + q_heads)


def _heads_attr(value: Any) -> int:
    count = int_attr(value)
    if count < 1:
        raise ValueError(f"must be positive, got {count}")
    return count


@kernel(
    "LinearAttention",
    Engine.PE,
    inputs=(3, 6),
    outputs=(1, 2),
    attrs={
        "chunk_size": Attr(int_attr, 64),  # a tuning hint of chunked implementations
        "kv_num_heads": Attr(_heads_attr),
        "q_num_heads": Attr(_heads_attr),
        "scale": Attr(float_attr, 0.0),
        "update_rule": Attr(choice_attr(*_UPDATE_RULES), "gated_delta"),
    },
    macs=_linear_attention_macs,
    since=(27,),
    check=dtype_check(FLOATS),
)
def _linear_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    past_state: np.ndarray | None = None,
    decay: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    *,
    chunk_size: int,
    kv_num_heads: int,
    q_num_heads: int,
    scale: float,
    update_rule: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(output, present_state): the recurrence over the tokens of (B, T, heads * size)
    inputs, per K/V head a state S (d_k, d_v) from past_state (default 0): S = exp(g) S
    (gated rules; g from decay, per head or per key feature), then S += k (x) v, or
    with the delta rules S += beta k (x) (v - S^T k); each query head reads its K/V
    head's state, o = scale q^T S (scale 0: 1 / sqrt(d_k)). Computed in float32."""
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ValueError(f"update_rule {update_rule} takes decay: {gated}, beta: {delta}")
    if q_num_heads % kv_num_heads:
        raise ValueError(f"{q_num_heads} query heads do not share {kv_num_heads} K/V heads")
    f32 = np.dtype(np.float32)
    q = _heads(_as(query, f32), q_num_heads, "query")  # (B, Hq, T, d_k)
    k = _heads(_as(key, f32), kv_num_heads, "key")
    v = _heads(_as(value, f32), kv_num_heads, "value")
    batch, _, steps, d_k = q.shape
    d_v = v.shape[3]
    shape = (batch, kv_num_heads, d_k, d_v)
    if past_state is not None and past_state.shape != shape:
        raise ValueError(f"past_state of shape {past_state.shape}, expected {shape}")
    state = np.zeros(shape, f32) if past_state is None else _as(past_state, f32).copy()
    if decay is not None:  # (B, Hkv, T, 1 or d_k)
        decay = _heads(_as(decay, f32), kv_num_heads, "decay")
    if beta is not None:  # (B, 1 or Hkv, T, 1)
        beta = _as(beta, f32).transpose(0, 2, 1)[..., None]
    factor = np.float32(scale or 1 / math.sqrt(d_k))
    group = q_num_heads // kv_num_heads
    reads = q.reshape(batch, kv_num_heads, group, steps, d_k)
    out = np.empty((batch, kv_num_heads, group, steps, d_v), f32)
    for t in range(steps):
        if decay is not None:
            state *= np.exp(decay[:, :, t])[..., None]
        update = v[:, :, t]
        if beta is not None:
            retrieved = np.einsum("bhkv,bhk->bhv", state, k[:, :, t])
            update = beta[:, :, t] * (update - retrieved)
        state += k[:, :, t, :, None] * update[:, :, None, :]
        out[:, :, :, t] = np.einsum("bhgk,bhkv->bhgv", reads[:, :, :, t], state) * factor
    output = out.reshape(batch, q_num_heads, steps, d_v).transpose(0, 2, 1, 3)
    output = output.reshape(batch, steps, q_num_heads * d_v).astype(query.dtype)
    return output, state.astype(query.dtype if past_state is None else past_state.dtype)
