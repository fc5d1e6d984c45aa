"""Probabilistic and hinge metrics with Keras 3 names (``probabilistic_metrics.py``, ``hinge_metrics.py``): the
(weighted) means of the loss functions, accumulated on the device."""

from __future__ import annotations

from typing import Any

from ..losses import classification as _cls_losses
from ..losses import core as _core_losses
from ..losses import regression as _reg_losses
from .regression import _Wrapper

__all__ = ["BinaryCrossentropy", "CategoricalCrossentropy", "SparseCategoricalCrossentropy", "Poisson", "Hinge",
           "SquaredHinge", "CategoricalHinge"]


class BinaryCrossentropy(_Wrapper):
    """The mean of :func:`~dnnbind.losses.binary_crossentropy` (``keras.metrics.BinaryCrossentropy``)."""
    _fn = staticmethod(_core_losses.binary_crossentropy)
    _config = ("from_logits", "label_smoothing")

    def __init__(self, name: str = "binary_crossentropy", dtype: Any = None, from_logits: bool = False,
                 label_smoothing: float = 0) -> None:
        super().__init__(name=name, dtype=dtype, from_logits=bool(from_logits), label_smoothing=label_smoothing)


class CategoricalCrossentropy(_Wrapper):
    """The mean of :func:`~dnnbind.losses.categorical_crossentropy` (``keras.metrics.CategoricalCrossentropy``)."""
    _fn = staticmethod(_core_losses.categorical_crossentropy)
    _config = ("from_logits", "label_smoothing", "axis")

    def __init__(self, name: str = "categorical_crossentropy", dtype: Any = None, from_logits: bool = False,
                 label_smoothing: float = 0, axis: int = -1) -> None:
        super().__init__(name=name, dtype=dtype, from_logits=bool(from_logits), label_smoothing=label_smoothing,
                         axis=axis)


class SparseCategoricalCrossentropy(_Wrapper):
    """The mean of :func:`~dnnbind.losses.sparse_categorical_crossentropy`
    (``keras.metrics.SparseCategoricalCrossentropy``)."""
    _fn = staticmethod(_core_losses.sparse_categorical_crossentropy)
    _config = ("from_logits", "ignore_class", "axis")

    def __init__(self, name: str = "sparse_categorical_crossentropy", dtype: Any = None, from_logits: bool = False,
                 ignore_class: Any = None, axis: int = -1) -> None:
        if axis != -1:
            raise NotImplementedError("SparseCategoricalCrossentropy metric: only axis=-1 is supported")
        super().__init__(name=name, dtype=dtype, from_logits=bool(from_logits), ignore_class=ignore_class, axis=axis)


class Poisson(_Wrapper):
    """The mean of :func:`~dnnbind.losses.poisson` (``keras.metrics.Poisson``)."""
    _fn = staticmethod(_reg_losses.poisson)

    def __init__(self, name: str = "poisson", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class Hinge(_Wrapper):
    """The mean of :func:`~dnnbind.losses.hinge` (``keras.metrics.Hinge``)."""
    _fn = staticmethod(_cls_losses.hinge)

    def __init__(self, name: str = "hinge", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class SquaredHinge(_Wrapper):
    """The mean of :func:`~dnnbind.losses.squared_hinge` (``keras.metrics.SquaredHinge``)."""
    _fn = staticmethod(_cls_losses.squared_hinge)

    def __init__(self, name: str = "squared_hinge", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)


class CategoricalHinge(_Wrapper):
    """The mean of :func:`~dnnbind.losses.categorical_hinge` (``keras.metrics.CategoricalHinge``)."""
    _fn = staticmethod(_cls_losses.categorical_hinge)

    def __init__(self, name: str = "categorical_hinge", dtype: Any = None) -> None:
        super().__init__(name=name, dtype=dtype)
