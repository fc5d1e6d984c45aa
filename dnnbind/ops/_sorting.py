"""Sorting, searching and counting in ``keras.ops``: ``sort``, ``argsort``, ``argpartition``, ``top_k``,
``in_top_k``, ``searchsorted``, ``digitize``, ``isin``, ``histogram``, ``bincount``, ``unique``.

Sorts are :func:`dnnbind.kernels.numeric.sort`/``argsort``/``top_k`` (stable: equal elements keep their
order; NaN sorts last). The gradient of a sort or a top-k scatters the output gradient back to where
each element came from (``index_add``, whose own VJP is a gather, so it is differentiable again).
Searches are one :func:`dnnbind.kernels.search.searchsorted` launch (a binary search per value), so
``digitize``, ``isin`` and ``histogram`` cost ``O(n log m)``, never an ``n x m`` comparison.

``bincount`` and ``unique`` read the host: their result's length depends on the data (as under JAX,
where they cannot be jitted). Everything else stays on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ..kernels import search as S
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import add, cast, equal, greater, isnan, less_equal, minimum, subtract, where
from ._indexing import index_add, take, take_along_axis
from ._joins import canonical_axis
from ._reductions import max as _max
from ._reductions import min as _min
from ._reductions import sum as _sum
from ._shape import concatenate, expand_dims, get_item, moveaxis, reshape, stack
from ._windows import linspace

__all__ = ["sort", "argsort", "argpartition", "top_k", "in_top_k", "searchsorted", "digitize", "isin", "histogram",
           "bincount", "unique"]

_I32 = np.dtype(np.int32)


def _flat_or(t: Tensor, axis: Any) -> "tuple[Tensor, Any]":
    """``axis=None``: the flattened tensor along axis 0 (Keras's rule for the sorts)."""
    return (reshape(t, (-1,)), 0) if axis is None else (t, axis)


def _iota(n: int, like: Tensor, step: int = 1) -> Tensor:
    return Tensor(N.iota(int(n), 0, int(step), _I32, device=like.device))


def scatter_along(g: Tensor, indices: Tensor, axis: int, n: int) -> Tensor:
    """The transpose of ``take_along_axis(x, indices, axis)`` for ``x`` with ``n`` entries on ``axis`` and
    ``indices`` of ``g``'s shape: zeros with each ``g`` entry added where it was taken from (differentiable:
    ``index_add``'s VJP is a gather)."""
    gm = moveaxis(g, axis, -1)
    im = moveaxis(indices, axis, -1)
    lead = tuple(gm.shape[:-1])
    rows = int(np.prod(lead)) if lead else 1
    k = int(gm.shape[-1])
    offsets = reshape(_iota(rows, g, n), (rows, 1))
    flat_idx = reshape(add(reshape(cast(im, _I32), (rows, k)), offsets), (-1,))
    zeros = Tensor(N.full((rows * n,), 0, g.dtype, device=g.device))
    summed = index_add(zeros, flat_idx, reshape(gm, (-1,)))
    return moveaxis(reshape(summed, lead + (n,)), -1, axis)


# ----------------------------------------------------------------------------------------- sorts
@keras_op
def sort(x: Any, axis: Any = -1) -> Tensor:
    """``keras.ops.sort``: ascending along ``axis`` (None: the flattened tensor), NaN last. The gradient
    goes back to each element's original position (ties: in order, as the stable sort placed them)."""
    (t,) = tensors(x)
    t, axis = _flat_or(t, axis)
    ax = canonical_axis("sort", axis, t.ndim)
    if not is_float(t.dtype) or not _core.needs_grad(t):
        return Tensor(N.sort(t.data, ax))
    idx = Tensor(N.argsort(t.data, ax))
    out = N.take_along_axis(t.data, idx.data, ax)
    n = int(t.shape[ax])
    return make(out, (t,), lambda node, g: (scatter_along(g, idx, ax, n),), "sort")


@keras_op(differentiable=False)
def argsort(x: Any, axis: Any = -1) -> Tensor:
    """``keras.ops.argsort``: int32 indices that sort ``x`` stably along ``axis`` (None, or a 0-d ``x``: the
    flattened tensor)."""
    (t,) = tensors(x)
    if t.ndim == 0:
        axis = None
    t, axis = _flat_or(t, axis)
    return Tensor(N.argsort(t.data, canonical_axis("argsort", axis, t.ndim)))


@keras_op(differentiable=False)
def argpartition(x: Any, kth: int, axis: Any = -1) -> Tensor:
    """``keras.ops.argpartition``: int32 indices with the ``kth`` smallest element at position ``kth``, the
    smaller ones before it (in increasing order) and the others after it (in index order): JAX's order.
    Three stable argsorts (the indices, their inverse, and the rest in index order)."""
    if isinstance(kth, bool) or not isinstance(kth, (int, np.integer)):
        raise ValueError(f"kth must be an integer. Received:kth = {kth}")
    (t,) = tensors(x)
    t, axis = _flat_or(t, axis)
    ax = canonical_axis("argpartition", axis, t.ndim)
    n = int(t.shape[ax])
    if not -n <= int(kth) < n:
        raise ValueError(f"argpartition: kth={kth} is out of range for axis {ax} of size {n}")
    k = int(kth) % n
    order = N.argsort(t.data, ax)
    rank = Tensor(N.argsort(order, ax))  # the inverse permutation: each element's sorted position
    in_bottom = cast(less_equal(rank, k), _I32)
    rest = N.argsort(in_bottom.data, ax)  # the other elements first, in index order
    low = [slice(None)] * t.ndim
    high = [slice(None)] * t.ndim
    low[ax], high[ax] = slice(0, k + 1), slice(0, n - k - 1)
    return concatenate([get_item(Tensor(order), tuple(low)), get_item(Tensor(rest), tuple(high))], axis=ax)


@keras_op(family="math")
def top_k(x: Any, k: int, sorted: bool = True) -> tuple:  # noqa: A002 (Keras's argument name)
    """``keras.ops.top_k``: ``(values, indices)`` of the ``k`` largest entries along the last axis, in
    decreasing order (ties: lower index first), indices int32. ``sorted=False`` returns them sorted too
    (as Keras's JAX backend). The gradient flows to the chosen entries."""
    (t,) = tensors(x)
    if t.ndim == 0:
        raise ValueError(f"top_k: x must have rank >= 1, got shape {t.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= int(k) <= t.shape[-1]:
        raise ValueError(f"top_k: k must be an int in [0, {t.shape[-1]}] (the size of the last axis), got {k!r}")
    vals, idx = N.top_k(t.data, int(k))
    indices = Tensor(idx)
    if not is_float(t.dtype):
        return Tensor(vals), indices
    n = int(t.shape[-1])
    values = make(vals, (t,), lambda node, g: (scatter_along(g, indices, t.ndim - 1, n),), "top_k")
    return values, indices


@keras_op(differentiable=False, family="math")
def in_top_k(targets: Any, predictions: Any, k: int) -> Tensor:
    """``keras.ops.in_top_k``: whether each target class is among the ``k`` largest predictions of its row:
    its rank (1 + the number of strictly larger predictions; a NaN prediction ranks last) is at most
    ``k``, so ties with the k-th value count as in (Keras's JAX backend)."""
    tg, pr = tensors(targets, predictions)
    if pr.ndim < 1 or tg.ndim != pr.ndim - 1 or tuple(tg.shape) != tuple(pr.shape[:-1]):
        raise ValueError(f"in_top_k: targets must have the shape of predictions without its last axis, got "
                         f"{tg.shape} and {pr.shape}")
    if tg.dtype.kind not in "iu":
        raise TypeError(f"in_top_k: targets must be integer class indices, got dtype {tg.dtype}")
    at_label = take_along_axis(pr, expand_dims(tg, -1), axis=-1)
    if is_float(pr.dtype):
        at_label = where(isnan(at_label), -np.inf, at_label)
    rank = add(_sum(greater(pr, at_label), axis=-1), 1)
    return less_equal(rank, int(k))


# -------------------------------------------------------------------------------------- searches
def _search(seq: Tensor, values: Tensor, side: str) -> Tensor:
    dt = np_dtype(result_type(seq, values))
    seq = seq if seq.dtype == dt else cast(seq, dt)
    values = values if values.dtype == dt else cast(values, dt)
    index = np.dtype(np.int64) if seq.shape[0] > np.iinfo(np.int32).max else _I32
    return Tensor(S.searchsorted(seq.data, values.data, side=side, dtype=index))


@keras_op(differentiable=False)
def searchsorted(sorted_sequence: Any, values: Any, side: str = "left") -> Tensor:
    """``keras.ops.searchsorted``: where each value would be inserted into the ascending 1-d
    ``sorted_sequence`` (``side`` "left": before equal entries, "right": after them); int32 (int64 for
    sequences longer than int32 can count). One binary-search kernel."""
    seq, vals = tensors(sorted_sequence, values)
    if seq.ndim != 1:
        raise ValueError("`searchsorted` only supports 1-D sorted sequences. You can use `keras.ops.vectorized_map` "
                         f"to extend it to N-D sequences. Received: sorted_sequence.shape={seq.shape}")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    return _search(seq, vals, side)


@keras_op(differentiable=False)
def digitize(x: Any, bins: Any) -> Tensor:
    """``keras.ops.digitize``: the int32 index of the bin of each ``x`` (increasing bins: ``bins[i-1] <= x <
    bins[i]``; decreasing: ``bins[i-1] > x >= bins[i]``), the direction read on the device."""
    t, b = tensors(x, bins)
    if b.ndim != 1:
        raise ValueError(f"`bins` must be a 1D array. Received: bins with shape bins.shape={b.shape}")
    if b.shape[0] == 0:
        return Tensor(N.full(tuple(t.shape), 0, _I32, device=t.device))
    n = int(b.shape[0])
    up = _search(b, t, "right")
    down = subtract(n, _search(_core.REGISTRY["flip"]["fn"](b, 0), t, "right"))
    return where(_core.REGISTRY["greater_equal"]["fn"](get_item(b, -1), get_item(b, 0)), up, down)


@keras_op(differentiable=False)
def isin(x1: Any, x2: Any, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """``keras.ops.isin``: whether each element of ``x1`` occurs in ``x2`` (NaN never does): ``x2`` sorted
    once, then one binary search per element of ``x1``. ``assume_unique`` changes nothing."""
    a, b = tensors(x1, x2)
    dt = np_dtype(result_type(a, b))
    a = a if a.dtype == dt else cast(a, dt)
    b = b if b.dtype == dt else cast(b, dt)
    if b.size == 0:
        return Tensor(N.full(tuple(a.shape), bool(invert), np.dtype(np.bool_), device=a.device))
    ref = Tensor(N.sort(b.data.reshape(-1), 0))
    pos = minimum(Tensor(S.searchsorted(ref.data, a.data, side="left")), b.size - 1)
    found = equal(take(ref, pos), a)
    return _core.REGISTRY["logical_not"]["fn"](found) if invert else found


@keras_op
def histogram(x: Any, bins: int = 10, range: Any = None) -> tuple:  # noqa: A002 (Keras's argument name)
    """``keras.ops.histogram``: ``(counts, bin_edges)`` of the 1-d ``x`` over ``bins`` equal bins spanning
    ``range`` (default: ``x``'s min and max, widened by 0.5 each way when equal); the last bin includes its
    right edge, values outside the range are not counted. Counts and edges have ``x``'s float dtype
    (floatx for integers), as Keras's JAX backend; everything stays on the device (no host read). The
    edges are differentiable (through the min and max), the counts are not."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)):
        raise TypeError(f"Argument `bins` must be of type `int`. Received: bins={bins}")
    if bins < 0:
        raise ValueError(f"Argument `bins` should be a non-negative integer. Received: bins={bins}")
    if range:
        if len(range) < 2 or not isinstance(range, tuple):
            raise ValueError(f"Argument `range` must be a tuple of two elements. Received: range={range}")
        if range[1] < range[0]:
            raise ValueError(f"The second element of `range` must be greater than the first. Received: range={range}")
    (t,) = tensors(x)
    if t.ndim > 1:
        raise ValueError(f"Input tensor must be 1-dimensional. Received: input.shape={t.shape}")
    dt = np_dtype(result_type(t.dtype, float)) if not is_float(t.dtype) else t.dtype
    t = reshape(t if t.dtype == dt else cast(t, dt), (-1,))
    if range:
        lo, hi = (float(range[0]), float(range[1])) if range[0] != range[1] else (range[0] - 0.5, range[1] + 0.5)
    else:
        lo, hi = _min(t), _max(t)
        same = equal(lo, hi)
        lo, hi = where(same, subtract(lo, 0.5), lo), where(same, add(hi, 0.5), hi)
    edges = linspace(lo, hi, int(bins) + 1, dtype=dt)
    idx = _search(_core.REGISTRY["stop_gradient"]["fn"](edges), t, "right")
    idx = where(equal(t, get_item(edges, -1)), int(bins), idx)
    ones = Tensor(N.full(tuple(t.shape), 1, dt, device=t.device))
    counts = N.index_add(N.full((int(bins) + 2,), 0, dt, device=t.device), idx.data, ones.data, 0)
    return Tensor(counts[1:int(bins) + 1] if counts.shape[0] else counts), edges


# -------------------------------------------------------------------------------------- counting
def _host_extrema(t: Tensor) -> "tuple[int, int]":
    """The min and max of integer ``t`` read on the host (one transfer): the shapes of ``bincount``'s
    result depend on them."""
    both = stack([_min(t), _max(t)]).numpy()
    return int(both[0]), int(both[1])


@keras_op
def bincount(x: Any, weights: Any = None, minlength: int = 0, sparse: bool = False) -> Tensor:
    """``keras.ops.bincount``: the number of occurrences (or the sum of ``weights``) of each value of the
    non-negative integer ``x`` (1-d, or 2-d: per row), ``max(minlength, max(x) + 1)`` bins. int32 counts;
    with weights, ``result_type(x, weights)``. Reads ``x``'s min and max on the host (the length depends on
    them; a negative value raises ``ValueError``). A 2-d ``x`` gives every row the same length (Keras
    fails when the rows' maxima differ). Differentiable in ``weights``."""
    if sparse:
        raise ValueError("bincount: dnnbind has no sparse tensors (sparse=True)")
    if isinstance(minlength, bool) or not isinstance(minlength, (int, np.integer)) or minlength < 0:
        raise ValueError(f"bincount: minlength must be a non-negative int, got {minlength!r}")
    (t,) = tensors(x)
    if t.dtype.kind == "b":
        t = cast(t, _I32)
    if t.dtype.kind not in "iu":
        raise TypeError(f"bincount: x must be an integer tensor, got dtype {t.dtype}")
    if t.ndim not in (1, 2):
        raise ValueError(f"bincount: x must be 1-d or 2-d, got shape {t.shape}")
    w = None
    if weights is not None:
        (w,) = tensors(weights) if not isinstance(weights, Tensor) else (weights,)
        if tuple(w.shape) != tuple(t.shape):
            raise ValueError(f"bincount: weights must have the shape of x {t.shape}, got {w.shape}")
    length = int(minlength)
    if t.size:
        low, high = _host_extrema(t)
        if low < 0:
            raise ValueError(f"bincount: x must hold non-negative integers, got a minimum of {low}")
        length = max(length, high + 1)
    dt = np_dtype(result_type(t.dtype, w.dtype)) if w is not None else _I32
    rows = 1 if t.ndim == 1 else int(t.shape[0])
    pos = cast(t, _I32)
    if t.ndim == 2:
        pos = add(pos, reshape(_iota(rows, t, length), (rows, 1)))
    updates = cast(w, dt) if w is not None and w.dtype != dt else w
    if updates is None:
        updates = Tensor(N.full(tuple(t.shape), 1, dt, device=t.device))
    zeros = Tensor(N.full((rows * length,), 0, dt, device=t.device))
    counts = index_add(zeros, reshape(pos, (-1,)), reshape(updates, (-1,)))
    return reshape(counts, (length,) if t.ndim == 1 else (rows, length))


def _unique_host_rows(t: Tensor, axis: int) -> "tuple[Tensor, Tensor, np.ndarray]":
    """(the slices along ``axis`` sorted lexicographically, as a tensor with that axis first; the sorting
    permutation; the host mask of group starts) for ``unique(axis=...)``: reads ``t`` on the host."""
    moved = moveaxis(t, axis, 0)
    host = moved.numpy().reshape(moved.shape[0], -1)
    n = host.shape[0]
    if host.shape[1] == 0:
        perm = np.zeros(min(n, 1), np.int32)
    else:
        perm = np.lexsort(host.T[::-1]).astype(np.int32)
    rows = host[perm]
    mask = np.ones(len(perm), bool)
    if len(perm) > 1:
        mask[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    perm_t = _core.tensor(perm, _core.device_of_args(t))
    return take(moved, perm_t, axis=0), perm_t, mask


@keras_op(differentiable=False)
def unique(x: Any, sorted: bool = True, return_index: bool = False, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, axis: Any = None, size: Any = None, fill_value: Any = None) -> Any:
    """``keras.ops.unique``: the sorted unique values of ``x`` (flattened, or the unique slices along
    ``axis``), optionally the index of each one's first occurrence, the inverse indices (``x``'s shape for
    ``axis=None``) and the counts, all int32. NaNs are all distinct. ``size`` pads (or truncates) to a fixed
    length as Keras's JAX backend: values with ``fill_value`` (default: the smallest value), indices with
    the smallest value's, counts with 0. Reads the host: the group boundaries (``axis=None``: the values
    are sorted on the device and only the boundary mask is read) or, with ``axis``, the whole tensor.
    ``sorted`` is accepted and ignored (the values always come sorted)."""
    (t,) = tensors(x)
    like = _core.device_of_args(t)
    if axis is None:
        flat = reshape(t, (-1,))
        n = int(flat.shape[0])
        perm = Tensor(N.argsort(flat.data, 0)) if n else Tensor(N.full((0,), 0, _I32, device=t.device))
        ordered = take(flat, perm)
        if n > 1:
            later, earlier = get_item(ordered, slice(1, None)), get_item(ordered, slice(None, -1))
            mask = np.concatenate([[True], _core.REGISTRY["not_equal"]["fn"](later, earlier).numpy()])
        else:
            mask = np.ones(n, bool)
        ax = 0
    else:
        ax = canonical_axis("unique", axis, t.ndim)
        ordered, perm, mask = _unique_host_rows(t, ax)
        n = int(t.shape[ax])
    if size is not None and n == 0 and fill_value is None:
        raise ValueError("unique: for a zero-sized input with a size, fill_value must be given")
    starts = np.flatnonzero(mask).astype(np.int32)
    groups = len(starts)
    if size is not None:
        size = int(size)
        ind = np.zeros(size, np.int32)
        ind[:min(size, groups)] = starts[:size]
    else:
        ind = starts
    ind_t = _core.tensor(ind, like)
    values = take(ordered, ind_t, axis=0) if n else ordered
    if size is not None and fill_value is not None and groups < size:
        valid = _core.tensor((np.arange(size) < groups).reshape((size,) + (1,) * (values.ndim - 1)), like)
        values = where(valid, values, cast(_core.tensor(fill_value, like), values.dtype)) if n else \
            Tensor(N.full((size,) + tuple(values.shape[1:]), fill_value, values.dtype, device=t.device))
    if axis is not None:
        values = moveaxis(values, 0, ax)
    out = [values]
    if return_index:
        out.append(take(perm, ind_t) if n else perm)
    if return_inverse:  # each element's group, scattered back to its place before the sort
        inverse = N.full((len(mask),), 0, _I32, device=t.device)
        if len(mask):
            group_of = _core.tensor((np.cumsum(mask) - 1).astype(np.int32), like)
            inverse = N.scatter_nd(inverse, reshape(perm, (-1, 1)).data, group_of.data, mode="set")
        out.append(reshape(Tensor(inverse), tuple(t.shape)) if axis is None else Tensor(inverse))
    if return_counts:
        bounds = np.append(starts, n)
        counts = np.diff(bounds).astype(np.int32)
        if size is not None:
            counts = np.concatenate([counts[:size], np.zeros(max(0, size - groups), np.int32)])
        out.append(_core.tensor(counts, like))
    return out[0] if len(out) == 1 else tuple(out)
