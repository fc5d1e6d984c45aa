"""Joins, splits and rearrangements of ``keras.ops``: ``append``, ``hstack``/``vstack``/``dstack``,
``array_split``/``hsplit``/``vsplit``/``dsplit``, ``unstack``, ``fliplr``/``flipud``, ``rot90``, ``roll``,
``repeat``, ``tile``, ``meshgrid``, ``rearrange``; the diagonals ``diag``, ``diagflat``, ``diagonal``,
``trace``; and ``select``, ``view``, ``saturate_cast``, ``unravel_index``, ``vectorize``.

Everything that only moves elements is one strided copy (``dnnbind.kernels.numeric.strided_copy``):
a diagonal, a rotation, a tile or an integer repeat is a single view of the input (broadcast views for
tiles and repeats, whose VJP sums back). A split is one node with one output per piece (its VJP
concatenates the pieces' gradients), so splitting into ``k`` pieces costs ``k`` copies forward and one
concatenation back, not ``k`` zero-filled gradients. ``roll`` and per-element ``repeat`` are gathers
(``take``) of indices computed on the device.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np

from ..autodiff.tensor import Tensor
from ..autodiff.variable import Variable
from ..kernels import numeric as N
from ..kernels import search as S
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import cast, floor_divide, greater, less, maximum, minimum, mod, where
from ._indexing import take
from ._reductions import sum as _sum
from ._shape import _assign_view, broadcast_to, c_strides, concatenate, flip, reshape, transpose, view_strided

__all__ = ["append", "hstack", "vstack", "dstack", "array_split", "hsplit", "vsplit", "dsplit", "unstack", "fliplr",
           "flipud", "rot90", "roll", "repeat", "tile", "meshgrid", "rearrange", "diag", "diagflat", "diagonal",
           "trace", "select", "view", "saturate_cast", "unravel_index", "vectorize"]

_I32 = np.dtype(np.int32)


def canonical_axis(op: str, axis: Any, ndim: int, name: str = "axis") -> int:
    """``axis`` (an int in ``[-ndim, ndim)``) as a non-negative int; ``TypeError``/``ValueError`` naming ``op``."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an int, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise ValueError(f"{op}: {name}={axis} is out of bounds for a tensor of rank {ndim}")
    return int(axis) % ndim


# ------------------------------------------------------------------------------------------ joins
@keras_op
def append(x1: Any, x2: Any, axis: Any = None) -> Tensor:
    """``keras.ops.append``: ``x2`` after ``x1`` along ``axis`` (None: both flattened); dtypes promoted."""
    a, b = tensors(x1, x2)
    if axis is None:
        return concatenate([reshape(a, (-1,)), reshape(b, (-1,))], axis=0)
    if a.ndim != b.ndim:
        raise ValueError(f"`append` requires inputs to have the same shape except the `axis={axis}`, but received "
                         f"shape {a.shape} and {b.shape}.")
    return concatenate([a, b], axis=canonical_axis("append", axis, a.ndim))


def _at_least(t: Tensor, rank: int) -> Tensor:
    """NumPy's ``atleast_2d``/``atleast_3d`` shapes: ``(n,)`` -> ``(1, n)`` / ``(1, n, 1)``, ``(m, n)`` ->
    ``(m, n, 1)``."""
    if t.ndim >= rank:
        return t
    if t.ndim == 0:
        return reshape(t, (1,) * rank)
    if t.ndim == 1:
        return reshape(t, (1, t.shape[0]) + (1,) * (rank - 2))
    return reshape(t, tuple(t.shape) + (1,))


def _listed(op: str, xs: Any) -> list:
    if isinstance(xs, (str, bytes)) or not isinstance(xs, (list, tuple)) or not xs:
        raise ValueError(f"{op}: xs must be a non-empty list of tensors, got {xs!r}")
    return tensors(*xs)


def _joined(op: str, ts: list, axis: int) -> Tensor:
    first = ts[0].shape
    for t in ts:
        if t.ndim != len(first) or any(p != q for i, (p, q) in enumerate(zip(t.shape, first)) if i != axis):
            raise ValueError(f"Every value in `xs` must have the same shape except on the `axis` dim. But found "
                             f"element of shape {t.shape}, which is different from the first element's shape {first}.")
    return concatenate(ts, axis=axis)


@keras_op
def hstack(xs: Sequence[Any]) -> Tensor:
    """``keras.ops.hstack``: joined along axis 1 (axis 0 for 1-d tensors; scalars become 1-d)."""
    ts = [_at_least(t, 1) for t in _listed("hstack", xs)]
    return _joined("hstack", ts, 0 if ts[0].ndim == 1 else 1)


@keras_op
def vstack(xs: Sequence[Any]) -> Tensor:
    """``keras.ops.vstack``: joined along axis 0 after ``atleast_2d``."""
    return _joined("vstack", [_at_least(t, 2) for t in _listed("vstack", xs)], 0)


@keras_op
def dstack(xs: Sequence[Any]) -> Tensor:
    """``keras.ops.dstack``: joined along axis 2 after ``atleast_3d``."""
    return _joined("dstack", [_at_least(t, 3) for t in _listed("dstack", xs)], 2)


# ----------------------------------------------------------------------------------------- splits
def _pieces(t: Tensor, axis: int, bounds: Sequence[tuple], squeeze: bool, name: str) -> list:
    """``t[..., lo:hi, ...]`` along ``axis`` for each ``(lo, hi)`` of ``bounds`` (covering the axis in
    order), one node for all pieces (``squeeze``: each piece of length 1 without the axis)."""
    shape = tuple(t.shape)
    if not bounds:
        return []
    cs = c_strides(shape)
    outs, sizes = [], []
    for lo, hi in bounds:
        piece = shape[:axis] + (hi - lo,) + shape[axis + 1:]
        raw = t.data[lo:hi] if axis == 0 else N.strided_copy(t.data, piece, cs, lo * cs[axis])
        outs.append(raw.reshape(shape[:axis] + shape[axis + 1:]) if squeeze else raw)
        sizes.append(piece)
    if not is_float(t.dtype):
        return [Tensor(o) for o in outs]

    def backward(node: Any, *grads: Tensor) -> tuple:
        parts = [Tensor(N.full(s, 0, t.dtype, device=t.device)) if g is None else reshape(g, s)
                 for g, s in zip(grads, sizes)]
        return (concatenate(parts, axis=axis),)

    return list(make(tuple(outs), (t,), backward, name, multiple=True))


def _sections(op: str, n: int, indices_or_sections: Any, equal: bool) -> list:
    """The ``(lo, hi)`` bounds of NumPy's ``split`` (``equal``) or ``array_split`` of an axis of ``n``."""
    if isinstance(indices_or_sections, (int, np.integer)) and not isinstance(indices_or_sections, bool):
        k = int(indices_or_sections)
        if k <= 0:
            raise ValueError(f"{op}: the number of sections must be positive, got {k}")
        if equal and n % k:
            raise ValueError(f"{op}: array split does not result in an equal division: an axis of size {n} into {k} "
                             "sections")
        size, extra = divmod(n, k)
        cuts = [i * size + min(i, extra) for i in range(k + 1)]
        return list(zip(cuts[:-1], cuts[1:]))
    points = [0] + [int(i) for i in indices_or_sections] + [n]
    out = []
    for lo, hi in zip(points[:-1], points[1:]):
        start, stop, _ = slice(lo, hi).indices(n)
        out.append((start, max(start, stop)))
    return out


def _split_cover(t: Tensor, axis: int, bounds: list, name: str) -> list:
    """Pieces for bounds that may overlap or leave gaps (NumPy's split of unsorted indices): one node when
    they tile the axis, else one view per piece."""
    if [b[0] for b in bounds[1:]] == [b[1] for b in bounds[:-1]] and bounds[0][0] == 0 and \
            bounds[-1][1] == t.shape[axis]:
        return _pieces(t, axis, bounds, False, name)
    cs = c_strides(t.shape)
    return [view_strided(t, tuple(t.shape[:axis]) + (hi - lo,) + tuple(t.shape[axis + 1:]), cs, lo * cs[axis], name)
            for lo, hi in bounds]


@keras_op
def array_split(x: Any, indices_or_sections: int, axis: int = 0) -> list:
    """``keras.ops.array_split``: ``indices_or_sections`` pieces along ``axis``, the first ``n % k`` one
    element longer."""
    if isinstance(indices_or_sections, bool) or not isinstance(indices_or_sections, (int, np.integer)):
        raise TypeError(f"Argument `indices_or_sections` must be of type `int`. Received: "
                        f"indices_or_sections={indices_or_sections}")
    if indices_or_sections <= 0:
        raise ValueError(f"Argument `indices_or_sections` must be a positive integer. Received: "
                         f"indices_or_sections={indices_or_sections}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"Argument `axis` must be of type `int`. Received: {axis}")
    (t,) = tensors(x)
    ax = canonical_axis("array_split", axis, t.ndim)
    return _pieces(t, ax, _sections("array_split", t.shape[ax], indices_or_sections, False), False, "array_split")


def _split_op(op: str, x: Any, indices_or_sections: Any, min_rank: int, axis_of: Callable[[int], int]) -> list:
    (t,) = tensors(x)
    if t.ndim < min_rank:
        raise ValueError(f"`{op}` only works on arrays of at least {min_rank} dimension{'s' if min_rank > 1 else ''}. "
                         f"Received array with shape {t.shape}.")
    ax = axis_of(t.ndim)
    return _split_cover(t, ax, _sections(op, t.shape[ax], indices_or_sections, True), op)


@keras_op
def hsplit(x: Any, indices_or_sections: Any) -> list:
    """``keras.ops.hsplit``: ``split`` along axis 1 (axis 0 of a 1-d tensor): equal sections or cut indices."""
    return _split_op("hsplit", x, indices_or_sections, 1, lambda nd: 0 if nd == 1 else 1)


@keras_op
def vsplit(x: Any, indices_or_sections: Any) -> list:
    """``keras.ops.vsplit``: ``split`` along axis 0 of a tensor of rank >= 2."""
    return _split_op("vsplit", x, indices_or_sections, 2, lambda nd: 0)


@keras_op
def dsplit(x: Any, indices_or_sections: Any) -> list:
    """``keras.ops.dsplit``: ``split`` along axis 2 of a tensor of rank >= 3."""
    return _split_op("dsplit", x, indices_or_sections, 3, lambda nd: 2)


@keras_op(family="core")
def unstack(x: Any, num: Any = None, axis: int = 0) -> list:
    """``keras.ops.unstack``: the slices along ``axis``, each without it (one node; along axis 0 the
    slices are views, no copy). ``num``, when given, must equal the axis' length."""
    (t,) = tensors(x)
    if t.ndim == 0:
        raise ValueError("unstack: x must have rank >= 1, got a scalar")
    ax = canonical_axis("unstack", axis, t.ndim)
    n = int(t.shape[ax])
    if num is not None and int(num) != n:
        raise ValueError(f"unstack: num={num} does not match the size {n} of axis {ax} (shape {t.shape})")
    return _pieces(t, ax, [(i, i + 1) for i in range(n)], True, "unstack")


# ------------------------------------------------------------------------------- flips, rotations
def _flip_along(op: str, x: Any, axis: int) -> Tensor:
    (t,) = tensors(x)
    if t.ndim <= axis:
        raise ValueError(f"`{op}` requires input with {axis + 1} or more dimensions. Received: x.shape={t.shape}")
    return flip(t, axis)


@keras_op
def fliplr(x: Any) -> Tensor:
    """``keras.ops.fliplr``: reversed along axis 1."""
    return _flip_along("fliplr", x, 1)


@keras_op
def flipud(x: Any) -> Tensor:
    """``keras.ops.flipud``: reversed along axis 0."""
    return _flip_along("flipud", x, 0)


@keras_op
def rot90(array: Any, k: int = 1, axes: Sequence[int] = (0, 1)) -> Tensor:
    """``keras.ops.rot90``: rotated by 90 degrees ``k`` times from the first axis of ``axes`` towards the
    second (counterclockwise for a matrix): one strided view."""
    (t,) = tensors(array)
    if t.ndim < 2:
        raise ValueError(f"Input array must have at least 2 dimensions. Received: array.ndim={t.ndim}")
    if len(axes) != 2 or axes[0] == axes[1]:
        raise ValueError(f"Invalid axes: {axes}. Axes must be a tuple of two different dimensions.")
    a1 = canonical_axis("rot90", axes[0], t.ndim, "axes[0]")
    a2 = canonical_axis("rot90", axes[1], t.ndim, "axes[1]")
    if a1 == a2:
        raise ValueError(f"Invalid axes: {axes}. Axes must be a tuple of two different dimensions.")
    k = int(k) % 4
    shape = list(t.shape)
    strides = list(c_strides(shape))
    offset = 0

    def flip_axis(a: int) -> None:
        nonlocal offset
        if shape[a] > 0:
            offset += (shape[a] - 1) * strides[a]
        strides[a] = -strides[a]

    def swap() -> None:
        shape[a1], shape[a2] = shape[a2], shape[a1]
        strides[a1], strides[a2] = strides[a2], strides[a1]

    if k == 0:
        return t
    if k == 2:
        flip_axis(a1)
        flip_axis(a2)
    elif k == 1:  # transpose(flip(m, a2))
        flip_axis(a2)
        swap()
    else:  # flip(transpose(m), a2)
        swap()
        flip_axis(a2)
    if t.size == 0:
        return reshape(t, tuple(shape))
    return view_strided(t, tuple(shape), tuple(strides), offset, "rot90")


@keras_op
def roll(x: Any, shift: Any, axis: Any = None) -> Tensor:
    """``keras.ops.roll``: elements shifted by ``shift`` along ``axis`` (None: the flattened tensor, reshaped
    back), wrapping around; several axes take one shift each (broadcast). One gather per rolled axis."""
    (t,) = tensors(x)
    if axis is None:
        flat = roll(reshape(t, (-1,)), sum(int(s) for s in np.ravel(shift)), 0)
        return reshape(flat, tuple(t.shape))
    shifts, axes = np.broadcast_arrays(np.asarray(shift, dtype=np.int64), np.asarray(axis, dtype=np.int64))
    total: dict = {}
    for s, a in zip(shifts.reshape(-1), axes.reshape(-1)):
        ax = canonical_axis("roll", int(a), t.ndim)
        total[ax] = total.get(ax, 0) + int(s)
    out = t
    for ax, s in total.items():
        n = int(t.shape[ax])
        if n == 0 or s % n == 0:
            continue
        idx = N.binary("mod", N.iota(n, (-s) % n, 1, _I32, device=t.device), n, dtype=_I32)
        out = take(out, Tensor(idx), axis=ax)
    return out


# ----------------------------------------------------------------------------------- repeat, tile
@keras_op
def repeat(x: Any, repeats: Any, axis: Any = None) -> Tensor:
    """``keras.ops.repeat``: each element repeated ``repeats`` times along ``axis`` (None: of the flattened
    tensor). An int repeat is one broadcast view; per-element repeats a gather of indices found by binary
    search in their running sum. Repeats given as a tensor are read on the host (the result's length is
    their sum); a Python list or NumPy array is host data already."""
    (t,) = tensors(x)
    if axis is None:
        t, ax = reshape(t, (-1,)), 0
    else:
        ax = canonical_axis("repeat", axis, t.ndim)
    n = int(t.shape[ax])
    on_device = isinstance(repeats, (Tensor, Variable)) or _core.backend.is_device_array(repeats)
    counts = tensors(repeats)[0] if on_device else None
    host = counts.numpy() if on_device else np.asarray(repeats)  # the data-dependent read (tensors only)
    if host.dtype.kind not in "iu":
        raise TypeError(f"repeat: repeats must be integers, got dtype {host.dtype}")
    if host.size and host.min() < 0:
        raise ValueError(f"repeat: repeats must be non-negative, got {repeats!r}")
    shape = tuple(t.shape)
    if host.size == 1:
        r = int(host.reshape(-1)[0])
        wide = broadcast_to(reshape(t, shape[:ax + 1] + (1,) + shape[ax + 1:]), shape[:ax + 1] + (r,) + shape[ax + 1:])
        return reshape(wide, shape[:ax] + (n * r,) + shape[ax + 1:])
    if host.ndim != 1 or host.shape[0] != n:
        raise ValueError(f"Size of `repeats` and dimensions of `axis {ax} of x` should be compatible. Received: "
                         f"{host.shape[0] if host.ndim == 1 else host.shape} and {shape}")
    if counts is None:
        counts = _core.tensor(host.astype(_I32), _core.device_of_args(t))
    ends = _core.REGISTRY["cumsum"]["fn"](cast(counts, _I32))
    positions = N.iota(int(host.sum()), 0, 1, _I32, device=t.device)
    return take(t, Tensor(S.searchsorted(ends.data, positions, side="right")), axis=ax)


@keras_op
def tile(x: Any, repeats: Any) -> Tensor:
    """``keras.ops.tile``: ``x`` repeated ``repeats[i]`` times along each axis (NumPy's rules for unequal
    lengths): one broadcast view."""
    (t,) = tensors(x)
    reps = [int(repeats)] if isinstance(repeats, (int, np.integer)) else [int(r) for r in np.ravel(repeats)]
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repeats must be non-negative, got {repeats!r}")
    nd = max(t.ndim, len(reps))
    reps = [1] * (nd - len(reps)) + reps
    shape = [1] * (nd - t.ndim) + list(t.shape)
    inter = tuple(v for s in shape for v in (1, s))
    wide = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    return reshape(broadcast_to(reshape(t, inter), wide), tuple(r * s for r, s in zip(reps, shape)))


@keras_op
def meshgrid(*x: Any, indexing: str = "xy") -> list:
    """``keras.ops.meshgrid``: coordinate grids of the (flattened) inputs, each keeping its dtype;
    ``"xy"`` swaps the first two output axes (Cartesian), ``"ij"`` does not (matrix)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"Valid values for `indexing` are 'xy' and 'ij', but received {indexing}.")
    ts = [reshape(t, (-1,)) for t in tensors(*x)]
    sizes = [int(t.shape[0]) for t in ts]
    pos = list(range(len(ts)))
    if indexing == "xy" and len(ts) >= 2:
        pos[0], pos[1] = 1, 0
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for t, p in zip(ts, pos):
        shape = [1] * len(ts)
        shape[p] = int(t.shape[0])
        out.append(broadcast_to(reshape(t, tuple(shape)), tuple(sizes)))
    return out


# -------------------------------------------------------------------------------------- rearrange
_GROUP = re.compile(r"\(([\w\s]+)\)")


def _axes_of(pattern: str) -> list:
    """The axes of one side of an einops pattern: names, and groups ``(a b)`` as lists of names."""
    out = []
    for item in re.findall(r"\w+|\(.*?\)", pattern):
        m = _GROUP.match(item)
        out.append(m.group(1).split() if m else [item])
    return out


@keras_op(family="core")
def rearrange(tensor: Any, pattern: str, **axes_lengths: int) -> Tensor:
    """``keras.ops.rearrange``: einops' ``rearrange`` as Keras has it (names, and groups ``(h w)`` that are
    merged on the output side or split on the input side, the lengths of split axes given in
    ``axes_lengths`` except one per group): a reshape, one transpose, a reshape."""
    (t,) = tensors(tensor)
    sides = re.split(r"\s*->\s*", pattern.strip())
    if len(sides) != 2:
        raise ValueError(f"rearrange: the pattern must read 'input -> output', got {pattern!r}")
    src, dst = _axes_of(sides[0]), _axes_of(sides[1])
    if len(src) != t.ndim:
        raise ValueError(f"rearrange: the input pattern {sides[0]!r} names {len(src)} axes but the tensor has shape "
                         f"{t.shape}")
    lengths = dict(axes_lengths)
    sizes: dict = {}
    for group, dim in zip(src, t.shape):
        if len(group) == 1 and group[0] not in lengths:
            sizes[group[0]] = int(dim)
            continue
        unknown = [a for a in group if a not in lengths]
        if len(unknown) > 1:
            raise ValueError(f"rearrange: cannot infer the lengths of {unknown} in ({' '.join(group)}); give all but "
                             "one in axes_lengths")
        known = math.prod(int(lengths[a]) for a in group if a in lengths)
        if unknown:
            if known == 0 or dim % known:
                raise ValueError(f"rearrange: an axis of length {dim} does not split into ({' '.join(group)}) with "
                                 f"{ {a: lengths[a] for a in group if a in lengths} }")
            lengths[unknown[0]] = dim // known
        elif known != dim:
            raise ValueError(f"rearrange: ({' '.join(group)}) has length {known}, but the axis has length {dim}")
        sizes.update({a: int(lengths[a]) for a in group})
    flat_src = [a for g in src for a in g]
    flat_dst = [a for g in dst for a in g]
    if sorted(flat_src) != sorted(flat_dst) or len(set(flat_src)) != len(flat_src):
        raise ValueError(f"rearrange: the output axes {flat_dst} must be the input axes {flat_src}, each once")
    split = reshape(t, tuple(sizes[a] for a in flat_src))
    moved = transpose(split, [flat_src.index(a) for a in flat_dst])
    return reshape(moved, tuple(math.prod(sizes[a] for a in g) for g in dst))


# -------------------------------------------------------------------------------------- diagonals
def _diagonal_view(shape: tuple, offset: int, a1: int, a2: int) -> "tuple[tuple, tuple, int]":
    """(shape, element strides, offset) of the diagonals of a C-contiguous array: the other axes, then
    the diagonal of axes ``a1``/``a2`` shifted by ``offset`` (towards ``a2`` when positive)."""
    cs = c_strides(shape)
    n1, n2 = shape[a1], shape[a2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    start = offset * cs[a2] if offset >= 0 else -offset * cs[a1]
    others = [i for i in range(len(shape)) if i not in (a1, a2)]
    return (tuple(shape[i] for i in others) + (length,), tuple(cs[i] for i in others) + (cs[a1] + cs[a2],),
            start if length else 0)


@keras_op
def diagonal(x: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor:
    """``keras.ops.diagonal``: the diagonal of the ``axis1``/``axis2`` planes (shifted by ``offset``), as the
    last axis after the others: one strided view (its VJP writes the gradient back onto the diagonal)."""
    (t,) = tensors(x)
    if t.ndim < 2:
        raise ValueError(f"`diagonal` requires an array of at least two dimensions, but `x` is of shape {t.shape}.")
    a1 = canonical_axis("diagonal", axis1, t.ndim, "axis1")
    a2 = canonical_axis("diagonal", axis2, t.ndim, "axis2")
    if a1 == a2:
        raise ValueError(f"`axis1` and `axis2` cannot be the same. Received: axis1={axis1}, axis2={axis2}")
    shape, strides, start = _diagonal_view(tuple(t.shape), int(offset), a1, a2)
    return view_strided(t, shape, strides, start, "diagonal")


@keras_op
def diag(x: Any, k: int = 0) -> Tensor:
    """``keras.ops.diag``: of a 1-d ``x``, the square matrix with ``x`` on diagonal ``k``; of a 2-d ``x``, its
    diagonal ``k``."""
    (t,) = tensors(x)
    if t.ndim == 2:
        return diagonal(t, int(k), 0, 1)
    if t.ndim != 1:
        raise ValueError(f"`x` must be 1-D or 2-D, but received shape {t.shape}.")
    n = int(t.shape[0]) + abs(int(k))
    shape, strides, start = _diagonal_view((n, n), int(k), 0, 1)
    if not is_float(t.dtype):
        out = N.full((n, n), 0, t.dtype, device=t.device)
        if t.size:
            N.strided_assign(out, shape, strides, start, t.data)
        return Tensor(out)
    return _assign_view(t, (n, n), shape, strides, start)


@keras_op
def diagflat(x: Any, k: int = 0) -> Tensor:
    """``keras.ops.diagflat``: the square matrix with the flattened ``x`` on diagonal ``k``."""
    (t,) = tensors(x)
    return diag(reshape(t, (-1,)), k)


@keras_op
def trace(x: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor:
    """``keras.ops.trace``: the sum of ``diagonal(x, offset, axis1, axis2)`` (bool and small ints sum in
    int32, small unsigned ints in uint32, as Keras)."""
    (t,) = tensors(x)
    if t.ndim < 2:
        raise ValueError(f"trace: x must have rank >= 2, got shape {t.shape}")
    if canonical_axis("trace", axis1, t.ndim, "axis1") == canonical_axis("trace", axis2, t.ndim, "axis2"):
        raise ValueError(f"`axis1` and `axis2` must be different. Received: axis1={axis1}, axis2={axis2}")
    return _sum(diagonal(t, offset, axis1, axis2), axis=-1)


# ---------------------------------------------------------------------------------- select, casts
@keras_op
def select(condlist: Sequence[Any], choicelist: Sequence[Any], default: Any = 0) -> Tensor:
    """``keras.ops.select``: at each position the choice of the first true condition, else ``default``
    (everything broadcast; the choices and ``default`` promoted together, a Python number weakly). One
    ``where`` per condition."""
    if not isinstance(condlist, (list, tuple)) or not isinstance(choicelist, (list, tuple)):
        raise ValueError(f"condlist and choicelist must be lists. Received: type(condlist) = {type(condlist)}, "
                         f"type(choicelist) = {type(choicelist)}")
    if not condlist or not choicelist:
        raise ValueError(f"condlist and choicelist must not be empty. Received: condlist = {condlist}, "
                         f"choicelist = {choicelist}")
    if len(condlist) != len(choicelist):
        raise ValueError(f"condlist must have length equal to choicelist ({len(condlist)} vs {len(choicelist)})")
    conds = tensors(*condlist)
    choices = tensors(*choicelist)
    weak = isinstance(default, (bool, int, float)) and not isinstance(default, np.generic)
    dflt = default if weak else _core.tensor(default, _core.device_of_args(*choices))
    dt = np_dtype(result_type(dflt, *choices))
    choices = [c if c.dtype == dt else cast(c, dt) for c in choices]
    out = dflt if weak else (dflt if dflt.dtype == dt else cast(dflt, dt))
    shape = N.broadcast_shapes(*[t.shape for t in conds + choices], () if weak else dflt.shape, op="select")
    for c, v in zip(reversed(conds), reversed(choices)):
        out = where(c, v, out)
    return out if tuple(out.shape) == shape else broadcast_to(out, shape)


@keras_op(differentiable=False)
def view(x: Any, dtype: Any = None) -> Tensor:
    """``keras.ops.view``: the same bytes read as ``dtype`` (no copy); a different itemsize scales the last
    axis."""
    (t,) = tensors(x)
    if dtype is None:
        return t
    dt = np_dtype(dtype)
    old = t.dtype.itemsize
    if dt.itemsize != old:
        if t.ndim == 0:
            raise ValueError("Cannot view a scalar as a different dtype if item sizes are different.")
        if (t.shape[-1] * old) % dt.itemsize:
            raise ValueError(f"Cannot view array of shape {t.shape} and dtype {t.dtype} as dtype "
                             f"{_core.standardize_dtype(dt)} because the total number of bytes is not divisible by the "
                             "new itemsize.")
    return Tensor(t.data.view(dt))


def _limits(dtype: np.dtype) -> tuple:
    if dtype.kind == "b":
        return 0, 1
    if dtype.kind in "iu":
        info = ml_dtypes.iinfo(dtype)
        return int(info.min), int(info.max)
    info = ml_dtypes.finfo(dtype)
    return float(info.min), float(info.max)


@keras_op(family="core")
def saturate_cast(x: Any, dtype: Any) -> Tensor:
    """``keras.ops.saturate_cast``: ``x`` clipped to the range both dtypes can hold, then cast (so
    ``saturate_cast(300., "uint8")`` is 255, not 44; infinities become the finite extremes, as Keras does).
    Floats cast to integers saturate exactly (``3e9`` in float32 becomes int32's maximum, NaN becomes 0),
    as Keras's JAX backend gives them. The gradient passes where ``x`` is inside the range."""
    (t,) = tensors(x)
    dt = np_dtype(dtype)
    src = t.dtype
    if src.kind == "b":
        return cast(t, dt)
    (in_min, in_max), (out_min, out_max) = _limits(src), _limits(dt)
    # the extremes of src inside dt's range (Python's exact float/int comparisons)
    lo = np.asarray(max(in_min, out_min)).astype(src)
    if lo.item() < out_min:
        lo = np.nextafter(lo, np.asarray(0, src), dtype=src)
    hi = np.asarray(min(in_max, out_max)).astype(src)
    if hi.item() > out_max:
        hi = np.nextafter(hi, np.asarray(0, src), dtype=src)
    if not is_float(src):
        return cast(minimum(maximum(t, int(lo)), int(hi)), dt)
    clipped = _core.REGISTRY["clip"]["fn"](t, float(lo), float(hi))
    if dt.kind not in "iu":
        return cast(clipped, dt)
    # NaN becomes 0; beyond the last float inside the integer range, the integer extremes
    out = cast(where(_core.REGISTRY["isnan"]["fn"](t), 0.0, clipped), dt)
    return where(greater(t, float(hi)), out_max, where(less(t, float(lo)), out_min, out))


@keras_op(differentiable=False)
def unravel_index(indices: Any, shape: Sequence[int]) -> tuple:
    """``keras.ops.unravel_index``: the coordinates in an array of ``shape`` of each flat index, one tensor
    per axis (``indices``' dtype). Out-of-range indices are clipped into the array (negative ones count from
    the end first), as Keras's JAX backend does."""
    (t,) = tensors(indices)
    if t.dtype.kind not in "iu":
        raise TypeError(f"unravel_index: indices must be integers, got dtype {t.dtype}")
    dims = [int(shape)] if isinstance(shape, (int, np.integer)) else [int(s) for s in shape]
    if any(d <= 0 for d in dims):
        raise ValueError(f"unravel_index: shape must hold positive sizes, got {tuple(dims)}")
    out: list = [None] * len(dims)
    rest = t
    for i in reversed(range(len(dims))):
        out[i] = mod(rest, dims[i])
        rest = floor_divide(rest, dims[i])
    high, low = greater(rest, 0), less(rest, -1)
    return tuple(where(high, d - 1, where(low, 0, c)) for d, c in zip(dims, out))


# -------------------------------------------------------------------------------------- vectorize
_SIG_ARG = r"\((?:\w+(?:,\s*\w+)*)?\)"
_SIGNATURE = re.compile(rf"^\s*{_SIG_ARG}(?:\s*,\s*{_SIG_ARG})*\s*->\s*{_SIG_ARG}(?:\s*,\s*{_SIG_ARG})*\s*$")


def _parse_signature(signature: str) -> "tuple[list, list]":
    if not _SIGNATURE.match(signature):
        raise ValueError(f"vectorize: not a valid gufunc signature: {signature!r} (e.g. '(m,n),(n)->(m)')")
    ins, outs = signature.split("->")

    def dims(side: str) -> list:
        return [[d.strip() for d in grp.split(",") if d.strip()] for grp in re.findall(r"\(([^)]*)\)", side)]

    return dims(ins), dims(outs)


@keras_op(differentiable=False)
def vectorize(pyfunc: Callable, *, excluded: Any = None, signature: "str | None" = None) -> Callable:
    """``keras.ops.vectorize``: ``pyfunc`` mapped over the broadcast leading ("loop") axes of its arguments,
    the trailing core axes of ``signature`` (``"(m,n),(n)->(m)"``; none by default) passed whole;
    ``excluded`` positions or keyword names are passed through unchanged. dnnbind has no batching
    transform (JAX's ``vmap``): ``pyfunc`` runs once per loop element, a Python loop, on slices that are
    views of the broadcast arguments, and the results are stacked. Differentiable when ``pyfunc`` is."""
    if not callable(pyfunc):
        raise ValueError(f"Expected argument `pyfunc` to be a callable. Received: pyfunc={pyfunc}")
    skip = set(excluded or ())
    in_core, out_core = _parse_signature(signature) if signature is not None else (None, None)

    def vectorized(*args: Any, **kwargs: Any) -> Any:
        names = [i for i in range(len(args)) if i not in skip] + [k for k in kwargs if k not in skip]
        values = [args[i] if isinstance(i, int) else kwargs[i] for i in names]
        ts = tensors(*values)
        cores = in_core if in_core is not None else [[] for _ in ts]
        if len(cores) != len(ts):
            raise ValueError(f"vectorize: the signature {signature!r} has {len(cores)} inputs, the call passes "
                             f"{len(ts)} vectorized arguments")
        sizes: dict = {}
        loops = []
        for t, core in zip(ts, cores):
            if t.ndim < len(core):
                raise ValueError(f"vectorize: an argument of shape {t.shape} has fewer axes than its core dimensions "
                                 f"{tuple(core)}")
            for name, dim in zip(core, t.shape[t.ndim - len(core):]):
                if sizes.setdefault(name, int(dim)) != int(dim):
                    raise ValueError(f"vectorize: core dimension {name!r} is {sizes[name]} in one argument and "
                                     f"{dim} in another")
            loops.append(tuple(t.shape[:t.ndim - len(core)]))
        loop = N.broadcast_shapes(*loops, op="vectorize")
        count = math.prod(loop)
        if count == 0:
            raise ValueError(f"vectorize: cannot call pyfunc on an empty loop shape {loop}")
        slices = []
        for t, core in zip(ts, cores):
            core_shape = tuple(t.shape[t.ndim - len(core):])
            full = broadcast_to(t, loop + core_shape) if tuple(t.shape) != loop + core_shape else t
            slices.append(unstack(reshape(full, (count,) + core_shape)))
        results = []
        for j in range(count):
            call_args = list(args)
            call_kwargs = dict(kwargs)
            for name, pieces in zip(names, slices):
                if isinstance(name, int):
                    call_args[name] = pieces[j]
                else:
                    call_kwargs[name] = pieces[j]
            res = pyfunc(*call_args, **call_kwargs)
            multi = isinstance(res, (tuple, list))
            results.append(tuple(res) if multi else (res,))
        n_out = len(results[0])
        if out_core is not None and len(out_core) != n_out:
            raise ValueError(f"vectorize: the signature {signature!r} declares {len(out_core)} outputs, pyfunc "
                             f"returned {n_out}")
        outs = []
        for k in range(n_out):
            parts = [_core.tensor(r[k]) for r in results]
            if out_core is not None and parts[0].ndim != len(out_core[k]):
                raise ValueError(f"vectorize: output {k} has shape {parts[0].shape}, the signature declares core "
                                 f"dimensions {tuple(out_core[k])}")
            stacked = _core.REGISTRY["stack"]["fn"](parts, axis=0)
            outs.append(reshape(stacked, loop + tuple(stacked.shape[1:])))
        return tuple(outs) if multi else outs[0]

    vectorized.__name__ = getattr(pyfunc, "__name__", "vectorized")
    vectorized.__doc__ = getattr(pyfunc, "__doc__", None)
    return vectorized
