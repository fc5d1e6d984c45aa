"""``index_reduce`` on NVRTC kernels (``segment.cu``): the device side of :mod:`dnnbind.kernels.segment`.
A copy of ``x``, then one launch of atomic max/min/product updates on the call's stream; nothing
synchronises. float16/bfloat16 combine in float32 copies, int8/uint8 in int32 copies."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _common as cm
from .elementwise import cast

__all__ = ["index_reduce", "KERNEL_DTYPES"]

_FILE = "segment.cu"
#: the data types segment.cu has kernels for, and the ones that combine in a wider copy
KERNEL_DTYPES = (cm.F32, cm.F64, np.dtype(np.int32), np.dtype(np.int64))
_WIDEN = {cm.F16: cm.F32, cm.BF16: cm.F32, np.dtype(np.int8): np.dtype(np.int32),
          np.dtype(np.uint8): np.dtype(np.int32)}
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def index_reduce(op: str, x: Any, indices: Any, updates: Any, axis: int, *, stream: Any = None) -> Any:
    """See :func:`dnnbind.kernels.segment.index_reduce` (``axis`` non-negative; arguments checked there)."""
    s = cm.stream_of(stream)
    wide = _WIDEN.get(x.dtype)
    if wide is not None:
        res = index_reduce(op, cast(x, wide, stream=s), indices, cast(updates, wide, stream=s), axis, stream=s)
        return cast(res, x.dtype, stream=s)
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"index_reduce: dtype {x.dtype} has no device kernel (float16, bfloat16, float32, float64, "
                        "int8, uint8, int32, int64 do)")
    if indices.dtype not in _INDEX_DTYPES:
        indices = cast(indices, np.dtype(np.int64), stream=s)
    out = cm.empty(x.shape, x.dtype, s)
    cm.memcpy(out, x, s)
    n_idx = int(indices.size)
    inner = cm.size_of(x.shape[axis + 1:])
    total = cm.size_of(updates.shape)
    if total == 0 or int(x.shape[axis]) == 0:
        return out
    name = f"index_reduce_{op}_{cm.suffix(x.dtype)}_{cm.suffix(indices.dtype)}"
    cm.launch(_FILE, name, total, (cm.p(out), cm.p(indices), cm.p(updates), cm.i64(n_idx), cm.i64(inner),
                                   cm.i64(int(x.shape[axis])), cm.i64(total)), s)
    return out
