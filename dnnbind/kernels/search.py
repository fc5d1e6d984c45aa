"""Binary search over a sorted 1-d array: the primitive under ``keras.ops.searchsorted``, ``digitize``,
``isin``, ``histogram`` and ``repeat`` (per-element counts).

:func:`searchsorted` routes on its first array like every kernel (``_dispatch.route``): the NumPy code
here is the reference, ``dnnbind.kernels._cuda.search`` runs one thread per value on the call's
stream (``search.cu``: a binary search of ``log2(len) + 1`` steps, nothing synchronises).

The order is NumPy's sort order: NaN sorts after every number, so a NaN value lands after the last
number of the sequence (``side="left"``: before the sequence's NaNs, ``"right"``: after them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validate import BFLOAT16, normalize_dtype
from ._dispatch import as_array, check_out, route

__all__ = ["searchsorted", "SIDES"]

SIDES = ("left", "right")
_LOW = (np.dtype(np.float16), BFLOAT16)
_INDEX = (np.dtype(np.int32), np.dtype(np.int64))


def searchsorted(sorted_sequence: Any, values: Any, *, side: str = "left", dtype: Any = None, out: Any = None,
                 stream: Any = None) -> Any:
    """For each element ``v`` of ``values``, the index ``i`` into the ascending 1-d ``sorted_sequence``
    (length ``n``) where ``v`` would be inserted to keep it sorted: ``side="left"``, the first ``i`` with
    ``v <= sorted_sequence[i]``; ``"right"``, the first with ``v < sorted_sequence[i]`` (``n`` when there
    is none). ``values`` has any shape and the sequence's dtype (the caller promotes both); the result
    has ``values``' shape and dtype ``dtype`` (int32 by default, or int64). float16/bfloat16 compare in
    float32 (exactly: the conversion preserves order)."""
    op = "searchsorted"
    if side not in SIDES:
        raise ValueError(f"{op}: side must be 'left' or 'right', got {side!r}")
    seq, vals = as_array(sorted_sequence), as_array(values)
    if seq.ndim != 1:
        raise ValueError(f"{op}: sorted_sequence must be 1-d, got shape {tuple(seq.shape)}")
    if seq.dtype != vals.dtype:
        raise TypeError(f"{op}: values have dtype {vals.dtype} but sorted_sequence has {seq.dtype}; promote both to "
                        "one dtype first")
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else _INDEX[0]
    if dt not in _INDEX:
        raise TypeError(f"{op}: dtype must be int32 or int64, got {dt}")
    check_out(op, out, tuple(vals.shape), dt)
    impl = route(op, "search", sorted_sequence=seq, values=vals, out=out)
    if impl is not None:
        return impl.searchsorted(seq, vals, side=side, dtype=dt, out=out, stream=stream)
    if seq.dtype in _LOW:
        seq, vals = seq.astype(np.float32), vals.astype(np.float32)
    res = np.asarray(np.searchsorted(seq, vals, side=side)).astype(dt)
    if out is not None:
        np.copyto(out, res)
        return out
    return np.ascontiguousarray(res) if res.ndim else res
