"""Regression losses with Keras 3 names (``keras/src/losses/losses.py``): per-sample functions written in
``keras.ops`` (differentiable on the op tape, on device arrays and NumPy alike) and their :class:`Loss`
classes, which the base class reduces."""

from __future__ import annotations

from typing import Any

from .. import backend, ops
from ..autodiff.tensor import Tensor
from .core import mean_absolute_error
from .loss import squeeze_or_expand_to_same_rank
from .loss import FunctionLoss, pair

__all__ = [
    "MeanAbsoluteError", "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError", "CosineSimilarity",
    "Huber", "LogCosh", "Poisson",
    "mean_absolute_percentage_error", "mean_squared_logarithmic_error", "cosine_similarity", "huber",
    "log_cosh", "poisson",
]


def mean_absolute_percentage_error(y_true: Any, y_pred: Any) -> Tensor:
    """``100 * mean(|y_true - y_pred| / max(|y_true|, epsilon), axis=-1)`` per sample (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    diff = ops.absolute(ops.divide(ops.subtract(y_true, y_pred),
                                   ops.maximum(ops.absolute(y_true), backend.epsilon())))
    return ops.multiply(ops.mean(diff, axis=-1), 100.0)


def mean_squared_logarithmic_error(y_true: Any, y_pred: Any) -> Tensor:
    """``mean((log(max(y_pred, eps) + 1) - log(max(y_true, eps) + 1))**2, axis=-1)`` per sample (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    eps = backend.epsilon()
    first = ops.log(ops.add(ops.maximum(y_pred, eps), 1.0))
    second = ops.log(ops.add(ops.maximum(y_true, eps), 1.0))
    return ops.mean(ops.square(ops.subtract(first, second)), axis=-1)


def cosine_similarity(y_true: Any, y_pred: Any, axis: int = -1) -> Tensor:
    """``-sum(l2_normalize(y_true) * l2_normalize(y_pred), axis)`` per sample (Keras's; -1 is the best)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    return ops.negative(ops.sum(ops.multiply(ops.normalize(y_true, axis=axis), ops.normalize(y_pred, axis=axis)),
                                axis=axis))


def huber(y_true: Any, y_pred: Any, delta: float = 1.0) -> Tensor:
    """The Huber loss per sample (Keras's): ``0.5 e**2`` where ``|e| <= delta``, else ``delta |e| - 0.5
    delta**2`` (``e = y_pred - y_true``), averaged over the last axis."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    delta = float(delta)
    error = ops.subtract(y_pred, y_true)
    abs_error = ops.absolute(error)
    quadratic = ops.multiply(ops.square(error), 0.5)
    linear = ops.subtract(ops.multiply(abs_error, delta), 0.5 * delta * delta)
    return ops.mean(ops.where(ops.less_equal(abs_error, delta), quadratic, linear), axis=-1)


def log_cosh(y_true: Any, y_pred: Any) -> Tensor:
    """``mean(log(cosh(y_pred - y_true)), axis=-1)`` per sample, as ``x + softplus(-2x) - log 2`` (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
    x = ops.subtract(y_pred, y_true)
    return ops.mean(ops.subtract(ops.add(x, ops.softplus(ops.multiply(x, -2.0))), float(ops.log(2.0))), axis=-1)


def poisson(y_true: Any, y_pred: Any) -> Tensor:
    """``mean(y_pred - y_true * log(y_pred + epsilon), axis=-1)`` per sample (Keras's)."""
    y_true, y_pred = pair(y_true, y_pred)
    return ops.mean(ops.subtract(y_pred, ops.multiply(y_true, ops.log(ops.add(y_pred, backend.epsilon())))),
                    axis=-1)


class MeanAbsoluteError(FunctionLoss):
    """``mean(|y_true - y_pred|, axis=-1)`` per sample, reduced (``keras.losses.MeanAbsoluteError``)."""

    _fn = staticmethod(mean_absolute_error)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "mean_absolute_error",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class MeanAbsolutePercentageError(FunctionLoss):
    """:func:`mean_absolute_percentage_error` per sample, reduced (``keras.losses.MeanAbsolutePercentageError``)."""

    _fn = staticmethod(mean_absolute_percentage_error)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "mean_absolute_percentage_error",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class MeanSquaredLogarithmicError(FunctionLoss):
    """:func:`mean_squared_logarithmic_error` per sample, reduced (``keras.losses.MeanSquaredLogarithmicError``)."""

    _fn = staticmethod(mean_squared_logarithmic_error)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "mean_squared_logarithmic_error",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class CosineSimilarity(FunctionLoss):
    """:func:`cosine_similarity` along ``axis`` per sample, reduced (``keras.losses.CosineSimilarity``; its
    config, as Keras's, keeps only name and reduction)."""

    _fn = staticmethod(cosine_similarity)

    def __init__(self, axis: int = -1, reduction: Any = "sum_over_batch_size", name: str = "cosine_similarity",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype, axis=int(axis))


class Huber(FunctionLoss):
    """:func:`huber` with ``delta`` per sample, reduced (``keras.losses.Huber``; Keras's config keeps only name
    and reduction)."""

    _fn = staticmethod(huber)

    def __init__(self, delta: float = 1.0, reduction: Any = "sum_over_batch_size", name: str = "huber_loss",
                 dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype, delta=float(delta))


class LogCosh(FunctionLoss):
    """:func:`log_cosh` per sample, reduced (``keras.losses.LogCosh``)."""

    _fn = staticmethod(log_cosh)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "log_cosh", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)


class Poisson(FunctionLoss):
    """:func:`poisson` per sample, reduced (``keras.losses.Poisson``)."""

    _fn = staticmethod(poisson)

    def __init__(self, reduction: Any = "sum_over_batch_size", name: str = "poisson", dtype: Any = None) -> None:
        super().__init__(reduction=reduction, name=name, dtype=dtype)
