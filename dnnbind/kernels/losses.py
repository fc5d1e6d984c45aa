"""Losses that return ``(loss, dpred)`` in one pass: the mean loss and its gradient.

Common rules:

* ``loss`` is a 0-d array, the mean over the batch (float32; float64 when the
  prediction is float64, so that float64 gradient checks stay exact).
* ``dpred`` has the prediction's shape and dtype and is already the gradient of
  that mean, multiplied by ``grad_scale`` (a number or a 0-d array; mixed-precision
  loss scaling). The loss itself is never scaled.
* Labels follow Keras: class indices (int, shape ``(N,)``) or one-hot /
  probability rows (float, shape ``(N, C)``). ``label_smoothing`` turns a target
  row ``y`` into ``y * (1 - ls) + ls / C`` (``ls / 2`` toward 0.5 for the binary loss).
* ``sample_weight`` (optional, shape ``(N,)`` or ``(N, 1)``, any real dtype, read as float32):
  one weight per sample that multiplies that sample's loss and its gradient rows. The reduction
  stays Keras 3's ``"sum_over_batch_size"``: ``loss = sum_i w_i l_i / N`` (divided by the batch
  size, *not* by the sum of the weights), where ``l_i`` is sample ``i``'s loss (for the
  element-wise losses, the mean over its elements). CUDA takes a DeviceArray of weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _validate
from ..backend import is_device_array
from ._dispatch import as_array, check_float, param_dtype, route, scalar, to_compute
from .elementwise import cast

__all__ = [
    "CLIP_EPSILON",
    "softmax_cross_entropy",
    "crossentropy_from_probs",
    "binary_crossentropy",
    "mean_squared_error",
]

#: Keras's backend epsilon: probabilities are clipped to ``[eps, 1 - eps]`` before the log.
CLIP_EPSILON = 1e-7


def _check_labels(op: str, pred: Any, labels: Any) -> bool:
    """Validate class labels against (N, C) predictions; True when they are sparse indices."""
    if pred.ndim != 2:
        raise ValueError(f"{op}: predictions must be 2-d (N, C), got shape {tuple(pred.shape)}")
    n, c = pred.shape
    if labels.dtype.kind in "iu":
        if tuple(labels.shape) not in ((n,), (n, 1)):
            raise ValueError(f"{op}: integer labels must have shape ({n},), got {tuple(labels.shape)}")
        return True
    if labels.dtype.kind != "f" and labels.dtype != _validate.BFLOAT16:
        raise TypeError(f"{op}: labels must be integer class indices or float rows, got dtype {labels.dtype}")
    if tuple(labels.shape) != (n, c):
        raise ValueError(
            f"{op}: float labels must have the predictions' shape ({n}, {c}), got {tuple(labels.shape)}; "
            "use integer labels of shape (N,) for class indices"
        )
    return False


def _check_smoothing(op: str, label_smoothing: Any) -> float:
    ls = float(label_smoothing)
    if not 0.0 <= ls <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    return ls


def _check_weights(op: str, pred: Any, sample_weight: Any) -> Any:
    """``sample_weight`` as ``(N,)`` float32 (on pred's device), or None; ValueError/TypeError otherwise."""
    if sample_weight is None:
        return None
    w = as_array(sample_weight)
    n = int(pred.shape[0]) if pred.ndim else 1
    if w.dtype.kind not in "fiub":
        raise TypeError(f"{op}: sample_weight must be numeric, got dtype {w.dtype}")
    if tuple(w.shape) not in ((n,), (n, 1)):
        raise ValueError(f"{op}: sample_weight must have shape ({n},) or ({n}, 1), one weight per sample of the "
                         f"predictions {tuple(pred.shape)}, got {tuple(w.shape)}")
    if tuple(w.shape) == (n, 1):
        w = w.reshape(n)
    if w.dtype != np.float32:
        w = cast(w, np.float32) if is_device_array(w) else w.astype(np.float32)
    return w


def _row_weights(w: "np.ndarray | None", shape: tuple, dtype: np.dtype) -> Any:
    """NumPy weights broadcastable against an array of ``shape`` (one per leading index), or 1."""
    if w is None:
        return 1.0
    return w.astype(dtype).reshape((shape[0],) + (1,) * (len(shape) - 1))


def _targets(labels: np.ndarray, sparse: bool, n: int, c: int, ls: float, dtype: np.dtype) -> np.ndarray:
    if sparse:
        idx = labels.reshape(n).astype(np.intp, copy=False)
        if n and (idx.min() < 0 or idx.max() >= c):
            raise ValueError(f"labels must be class indices in [0, {c}), got values in [{idx.min()}, {idx.max()}]")
        y = np.zeros((n, c), dtype=dtype)
        y[np.arange(n), idx] = 1
    else:
        y = labels.astype(dtype, copy=True)
    if ls:
        y *= 1.0 - ls
        y += ls / c
    return y


def softmax_cross_entropy(
    logits: Any, labels: Any, *, label_smoothing: float = 0.0, grad_scale: Any = 1.0, sample_weight: Any = None,
    stream: Any = None
) -> tuple[Any, Any]:
    """Categorical cross-entropy of ``softmax(logits)`` (Keras ``from_logits=True``), fused.

    ``logits`` ``(N, C)``; ``labels`` int ``(N,)`` or float ``(N, C)``. Per row the loss is
    ``sum(y) * logsumexp(logits) - sum(y * logits)`` (``y`` the smoothed target row), and
    ``(loss, dlogits)`` is returned with ``dlogits = w (softmax(logits) * sum(y) - y) / N * grad_scale``
    (``w`` the sample weights, 1 without): exact also for dense label rows that do not sum to 1,
    as the CUDA kernel computes it (``sum(y)`` is 1 for sparse and normalised rows).

    CUDA: ``_cuda.losses.softmax_cross_entropy(logits, labels, label_smoothing=ls, grad_scale=grad_scale,
    sample_weight=w, stream=stream)`` with ``ls`` a float, ``grad_scale`` a float or a 0-d DeviceArray
    and ``w`` None or an ``(N,)`` float32 DeviceArray.
    """
    op = "softmax_cross_entropy"
    logits, labels = as_array(logits), as_array(labels)
    check_float(op, "logits", logits)
    sparse = _check_labels(op, logits, labels)
    ls = _check_smoothing(op, label_smoothing)
    impl = route(op, "losses", logits=logits, labels=labels, sample_weight=sample_weight)
    w = _check_weights(op, logits, sample_weight)
    if impl is not None:
        return impl.softmax_cross_entropy(logits, labels, label_smoothing=ls, grad_scale=grad_scale,
                                          sample_weight=w, stream=stream)
    x = to_compute(logits)
    n, c = x.shape
    y = _targets(labels, sparse, n, c, ls, x.dtype)
    rw = _row_weights(w, x.shape, x.dtype)
    shifted = x - x.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_p = shifted - log_z
    loss = -(rw * y * log_p).sum() / n
    grad = np.exp(log_p)
    if not sparse:  # an unnormalised row y: d/dz [sum(y) logsumexp(z) - y.z] = softmax(z) sum(y) - y
        grad *= y.sum(axis=1, keepdims=True)
    grad -= y
    grad *= rw * (scalar(grad_scale, op, "grad_scale") / n)
    return np.asarray(loss, dtype=param_dtype(logits.dtype)), grad.astype(logits.dtype, copy=False)


def crossentropy_from_probs(
    probs: Any, labels: Any, *, label_smoothing: float = 0.0, grad_scale: Any = 1.0, sample_weight: Any = None,
    stream: Any = None
) -> tuple[Any, Any]:
    """Categorical cross-entropy of probabilities (Keras ``from_logits=False``).

    As Keras 3: each row is first divided by its sum, then clipped to
    ``[1e-7, 1 - 1e-7]``; ``loss = sum_n(-w_n sum_c y log p) / N``. The gradient
    includes the row normalisation and is 0 where the clip is active.

    CUDA: ``_cuda.losses.crossentropy_from_probs(probs, labels, label_smoothing=ls, grad_scale=grad_scale,
    sample_weight=w, stream=stream)``.
    """
    op = "crossentropy_from_probs"
    probs, labels = as_array(probs), as_array(labels)
    check_float(op, "probs", probs)
    sparse = _check_labels(op, probs, labels)
    ls = _check_smoothing(op, label_smoothing)
    impl = route(op, "losses", probs=probs, labels=labels, sample_weight=sample_weight)
    w = _check_weights(op, probs, sample_weight)
    if impl is not None:
        return impl.crossentropy_from_probs(probs, labels, label_smoothing=ls, grad_scale=grad_scale,
                                            sample_weight=w, stream=stream)
    q = to_compute(probs)
    n, c = q.shape
    y = _targets(labels, sparse, n, c, ls, q.dtype)
    rw = _row_weights(w, q.shape, q.dtype)
    total = q.sum(axis=1, keepdims=True)
    p = q / total
    inside = (p > CLIP_EPSILON) & (p < 1 - CLIP_EPSILON)
    pc = np.clip(p, CLIP_EPSILON, 1 - CLIP_EPSILON)
    loss = -(rw * y * np.log(pc)).sum() / n
    g = np.where(inside, -y / pc, 0.0)  # dL/dp for one row (before the 1/N mean)
    # p = q / sum(q): dL/dq_j = (g_j - sum_i g_i p_i) / sum(q)
    grad = (g - (g * p).sum(axis=1, keepdims=True)) / total
    grad *= rw * (scalar(grad_scale, op, "grad_scale") / n)
    return np.asarray(loss, dtype=param_dtype(probs.dtype)), grad.astype(probs.dtype, copy=False)


def _check_same(op: str, pred: Any, target: Any) -> Any:
    if tuple(target.shape) == tuple(pred.shape):
        return target
    # Keras accepts (N,) targets for (N, 1) predictions and the reverse.
    if target.size == pred.size and pred.ndim >= 1 and target.ndim >= 1 and target.shape[0] == pred.shape[0] \
            and (pred.ndim == 2 and pred.shape[1] == 1 or target.ndim == 2 and target.shape[1] == 1):
        return target.reshape(pred.shape)
    raise ValueError(f"{op}: target has shape {tuple(target.shape)} but the prediction has {tuple(pred.shape)}")


def binary_crossentropy(
    pred: Any,
    target: Any,
    *,
    from_logits: bool = False,
    label_smoothing: float = 0.0,
    grad_scale: Any = 1.0,
    sample_weight: Any = None,
    stream: Any = None,
) -> tuple[Any, Any]:
    """Binary cross-entropy averaged over every element (Keras: mean over the last axis, then the batch).

    ``from_logits``: ``loss = max(x, 0) - x t + log(1 + exp(-|x|))``, gradient ``(sigmoid(x) - t)/size``.
    Otherwise ``pred`` is clipped to ``[1e-7, 1 - 1e-7]`` and the gradient is
    ``(p - t) / (p (1 - p)) / size`` inside the clip, 0 outside. ``target``
    is float, ``pred``'s shape (``(N,)`` vs ``(N, 1)`` is accepted). Sample weights multiply
    every element of their sample's row (loss and gradient).

    CUDA: ``_cuda.losses.binary_crossentropy(pred, target, from_logits=from_logits, label_smoothing=ls,
    grad_scale=grad_scale, sample_weight=w, stream=stream)`` (``target`` already reshaped to ``pred``'s shape).
    """
    op = "binary_crossentropy"
    pred, target = as_array(pred), as_array(target)
    check_float(op, "pred", pred)
    target = _check_same(op, pred, target)
    ls = _check_smoothing(op, label_smoothing)
    from_logits = bool(from_logits)
    impl = route(op, "losses", pred=pred, target=target, sample_weight=sample_weight)
    w = _check_weights(op, pred, sample_weight)
    if impl is not None:
        return impl.binary_crossentropy(pred, target, from_logits=from_logits, label_smoothing=ls,
                                        grad_scale=grad_scale, sample_weight=w, stream=stream)
    x = to_compute(pred)
    t = target.astype(x.dtype, copy=True)
    if ls:
        t *= 1.0 - ls
        t += 0.5 * ls
    size = max(x.size, 1)
    if from_logits:
        elem = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
        sig = np.exp(-np.logaddexp(0, -x))
        grad = sig - t
    else:
        inside = (x > CLIP_EPSILON) & (x < 1 - CLIP_EPSILON)
        p = np.clip(x, CLIP_EPSILON, 1 - CLIP_EPSILON)
        elem = -(t * np.log(p) + (1 - t) * np.log1p(-p))
        grad = np.where(inside, (p - t) / (p * (1 - p)), 0.0)
    rw = _row_weights(w, x.shape, x.dtype)
    loss = (rw * elem).sum() / size
    grad *= rw * (scalar(grad_scale, op, "grad_scale") / size)
    return np.asarray(loss, dtype=param_dtype(pred.dtype)), grad.astype(pred.dtype, copy=False)


def mean_squared_error(pred: Any, target: Any, *, grad_scale: Any = 1.0, sample_weight: Any = None,
                       stream: Any = None) -> tuple[Any, Any]:
    """``mean((pred - target)^2)`` over every element; gradient ``2 (pred - target) / size``
    (each sample's elements times its weight, with ``sample_weight``).

    CUDA: ``_cuda.losses.mean_squared_error(pred, target, grad_scale=grad_scale, sample_weight=w,
    stream=stream)`` (``target`` already reshaped to ``pred``'s shape).
    """
    op = "mean_squared_error"
    pred, target = as_array(pred), as_array(target)
    check_float(op, "pred", pred)
    target = _check_same(op, pred, target)
    impl = route(op, "losses", pred=pred, target=target, sample_weight=sample_weight)
    w = _check_weights(op, pred, sample_weight)
    if impl is not None:
        return impl.mean_squared_error(pred, target, grad_scale=grad_scale, sample_weight=w, stream=stream)
    x = to_compute(pred)
    diff = x - target.astype(x.dtype, copy=False)
    size = max(x.size, 1)
    if w is None:
        loss = np.vdot(diff, diff) / size if diff.size else 0.0
    else:
        loss = (_row_weights(w, x.shape, x.dtype) * diff * diff).sum() / size
    diff *= 2.0 * scalar(grad_scale, op, "grad_scale") / size
    diff *= _row_weights(w, x.shape, x.dtype)
    return np.asarray(loss, dtype=param_dtype(pred.dtype)), diff.astype(pred.dtype, copy=False)
