"""Metrics with Keras 3 names, accumulated on the device.

A metric keeps a running total in a 0-d float32 array on the predictions' device (updated in
place by ``kernels.axpy``) and a host-side sample count (known without asking the device); a weighted
update counts its weights on the device too. Nothing is read back until :meth:`Metric.result` is called
(the progress bar, the end of an epoch). Where a user's ``train_step`` reads ``result()`` inside the
step (a CUDA graph replays it with no Python), the trainer has the metric keep its count on the device
as well (:meth:`Metric._count_on_device`). The metrics with more state (confusion counts, IoU's
confusion matrix, F-scores, R2) keep it in device variables updated in ``keras.ops``.

Layout (Keras 3's ``keras/src/metrics/``): ``metric.py`` the base, the means and the kernel-backed
accuracies and confusion counts; ``accuracy.py`` the accuracy functions; ``regression.py``,
``probabilistic.py``, ``confusion.py``, ``iou.py`` the rest; this package holds the registry.
"""

from __future__ import annotations

from typing import Any

from ..losses import classification as _cls_losses
from ..losses import core as _core_losses
from ..losses import regression as _reg_losses
from . import accuracy as _accuracy
from . import confusion as _confusion
from . import iou as _iou
from . import metric as _metric
from . import probabilistic as _probabilistic
from . import regression as _regression
from .accuracy import *  # noqa: F401,F403
from .confusion import *  # noqa: F401,F403
from .iou import *  # noqa: F401,F403
from .metric import *  # noqa: F401,F403
from .metric import _CLASS_TO_NAME, Metric, _AutoAccuracy, _snake
from .probabilistic import *  # noqa: F401,F403
from .regression import *  # noqa: F401,F403

# the loss functions Keras 3 also exports as metrics (per-sample values)
binary_crossentropy = _core_losses.binary_crossentropy
categorical_crossentropy = _core_losses.categorical_crossentropy
sparse_categorical_crossentropy = _core_losses.sparse_categorical_crossentropy
mean_squared_error = _core_losses.mean_squared_error
mean_absolute_error = _core_losses.mean_absolute_error
kl_divergence = _core_losses.kl_divergence
binary_focal_crossentropy = _cls_losses.binary_focal_crossentropy
categorical_focal_crossentropy = _cls_losses.categorical_focal_crossentropy
hinge = _cls_losses.hinge
squared_hinge = _cls_losses.squared_hinge
categorical_hinge = _cls_losses.categorical_hinge
huber = _reg_losses.huber
log_cosh = _reg_losses.log_cosh
mean_absolute_percentage_error = _reg_losses.mean_absolute_percentage_error
mean_squared_logarithmic_error = _reg_losses.mean_squared_logarithmic_error
poisson = _reg_losses.poisson

_LOSS_FUNCTIONS = ["binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy",
                   "mean_squared_error", "mean_absolute_error", "kl_divergence", "binary_focal_crossentropy",
                   "categorical_focal_crossentropy", "hinge", "squared_hinge", "categorical_hinge", "huber",
                   "log_cosh", "mean_absolute_percentage_error", "mean_squared_logarithmic_error", "poisson"]

__all__ = sorted({*_metric.__all__, *_accuracy.__all__, *_regression.__all__, *_probabilistic.__all__,
                  *_confusion.__all__, *_iou.__all__, *_LOSS_FUNCTIONS, "get", "serialize", "deserialize",
                  "known_names"})

_BY_NAME: dict[str, type] = {
    "accuracy": Accuracy,
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "categorical_accuracy": CategoricalAccuracy,
    "binary_accuracy": BinaryAccuracy,
    "top_k_categorical_accuracy": TopKCategoricalAccuracy,
    "sparse_top_k_categorical_accuracy": SparseTopKCategoricalAccuracy,
    "true_positives": TruePositives,
    "false_positives": FalsePositives,
    "true_negatives": TrueNegatives,
    "false_negatives": FalseNegatives,
    "precision": Precision,
    "recall": Recall,
    "mean_squared_error": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError,
    "kl_divergence": KLDivergence,
    "auc": AUC,
}
_CLASS_TO_NAME.update({cls.__name__: name for name, cls in _BY_NAME.items()})
# Keras 3 resolves every metric class by its snake-case name ("f1_score", "mean_io_u", "r2_score") and the
# wrapped functions by theirs ("poisson", "huber"...: a mean of the function, as compile wraps it)
for _module in (_regression, _probabilistic, _confusion, _iou):
    for _name in _module.__all__:
        _obj = getattr(_module, _name)
        if isinstance(_obj, type):
            _BY_NAME.setdefault(_snake(_name), _obj)
_BY_NAME.setdefault("sum", Sum)
_BY_NAME.setdefault("mean", Mean)
_FUNCTION_CLASSES = {"mean_absolute_percentage_error": MeanAbsolutePercentageError,
                     "mean_squared_logarithmic_error": MeanSquaredLogarithmicError, "log_cosh": LogCoshError,
                     "logcosh": LogCoshError, "pearson_correlation": PearsonCorrelation,
                     "concordance_correlation": ConcordanceCorrelation}
for _name, _cls in _FUNCTION_CLASSES.items():
    _BY_NAME.setdefault(_name, _cls)
_ALIASES = {"acc": "accuracy", "mse": "mean_squared_error", "mae": "mean_absolute_error", "kld": "kl_divergence",
            "mape": "mean_absolute_percentage_error", "msle": "mean_squared_logarithmic_error",
            "rmse": "root_mean_squared_error", "iou": "io_u", "mean_iou": "mean_io_u", "binary_iou": "binary_io_u",
            "one_hot_iou": "one_hot_io_u", "one_hot_mean_iou": "one_hot_mean_io_u"}
#: names Keras 3 resolves to a function only (no class of the same meaning): compile wraps them in a mean
_WRAPPED_FUNCTIONS = {"binary_focal_crossentropy": binary_focal_crossentropy,
                      "categorical_focal_crossentropy": categorical_focal_crossentropy, "huber": huber}


_BY_CLASS_NAME = {cls.__name__: cls for cls in _BY_NAME.values()}


def known_names() -> list[str]:
    return sorted([*_BY_NAME, *_ALIASES])


def compile_metric(identifier: Any) -> Metric:
    """A metric for ``compile``: as :func:`get`, except that the strings ``"accuracy"`` and ``"acc"`` give the
    accuracy that picks binary, categorical or sparse from the shapes (Keras 3's ``compile_utils``), named
    as given."""
    if isinstance(identifier, str) and identifier.strip().lower() in ("accuracy", "acc"):
        return _AutoAccuracy(name=identifier.strip())
    return get(identifier)


def get(identifier: Any) -> Metric:
    """A metric from a name (``"accuracy"``: :class:`Accuracy`, exact equality, as Keras 3's
    ``metrics.get``; ``"acc"``, ``"top_k_categorical_accuracy"``...), a config dict, a class or an
    instance. ``"acc"`` keeps the name ``"acc"`` in logs, as Keras. ``compile`` reads its metrics with
    :func:`compile_metric`."""
    if isinstance(identifier, Metric):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Metric):
        return identifier()
    if isinstance(identifier, str):
        key = identifier.strip()
        name = _CLASS_TO_NAME.get(key) or _ALIASES.get(key.lower(), key.lower())
        if name not in _BY_NAME and key in _BY_CLASS_NAME:
            name = _snake(key)
        if name in _WRAPPED_FUNCTIONS:
            return MeanMetricWrapper(_WRAPPED_FUNCTIONS[name], name=key)
        if name not in _BY_NAME:
            raise ValueError(f"unknown metric {identifier!r}; known metrics: {', '.join(known_names())}")
        cls = _BY_NAME[name]
        return cls(name=key) if key.lower() in _ALIASES or key.lower() in _FUNCTION_CLASSES else cls()
    if isinstance(identifier, dict):
        if identifier.get("class_name") == "_AutoAccuracy":  # compile's "accuracy", copied per output
            return _AutoAccuracy(**identifier.get("config", {}))
        name = _CLASS_TO_NAME.get(identifier.get("class_name"))
        if name is None and identifier.get("class_name") in _BY_CLASS_NAME:
            return _BY_CLASS_NAME[identifier["class_name"]](**identifier.get("config", {}))
        if name is None:
            raise ValueError(f"unknown metric class {identifier.get('class_name')!r}")
        return _BY_NAME[name](**identifier.get("config", {}))
    raise TypeError(f"cannot interpret {identifier!r} as a metric; use a name such as 'accuracy'")


def serialize(metric: Metric) -> dict:
    return {"class_name": type(metric).__name__, "config": metric.get_config()}


def deserialize(config: dict) -> Metric:
    """A metric from :func:`serialize`'s dict (Keras 3's ``keras.metrics.deserialize``)."""
    return get(config)
