"""Gathers and scatters of ``keras.ops``: ``take``, ``take_along_axis``, ``scatter``, ``scatter_update``,
``slice``, ``slice_update``, ``one_hot``, ``nonzero``, and the two primitives their VJPs need,
``gather_nd`` and ``index_add`` (dnnbind names). Each gather's VJP is the matching scatter-add and
back. Out-of-range indices raise on NumPy and are clamped on the device (see kernels.numeric)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import is_float, keras_op, make, np_dtype, tensors
from ._shape import c_strides, reshape, view_strided

__all__ = ["take", "take_along_axis", "gather_nd", "index_add", "scatter", "scatter_update", "slice",
           "slice_update", "one_hot", "nonzero"]


def _int_index(t: Tensor) -> Tensor:
    if t.dtype.kind not in "iu":
        if is_float(t.dtype) or t.dtype.kind == "b":
            raise TypeError(f"indices must be integers, got dtype {t.dtype}")
    return t


@keras_op
def take(x: Any, indices: Any, axis: Any = None) -> Tensor:
    """``keras.ops.take`` (``axis`` None: of the flattened tensor); the VJP adds into the taken rows."""
    t, idx = tensors(x, indices)
    idx = _int_index(idx)
    out = N.take(t.data, idx.data, None if axis is None else int(axis))
    if not is_float(t.dtype):
        return Tensor(out)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        if axis is None:
            zeros = Tensor(N.full((t.size,), 0, g.dtype, device=g.device))
            return (reshape(index_add(zeros, idx, reshape(g, tuple(idx.shape))), shape), None)
        zeros = Tensor(N.full(shape, 0, g.dtype, device=g.device))
        return (index_add(zeros, idx, g, axis=int(axis) % len(shape)), None)

    return make(out, (t, None), backward, "take")


@keras_op
def index_add(x: Any, indices: Any, updates: Any, axis: int = 0) -> Tensor:
    """``x`` with ``updates`` added at ``indices`` along ``axis`` (dnnbind; torch's ``index_add``)."""
    t, idx, u = tensors(x, indices, updates)
    ax = int(axis) % max(t.ndim, 1)
    if u.dtype != t.dtype:
        u = _core.REGISTRY["cast"]["fn"](u, t.dtype)
    out = N.index_add(t.data, idx.data, u.data, ax)
    if not is_float(t.dtype):
        return Tensor(out)
    return make(out, (t, None, u), lambda node, g: (g, None, take(g, idx, axis=ax)), "index_add")


@keras_op
def take_along_axis(x: Any, indices: Any, axis: Any = None) -> Tensor:
    """``keras.ops.take_along_axis`` (``axis`` None: of the flattened tensor)."""
    t, idx = tensors(x, indices)
    if axis is None:
        t, axis = reshape(t, (-1,)), 0
        idx = reshape(idx, (-1,))
    ax = int(axis) % t.ndim
    out = N.take_along_axis(t.data, idx.data, ax)
    if not is_float(t.dtype):
        return Tensor(out)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        # scatter-add g back: flat positions of every taken element
        bshape = tuple(g.shape)
        reg = _core.REGISTRY
        pos = reg["broadcast_to"]["fn"](idx, bshape)
        n = shape[ax]
        pos = reg["where"]["fn"](reg["less"]["fn"](pos, 0), reg["add"]["fn"](pos, n), pos)
        coords = []
        for d in range(len(bshape)):
            if d == ax:
                coords.append(reg["cast"]["fn"](pos, "int32"))
            else:
                shp = [1] * len(bshape)
                shp[d] = bshape[d]
                ar = reshape(reg["arange"]["fn"](bshape[d], dtype="int32"), shp)
                coords.append(reg["broadcast_to"]["fn"](ar, bshape))
        full_shape = tuple(bshape[d] if d != ax else n for d in range(len(bshape)))
        zeros = Tensor(N.full(full_shape, 0, g.dtype, device=g.device))
        summed = scatter_add_nd(zeros, reg["stack"]["fn"](coords, axis=-1), g)
        if full_shape != shape:
            summed = _core.unbroadcast(summed, shape)
        return (summed, None)

    return make(out, (t, None), backward, "take_along_axis")


@keras_op
def gather_nd(x: Any, indices: Any) -> Tensor:
    """``x[indices[..., 0], ..., indices[..., K-1]]`` (dnnbind; TensorFlow's ``gather_nd``)."""
    t, idx = tensors(x, indices)
    out = N.gather_nd(t.data, idx.data)
    if not is_float(t.dtype):
        return Tensor(out)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        zeros = Tensor(N.full(shape, 0, g.dtype, device=g.device))
        return (scatter_add_nd(zeros, idx, g), None)

    return make(out, (t, None), backward, "gather_nd")


def scatter_add_nd(x: Tensor, idx: Tensor, updates: Tensor) -> Tensor:
    """``x`` with ``updates`` added at the ``(..., K)`` indices, differentiable in ``x`` and ``updates``."""
    out = N.scatter_nd(x.data, idx.data, updates.data, mode="add")
    return make(out, (x, None, updates), lambda node, g: (g, None, gather_nd(g, idx)), "scatter_add")


@keras_op
def scatter(indices: Any, values: Any, shape: Any) -> Tensor:
    """``keras.ops.scatter``: zeros of ``shape`` with ``values`` added at ``indices`` (``(N, K)``;
    duplicates add up, as Keras's JAX and TensorFlow backends do)."""
    idx, v = tensors(indices, values)
    zeros = Tensor(N.full(tuple(int(s) for s in shape), 0, v.dtype, device=v.device))
    return scatter_add_nd(zeros, idx, v)


@keras_op
def scatter_update(inputs: Any, indices: Any, updates: Any) -> Tensor:
    """``keras.ops.scatter_update``: ``inputs`` with the entries at ``indices`` replaced by ``updates``."""
    t, idx, u = tensors(inputs, indices, updates)
    if u.dtype != t.dtype:
        u = _core.REGISTRY["cast"]["fn"](u, t.dtype)
    out = N.scatter_nd(t.data, idx.data, u.data, mode="set")
    if not is_float(t.dtype):
        return Tensor(out)

    def backward(node: Any, g: Tensor) -> tuple:
        zero_at = N.scatter_nd(N.full(tuple(t.shape), 1, g.dtype, device=g.device), idx.data,
                               N.full(tuple(u.shape), 0, g.dtype, device=g.device), mode="set")
        return (_core.REGISTRY["multiply"]["fn"](g, Tensor(zero_at)), None, gather_nd(g, idx))

    return make(out, (t, None, u), backward, "scatter_update")


def _starts(start_indices: Any, ndim: int) -> list[int]:
    vals = start_indices.numpy() if isinstance(start_indices, Tensor) else start_indices
    out = [int(v) for v in np.asarray(vals).reshape(-1)]
    if len(out) != ndim:
        raise ValueError(f"start_indices must have one entry per axis ({ndim}), got {len(out)}")
    return out


@keras_op
def slice(inputs: Any, start_indices: Any, shape: Any) -> Tensor:  # noqa: A001
    """``keras.ops.slice``: the block of ``shape`` at ``start_indices`` (Python ints, or a tensor read on
    the host)."""
    (t,) = tensors(inputs)
    starts = _starts(start_indices, t.ndim)
    size = tuple(int(s) if int(s) != -1 else t.shape[i] - starts[i] for i, s in enumerate(shape))
    for i, (s0, n) in enumerate(zip(starts, size)):
        if s0 < 0 or s0 + n > t.shape[i]:
            raise ValueError(f"slice: the block starting at {starts} of shape {size} leaves the tensor of shape "
                             f"{t.shape} on axis {i}")
    cs = c_strides(t.shape)
    return view_strided(t, size, cs, sum(s * c for s, c in zip(starts, cs)), "slice")


@keras_op
def slice_update(inputs: Any, start_indices: Any, updates: Any) -> Tensor:
    """``keras.ops.slice_update``: ``inputs`` with the block at ``start_indices`` replaced by ``updates``."""
    t, u = tensors(inputs, updates)
    starts = _starts(start_indices, t.ndim)
    if u.dtype != t.dtype:
        u = _core.REGISTRY["cast"]["fn"](u, t.dtype)
    size = tuple(u.shape)
    for i, (s0, n) in enumerate(zip(starts, size)):
        if s0 < 0 or s0 + n > t.shape[i]:
            raise ValueError(f"slice_update: updates of shape {size} at {starts} leave the tensor of shape {t.shape}")
    cs = c_strides(t.shape)
    offset = sum(s * c for s, c in zip(starts, cs))
    out = N.strided_copy(t.data, tuple(t.shape), cs, 0)
    N.strided_assign(out, size, cs, offset, u.data)
    if not is_float(t.dtype):
        return Tensor(out)

    def backward(node: Any, g: Tensor) -> tuple:
        gx = N.strided_copy(g.data, tuple(g.shape), cs, 0)
        N.strided_assign(gx, size, cs, offset, 0)
        return (Tensor(gx) if not _core.engine.recording() else
                _core.REGISTRY["multiply"]["fn"](g, slice_update(_core.REGISTRY["ones_like"]["fn"](g), starts,
                                                                 _core.REGISTRY["zeros"]["fn"](size, g.dtype))),
                view_strided(g, size, cs, offset, "slice"))

    return make(out, (t, u), backward, "slice_update")


@keras_op(differentiable=False, family="nn")
def one_hot(x: Any, num_classes: int, axis: int = -1, dtype: Any = None, sparse: bool = False) -> Tensor:
    """``keras.ops.one_hot``: floatx ones at the class of each entry (out-of-range classes: all zeros)."""
    if sparse:
        raise ValueError("one_hot: dnnbind has no sparse tensors")
    (t,) = tensors(x)
    dt = np_dtype(dtype)
    classes = N.iota(int(num_classes), 0, 1, t.dtype if t.dtype.kind in "iu" else np.int32, device=t.device)
    expanded = t.data.reshape(*t.shape, 1)
    hot = N.binary("equal", expanded, classes.reshape(*([1] * t.ndim), int(num_classes)))
    out = Tensor(N.where(hot, 1, 0, dtype=dt))
    if axis != -1 and axis != t.ndim:
        out = _core.REGISTRY["moveaxis"]["fn"](out, -1, axis)
    return out


@keras_op(differentiable=False)
def nonzero(x: Any) -> tuple:
    """``keras.ops.nonzero``: a tuple of int32 index tensors, one per axis (reads ``x`` on the host: the
    result's length depends on it)."""
    (t,) = tensors(x)
    host = t.numpy()
    like = t.data if _core.backend.is_device_array(t.data) else None
    return tuple(_core.tensor(np.ascontiguousarray(i.astype(np.int32)), like) for i in np.nonzero(host))
