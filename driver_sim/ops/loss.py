"""Losses of the NeuronCore: NegativeLogLikelihoodLoss (POOL: a gather and a reduction)
and SoftmaxCrossEntropyLoss (ACT: a log-softmax, then the same). float16 is computed in
float32 and rounded back once at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.activation import log_softmax
from driver_sim.ops.registry import (
    FLOATS,
    INDICES,
    Attr,
    check_dtypes,
    choice_attr,
    compute_dtype,
    int_attr,
    kernel,
)

_LOSS_ATTRS = {
    "ignore_index": Attr(int_attr, None),
    "reduction": Attr(choice_attr("none", "sum", "mean"), "mean"),
}


def _loss_check(dtypes: Sequence[np.dtype], values: Mapping[str, Any]) -> None:
    check_dtypes(dtypes, (FLOATS, INDICES, FLOATS), same=(0, 2))


def _negative_log_likelihood(
    log_prob: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None,
    ignore_index: int | None,
    reduction: str,
) -> np.ndarray:
    """loss[n, d...] = -log_prob[n, target[n, d...], d...] * weight[target] (0 where
    target is ignore_index), summed, averaged by the weights' sum, or as it is."""
    if log_prob.ndim < 2 or target.shape != (log_prob.shape[0], *log_prob.shape[2:]):
        raise ValueError(f"target {target.shape} does not fit input {log_prob.shape}")
    classes = log_prob.shape[1]
    kept = np.ones(target.shape, dtype=bool) if ignore_index is None else target != ignore_index
    index = np.where(kept, target, 0)
    if np.any((index < 0) | (index >= classes)):
        raise ValueError(f"a target is out of range for {classes} classes")
    picked = np.take_along_axis(log_prob, index[:, None], axis=1)[:, 0]
    scale = np.ones(target.shape, dtype=log_prob.dtype) if weight is None else weight[index]
    scale = np.where(kept, scale, 0).astype(log_prob.dtype)
    loss = np.negative(picked) * scale
    if reduction == "sum":
        return np.asarray(np.sum(loss))
    if reduction == "mean":
        return np.asarray(np.sum(loss) / np.sum(scale))
    return loss


@kernel(
    "NegativeLogLikelihoodLoss",
    Engine.POOL,
    inputs=(2, 3),
    attrs=_LOSS_ATTRS,
    since=(12, 13, 22),
    check=_loss_check,
)
def _nll_loss(
    x: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    *,
    ignore_index: int | None,
    reduction: str,
) -> np.ndarray:
    """The negative log-likelihood of input (N, C, d...) (log-probabilities) at the
    target classes (N, d...), weighted per class; mean: sum / sum of the weights used."""
    dtype = compute_dtype(x.dtype)
    loss = _negative_log_likelihood(
        np.asarray(x, dtype=dtype),
        np.asarray(target),
        None if weight is None else np.asarray(weight, dtype=dtype),
        ignore_index,
        reduction,
    )
    return loss.astype(x.dtype)


@kernel(
    "SoftmaxCrossEntropyLoss",
    Engine.ACT,
    inputs=(2, 3),
    outputs=(1, 2),
    attrs=_LOSS_ATTRS,
    since=(12, 13),
    check=_loss_check,
)
def _softmax_cross_entropy_loss(
    scores: np.ndarray,
    labels: np.ndarray,
    weight: np.ndarray | None = None,
    *,
    ignore_index: int | None,
    reduction: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(loss, log_prob): log_prob = LogSoftmax(scores) over the classes (axis 1), then
    the negative log-likelihood loss of it at the labels."""
    dtype = compute_dtype(scores.dtype)
    if scores.ndim < 2:
        raise ValueError(f"scores need rank >= 2, got shape {scores.shape}")
    log_prob = log_softmax(np.asarray(scores, dtype=dtype), axis=1)
    loss = _negative_log_likelihood(
        log_prob,
        np.asarray(labels),
        None if weight is None else np.asarray(weight, dtype=dtype),
        ignore_index,
        reduction,
    )
    return loss.astype(scores.dtype), log_prob.astype(scores.dtype, copy=False)
