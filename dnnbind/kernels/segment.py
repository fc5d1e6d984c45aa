"""The scatter-with-a-reduction primitive the segment reductions of ``keras.ops`` need, on either backend.

:func:`index_reduce` is :func:`dnnbind.kernels.numeric.index_add` with ``max``, ``min`` or ``prod`` in
place of the sum (PyTorch's ``index_reduce`` with ``include_self=True``). The NumPy code here is the
reference (``numpy.maximum.at`` and friends); ``dnnbind.kernels._cuda.segment`` (``segment.cu``)
implements the same signature with one NVRTC kernel of atomic updates on the call's stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import BFLOAT16
from ._dispatch import as_array, route

__all__ = ["REDUCE_OPS", "index_reduce"]

REDUCE_OPS = ("max", "min", "prod")
_LOW = (np.dtype(np.float16), BFLOAT16)
_UFUNC = {"max": np.maximum, "min": np.minimum, "prod": np.multiply}


def index_reduce(op: str, x: Any, indices: Any, updates: Any, axis: int = 0, *, stream: Any = None) -> Any:
    """A copy of ``x`` with each slice of ``updates`` combined by ``op`` (:data:`REDUCE_OPS`) into the slice
    of ``x`` that ``indices`` names along ``axis``: ``out[..., indices[j], ...] = op(out[..., indices[j], ...],
    updates[..., j, ...])`` for every ``j`` (duplicates combine; ``updates`` has ``take(x, indices, axis)``'s
    shape, ``indices`` is 1-d). ``max``/``min`` propagate NaN, as ``numpy.maximum``; the order of a float
    ``prod`` over duplicates is not fixed on the device. Negative indices count from the end; out-of-range
    indices raise ``IndexError`` on NumPy and are clamped into range on the device (as ``index_add``).
    float16/bfloat16 combine in float32."""
    name = "index_reduce"
    if op not in REDUCE_OPS:
        raise ValueError(f"{name}: op must be one of {REDUCE_OPS}, got {op!r}")
    x = as_array(x)
    indices = as_array(indices)
    updates = as_array(updates)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{name}: indices must be an integer array, got dtype {indices.dtype}")
    if indices.ndim != 1:
        raise ValueError(f"{name}: indices must be 1-d, got shape {tuple(indices.shape)}")
    if x.ndim == 0:
        raise ValueError(f"{name}: x must have rank >= 1")
    if not -x.ndim <= int(axis) < x.ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for an array of rank {x.ndim}")
    ax = int(axis) % x.ndim
    want = tuple(x.shape[:ax]) + tuple(indices.shape) + tuple(x.shape[ax + 1:])
    if tuple(updates.shape) != want:
        raise ValueError(f"{name}: updates must have shape {want} (x {tuple(x.shape)}, indices "
                         f"{tuple(indices.shape)}, axis {ax}), got {tuple(updates.shape)}")
    if updates.dtype != x.dtype:
        raise TypeError(f"{name}: updates have dtype {updates.dtype} but x has {x.dtype}; they must match")
    impl = route(name, "segment", x=x, indices=indices, updates=updates)
    if impl is not None:
        return impl.index_reduce(op, x, indices, updates, ax, stream=stream)
    n = int(x.shape[ax])
    idx = indices.astype(np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = int(idx.max()) if idx.max() >= n else int(idx.min())
        raise IndexError(f"{name}: index {bad} is out of bounds for axis {ax} of size {n}")
    idx = np.where(idx < 0, idx + n, idx)
    acc = x.astype(np.float32) if x.dtype in _LOW else x.copy()
    moved = np.moveaxis(acc, ax, 0)
    with np.errstate(all="ignore"):
        _UFUNC[op].at(moved, idx, np.moveaxis(updates, ax, 0).astype(acc.dtype))
    return acc.astype(x.dtype) if acc.dtype != x.dtype else acc
