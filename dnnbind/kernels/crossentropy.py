"""Categorical cross-entropy per row, with the row's gradient, in one pass: what
``keras.ops.categorical_crossentropy`` and ``sparse_categorical_crossentropy`` return (one loss per
sample, no reduction).

:mod:`dnnbind.kernels.losses` computes the same rows and reduces them to the batch mean (a training
loss); these keep each row's loss and return the gradient of that row's own loss, unscaled:

* :func:`softmax_cross_entropy_rows` (``from_logits=True``): ``loss_i = -sum_c t_ic log softmax(z_i)_c``,
  ``dlogits_i = softmax(z_i) * sum_c t_ic - t_i``;
* :func:`crossentropy_from_probs_rows` (``from_logits=False``): each row divided by its sum, clipped to
  ``[1e-7, 1 - 1e-7]`` (Keras), ``loss_i = -sum_c t_ic log p_ic``; the gradient w.r.t. the unnormalised
  row includes the normalisation and is 0 where the clip is active.

Labels are class indices (int, ``(N,)``) or float rows ``(N, C)``. Losses have the predictions' dtype
(computed in float32 for float16/bfloat16, float64 for float64). A sparse label outside ``[0, C)``
raises on NumPy; on the device (which cannot raise) that row's loss and gradient are NaN.

CUDA: ``_cuda.crossentropy.<op>(pred, labels, stream=stream)``: ``losses.cu``'s row kernels (the ones
behind :mod:`dnnbind.kernels.losses`) with the row loss written to a float64 buffer, then cast.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dispatch import BFLOAT16, as_array, check_float, route, to_compute
from .losses import CLIP_EPSILON, _check_labels, _targets

__all__ = ["softmax_cross_entropy_rows", "crossentropy_from_probs_rows"]


def _rows(op: str, pred: Any, labels: Any, stream: Any, reference: Any) -> "tuple[Any, Any]":
    """Validate, route, or run ``reference(x, t) -> (losses, grad)`` on the compute-dtype predictions and
    the dense targets."""
    pred, labels = as_array(pred), as_array(labels)
    check_float(op, "pred", pred)
    if labels.dtype == BFLOAT16:  # float rows (kernels.losses' checks know NumPy's float kinds only)
        if tuple(labels.shape) != tuple(pred.shape):
            raise ValueError(f"{op}: float labels must have the predictions' shape {tuple(pred.shape)}, got "
                             f"{tuple(labels.shape)}")
        sparse = False
    else:
        sparse = _check_labels(op, pred, labels)
    impl = route(op, "crossentropy", pred=pred, labels=labels)
    if impl is not None:
        return getattr(impl, op)(pred, labels, stream=stream)
    x = to_compute(pred)
    n, c = x.shape
    loss, grad = reference(x, _targets(labels, sparse, n, c, 0.0, x.dtype))
    return loss.astype(pred.dtype), grad.astype(pred.dtype)


def _softmax_reference(x: np.ndarray, t: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    shifted = x - x.max(axis=1, keepdims=True) if x.shape[1] else x
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -(t * log_p).sum(axis=1), np.exp(log_p) * t.sum(axis=1, keepdims=True) - t


def _probs_reference(q: np.ndarray, t: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    total = q.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = q / total
    inside = (p > CLIP_EPSILON) & (p < 1 - CLIP_EPSILON)
    pc = np.clip(p, CLIP_EPSILON, 1 - CLIP_EPSILON)
    g = np.where(inside, -t / pc, 0.0)  # d loss / d p
    return -(t * np.log(pc)).sum(axis=1), (g - (g * p).sum(axis=1, keepdims=True)) / total  # through p = q / sum(q)


def softmax_cross_entropy_rows(logits: Any, labels: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """``(losses, dlogits)`` of the softmax cross-entropy of each row of ``logits`` ``(N, C)``.

    ``losses`` ``(N,)`` and ``dlogits`` ``(N, C)`` have ``logits``' dtype; ``dlogits`` is the gradient of
    each row's own loss (``softmax * sum(t) - t``).

    CUDA: ``_cuda.crossentropy.softmax_cross_entropy_rows(logits, labels, stream=stream)``.
    """
    return _rows("softmax_cross_entropy_rows", logits, labels, stream, _softmax_reference)


def crossentropy_from_probs_rows(probs: Any, labels: Any, *, stream: Any = None) -> "tuple[Any, Any]":
    """``(losses, dprobs)`` of the cross-entropy of each (renormalised, clipped) row of ``probs`` ``(N, C)``.

    CUDA: ``_cuda.crossentropy.crossentropy_from_probs_rows(probs, labels, stream=stream)``.
    """
    return _rows("crossentropy_from_probs_rows", probs, labels, stream, _probs_reference)
