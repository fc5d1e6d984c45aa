"""Losses with Keras 3 names: differentiable tensors on the tape, with fused kernels for the built-ins.

``loss(y_true, y_pred, sample_weight=None)`` returns a 0-d tensor (Keras 3's ``Loss.__call__``): a
subclass's ``call(y_true, y_pred)`` gives per-sample losses written in ``keras.ops`` and the base class
reduces them (``reduction``: ``"sum_over_batch_size"`` (default), ``"sum"``, ``"mean"``,
``"mean_with_sample_weight"``, ``"none"``/None; ``sample_weight`` multiplies first), exactly as Keras's
``reduce_weighted_values``. dnnbind's built-in losses with the default reduction take one fused kernel
instead (``kernels.softmax_cross_entropy`` and friends compute the loss and its gradient in one pass):
the node they record keeps that gradient, so the backward costs nothing when the seed is one, or one
scale when it is a number. A final softmax with a ``from_logits=False`` cross-entropy is fused by the
model: the loss then sees the logits.

Layout (Keras 3's ``keras/src/losses/``): ``loss.py`` the base class and the reductions, ``core.py`` the fused
built-ins (cross-entropies, MSE) with KL divergence and MAE, ``regression.py`` and ``classification.py`` the
rest; this package holds the registry (:func:`get`, :func:`serialize`, :func:`deserialize`).
"""

from __future__ import annotations

from typing import Any

from . import classification as _classification
from . import regression as _regression
from .classification import *  # noqa: F401,F403
from .core import (BinaryCrossentropy, CategoricalCrossentropy, KLDivergence, MeanSquaredError,
                   SparseCategoricalCrossentropy, binary_crossentropy, categorical_crossentropy, kl_divergence,
                   mean_absolute_error, mean_squared_error, sparse_categorical_crossentropy)
from .loss import (_CLASS_TO_NAME, FunctionLoss, Loss, LossFunctionWrapper, kernel_loss,
                   reduce_weighted_values, squeeze_or_expand_to_same_rank)
from .regression import *  # noqa: F401,F403

__all__ = [
    "Loss",
    "LossFunctionWrapper",
    "SparseCategoricalCrossentropy",
    "CategoricalCrossentropy",
    "BinaryCrossentropy",
    "MeanSquaredError",
    "KLDivergence",
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mean_squared_error",
    "mse",
    "mean_absolute_error",
    "mae",
    "kl_divergence",
    "get",
    "serialize",
    "deserialize",
    "reduce_weighted_values",
]
__all__ += ["FunctionLoss", *_regression.__all__, *_classification.__all__]

mse = mean_squared_error
mae = mean_absolute_error

_BY_NAME: dict[str, type] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "kl_divergence": KLDivergence,
}
_FUNCTIONS = {"sparse_categorical_crossentropy": sparse_categorical_crossentropy,
              "categorical_crossentropy": categorical_crossentropy, "binary_crossentropy": binary_crossentropy,
              "mean_squared_error": mean_squared_error, "kl_divergence": kl_divergence,
              "mean_absolute_error": mean_absolute_error}
for _module in (_regression, _classification):
    for _name in _module.__all__:
        _obj = getattr(_module, _name)
        if isinstance(_obj, type):  # registered under its function's name, as Keras's get("huber")
            _BY_NAME[_obj._fn.__name__] = _obj
        elif _name != "convert_binary_labels_to_hinge":
            _FUNCTIONS[_name] = _obj
_ALIASES = {"mse": "mean_squared_error", "scce": "sparse_categorical_crossentropy",
            "cce": "categorical_crossentropy", "bce": "binary_crossentropy",
            "kld": "kl_divergence", "kullback_leibler_divergence": "kl_divergence",
            "mae": "mean_absolute_error", "mape": "mean_absolute_percentage_error",
            "msle": "mean_squared_logarithmic_error", "logcosh": "log_cosh", "huber_loss": "huber"}
_CLASS_TO_NAME.update({cls.__name__: name for name, cls in _BY_NAME.items()})


def known_names() -> list[str]:
    return sorted([*_BY_NAME, *_ALIASES])


def get(identifier: Any) -> Loss:
    """A :class:`Loss` from a name (``"sparse_categorical_crossentropy"``, ``"mse"``), a class name,
    a config dict, an instance, or one of this module's functions."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Loss):
        return identifier()
    if callable(identifier) and any(identifier is f for f in _FUNCTIONS.values()):
        return _BY_NAME[identifier.__name__]()
    if callable(identifier) and not isinstance(identifier, (str, dict)):
        return LossFunctionWrapper(identifier)
    if isinstance(identifier, dict):
        cls_name = identifier.get("class_name")
        name = _CLASS_TO_NAME.get(cls_name)
        if name is None:
            raise ValueError(f"unknown loss class {cls_name!r}; known: {', '.join(sorted(_CLASS_TO_NAME))}")
        return _BY_NAME[name].from_config(identifier.get("config", {}))
    if isinstance(identifier, str):
        key = identifier.strip()
        name = _CLASS_TO_NAME.get(key) or _ALIASES.get(key.lower(), key.lower())
        if name in _BY_NAME:
            return _BY_NAME[name]()
        raise ValueError(f"unknown loss {identifier!r}; known losses: {', '.join(known_names())}")
    raise TypeError(f"cannot interpret {identifier!r} as a loss; use a name such as "
                    "'sparse_categorical_crossentropy' or a dnnbind.losses.Loss")


def serialize(loss: Loss) -> dict:
    return {"class_name": type(loss).__name__, "config": loss.get_config()}


def deserialize(config: dict) -> Loss:
    return get(config)
