"""``keras.regularizers``: weight penalties with Keras 3's classes, numerics and configs.

A regularizer is called on a weight (a :class:`dnnbind.Variable`, a tensor or an array) and returns a
0-d :class:`dnnbind.Tensor` of the weight's dtype, differentiable under a :class:`dnnbind.GradientTape`
(its gradient flows to the variable), which a layer adds to its losses.

As in Keras, ``L1`` and ``OrthogonalRegularizer`` keep their factor as a float32 number (Keras stores it
in a float32 tensor: ``L1(0.01).get_config() == {"l1": 0.009999999776482582}``), while ``L2`` and
``L1L2`` keep Python floats.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import backend, ops
from ._keras_objects import deserialize_object, get_object, serialize_object
from .ops import _core

__all__ = ["Regularizer", "L1", "L2", "L1L2", "OrthogonalRegularizer", "l1", "l2", "l1_l2", "orthogonal_regularizer",
           "get", "serialize", "deserialize"]


def validate_float_arg(value: Any, name: str) -> float:
    """``value`` as a float, which must be finite and non-negative (Keras's check)."""
    if isinstance(value, bool) or not isinstance(value, (float, int)) or math.isinf(value) or math.isnan(value) \
            or value < 0:
        raise ValueError(f"Invalid value for argument {name}: expected a non-negative float.Received: {name}={value}")
    return float(value)


def _float32(value: float) -> float:
    """``value`` rounded to float32, as Keras's ``ops.convert_to_tensor(value)`` stores it."""
    return float(np.float32(value))


class Regularizer:
    """Base class: ``__call__(x)`` returns the penalty of ``x``; subclasses define ``get_config``."""

    def __call__(self, x: Any) -> Any:
        return 0.0

    @classmethod
    def from_config(cls, config: dict) -> "Regularizer":
        return cls(**config)

    def get_config(self) -> dict:
        raise NotImplementedError(f"{self} does not implement get_config()")


class L1L2(Regularizer):
    """``l1 * sum(|x|) + l2 * sum(x**2)`` (None counts as 0)."""

    def __init__(self, l1: float = 0.0, l2: float = 0.0) -> None:
        self.l1 = validate_float_arg(0.0 if l1 is None else l1, name="l1")
        self.l2 = validate_float_arg(0.0 if l2 is None else l2, name="l2")

    def __call__(self, x: Any) -> Any:
        t = _core.tensor(x)
        total = ops.convert_to_tensor(0.0, dtype=t.dtype)
        if self.l1 != 0.0:
            total = ops.add(total, ops.multiply(ops.sum(ops.absolute(t)), self.l1))
        if self.l2 != 0.0:
            total = ops.add(total, ops.multiply(ops.sum(ops.square(t)), self.l2))
        return total

    def get_config(self) -> dict:
        return {"l1": self.l1, "l2": self.l2}


class L1(Regularizer):
    """``l1 * sum(|x|)``."""

    def __init__(self, l1: float = 0.01) -> None:
        self.l1 = _float32(validate_float_arg(0.01 if l1 is None else l1, name="l1"))

    def __call__(self, x: Any) -> Any:
        return ops.multiply(ops.sum(ops.absolute(_core.tensor(x))), self.l1)

    def get_config(self) -> dict:
        return {"l1": self.l1}


class L2(Regularizer):
    """``l2 * sum(x**2)``."""

    def __init__(self, l2: float = 0.01) -> None:
        self.l2 = validate_float_arg(0.01 if l2 is None else l2, name="l2")

    def __call__(self, x: Any) -> Any:
        return ops.multiply(ops.sum(ops.square(_core.tensor(x))), self.l2)

    def get_config(self) -> dict:
        return {"l2": self.l2}


class OrthogonalRegularizer(Regularizer):
    """Pushes the rows (``mode="rows"``) or columns (``"columns"``) of a rank-2 weight towards orthogonality:
    ``factor * mean over pairs i < j of |<u_i, u_j>|`` for the L2-normalised vectors ``u`` (each normalised
    as Keras's ``ops.normalize``: ``x * min(rsqrt(sum(x**2)), 1 / epsilon)``)."""

    def __init__(self, factor: float = 0.01, mode: str = "rows") -> None:
        self.factor = _float32(validate_float_arg(factor, name="factor"))
        if mode not in {"rows", "columns"}:
            raise ValueError('Invalid value for argument `mode`. Expected one of {"rows", "columns"}. '
                             f"Received: mode={mode}")
        self.mode = mode

    def __call__(self, inputs: Any) -> Any:
        t = _core.tensor(inputs)
        if t.ndim != 2:
            raise ValueError(f"Inputs to OrthogonalRegularizer must have rank 2. Received: inputs.shape={tuple(t.shape)}")
        axis = 1 if self.mode == "rows" else 0
        inv_norm = ops.minimum(ops.rsqrt(ops.sum(ops.square(t), axis=axis, keepdims=True)), 1.0 / backend.epsilon())
        unit = ops.multiply(t, inv_norm)
        if self.mode == "rows":
            product, size = ops.matmul(unit, ops.transpose(unit)), t.shape[0]
        else:
            product, size = ops.matmul(ops.transpose(unit), unit), t.shape[1]
        off_diagonal = ops.multiply(product, ops.subtract(1.0, ops.eye(size, dtype=t.dtype)))
        num_pairs = size * (size - 1.0) / 2.0
        return ops.divide(ops.multiply(ops.sum(ops.absolute(off_diagonal)), self.factor * 0.5), num_pairs)

    def get_config(self) -> dict:
        return {"factor": self.factor, "mode": self.mode}


l1, l2, l1_l2, orthogonal_regularizer = L1, L2, L1L2, OrthogonalRegularizer

ALL_OBJECTS_DICT: dict[str, type] = {}
for _cls, _snake in ((Regularizer, "regularizer"), (L1, "l1"), (L2, "l2"), (L1L2, "l1l2"),
                     (OrthogonalRegularizer, "orthogonal_regularizer")):
    ALL_OBJECTS_DICT[_cls.__name__] = ALL_OBJECTS_DICT[_snake] = _cls  # Keras: class names and to_snake_case


def serialize(regularizer: Regularizer) -> dict:
    """Keras's dict: ``{"module": "keras.regularizers", "class_name": "L2", "config": {"l2": 0.01},
    "registered_name": None}``."""
    return serialize_object(regularizer, "keras.regularizers")


def deserialize(config: Any, custom_objects: "dict | None" = None) -> Regularizer:
    """The regularizer :func:`serialize` (or Keras) wrote, or one by name (``"l2"``, ``"L1L2"``)."""
    return deserialize_object(config, ALL_OBJECTS_DICT, custom_objects, "regularizer")


def get(identifier: Any) -> "Regularizer | None":
    """A regularizer from None (None), a name, a serialized dict, a class (instantiated) or a callable."""
    return get_object(identifier, ALL_OBJECTS_DICT, "regularizer")
