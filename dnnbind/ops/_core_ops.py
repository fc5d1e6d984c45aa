"""The ``keras.ops`` core namespace: ``stop_gradient``, ``shape``, ``dtype``, ``ndim``, ``size``,
``convert_to_tensor``, ``convert_to_numpy``, ``is_tensor``, ``custom_gradient``, ``copy``,
``identity``-like helpers. Control flow (``cond``, ``scan``, ``fori_loop``...) lives in ``_control``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autodiff import function as _function
from ..autodiff.tensor import Tensor, is_tensor as _is_tensor
from ..kernels import numeric as N
from . import _core
from ._core import convert_to_tensor, keras_op, make, standardize_dtype, tensors
from ._shape import c_strides

__all__ = ["stop_gradient", "shape", "dtype", "ndim", "size", "convert_to_tensor", "convert_to_numpy", "is_tensor",
           "custom_gradient", "copy", "array"]

convert_to_tensor = keras_op(convert_to_tensor, name="convert_to_tensor", differentiable=True, family="core")


@keras_op(family="core", differentiable=False)
def stop_gradient(variable: Any) -> Tensor:
    """``keras.ops.stop_gradient``: the same values, as a constant to every tape."""
    (t,) = tensors(variable)
    if t._node is None:
        return t
    return Tensor(t.data)


def shape(x: Any) -> tuple:
    """``keras.ops.shape``: a tuple of ints (``None`` for an unknown dimension of a symbolic tensor)."""
    return tuple(x.shape)


def dtype(x: Any) -> str:
    """``keras.ops.dtype``: the dtype's Keras name."""
    return standardize_dtype(x.dtype if hasattr(x, "dtype") else _core.tensor(x).dtype)


def ndim(x: Any) -> int:
    return len(x.shape) if hasattr(x, "shape") else _core.tensor(x).ndim


def size(x: Any) -> int:
    return int(np.prod(x.shape)) if hasattr(x, "shape") else _core.tensor(x).size


for _name in ("shape", "dtype", "ndim", "size"):
    _core.REGISTRY[_name] = {"fn": globals()[_name], "differentiable": False, "family": "core"}


def convert_to_numpy(x: Any) -> np.ndarray:
    """``keras.ops.convert_to_numpy``: a host NumPy array (an explicit device-to-host copy on a GPU)."""
    if isinstance(x, Tensor):
        return x.numpy()
    if hasattr(x, "numpy") and hasattr(x, "_leaf"):
        return x.numpy()
    return np.asarray(_core.raw(x) if not _core.backend.is_device_array(x) else _core.backend.to_numpy(x))


def is_tensor(x: Any) -> bool:
    """``keras.ops.is_tensor``: a dnnbind Tensor."""
    return _is_tensor(x)


for _name in ("convert_to_numpy", "is_tensor"):
    _core.REGISTRY[_name] = {"fn": globals()[_name], "differentiable": False, "family": "core"}

custom_gradient = _function.custom_gradient
# (its gradients are the user's: tested in tests/test_autodiff.py, not by finite differences)
_core.REGISTRY["custom_gradient"] = {"fn": custom_gradient, "differentiable": False, "family": "core"}


@keras_op
def copy(x: Any) -> Tensor:
    """``keras.ops.copy``: a new tensor with the same values (one copy kernel)."""
    (t,) = tensors(x)
    out = N.strided_copy(t.data, tuple(t.shape), c_strides(t.shape), 0)
    return make(out, (t,), lambda node, g: (g,), "copy")


@keras_op
def array(x: Any, dtype: Any = None) -> Tensor:
    """``keras.ops.array``: ``convert_to_tensor``."""
    return convert_to_tensor(x, dtype)
