"""Threshold-swept confusion metrics and F-scores with Keras 3 names (``confusion_metrics.py``,
``f_score_metrics.py``): counts in device variables, updated in ``keras.ops`` without a host read; the
constrained maxima and the F-scores are computed from them in :meth:`result`."""

from __future__ import annotations

from typing import Any

from .. import _validate, backend, ops
from .metric import Metric, _ConfusionMatrixMetric

__all__ = ["SensitivityAtSpecificity", "SpecificityAtSensitivity", "PrecisionAtRecall", "RecallAtPrecision",
           "FBetaScore", "F1Score"]


class _SensitivitySpecificityBase(_ConfusionMatrixMetric):
    """The four counts at ``num_thresholds`` thresholds evenly spread over [0, 1] (0.5 alone for one), for
    ``class_id``'s column when given; ``result`` is the best ``dependent`` where ``constrained >= value``."""

    _kinds = ("tp", "fp", "tn", "fn")
    _value_name = "value"

    def __init__(self, value: float, num_thresholds: int = 200, class_id: Any = None, name: "str | None" = None,
                 dtype: Any = None) -> None:
        owner = f"{type(self).__name__} '{name or ''}'"
        value = _validate.number(value, self._value_name, owner, low=0.0, high=1.0)
        num_thresholds = _validate.integer(num_thresholds, "num_thresholds", owner, minimum=1)
        if class_id is not None:
            class_id = _validate.integer(class_id, "class_id", owner, minimum=0)
        thresholds = [0.5] if num_thresholds == 1 else (
            [0.0] + [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)] + [1.0])
        super().__init__(thresholds=thresholds, name=name, dtype=dtype)
        self.value = value
        setattr(self, self._value_name, value)
        self.num_thresholds = num_thresholds
        self.class_id = class_id

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        if self.class_id is not None:
            y_true = ops.convert_to_tensor(y_true)[..., self.class_id]
            y_pred = ops.convert_to_tensor(y_pred)[..., self.class_id]
        super().update_state(y_true, y_pred, sample_weight)

    def _rates(self) -> tuple:
        tp, fp, tn, fn = (self._value(k) for k in self._kinds)
        sensitivity = ops.divide_no_nan(tp, ops.add(tp, fn))  # = recall
        specificity = ops.divide_no_nan(tn, ops.add(tn, fp))
        precision = ops.divide_no_nan(tp, ops.add(tp, fp))
        return sensitivity, specificity, precision

    def _max_under(self, constrained: Any, dependent: Any) -> Any:
        feasible = ops.greater_equal(constrained, self.value)
        return ops.max(ops.where(feasible, dependent, 0.0), initial=0.0)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "class_id": self.class_id,
                "num_thresholds": self.num_thresholds, self._value_name: self.value}


class SensitivityAtSpecificity(_SensitivitySpecificityBase):
    """The best sensitivity where specificity >= ``specificity`` (``keras.metrics.SensitivityAtSpecificity``)."""
    _value_name = "specificity"

    def __init__(self, specificity: float, num_thresholds: int = 200, class_id: Any = None,
                 name: "str | None" = None, dtype: Any = None) -> None:
        super().__init__(specificity, num_thresholds, class_id, name, dtype)

    def result(self) -> Any:
        sensitivity, specificity, _ = self._rates()
        return self._max_under(specificity, sensitivity)


class SpecificityAtSensitivity(_SensitivitySpecificityBase):
    """The best specificity where sensitivity >= ``sensitivity`` (``keras.metrics.SpecificityAtSensitivity``)."""
    _value_name = "sensitivity"

    def __init__(self, sensitivity: float, num_thresholds: int = 200, class_id: Any = None,
                 name: "str | None" = None, dtype: Any = None) -> None:
        super().__init__(sensitivity, num_thresholds, class_id, name, dtype)

    def result(self) -> Any:
        sensitivity, specificity, _ = self._rates()
        return self._max_under(sensitivity, specificity)


class PrecisionAtRecall(_SensitivitySpecificityBase):
    """The best precision where recall >= ``recall`` (``keras.metrics.PrecisionAtRecall``)."""
    _value_name = "recall"

    def __init__(self, recall: float, num_thresholds: int = 200, class_id: Any = None, name: "str | None" = None,
                 dtype: Any = None) -> None:
        super().__init__(recall, num_thresholds, class_id, name, dtype)

    def result(self) -> Any:
        recall, _, precision = self._rates()
        return self._max_under(recall, precision)


class RecallAtPrecision(_SensitivitySpecificityBase):
    """The best recall where precision >= ``precision`` (``keras.metrics.RecallAtPrecision``)."""
    _value_name = "precision"

    def __init__(self, precision: float, num_thresholds: int = 200, class_id: Any = None,
                 name: "str | None" = None, dtype: Any = None) -> None:
        super().__init__(precision, num_thresholds, class_id, name, dtype)

    def result(self) -> Any:
        recall, _, precision = self._rates()
        return self._max_under(precision, recall)


class FBetaScore(Metric):
    """The F-beta score (``keras.metrics.FBetaScore``) of 2-D ``(batch, classes)`` labels and scores: a score is
    positive where it is the row's maximum (``threshold`` None) or above ``threshold``. ``average`` None (one
    score per class), ``"micro"``, ``"macro"`` or ``"weighted"``. Counts in device variables."""

    def __init__(self, average: Any = None, beta: float = 1.0, threshold: Any = None, name: str = "fbeta_score",
                 dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)
        if average not in (None, "micro", "macro", "weighted"):
            raise ValueError("FBetaScore: Invalid `average` argument value. Expected one of: {None, 'micro', "
                             f"'macro', 'weighted'}}. Received: average={average!r}")
        if not isinstance(beta, float):
            raise ValueError(f"FBetaScore: Invalid `beta` argument value. It should be a Python float. Received: "
                             f"beta={beta!r} of type '{type(beta)}'")
        if beta <= 0.0:
            raise ValueError(f"FBetaScore: Invalid `beta` argument value. It should be > 0. Received: beta={beta}")
        if threshold is not None:
            if not isinstance(threshold, float):
                raise ValueError("FBetaScore: Invalid `threshold` argument value. It should be a Python float. "
                                 f"Received: threshold={threshold!r} of type '{type(threshold)}'")
            if threshold > 1.0 or threshold <= 0.0:
                raise ValueError("FBetaScore: Invalid `threshold` argument value. It should verify 0 < threshold "
                                 f"<= 1. Received: threshold={threshold}")
        self.average = average
        self.beta = beta
        self.threshold = threshold
        self.axis = None if average == "micro" else 0
        self._built = False

    def _build(self, y_true_shape: tuple, y_pred_shape: tuple) -> None:
        if len(y_pred_shape) != 2 or len(y_true_shape) != 2:
            raise ValueError(f"{type(self).__name__} expects 2D inputs with shape (batch_size, output_dim). Received "
                             f"input shapes: y_pred.shape={y_pred_shape} and y_true.shape={y_true_shape}.")
        shape = () if self.average == "micro" else (int(y_pred_shape[-1]),)
        for name in ("true_positives", "false_positives", "false_negatives", "intermediate_weights"):
            setattr(self, name, self.add_variable(shape, "zeros", dtype="float32", name=name))
        self._built = True

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_true = ops.cast(ops.convert_to_tensor(y_true), "float32")
        y_pred = ops.cast(ops.convert_to_tensor(y_pred), "float32")
        if not self._built:
            self._build(tuple(y_true.shape), tuple(y_pred.shape))
        if self.threshold is None:
            top = ops.max(y_pred, axis=-1, keepdims=True)
            y_pred = ops.logical_and(ops.greater_equal(y_pred, top), ops.greater(ops.absolute(y_pred), 1e-9))
        else:
            y_pred = ops.greater(y_pred, self.threshold)
        y_pred = ops.cast(y_pred, "float32")
        w = None if sample_weight is None else ops.expand_dims(
            ops.cast(ops.convert_to_tensor(sample_weight), "float32"), 1)

        def weighted_sum(value: Any) -> Any:
            return ops.sum(value if w is None else ops.multiply(value, w), axis=self.axis)

        self.true_positives.assign_add(weighted_sum(ops.multiply(y_pred, y_true)))
        self.false_positives.assign_add(weighted_sum(ops.multiply(y_pred, ops.subtract(1.0, y_true))))
        self.false_negatives.assign_add(weighted_sum(ops.multiply(ops.subtract(1.0, y_pred), y_true)))
        self.intermediate_weights.assign_add(weighted_sum(y_true))

    def result(self) -> Any:
        if not self._built:
            return ops.zeros((), "float32")
        eps = backend.epsilon()
        tp, fp, fn = (ops.convert_to_tensor(v) for v in (self.true_positives, self.false_positives,
                                                         self.false_negatives))
        precision = ops.divide(tp, ops.add(ops.add(tp, fp), eps))
        recall = ops.divide(tp, ops.add(ops.add(tp, fn), eps))
        b2 = self.beta ** 2
        score = ops.multiply(ops.divide(ops.multiply(precision, recall),
                                        ops.add(ops.add(ops.multiply(precision, b2), recall), eps)), 1.0 + b2)
        if self.average == "weighted":
            weights = ops.convert_to_tensor(self.intermediate_weights)
            score = ops.sum(ops.multiply(score, ops.divide(weights, ops.add(ops.sum(weights), eps))))
        elif self.average is not None:
            score = ops.mean(score)
        return score

    def reset_state(self) -> None:
        for v in self._variables:
            v.assign(ops.zeros(tuple(v.shape), dtype=v.dtype))

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "average": self.average, "beta": self.beta,
                "threshold": self.threshold}


class F1Score(FBetaScore):
    """The F1 score (``keras.metrics.F1Score``): :class:`FBetaScore` with ``beta=1``."""

    def __init__(self, average: Any = None, threshold: Any = None, name: str = "f1_score", dtype: Any = None) -> None:
        super().__init__(average=average, beta=1.0, threshold=threshold, name=name, dtype=dtype)

    def get_config(self) -> dict:
        config = super().get_config()
        del config["beta"]
        return config
