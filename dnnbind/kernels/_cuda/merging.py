"""Merge ops on NVRTC kernels (``merging.cu``): maximum/minimum, their gradient, concatenation and
its inverse. Inputs are contiguous; every launch goes on the call's stream, nothing synchronises.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _common as cm

__all__ = ["maximum", "minimum", "extremum_backward", "concatenate", "concatenate_backward"]

_FILE = "merging.cu"
_U8 = np.dtype(np.uint8)


def _extremum(a: Any, b: Any, out: Any, stream: Any, is_min: bool) -> Any:
    s = cm.stream_of(stream)
    res = cm.output(out, a.shape, a.dtype, s)
    n = int(a.size)
    cm.launch(_FILE, f"extremum_{cm.suffix(a.dtype)}", n,
              (cm.p(a), cm.p(b), cm.p(res), cm.i64(n), cm.i32(is_min)), s)
    return res


def maximum(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Elementwise maximum (same shape and dtype; NaN propagates)."""
    return _extremum(a, b, out, stream, False)


def minimum(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Elementwise minimum (same shape and dtype; NaN propagates)."""
    return _extremum(a, b, out, stream, True)


def extremum_backward(dy: Any, inputs: Sequence[Any], y: Any, *, stream: Any = None) -> list:
    """One gradient per input: ``dy`` where the input is the first equal to ``y``, else 0."""
    s = cm.stream_of(stream)
    n = int(dy.size)
    # which elements an earlier input already took; dies with this call (capture-safe)
    taken = cm.empty(dy.shape, _U8, s)
    cm.memset(taken, 0, s)
    name = f"extremum_bwd_{cm.suffix(dy.dtype)}"
    grads = []
    for x in inputs:
        dx = cm.empty(dy.shape, dy.dtype, s)
        cm.launch(_FILE, name, n, (cm.p(dy), cm.p(x), cm.p(y), cm.p(dx), cm.p(taken), cm.i64(n)), s)
        grads.append(dx)
    return grads


def _unit(*byte_counts: int) -> int:
    """The widest copy unit (8, 4, 2 or 1 bytes) dividing every size, offset and address."""
    for unit in (8, 4, 2):
        if all(b % unit == 0 for b in byte_counts):
            return unit
    return 1


def _copy_rows(src: Any, dst: Any, rows: int, width: int, src_row: int, src_off: int, dst_row: int, dst_off: int,
               stream) -> None:
    """Copy ``rows`` runs of ``width`` elements between row-major blocks (all counts in elements)."""
    if rows == 0 or width == 0:
        return
    counts = [v * src.dtype.itemsize for v in (width, src_row, src_off, dst_row, dst_off)]
    unit = _unit(*counts, int(src.ptr), int(dst.ptr))
    w, sr, so, dr, do = (c // unit for c in counts)
    cm.launch(_FILE, f"copy_rows_u{unit}", rows * w,
              (cm.p(src), cm.p(dst), cm.i64(rows), cm.i64(w), cm.i64(sr), cm.i64(so), cm.i64(dr), cm.i64(do)),
              stream)


def _outer_inner(shape: Sequence[int], axis: int) -> "tuple[int, int]":
    return cm.size_of(shape[:axis]), cm.size_of(shape[axis + 1:])


def concatenate(arrays: Sequence[Any], axis: int = -1, *, out: Any = None, stream: Any = None) -> Any:
    """``arrays`` joined along ``axis`` (non-negative): one row-block copy per input."""
    s = cm.stream_of(stream)
    first = arrays[0]
    shape = list(int(d) for d in first.shape)
    total = sum(int(a.shape[axis]) for a in arrays)
    shape[axis] = total
    res = cm.output(out, tuple(shape), first.dtype, s)
    outer, inner = _outer_inner(shape, axis)
    offset = 0
    for a in arrays:
        width = int(a.shape[axis]) * inner
        _copy_rows(a, res, outer, width, width, 0, total * inner, offset, s)
        offset += width
    return res


def concatenate_backward(dy: Any, sizes: Sequence[int], axis: int = -1, *, stream: Any = None) -> list:
    """The pieces of ``dy`` along ``axis`` (non-negative) of lengths ``sizes``, as new arrays."""
    s = cm.stream_of(stream)
    shape = tuple(int(d) for d in dy.shape)
    outer, inner = _outer_inner(shape, axis)
    total = shape[axis]
    pieces, offset = [], 0
    for size in sizes:
        piece = cm.empty(shape[:axis] + (int(size),) + shape[axis + 1:], dy.dtype, s)
        width = int(size) * inner
        _copy_rows(dy, piece, outer, width, total * inner, offset, width, 0, s)
        pieces.append(piece)
        offset += width
    return pieces
