"""The accuracy functions of ``keras.metrics`` (Keras 3's ``accuracy_metrics.py``): per-sample (or per-element)
float32 matches in ``keras.ops``, on device arrays and NumPy alike. The classes that average them live in
``metric.py`` (with their kernels) and take these functions for weighted updates."""

from __future__ import annotations

from typing import Any

from .. import ops
from ..autodiff.tensor import Tensor
from ..losses.loss import squeeze_or_expand_to_same_rank

__all__ = ["accuracy", "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy",
           "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy"]

_FLOATX = "float32"


def accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """``keras.metrics.accuracy``: 1.0 where ``y_true == y_pred`` (``y_true`` cast to ``y_pred``'s dtype), else
    0.0, elementwise, after Keras 3's ``squeeze_or_expand_to_same_rank``."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    return ops.cast(ops.equal(y_true, y_pred), _FLOATX)


def binary_accuracy(y_true: Any, y_pred: Any, threshold: float = 0.5) -> Tensor:
    """1.0 where ``(y_pred > threshold) == y_true``, elementwise (Keras's ``binary_accuracy``)."""
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.convert_to_tensor(y_true)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    predicted = ops.cast(ops.greater(y_pred, float(threshold)), y_true.dtype)
    return ops.cast(ops.equal(y_true, predicted), _FLOATX)


def _sparse_matches(labels: Tensor, y_pred: Tensor, squeeze_last: bool) -> Tensor:
    original = tuple(labels.shape)
    reshape = False
    if labels.ndim == y_pred.ndim and (not squeeze_last or labels.shape[-1] == 1):
        labels = ops.squeeze(labels, -1)
        reshape = True
    predicted = ops.cast(ops.argmax(y_pred, axis=-1), labels.dtype)
    matches = ops.cast(ops.equal(labels, predicted), _FLOATX)
    if reshape:
        matches = ops.reshape(matches, original)
    return matches


def categorical_accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """1.0 where ``argmax(y_true) == argmax(y_pred)`` over the last axis, per sample (Keras's)."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.argmax(ops.convert_to_tensor(y_true), axis=-1), y_pred.dtype)
    return _sparse_matches(labels, y_pred, squeeze_last=False)


def sparse_categorical_accuracy(y_true: Any, y_pred: Any) -> Tensor:
    """1.0 where the integer label equals ``argmax(y_pred)``, per sample (Keras's)."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    matches = _sparse_matches(labels, y_pred, squeeze_last=True)
    if matches.ndim > 1 and matches.shape[-1] == 1:
        matches = ops.squeeze(matches, -1)
    return matches


def _in_top_k(labels: Tensor, y_pred: Tensor, k: int) -> Tensor:
    original = tuple(labels.shape)
    if y_pred.ndim > 2:
        y_pred = ops.reshape(y_pred, (-1, int(y_pred.shape[-1])))
    if labels.ndim > 1:
        labels = ops.reshape(labels, (-1,))
    matches = ops.cast(ops.in_top_k(ops.cast(labels, "int32"), y_pred, int(k)), _FLOATX)
    return ops.reshape(matches, original) if len(original) > 1 else matches


def top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5) -> Tensor:
    """1.0 where ``argmax(y_true)`` is among the ``k`` highest scores, per sample (Keras's)."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.argmax(ops.convert_to_tensor(y_true), axis=-1)
    return _in_top_k(labels, y_pred, k)


def sparse_top_k_categorical_accuracy(y_true: Any, y_pred: Any, k: int = 5, from_sorted_ids: bool = False) -> Tensor:
    """1.0 where the integer label is among the ``k`` highest scores (or, ``from_sorted_ids``, among the first
    ``k`` ids of ``y_pred``), per sample (Keras's)."""
    y_pred = ops.convert_to_tensor(y_pred)
    labels = ops.convert_to_tensor(y_true)
    if not from_sorted_ids:
        return _in_top_k(labels, y_pred, k)
    original = tuple(labels.shape)
    if y_pred.ndim > 2:
        y_pred = ops.reshape(y_pred, (-1, int(y_pred.shape[-1])))
    labels = ops.cast(ops.reshape(labels, (-1,)), y_pred.dtype)
    matches = ops.any(ops.equal(ops.expand_dims(labels, 1), y_pred[:, :k]), axis=1)
    matches = ops.cast(matches, _FLOATX)
    return ops.reshape(matches, original) if len(original) > 1 else matches
