"""``keras.constraints``: projections applied to a weight after each optimizer update, with Keras 3's
classes, numerics and configs.

``constraint(w)`` takes a weight (a :class:`dnnbind.Variable`, a tensor or an array) and returns the
constrained value as a :class:`dnnbind.Tensor` (computed with ``keras.ops``, so on the weight's
device); the optimizer assigns it to the variable. Norms are taken over ``axis`` (an int or a list of
ints; Keras's default 0 is each output unit's incoming weights for a Dense kernel ``(in, out)``) and
divided with ``keras.config.epsilon()`` added, as Keras does.
"""

from __future__ import annotations

from typing import Any

from . import backend, ops
from ._keras_objects import deserialize_object, get_object, serialize_object
from .ops import _core

__all__ = ["Constraint", "MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm", "max_norm", "min_max_norm", "non_neg",
           "unit_norm", "get", "serialize", "deserialize"]


def _axis(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


def _norms(w: Any, axis: Any) -> Any:
    return ops.sqrt(ops.sum(ops.square(w), axis=_axis(axis), keepdims=True))


class Constraint:
    """Base class: ``__call__(w)`` returns the constrained weight (here: ``w`` unchanged)."""

    def __call__(self, w: Any) -> Any:
        return w

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict) -> "Constraint":
        return cls(**config)


class MaxNorm(Constraint):
    """Rescales each slice along ``axis`` whose L2 norm exceeds ``max_value`` down to it:
    ``w * clip(norm, 0, max_value) / (epsilon + norm)``."""

    def __init__(self, max_value: float = 2, axis: Any = 0) -> None:
        self.max_value = max_value
        self.axis = axis

    def __call__(self, w: Any) -> Any:
        w = _core.tensor(w)
        norms = _norms(w, self.axis)
        desired = ops.clip(norms, 0, self.max_value)
        return ops.multiply(ops.cast(w, norms.dtype), ops.divide(desired, ops.add(norms, backend.epsilon())))

    def get_config(self) -> dict:
        return {"max_value": self.max_value, "axis": self.axis}


class NonNeg(Constraint):
    """``max(w, 0)``."""

    def __call__(self, w: Any) -> Any:
        return ops.maximum(_core.tensor(w), 0)


class UnitNorm(Constraint):
    """Each slice along ``axis`` divided by its L2 norm (plus epsilon)."""

    def __init__(self, axis: Any = 0) -> None:
        self.axis = axis

    def __call__(self, w: Any) -> Any:
        w = _core.tensor(w)
        norms = _norms(w, self.axis)
        return ops.divide(ops.cast(w, norms.dtype), ops.add(norms, backend.epsilon()))

    def get_config(self) -> dict:
        return {"axis": self.axis}


class MinMaxNorm(Constraint):
    """Moves each slice's L2 norm into ``[min_value, max_value]``, a fraction ``rate`` of the way:
    ``desired = rate * clip(norm, min_value, max_value) + (1 - rate) * norm``, then
    ``w * desired / (epsilon + norm)``."""

    def __init__(self, min_value: float = 0.0, max_value: float = 1.0, rate: float = 1.0, axis: Any = 0) -> None:
        self.min_value = min_value
        self.max_value = max_value
        self.rate = rate
        self.axis = axis

    def __call__(self, w: Any) -> Any:
        w = _core.tensor(w)
        norms = _norms(w, self.axis)
        desired = ops.add(ops.multiply(ops.clip(norms, self.min_value, self.max_value), self.rate),
                          ops.multiply(norms, 1 - self.rate))
        return ops.multiply(ops.cast(w, norms.dtype), ops.divide(desired, ops.add(norms, backend.epsilon())))

    def get_config(self) -> dict:
        return {"min_value": self.min_value, "max_value": self.max_value, "rate": self.rate, "axis": self.axis}


max_norm, min_max_norm, non_neg, unit_norm = MaxNorm, MinMaxNorm, NonNeg, UnitNorm

ALL_OBJECTS_DICT: dict[str, type] = {}
for _cls, _snake in ((Constraint, "constraint"), (MaxNorm, "max_norm"), (MinMaxNorm, "min_max_norm"),
                     (NonNeg, "non_neg"), (UnitNorm, "unit_norm")):
    ALL_OBJECTS_DICT[_cls.__name__] = ALL_OBJECTS_DICT[_snake] = _cls  # Keras: class names and to_snake_case


def serialize(constraint: Constraint) -> dict:
    """Keras's dict: ``{"module": "keras.constraints", "class_name": "MaxNorm", "config": {...},
    "registered_name": None}``."""
    return serialize_object(constraint, "keras.constraints")


def deserialize(config: Any, custom_objects: "dict | None" = None) -> Constraint:
    """The constraint :func:`serialize` (or Keras) wrote, or one by name (``"max_norm"``, ``"NonNeg"``)."""
    return deserialize_object(config, ALL_OBJECTS_DICT, custom_objects, "constraint")


def get(identifier: Any) -> "Constraint | None":
    """A constraint from None (None), a name, a serialized dict, a class (instantiated) or a callable."""
    return get_object(identifier, ALL_OBJECTS_DICT, "constraint")
