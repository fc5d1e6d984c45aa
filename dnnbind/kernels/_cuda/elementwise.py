"""Elementwise ops, reductions, counts, casts, fills, gathers, finiteness and augmentation on
NVRTC kernels (``elementwise.cu``). Inputs are contiguous; every launch goes on the call's
stream and nothing is synchronised (counts and flags stay on the device as 0-d arrays).
"""

from __future__ import annotations

import builtins
import weakref
from typing import Any, Sequence

import numpy as np

from ...utils import draw_seed
from ...cuda import array as _array
from ...cuda.array import DeviceArray, _layout, to_device
from ..optim import UpdateTables
from . import _common as cm
from .optim import chunk_items

__all__ = [
    "add", "subtract", "multiply", "scale", "axpy", "sum", "mean", "argmax", "accuracy_count",
    "top_k_count", "cast", "cast_many", "fill", "zeros_like", "empty_like", "copy", "take", "all_finite",
    "random_crop_flip",
]

_FILE = "elementwise.cu"
_I64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)


def _binary(op: int, a: Any, b: Any, out: Any, stream: Any) -> Any:
    s = cm.stream_of(stream)
    res = cm.output(out, a.shape, a.dtype, s)
    n = int(a.size)
    cm.launch(_FILE, f"binary_{cm.suffix(a.dtype)}", n,
              (cm.p(a), cm.p(b), cm.p(res), cm.i64(n), cm.i64(int(b.size)), cm.i32(op), cm.i32(0)), s)
    return res


def add(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a + b`` (same shape and dtype)."""
    return _binary(0, a, b, out, stream)


def subtract(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a - b``."""
    return _binary(1, a, b, out, stream)


def multiply(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a * b``."""
    return _binary(2, a, b, out, stream)


def scale(x: Any, alpha: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``alpha * x``; ``alpha`` a number or a 0-d float32 DeviceArray (read at run time)."""
    s = cm.stream_of(stream)
    value, aptr = cm.device_scalar_ptr(alpha, "scale", "alpha")
    res = cm.output(out, x.shape, x.dtype, s)
    cm.launch(_FILE, f"scale_{cm.suffix(x.dtype)}", int(x.size),
              (cm.p(x), cm.p(res), cm.i64(int(x.size)), cm.f64(value), cm.p(aptr)), s)
    return res


def axpy(alpha: Any, x: Any, y: Any, *, stream: Any = None) -> Any:
    """``y += alpha * x`` in place; returns ``y``."""
    s = cm.stream_of(stream)
    value, aptr = cm.device_scalar_ptr(alpha, "axpy", "alpha")
    cm.launch(_FILE, f"axpy_{cm.suffix(x.dtype)}", int(x.size),
              (cm.p(x), cm.p(y), cm.i64(int(x.size)), cm.f64(value), cm.p(aptr)), s)
    return y


# ------------------------------------------------------------------------------ reductions

def _reduce_axis(x: Any, axis: int, out: Any, scale_: float, stream) -> Any:
    """Reduce one axis of contiguous ``x`` into ``out`` (shape of x without ``axis``)."""
    shape = tuple(int(d) for d in x.shape)
    outer, mid, inner = cm.size_of(shape[:axis]), shape[axis], cm.size_of(shape[axis + 1:])
    sfx = cm.suffix(x.dtype)
    if inner == 1:
        cm.launch_rows(_FILE, f"reduce_rows_{sfx}", outer,
                       (cm.p(x), cm.p(out), cm.i64(outer), cm.i64(mid), cm.f64(scale_)), stream)
    else:
        cm.launch(_FILE, f"reduce_mid_{sfx}", outer * inner,
                  (cm.p(x), cm.p(out), cm.i64(outer), cm.i64(mid), cm.i64(inner), cm.f64(scale_)), stream)
    return out


def _merge_runs(shape: tuple, axes: tuple) -> "tuple[tuple, tuple]":
    """Merge adjacent axes of the same kind (reduced / kept) so each run is one axis."""
    new_shape: list[int] = []
    new_axes: list[int] = []
    prev = None
    for i, d in enumerate(shape):
        red = i in axes
        if prev is not None and red == prev:
            new_shape[-1] *= d
        else:
            new_shape.append(d)
            if red:
                new_axes.append(len(new_shape) - 1)
        prev = red
    return tuple(new_shape), tuple(new_axes)


def _reduce(x: Any, axis: "tuple | None", keepdims: bool, out: Any, stream: Any, mean: bool) -> Any:
    s = cm.stream_of(stream)
    shape = tuple(int(d) for d in x.shape)
    axes = tuple(range(len(shape))) if axis is None else tuple(sorted(set(axis)))
    count = cm.size_of([shape[a] for a in axes])
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else \
        tuple(d for i, d in enumerate(shape) if i not in axes)
    res = cm.output(out, out_shape, x.dtype, s)
    if count == 0 or x.size == 0:
        # NumPy: the sum of nothing is 0, the mean of nothing is NaN.
        fill(res, float("nan") if mean and count == 0 else 0.0, stream=s)
        return res
    merged, raxes = _merge_runs(shape, axes)
    if not raxes:  # reducing only size-1 axes: a copy
        cm.memcpy(res, x, s)
        return res
    scale_ = 1.0 / count if mean else 1.0
    # Reduce the reduced runs last to first, so the axis numbers still to do stay valid. Each
    # pass sums in a fixed order (deterministic); only the first applies the mean's scale.
    cur, cur_shape = x, merged
    for j, ax in enumerate(reversed(raxes)):
        next_shape = cur_shape[:ax] + cur_shape[ax + 1:]
        target = res if j == len(raxes) - 1 else cm.empty(next_shape, x.dtype, s)
        _reduce_axis(_Shaped(cur, cur_shape), ax, target, scale_ if j == 0 else 1.0, s)
        cur, cur_shape = target, next_shape
    return res


class _Shaped:
    """A (pointer, shape, dtype) view for the reduction passes (no DeviceArray reshape needed)."""

    def __init__(self, array: Any, shape: tuple) -> None:
        self.array = array.array if isinstance(array, _Shaped) else array
        self.ptr = self.array.ptr
        self.shape = tuple(shape)
        self.dtype = self.array.dtype


def sum(x: Any, axis: "tuple | None" = None, keepdims: bool = False, *, out: Any = None, stream: Any = None) -> Any:
    """Sum over ``axis`` (a tuple of non-negative ints, or None for all), in x's dtype."""
    return _reduce(x, axis, keepdims, out, stream, mean=False)


def mean(x: Any, axis: "tuple | None" = None, keepdims: bool = False, *, out: Any = None, stream: Any = None) -> Any:
    """Mean over ``axis``, in x's dtype (accumulated in float32, float64 for float64)."""
    return _reduce(x, axis, keepdims, out, stream, mean=True)


def argmax(x: Any, axis: int = -1, *, out: Any = None, stream: Any = None) -> Any:
    """Index (int64) of the first maximum along ``axis``."""
    s = cm.stream_of(stream)
    shape = tuple(int(d) for d in x.shape)
    axis = axis % len(shape)
    outer, mid, inner = cm.size_of(shape[:axis]), shape[axis], cm.size_of(shape[axis + 1:])
    res = cm.output(out, shape[:axis] + shape[axis + 1:], _I64, s)
    if mid == 0:
        raise ValueError(f"argmax: axis {axis} of shape {shape} is empty")
    cm.launch(_FILE, f"argmax_{cm.suffix(x.dtype)}", outer * inner,
              (cm.p(x), cm.p(res), cm.i64(outer), cm.i64(mid), cm.i64(inner)), s)
    return res


def _label_indices(labels: Any, n: int, s) -> Any:
    """int32/int64 class indices from int labels (N,)/(N, 1) or one-hot (N, C) (their argmax)."""
    if labels.dtype.kind in "iu":
        if labels.dtype not in (_I32, _I64):
            return cast(labels, _I64, stream=s)
        return labels
    return argmax(labels, axis=1, stream=s)


def _count(kind: str, scores: Any, labels: Any, extra: tuple, stream: Any) -> Any:
    s = cm.stream_of(stream)
    n, c = int(scores.shape[0]), int(scores.shape[1])
    idx = _label_indices(labels, n, s)
    count = cm.empty((), _I64, s)
    cm.memset(count, 0, s)
    if n:
        warps_per_block = cm.BLOCK // 32
        cm.launch_rows(_FILE, f"{kind}_{cm.suffix(scores.dtype)}_{cm.suffix(idx.dtype)}",
                       -(-n // warps_per_block),
                       (cm.p(scores), cm.p(idx), cm.p(count), cm.i64(n), cm.i64(c)) + extra, s)
    return count


def accuracy_count(scores: Any, labels: Any, *, stream: Any = None) -> Any:
    """0-d int64: rows whose first argmax equals the label."""
    return _count("accuracy_count", scores, labels, (), stream)


def top_k_count(scores: Any, labels: Any, k: int, *, stream: Any = None) -> Any:
    """0-d int64: rows where fewer than ``k`` classes score strictly above the label's class."""
    return _count("top_k_count", scores, labels, (cm.i64(int(k)),), stream)


# ------------------------------------------------------------------------- casts and memory

# (source dtype, target dtype, device) -> (kernel, items per vector access, the two address
# alignments that access needs, the grid cap): a cast runs for every weight of every mixed-precision
# step, so its launch is looked up once instead of formatting the kernel name and the grid per call.
_cast_plans: dict = {}


def _cast_plan(src: np.dtype, dst: np.dtype, device: int) -> tuple:
    plan = _cast_plans.get((src, dst, device))
    if plan is None:
        vw = 16 // max(src.itemsize, dst.itemsize)
        plan = (cm.kernel(_FILE, f"cast_{cm.suffix(src)}_{cm.suffix(dst)}", device), vw,
                min(16, vw * src.itemsize), min(16, vw * dst.itemsize), cm._sm_count(device) * 32)
        _cast_plans[(src, dst, device)] = plan
    return plan


def cast(x: Any, dtype: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``x`` converted to ``dtype`` (float to int truncates toward zero, as NumPy)."""
    s = cm.stream_of(stream)
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    res = cm.output(out, x.shape, dt, s)
    if dt == x.dtype:
        cm.memcpy(res, x, s)
        return res
    n = int(x.size)
    if n <= 0:
        return res
    kern, vw, x_align, res_align, max_grid = _cast_plan(x.dtype, dt, s.device_index)
    # vectorised (see elementwise.cu) when both addresses suit VW-item accesses
    vec = x.ptr % x_align == 0 and res.ptr % res_align == 0
    items = -(-n // vw) if vec else n
    # the grid cm.launch would pick: grid-stride loops, at most 32 blocks per SM
    grid = max(1, min(-(-items // cm.BLOCK), max_grid))
    kern((grid, 1, 1), (cm.BLOCK, 1, 1), (cm.p(x), cm.p(res), cm.i64(n), cm.i32(vec)), stream=s)
    return res


# ---- the multi-tensor cast (cast_many in elementwise.cu)
_CAST_COLS = 5  # per tensor: source, destination byte offset, size, first chunk, vectorised
# Each output starts at a multiple of this many bytes from the shared buffer's start, as if
# cudaMalloc had made it: cuDNN and cuBLASLt, which read the copies, see the alignment their own
# allocations would have (and the kernel's vector stores need 16).
_OUT_ALIGN = 256
# The tables of callers that pass none, kept with their first source array (weakly, by identity),
# as the optimizer's (kernels/_cuda/optim.py).
_cast_tables_of: "weakref.WeakKeyDictionary[Any, UpdateTables]" = weakref.WeakKeyDictionary()


class _CastPlan:
    """What a cast_many launch needs besides its device table: the outputs' layouts and offsets in
    the shared buffer, its size, the table's shape and the kernel."""

    __slots__ = ("views", "nbytes", "ntensors", "nchunks", "chunk", "kernel", "host")

    def __init__(self, xs: Sequence[Any], dt: np.dtype) -> None:
        src = xs[0].dtype
        vw = 16 // max(src.itemsize, dt.itemsize)
        align = min(16, vw * src.itemsize)
        sizes = [x.size for x in xs]
        self.chunk = chunk = chunk_items(builtins.sum(sizes))  # (this module's sum is the op)
        views, rows, chunks, offset = [], [], [], 0
        for t, (x, size) in enumerate(zip(xs, sizes)):
            shape, dtype, strides, nbytes, n, ndim = _layout(x.shape, dt)
            views.append((shape, dtype, strides, offset, n, ndim))
            first = len(chunks)
            chunks += [(t, start) for start in range(0, size, chunk)]
            rows.append((x.ptr, offset, size, first, int(x.ptr % align == 0)))
            offset += -(-nbytes // _OUT_ALIGN) * _OUT_ALIGN
        self.views, self.nbytes = views, max(offset, _OUT_ALIGN)
        self.ntensors, self.nchunks = len(xs), len(chunks)
        self.kernel = f"cast_many_{cm.suffix(src)}_{cm.suffix(dt)}"
        self.host = np.asarray([v for row in rows for v in row] + [v for c in chunks for v in c], dtype=np.int64)


def _cast_entry(xs: Sequence[Any], dt: np.dtype, stream, tables: "UpdateTables | None", owner: Any) -> tuple:
    """(device table, plan) for casting ``xs`` to ``dt``: ``owner``'s (an ``kernels.elementwise.CastMany``,
    which holds ``xs``, so the addresses in its table stay theirs), else kept in ``tables`` by the
    sources' addresses and shapes (a hit is right whatever lives at those addresses now: the table
    holds nothing else). While ``stream`` is captured nothing is looked up or kept (see UpdateTables)."""
    capturing = stream.is_capturing()
    if owner is not None and not capturing:
        entry = owner._entry
        # a table is read on the stream it was uploaded (and is freed) on: another stream gets its own
        if entry is None or entry[0].stream is not stream:
            plan = _CastPlan(xs, dt)
            entry = owner._entry = (_array.constant(plan.host, stream=stream), plan)
        return entry
    if not capturing:
        if tables is None:
            tables = _cast_tables_of.get(xs[0])
            if tables is None:
                tables = _cast_tables_of[xs[0]] = UpdateTables()
        key = ("cast", stream._handle, stream.device_index, xs[0].dtype, dt, tuple([x.ptr for x in xs]),
               tuple([x.shape for x in xs]))
        hit = tables._get(key)
        if hit is not None:
            return hit
    plan = _CastPlan(xs, dt)
    # constant(): the table may be made while a step is captured (then it is graph memory that
    # dies with the captured step, and the graph re-uploads it from its own pinned bytes)
    entry = (_array.constant(plan.host, stream=stream), plan)
    if not capturing:
        tables._put(key, entry)
    return entry


def cast_many(xs: Sequence[Any], dtype: Any, *, tables: "UpdateTables | None" = None, stream: Any = None,
              owner: Any = None) -> list:
    """Every array of ``xs`` (one float dtype, contiguous) converted to float ``dtype`` by one
    launch; the results are views of one new allocation, each at a 256-byte boundary. ``owner``:
    the ``kernels.elementwise.CastMany`` holding ``xs`` (it keeps their table)."""
    s = cm.stream_of(stream)
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    table, plan = _cast_entry(xs, dt, s, tables, owner)
    out = cm.empty((plan.nbytes,), _U8, s)
    base, ptr, device = out._base, out.ptr, s._device
    if plan.nchunks:
        cm.launch_rows(_FILE, plan.kernel, plan.nchunks,
                       (cm.p(table), cm.i64(plan.ntensors), cm.i64(plan.nchunks), cm.i64(plan.chunk), cm.p(out),
                        cm.i32(ptr % 16 == 0)), s, max_grid=4096)
    # views that keep the one allocation alive; it is freed (stream-ordered) when the last dies
    return [DeviceArray._make(base, shape, dtype, ptr + offset, strides, device, s, n, ndim)
            for shape, dtype, strides, offset, n, ndim in plan.views]


def fill(x: Any, value: float, *, stream: Any = None) -> Any:
    """Every element of ``x`` set to ``value`` (in place); returns ``x``."""
    s = cm.stream_of(stream)
    if value == 0.0 and not np.signbit(value):
        cm.memset(x, 0, s)  # all-zero bytes are 0 in every supported dtype
        return x
    cm.launch(_FILE, f"fill_{cm.suffix(x.dtype)}", int(x.size), (cm.p(x), cm.i64(int(x.size)), cm.f64(value)), s)
    return x


def zeros_like(x: Any, *, dtype: Any = None, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    res = cm.empty(x.shape, x.dtype if dtype is None else dtype, s)
    cm.memset(res, 0, s)
    return res


def empty_like(x: Any, *, dtype: Any = None, stream: Any = None) -> Any:
    return cm.empty(x.shape, x.dtype if dtype is None else dtype, cm.stream_of(stream))


def copy(x: Any, *, out: Any = None, stream: Any = None) -> Any:
    s = cm.stream_of(stream)
    res = cm.output(out, x.shape, x.dtype, s)
    cm.memcpy(res, x, s)
    return res


def take(x: Any, indices: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Rows ``x[indices]`` (axis 0). A NumPy ``indices`` is copied to the device first.

    No host-side bounds check is possible for device indices without a sync: an index
    outside [-rows, rows) fills its output row with 0xFF bytes (NaN for floats).
    """
    s = cm.stream_of(stream)
    if isinstance(indices, np.ndarray):
        if indices.size and (indices.min() < -x.shape[0] or indices.max() >= x.shape[0]):
            raise IndexError(f"take: indices out of range for {x.shape[0]} rows")
        indices = to_device(np.ascontiguousarray(indices, dtype=np.int64), stream=s)
    idx = indices if indices.dtype in (_I32, _I64) else cast(indices, _I64, stream=s)
    nidx = int(idx.shape[0])
    res = cm.output(out, (nidx,) + tuple(x.shape[1:]), x.dtype, s)
    row_bytes = cm.size_of(x.shape[1:]) * x.dtype.itemsize
    if nidx == 0 or row_bytes == 0:
        return res
    if row_bytes % 4 == 0:
        name, units = f"take_rows_w4_{cm.suffix(idx.dtype)}", row_bytes // 4
    else:
        name, units = f"take_rows_b1_{cm.suffix(idx.dtype)}", row_bytes
    cm.launch(_FILE, name, nidx * units,
              (cm.p(x), cm.p(res), cm.p(idx), cm.i64(nidx), cm.i64(units), cm.i64(int(x.shape[0]))), s)
    return res


def all_finite(arrays: Sequence[Any], *, stream: Any = None) -> Any:
    """0-d int32 on the device: 1 when no float element of any array is NaN or inf, else 0."""
    s = cm.stream_of(stream)
    flag = cm.empty((), _I32, s)
    fill(flag, 1.0, stream=s)
    for a in arrays:
        if a.dtype not in cm.FLOAT_DTYPES or a.size == 0:
            continue  # integers are always finite
        cm.launch(_FILE, f"all_finite_{cm.suffix(a.dtype)}", int(a.size),
                  (cm.p(a), cm.i64(int(a.size)), cm.p(flag)), s)
    return flag


def random_crop_flip(x: Any, *, padding: int = 4, flip: bool = True, layout: str = "NCHW",
                     seed: "int | np.random.Generator | None" = None, out: Any = None, stream: Any = None) -> Any:
    """Per-sample random crop of the zero-padded image and optional left-right flip.

    The draws come from a counter-based hash of (seed, sample): an int seed gives the same
    crops every time (but not the NumPy backend's crops: the generators differ); a Generator
    is advanced by one draw; None draws one from dnnbind's seed generator (``utils.draw_seed``).
    Under CUDA-graph replay the seed is the one captured, so the crops repeat: pass a new seed
    per step outside graphs.
    """
    s = cm.stream_of(stream)
    if isinstance(seed, np.random.Generator):
        seed_value = int(seed.integers(0, 2**63))
    elif seed is None:
        seed_value = draw_seed()  # the public op resolves None first; a direct call lands here
    else:
        seed_value = int(seed) & (2**64 - 1)
    n, c, h, w = cm.nchw_dims(x.shape, layout)
    res = cm.output(out, x.shape, x.dtype, s)
    cm.launch(_FILE, f"random_crop_flip_{cm.suffix(x.dtype)}", int(x.size),
              (cm.p(x), cm.p(res), cm.i64(n), cm.i32(c), cm.i32(h), cm.i32(w), cm.i32(int(padding)),
               cm.u64(seed_value), cm.i32(layout == "NHWC"), cm.i32(bool(flip))), s)
    return res

