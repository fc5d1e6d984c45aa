"""Column sums of channels-last data on the device: ``out[c] = sum over rows of x[..., c]``.

One driver for ``layout.cu``'s column-sum kernels, shared by the bias gradient
(:func:`dnnbind.kernels._cuda.conv.bias_backward`) and the generic reductions that sum the leading axes
of a contiguous array (:func:`dnnbind.kernels._cuda.numeric.reduce`: the VJP of a broadcast add is
one). Every sum runs in a fixed order set by the shape alone, so the result is deterministic.
Channels-last data is read once with 16-byte loads where C and the address allow: up to 512 row
blocks write float32 (float64) partial sums, which a second launch adds; 256 rows or fewer take one
launch. NCHW, whose channel planes are contiguous, takes one block per channel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _common as cm

__all__ = ["channel_sums", "channel_split"]


def channel_split(shape, layout: str) -> "tuple[int, int, int]":
    """(outer, C, inner) of a tensor whose channel axis is 1 (4-d NCHW) or the last one."""
    shape = tuple(int(v) for v in shape)
    axis = 1 if (len(shape) == 4 and layout == "NCHW") else len(shape) - 1
    return cm.size_of(shape[:axis]), shape[axis], cm.size_of(shape[axis + 1:])


# (shape, layout, dtype, 16-byte aligned, device) -> the launches, worked out once:
# ("last1", kernel, grid, c, outer, lanes, vec) | ("last2", rows kernel, grid, partials kernel,
# grid, c, outer, blocks, rows per block, lanes, vec, partials lanes, partials vec, partial dtype)
# | ("planes", kernel name, c, outer, inner). Every step repeats a few shapes, and the tiling
# arithmetic and kernel names cost more host time than the launches. Bounded: cleared when full.
_plans: dict = {}


def _plan(shape: tuple, layout: str, dtype: np.dtype, aligned: bool, device: int) -> tuple:
    outer, c, inner = channel_split(shape, layout)
    sfx = cm.suffix(dtype)
    if not (inner == 1 and outer > 0 and c > 0):
        return ("planes", f"channel_sum_{sfx}", c, outer, inner)
    acc = cm.F64 if dtype == cm.F64 else cm.F32

    def tiles(dt: np.dtype, is_aligned: bool) -> "tuple[int, int, int]":
        """(vectorised, column lanes per block (a power of two), column blocks) for 256 threads."""
        vw = 16 // dt.itemsize
        vec = is_aligned and c % vw == 0
        vectors = -(-c // (vw if vec else 1))
        lanes = min(256, 1 << (vectors - 1).bit_length())
        return int(vec), lanes, -(-vectors // lanes)

    rows_per_block = max(256, -(-outer // 512))
    blocks = -(-outer // rows_per_block)
    vec, lanes, col_blocks = tiles(dtype, aligned)
    if blocks == 1:
        return ("last1", cm.kernel("layout.cu", f"channel_sum_last_{sfx}", device), (1, col_blocks, 1),
                c, outer, lanes, vec)
    part_vec, part_lanes, part_col_blocks = tiles(acc, True)
    return ("last2", cm.kernel("layout.cu", f"channel_sum_rows_{sfx}", device), (blocks, col_blocks, 1),
            cm.kernel("layout.cu", f"channel_sum_partials_{sfx}", device), (1, part_col_blocks, 1),
            c, outer, blocks, rows_per_block, lanes, vec, part_lanes, part_vec, acc)



def channel_sums(dy: Any, layout: str, stream: Any, out: Any = None) -> Any:
    """``db[c]``: the sum of ``dy`` over every axis but the channel axis (axis 1 of 4-d NCHW, else the
    last), in ``dy``'s dtype, shape (C,); into ``out`` (contiguous, (C,), dy's dtype) when given."""
    s = cm.stream_of(stream)
    dtype = dy.dtype
    key = (dy.shape, layout, dtype, dy.ptr % 16 == 0, s._device)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(*key)
        if len(_plans) >= 1024:
            _plans.clear()
        _plans[key] = plan
    kind = plan[0]
    if kind == "last1":
        _, kern, grid, c, outer, lanes, vec = plan
        db = cm.empty((c,), dtype, s) if out is None else out
        kern(grid, (256, 1, 1), (dy, db, cm.i64(outer), cm.i64(c), cm.i32(lanes), cm.i32(vec), cm.f64(1.0)),
             stream=s)
        return db
    if kind == "last2":
        (_, rows_kern, rows_grid, part_kern, part_grid, c, outer, blocks, rows_per_block, lanes, vec,
         part_lanes, part_vec, acc) = plan
        db = cm.empty((c,), dtype, s) if out is None else out
        partial = cm.empty((blocks, c), acc, s)
        rows_kern(rows_grid, (256, 1, 1), (dy, partial, cm.i64(outer), cm.i64(c), cm.i64(rows_per_block),
                                           cm.i32(lanes), cm.i32(vec)), stream=s)
        part_kern(part_grid, (256, 1, 1), (partial, db, cm.i64(blocks), cm.i64(c), cm.i32(part_lanes),
                                           cm.i32(part_vec),
                                           cm.f64(1.0)), stream=s)
        return db
    _, name, c, outer, inner = plan
    db = cm.empty((c,), dtype, s) if out is None else out
    cm.launch_rows("layout.cu", name, c,
                   (cm.p(dy), cm.p(db), cm.i64(outer), cm.i64(c), cm.i64(inner), cm.f64(1.0)), s)
    return db
