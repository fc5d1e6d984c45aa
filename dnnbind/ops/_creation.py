"""Tensor constructors of ``keras.ops``: ``zeros``, ``ones``, ``full``, ``empty`` and their ``*_like``,
``arange``, ``eye``, ``identity``, ``tri``, ``tril``, ``triu``. New tensors go on the default device
(fill kernels there: nothing is uploaded); ``*_like`` go where their argument is."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..autodiff.tensor import Tensor
from ..kernels import numeric as numeric_kernels
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors

__all__ = ["zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "arange", "eye",
           "identity", "tri", "tril", "triu"]


def _shape(shape: Any) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def _fill(shape: Any, value: Any, dtype: Any, device: Any = None) -> Tensor:
    return Tensor(numeric_kernels.full(_shape(shape), value, np_dtype(dtype), device=device))


@keras_op(differentiable=False)
def zeros(shape: Any, dtype: Any = None) -> Tensor:
    return _fill(shape, 0, dtype)


@keras_op(differentiable=False)
def ones(shape: Any, dtype: Any = None) -> Tensor:
    return _fill(shape, 1, dtype)


@keras_op(differentiable=False)
def empty(shape: Any, dtype: Any = None) -> Tensor:
    """``keras.ops.empty``: dnnbind fills it with zeros (a fill kernel), so nothing uninitialised leaks."""
    return _fill(shape, 0, dtype)


@keras_op(differentiable=False)
def full(shape: Any, fill_value: Any, dtype: Any = None) -> Tensor:
    """``keras.ops.full``: ``dtype`` None is floatx (Keras's rule, whatever the value's type)."""
    if isinstance(fill_value, (Tensor,)) or hasattr(fill_value, "shape") and getattr(fill_value, "ndim", 0):
        t = _core.tensor(fill_value)
        dt = np_dtype(dtype)
        return _core.REGISTRY["broadcast_to"]["fn"](_core.REGISTRY["cast"]["fn"](t, dt), _shape(shape))
    value = fill_value.item() if hasattr(fill_value, "item") else fill_value
    return _fill(shape, value, dtype)


def _like(x: Any, value: Any, dtype: Any) -> Tensor:
    (t,) = tensors(x)
    dt = np_dtype(dtype) if dtype is not None else t.dtype
    return Tensor(numeric_kernels.full(tuple(t.shape), value, dt, device=t.device))


@keras_op(differentiable=False)
def zeros_like(x: Any, dtype: Any = None) -> Tensor:
    return _like(x, 0, dtype)


@keras_op(differentiable=False)
def ones_like(x: Any, dtype: Any = None) -> Tensor:
    return _like(x, 1, dtype)


@keras_op(differentiable=False)
def empty_like(x: Any, dtype: Any = None) -> Tensor:
    return _like(x, 0, dtype)


@keras_op(differentiable=False)
def full_like(x: Any, fill_value: Any, dtype: Any = None) -> Tensor:
    value = fill_value.item() if hasattr(fill_value, "item") else fill_value
    return _like(x, value, dtype)


@keras_op(differentiable=False)
def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Tensor:
    """``keras.ops.arange``: ``dtype`` None is Keras's result type of start, stop and step (Python ints:
    int32, floats: floatx)."""
    if stop is None:
        start, stop = 0, start
    if step is None:
        step = 1
    vals = [v.item() if hasattr(v, "item") else v for v in (start, stop, step)]
    start, stop, step = vals
    if step == 0:
        raise ValueError("arange: step must not be zero")
    dt = np_dtype(dtype) if dtype is not None else np_dtype(result_type(*vals))
    n = max(0, int(math.ceil((stop - start) / step)))
    return Tensor(numeric_kernels.iota(n, start, step, dt, device=None))


def _eye(N, M=None, k=0, dtype=None):  # noqa: N803 (Keras's argument names)
    """``keras.ops.eye(N, M=None, k=0, dtype=None)``: ones on diagonal ``k``."""
    return tri(N, M, k=k, dtype=dtype, _band=True)


eye = keras_op(_eye, name="eye", differentiable=False)


@keras_op(differentiable=False)
def identity(n: int, dtype: Any = None) -> Tensor:
    return eye(n, dtype=dtype)


def _tri(N, M=None, k=0, dtype=None, _band=False):  # noqa: N803 (Keras's argument names)
    """``keras.ops.tri``: ones at and below diagonal ``k`` (a mask computed by kernels on the device)."""
    n = int(N)
    m = n if M is None else int(M)
    dt = np_dtype(dtype)
    rows = numeric_kernels.iota(n, 0, 1, np.int32, device=None)
    cols = numeric_kernels.iota(m, 0, 1, np.int32, device=None)
    diff = numeric_kernels.binary("subtract", cols.reshape(1, m), rows.reshape(n, 1), dtype=np.int32)
    mask = numeric_kernels.binary("equal" if _band else "less_equal", diff, int(k))
    return Tensor(numeric_kernels.where(mask, 1, 0, dtype=dt))


tri = keras_op(_tri, name="tri", differentiable=False)


def _triangle(x: Any, k: int, lower: bool) -> Tensor:
    (t,) = tensors(x)
    if t.ndim < 2:
        raise ValueError(f"{'tril' if lower else 'triu'}: needs a tensor of rank >= 2, got shape {t.shape}")
    n, m = t.shape[-2], t.shape[-1]
    keep = tri(n, m, k=k if lower else k - 1, dtype="bool")
    if not lower:
        keep = _core.REGISTRY["logical_not"]["fn"](keep)
    where = _core.REGISTRY["where"]["fn"]
    return where(keep, t, _core.REGISTRY["zeros_like"]["fn"](t))


@keras_op
def tril(x: Any, k: int = 0) -> Tensor:
    return _triangle(x, int(k), True)


@keras_op
def triu(x: Any, k: int = 0) -> Tensor:
    return _triangle(x, int(k), False)
