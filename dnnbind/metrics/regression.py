"""Regression and correlation metrics with Keras 3 names (``regression_metrics.py``,
``correlation_metrics.py``): means of per-sample functions (device totals, device weighted counts), and
:class:`R2Score`'s per-column sums in device variables."""

from __future__ import annotations

import warnings
from typing import Any

from .. import backend, ops
from ..autodiff.tensor import Tensor
from ..losses import regression as _reg
from ..losses.loss import squeeze_or_expand_to_same_rank
from .metric import MeanMetricWrapper, Metric

__all__ = ["MeanAbsolutePercentageError", "MeanSquaredLogarithmicError", "RootMeanSquaredError", "CosineSimilarity",
           "LogCoshError", "R2Score", "PearsonCorrelation", "ConcordanceCorrelation", "cosine_similarity",
           "pearson_correlation", "concordance_correlation"]


def cosine_similarity(y_true: Any, y_pred: Any, axis: int = -1) -> Tensor:
    """``sum(l2_normalize(y_true) * l2_normalize(y_pred), axis)`` per sample (the metric's sign: 1 is best)."""
    return ops.negative(_reg.cosine_similarity(y_true, y_pred, axis=axis))


def _pair(y_true: Any, y_pred: Any) -> tuple:
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.cast(ops.convert_to_tensor(y_true), y_pred.dtype)
    return squeeze_or_expand_to_same_rank(y_true, y_pred)


def pearson_correlation(y_true: Any, y_pred: Any, axis: int = -1) -> Tensor:
    """Pearson's correlation between ``y_true`` and ``y_pred`` along ``axis``, per sample (Keras's)."""
    y_true, y_pred = _pair(y_true, y_pred)
    t = ops.subtract(y_true, ops.mean(y_true, axis=axis, keepdims=True))
    p = ops.subtract(y_pred, ops.mean(y_pred, axis=axis, keepdims=True))
    t = ops.divide(t, ops.std(t, axis=axis, keepdims=True))
    p = ops.divide(p, ops.std(p, axis=axis, keepdims=True))
    return ops.mean(ops.multiply(t, p), axis=axis)


def concordance_correlation(y_true: Any, y_pred: Any, axis: int = -1) -> Tensor:
    """Lin's concordance correlation along ``axis``, per sample, as Keras 3.15 computes it (its covariance
    term centres ``y_true`` on ``y_pred``'s mean)."""
    y_true, y_pred = _pair(y_true, y_pred)
    true_mean = ops.mean(y_true, axis=axis, keepdims=True)
    pred_mean = ops.mean(y_pred, axis=axis, keepdims=True)
    true_var = ops.var(ops.subtract(y_true, true_mean), axis=axis, keepdims=True)
    pred_var = ops.var(ops.subtract(y_pred, pred_mean), axis=axis, keepdims=True)
    covar = ops.multiply(ops.subtract(y_true, pred_mean), ops.subtract(y_pred, pred_mean))
    norm = ops.add(ops.add(true_var, pred_var), ops.square(ops.subtract(true_mean, pred_mean)))
    return ops.mean(ops.divide(ops.multiply(covar, 2.0), ops.add(norm, backend.epsilon())), axis=axis)


class _Wrapper(MeanMetricWrapper):
    """A :class:`MeanMetricWrapper` of a fixed function whose config is Keras's ``{"name", "dtype"}`` plus the
    keyword arguments named in ``_config``."""

    _config: tuple = ()

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, **{k: self._fn_kwargs[k] for k in self._config}}


class MeanAbsolutePercentageError(_Wrapper):
    """The mean of :func:`~dnnbind.losses.mean_absolute_percentage_error` (``keras.metrics``)."""
    _fn = staticmethod(_reg.mean_absolute_percentage_error)

    def __init__(self, name: str = "mean_absolute_percentage_error", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class MeanSquaredLogarithmicError(_Wrapper):
    """The mean of :func:`~dnnbind.losses.mean_squared_logarithmic_error` (``keras.metrics``)."""
    _fn = staticmethod(_reg.mean_squared_logarithmic_error)

    def __init__(self, name: str = "mean_squared_logarithmic_error", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


def _squared_error(y_true: Any, y_pred: Any) -> Tensor:
    y_true, y_pred = _pair(y_true, y_pred)
    return ops.square(ops.subtract(y_pred, y_true))


class RootMeanSquaredError(_Wrapper):
    """``sqrt`` of the (weighted) mean squared error (``keras.metrics.RootMeanSquaredError``)."""
    _fn = staticmethod(_squared_error)

    def __init__(self, name: str = "root_mean_squared_error", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)

    def result(self) -> Any:
        return ops.sqrt(super().result())


class CosineSimilarity(_Wrapper):
    """The mean of :func:`cosine_similarity` along ``axis`` (``keras.metrics.CosineSimilarity``; Keras's config
    keeps name and dtype only)."""
    _fn = staticmethod(cosine_similarity)

    def __init__(self, name: str = "cosine_similarity", dtype: Any = None, axis: int = -1) -> None:
        super().__init__(name=name, dtype=dtype, axis=int(axis))


class LogCoshError(_Wrapper):
    """The mean of :func:`~dnnbind.losses.log_cosh` (``keras.metrics.LogCoshError``, named ``"logcosh"``)."""
    _fn = staticmethod(_reg.log_cosh)

    def __init__(self, name: str = "logcosh", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class PearsonCorrelation(_Wrapper):
    """The mean of :func:`pearson_correlation` along ``axis`` (``keras.metrics.PearsonCorrelation``)."""
    _fn = staticmethod(pearson_correlation)
    _config = ("axis",)

    def __init__(self, name: str = "pearson_correlation", dtype: Any = None, axis: int = -1) -> None:
        super().__init__(name=name, dtype=dtype, axis=int(axis))


class ConcordanceCorrelation(_Wrapper):
    """The mean of :func:`concordance_correlation` along ``axis`` (``keras.metrics.ConcordanceCorrelation``)."""
    _fn = staticmethod(concordance_correlation)
    _config = ("axis",)

    def __init__(self, name: str = "concordance_correlation", dtype: Any = None, axis: int = -1) -> None:
        super().__init__(name=name, dtype=dtype, axis=int(axis))


class R2Score(Metric):
    """The coefficient of determination (``keras.metrics.R2Score``): per output column, from weighted sums kept
    in device variables (created at the first update, from ``y_pred``'s width). ``class_aggregation``
    ``"uniform_average"`` (default), ``"variance_weighted_average"`` or None (one score per column);
    ``num_regressors`` > 0 gives the adjusted score (its check against the sample count reads the count when
    ``result`` is asked, as Keras)."""

    def __init__(self, class_aggregation: Any = "uniform_average", num_regressors: int = 0, name: str = "r2_score",
                 dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)
        valid = (None, "uniform_average", "variance_weighted_average")
        if class_aggregation not in valid:
            raise ValueError(f"R2Score: Invalid value for argument `class_aggregation`. Expected one of {valid}. "
                             f"Received: class_aggregation={class_aggregation!r}")
        if isinstance(num_regressors, bool) or not isinstance(num_regressors, int) or num_regressors < 0:
            raise ValueError("R2Score: Invalid value for argument `num_regressors`. Expected a value >= 0. "
                             f"Received: num_regressors={num_regressors!r}")
        self.class_aggregation = class_aggregation
        self.num_regressors = num_regressors
        self.num_samples = self.add_variable((), "zeros", dtype="float32", name="num_samples")
        self._built = False

    def _build(self, y_true_shape: tuple, y_pred_shape: tuple) -> None:
        if len(y_pred_shape) != 2 or len(y_true_shape) != 2:
            raise ValueError("R2Score expects 2D inputs with shape (batch_size, output_dim). Received input shapes: "
                             f"y_pred.shape={y_pred_shape} and y_true.shape={y_true_shape}.")
        n = int(y_pred_shape[-1])
        self.squared_sum = self.add_variable((n,), "zeros", dtype="float32", name="squared_sum")
        self.sum = self.add_variable((n,), "zeros", dtype="float32", name="sum")
        self.total_mse = self.add_variable((n,), "zeros", dtype="float32", name="residual")
        self.count = self.add_variable((n,), "zeros", dtype="float32", name="count")
        self._built = True

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_pred = ops.cast(ops.convert_to_tensor(y_pred), "float32")
        y_true = ops.cast(ops.convert_to_tensor(y_true), "float32")
        y_true, y_pred = squeeze_or_expand_to_same_rank(y_true, y_pred)
        if not self._built:
            self._build(tuple(y_true.shape), tuple(y_pred.shape))
        w = ops.ones((), "float32") if sample_weight is None else ops.cast(ops.convert_to_tensor(sample_weight),
                                                                           "float32")
        if w.ndim == 1:
            w = ops.expand_dims(w, 1)
        w = ops.broadcast_to(w, tuple(y_true.shape))
        weighted = ops.multiply(y_true, w)
        self.sum.assign_add(ops.sum(weighted, axis=0))
        self.squared_sum.assign_add(ops.sum(ops.multiply(y_true, weighted), axis=0))
        self.total_mse.assign_add(ops.sum(ops.multiply(ops.square(ops.subtract(y_true, y_pred)), w), axis=0))
        self.count.assign_add(ops.sum(w, axis=0))
        self.num_samples.assign_add(float(y_true.size))

    def result(self) -> Any:
        if not self._built:
            return ops.zeros((), "float32")
        total_sum, count = ops.convert_to_tensor(self.sum), ops.convert_to_tensor(self.count)
        mean = ops.divide(total_sum, count)
        total = ops.subtract(ops.convert_to_tensor(self.squared_sum), ops.multiply(total_sum, mean))
        raw = ops.subtract(1.0, ops.divide(ops.convert_to_tensor(self.total_mse), total))
        raw = ops.where(ops.isinf(raw), 0.0, raw)
        if self.class_aggregation == "uniform_average":
            score = ops.mean(raw)
        elif self.class_aggregation == "variance_weighted_average":
            score = ops.divide(ops.sum(ops.multiply(total, raw)), ops.sum(total))
        else:
            score = raw
        if self.num_regressors:
            n = float(ops.convert_to_numpy(self.num_samples))  # Keras compares on the host too
            p = float(self.num_regressors)
            if p > n - 1:
                warnings.warn("More independent predictors than datapoints in adjusted R2 score. Falling back to "
                              "standard R2 score.", stacklevel=2)
            elif p == n - 1:
                warnings.warn("Division by zero in Adjusted R2 score. Falling back to standard R2 score.",
                              stacklevel=2)
            else:
                score = ops.subtract(1.0, ops.divide(ops.multiply(ops.subtract(1.0, score), n - 1.0), n - p - 1.0))
        return score

    def reset_state(self) -> None:
        for v in self._variables:
            v.assign(ops.zeros(tuple(v.shape), dtype=v.dtype))

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "class_aggregation": self.class_aggregation,
                "num_regressors": self.num_regressors}
