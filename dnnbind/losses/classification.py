"""Classification, segmentation, metric-learning and sequence losses with Keras 3 names
(``keras/src/losses/losses.py``): hinges, focal cross-entropies, the generalized cross-entropy, Dice,
Tversky, Circle and CTC. Per-sample functions in ``keras.ops`` (differentiable on the op tape, on device
arrays and NumPy alike) and their :class:`Loss` classes. Nothing here reads a value back to the host:
Keras's data-dependent choices (``ops.cond`` on binary labels) are ``ops.where`` on the device."""

from __future__ import annotations

import warnings
from typing import Any

from .. import _validate, backend, ops
from ..autodiff.tensor import Tensor
from .loss import FunctionLoss, pair

__all__ = [
    "Hinge", "SquaredHinge", "CategoricalHinge", "BinaryFocalCrossentropy", "CategoricalFocalCrossentropy",
    "CategoricalGeneralizedCrossEntropy", "Dice", "Tversky", "Circle", "CTC",
    "hinge", "squared_hinge", "categorical_hinge", "binary_focal_crossentropy", "categorical_focal_crossentropy",
    "categorical_generalized_cross_entropy", "dice", "tversky", "circle", "ctc",
    "convert_binary_labels_to_hinge",
]


def convert_binary_labels_to_hinge(y_true: Tensor) -> Tensor:
    """Labels all in {0, 1} become {-1, 1}; any other labels stay as they are (Keras's rule, decided on the
    device: no host read)."""
    is_binary = ops.all(ops.logical_or(ops.equal(y_true, 0.0), ops.equal(y_true, 1.0)))
    return ops.where(is_binary, ops.subtract(ops.multiply(y_true, 2.0), 1.0), y_true)


def hinge(y_true: Any, y_pred: Any) -> Tensor:
    """``mean(max(1 - y_true * y_pred, 0), axis=-1)`` per sample; labels -1/1 (0/1 are converted) (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true = convert_binary_labels_to_hinge(y_true)
    return ops.mean(ops.maximum(ops.subtract(1.0, ops.multiply(y_true, y_pred)), 0.0), axis=-1)


def squared_hinge(y_true: Any, y_pred: Any) -> Tensor:
    """``mean(max(1 - y_true * y_pred, 0)**2, axis=-1)`` per sample; labels -1/1 (0/1 converted) (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true = convert_binary_labels_to_hinge(y_true)
    return ops.mean(ops.square(ops.maximum(ops.subtract(1.0, ops.multiply(y_true, y_pred)), 0.0)), axis=-1)


def categorical_hinge(y_true: Any, y_pred: Any) -> Tensor:
    """``max(max((1 - y_true) * y_pred) - sum(y_true * y_pred) + 1, 0)`` over the last axis (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    pos = ops.sum(ops.multiply(y_true, y_pred), axis=-1)
    neg = ops.max(ops.multiply(ops.subtract(1.0, y_true), y_pred), axis=-1)
    return ops.maximum(ops.add(ops.subtract(neg, pos), 1.0), 0.0)


def _check_axis(axis: Any, owner: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"{owner}: `axis` must be of type `int`. Received: axis={axis!r} of type {type(axis)}")
    return axis


def binary_focal_crossentropy(y_true: Any, y_pred: Any, apply_class_balancing: bool = False, alpha: float = 0.25,
                              gamma: float = 2.0, from_logits: bool = False, label_smoothing: float = 0.0,
                              axis: int = -1) -> Tensor:
    """The binary focal cross-entropy (Lin et al. 2017) per sample (Keras's): ``(1 - p_t)**gamma * bce``,
    times ``alpha`` / ``1 - alpha`` with ``apply_class_balancing``, averaged over ``axis``."""
    y_true, y_pred = pair(y_true, y_pred)
    if label_smoothing:
        y_true = ops.add(ops.multiply(y_true, 1.0 - label_smoothing), 0.5 * label_smoothing)
    if from_logits:
        y_pred = ops.sigmoid(y_pred)
    bce = ops.binary_crossentropy(y_true, y_pred, from_logits=False)
    p_t = ops.add(ops.multiply(y_true, y_pred), ops.multiply(ops.subtract(1.0, y_true), ops.subtract(1.0, y_pred)))
    focal = ops.multiply(ops.power(ops.subtract(1.0, p_t), float(gamma)), bce)
    if apply_class_balancing:
        weight = ops.add(ops.multiply(y_true, float(alpha)), ops.multiply(ops.subtract(1.0, y_true), 1.0 - alpha))
        focal = ops.multiply(weight, focal)
    return ops.mean(focal, axis=axis)


def categorical_focal_crossentropy(y_true: Any, y_pred: Any, alpha: float = 0.25, gamma: float = 2.0,
                                   from_logits: bool = False, label_smoothing: float = 0.0,
                                   axis: int = -1) -> Tensor:
    """The categorical focal cross-entropy per sample (Keras's): ``sum(alpha (1 - p)**gamma * -y log p,
    axis)`` with ``p`` the predictions normalised to sum 1 and clipped to ``[eps, 1 - eps]``."""
    axis = _check_axis(axis, "categorical_focal_crossentropy")
    y_true, y_pred = pair(y_true, y_pred)
    if y_pred.shape[-1] == 1:
        warnings.warn("In loss categorical_focal_crossentropy, expected y_pred.shape to be (batch_size, "
                      f"num_classes) with num_classes > 1. Received: y_pred.shape={tuple(y_pred.shape)}. Consider "
                      "using 'binary_crossentropy' if you only have 2 classes.", SyntaxWarning, stacklevel=2)
    if label_smoothing:
        y_true = ops.add(ops.multiply(y_true, 1.0 - label_smoothing), label_smoothing / float(y_true.shape[-1]))
    if from_logits:
        y_pred = ops.softmax(y_pred, axis=axis)
    eps = backend.epsilon()
    output = ops.clip(ops.divide(y_pred, ops.sum(y_pred, axis=axis, keepdims=True)), eps, 1.0 - eps)
    cce = ops.multiply(ops.negative(y_true), ops.log(output))
    weighting = ops.multiply(ops.power(ops.subtract(1.0, output), float(gamma)), float(alpha))
    return ops.sum(ops.multiply(weighting, cce), axis=axis)


def categorical_generalized_cross_entropy(y_true: Any, y_pred: Any, q: float) -> Tensor:
    """The generalized cross-entropy (Zhang & Sabuncu 2018) per sample (Keras's): ``(1 - p**q) / q`` with
    ``p`` the predicted probability of the integer label ``y_true``."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.convert_to_tensor(y_true), "int32")
    hot = ops.cast(ops.one_hot(labels, int(y_pred.shape[-1])), y_pred.dtype)
    p = ops.sum(ops.multiply(y_pred, hot), axis=-1)
    return ops.divide(ops.subtract(1.0, ops.power(p, float(q))), float(q))


def dice(y_true: Any, y_pred: Any, axis: Any = None) -> Tensor:
    """``1 - 2 sum(y_true y_pred) / (sum(y_true) + sum(y_pred) + eps)`` over ``axis`` (None: all) (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    intersection = ops.sum(ops.multiply(y_true, y_pred), axis=axis)
    denominator = ops.add(ops.add(ops.sum(y_true, axis=axis), ops.sum(y_pred, axis=axis)), backend.epsilon())
    return ops.subtract(1.0, ops.divide(ops.multiply(intersection, 2.0), denominator))


def tversky(y_true: Any, y_pred: Any, alpha: float = 0.5, beta: float = 0.5, axis: Any = None) -> Tensor:
    """``1 - tp / (tp + alpha fp + beta fn + eps)`` over ``axis`` (None: all) (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    tp = ops.sum(ops.multiply(y_true, y_pred), axis=axis)
    fp = ops.sum(ops.multiply(ops.subtract(1.0, y_pred), y_true), axis=axis)
    fn = ops.sum(ops.multiply(y_pred, ops.subtract(1.0, y_true)), axis=axis)
    denominator = ops.add(ops.add(ops.add(tp, ops.multiply(fp, float(alpha))), ops.multiply(fn, float(beta))),
                          backend.epsilon())
    return ops.subtract(1.0, ops.divide(tp, denominator))


def _pos_neg_masks(query: Tensor, key: Tensor, remove_diagonal: bool) -> tuple:
    if query.ndim == 1:
        query = ops.reshape(query, (-1, 1))
    if key.ndim == 1:
        key = ops.reshape(key, (-1, 1))
    positive = ops.equal(query, ops.transpose(key))
    negative = ops.logical_not(positive)
    if remove_diagonal:
        positive = ops.logical_and(positive, ops.logical_not(
            ops.eye(int(query.size), int(key.size), k=0, dtype="bool")))
    return positive, negative


def circle(y_true: Any, y_pred: Any, ref_labels: Any = None, ref_embeddings: Any = None,
           remove_diagonal: bool = True, gamma: float = 80, margin: float = 0.4) -> Tensor:
    """The Circle loss (Sun et al. 2020) per sample (Keras's): ``y_true`` integer labels ``(batch,)``,
    ``y_pred`` L2-normalised embeddings ``(batch, dim)``, compared with ``ref_embeddings`` (default the batch
    itself). The result carries a mask (``loss > 0``) that the reduction honours, as Keras's."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.convert_to_tensor(y_true), "int32")
    ref_embeddings = y_pred if ref_embeddings is None else ops.convert_to_tensor(ref_embeddings)
    ref_labels = labels if ref_labels is None else ops.cast(ops.convert_to_tensor(ref_labels), "int32")
    optim_pos, optim_neg, delta_pos, delta_neg = margin, 1.0 + margin, margin, 1.0 - margin
    distances = ops.maximum(ops.subtract(1.0, ops.matmul(y_pred, ops.transpose(ref_embeddings))), 0.0)
    positive, negative = _pos_neg_masks(labels, ref_labels, remove_diagonal)
    pos_f, neg_f = ops.cast(positive, distances.dtype), ops.cast(negative, distances.dtype)
    pos_weights = ops.maximum(ops.multiply(ops.add(distances, optim_pos), pos_f), 0.0)
    neg_weights = ops.maximum(ops.multiply(ops.subtract(optim_neg, distances), neg_f), 0.0)
    pos_w = ops.multiply(ops.multiply(pos_weights, ops.subtract(delta_pos, distances)), -float(gamma))
    neg_w = ops.multiply(ops.multiply(neg_weights, ops.subtract(delta_neg, distances)), float(gamma))
    p_loss = ops.logsumexp(ops.where(positive, pos_w, float("-inf")), axis=1)
    n_loss = ops.logsumexp(ops.where(negative, neg_w, float("-inf")), axis=1)
    loss = ops.softplus(ops.add(p_loss, n_loss))
    loss._keras_mask = ops.greater(loss, 0.0)
    return loss


def ctc(y_true: Any, y_pred: Any) -> Tensor:
    """The CTC loss per sequence (Keras's ``keras.losses.ctc``): ``y_true`` ``(batch, max_length)`` class ids
    padded with 0 (the blank), ``y_pred`` ``(batch, time, classes)`` logits; every sequence is ``time`` long.
    Differentiable w.r.t. ``y_pred`` (``ops.ctc_loss``)."""
    y_true = ops.convert_to_tensor(y_true)
    y_pred = ops.convert_to_tensor(y_pred)
    if y_true.ndim != 2:
        raise ValueError("ctc: Targets `y_true` are expected to be a tensor of shape `(batch_size, max_length)` in "
                         f"integer format. Received: y_true.shape={tuple(y_true.shape)}")
    if y_pred.ndim != 3:
        raise ValueError("ctc: Logits `y_pred` are expected to be a tensor of shape `(batch_size, max_length, "
                         f"num_classes)`. Received: y_pred.shape={tuple(y_pred.shape)}")
    batch, steps = int(y_pred.shape[0]), int(y_pred.shape[1])
    input_length = ops.full((batch,), steps, dtype="int32")
    label_length = ops.cast(ops.sum(ops.cast(ops.not_equal(y_true, 0), "int32"), axis=-1), "int32")
    return ops.ctc_loss(y_true, y_pred, label_length, input_length, mask_index=0)


class Hinge(FunctionLoss):
    """:func:`hinge` per sample, reduced (``keras.losses.Hinge``)."""

    _fn = staticmethod(hinge)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "hinge", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class SquaredHinge(FunctionLoss):
    """:func:`squared_hinge` per sample, reduced (``keras.losses.SquaredHinge``)."""

    _fn = staticmethod(squared_hinge)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "squared_hinge", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class CategoricalHinge(FunctionLoss):
    """:func:`categorical_hinge` per sample, reduced (``keras.losses.CategoricalHinge``)."""

    _fn = staticmethod(categorical_hinge)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "categorical_hinge",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


def _smoothing(value: Any, owner: str) -> float:
    return _validate.number(value, "label_smoothing", owner, low=0.0, high=1.0)


class BinaryFocalCrossentropy(FunctionLoss):
    """:func:`binary_focal_crossentropy` per sample, reduced (``keras.losses.BinaryFocalCrossentropy``)."""

    _fn = staticmethod(binary_focal_crossentropy)
    _config = ("apply_class_balancing", "alpha", "gamma", "from_logits", "label_smoothing", "axis")

    def __init__(self, apply_class_balancing: bool = False, alpha: float = 0.25, gamma: float = 2.0,
                 from_logits: bool = False, label_smoothing: float = 0.0, axis: int = -1,
                 reduction: Any = "sum_over_batch_size", name: str = "binary_focal_crossentropy",
                 dtype: Any = None) -> None:
        owner = f"BinaryFocalCrossentropy '{name}'"
        super().__init__(reduction=reduction, name=name, dtype=dtype,
                         apply_class_balancing=bool(apply_class_balancing), alpha=float(alpha), gamma=float(gamma),
                         from_logits=bool(from_logits), label_smoothing=_smoothing(label_smoothing, owner),
                         axis=_check_axis(axis, owner))


class CategoricalFocalCrossentropy(FunctionLoss):
    """:func:`categorical_focal_crossentropy` per sample, reduced (``keras.losses.CategoricalFocalCrossentropy``)."""

    _fn = staticmethod(categorical_focal_crossentropy)
    _config = ("alpha", "gamma", "from_logits", "label_smoothing", "axis")

    def __init__(self, alpha: float = 0.25, gamma: float = 2.0, from_logits: bool = False,
                 label_smoothing: float = 0.0, axis: int = -1, reduction: Any = "sum_over_batch_size",
                 name: str = "categorical_focal_crossentropy", dtype: Any = None) -> None:
        owner = f"CategoricalFocalCrossentropy '{name}'"
        super().__init__(reduction=reduction, name=name, dtype=dtype, alpha=float(alpha), gamma=float(gamma),
                         from_logits=bool(from_logits), label_smoothing=_smoothing(label_smoothing, owner),
                         axis=_check_axis(axis, owner))


class CategoricalGeneralizedCrossEntropy(FunctionLoss):
    """:func:`categorical_generalized_cross_entropy` per sample, reduced (``q`` in (0, 1);
    ``keras.losses.CategoricalGeneralizedCrossEntropy``)."""

    _fn = staticmethod(categorical_generalized_cross_entropy)
    _config = ("q",)

    def __init__(self, q: float = 0.5, reduction: Any = "sum_over_batch_size",
                 name: str = "categorical_generalized_cross_entropy", dtype: Any = None) -> None:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 1:
            raise ValueError(f"CategoricalGeneralizedCrossEntropy '{name}': q must be in the interval (0, 1), "
                             f"got q={q!r}")
        super().__init__(reduction=reduction, name=name, dtype=dtype, q=float(q))


class Dice(FunctionLoss):
    """:func:`dice` over ``axis``, reduced (``keras.losses.Dice``)."""

    _fn = staticmethod(dice)
    _config = ("axis",)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "dice", axis: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype, axis=axis)


class Tversky(FunctionLoss):
    """:func:`tversky` with ``alpha`` (false positives) and ``beta`` (false negatives) over ``axis``, reduced
    (``keras.losses.Tversky``)."""

    _fn = staticmethod(tversky)
    _config = ("alpha", "beta", "axis")

    def __init__(self, alpha: float = 0.5, beta: float = 0.5, reduction: Any = "sum_over_batch_size",
                 name: str = "tversky", axis: Any = None, dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype, alpha=float(alpha), beta=float(beta), axis=axis)


class Circle(FunctionLoss):
    """:func:`circle` per sample, reduced over the samples its mask keeps (``keras.losses.Circle``)."""

    _fn = staticmethod(circle)
    _config = ("gamma", "margin", "remove_diagonal")

    def __init__(self, gamma: float = 80.0, margin: float = 0.4, remove_diagonal: bool = True,
                 reduction: Any = "sum_over_batch_size", name: str = "circle", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype, gamma=float(gamma), margin=float(margin),
                         remove_diagonal=bool(remove_diagonal))


class CTC(FunctionLoss):
    """:func:`ctc` per sequence, reduced (``keras.losses.CTC``)."""

    _fn = staticmethod(ctc)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "ctc", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)
