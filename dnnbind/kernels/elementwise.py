"""Elementwise arithmetic, reductions, metrics counts, casts, fills, gathers and data augmentation.

Binary ops take two arrays of one shape and dtype (no broadcasting, so that the
CUDA kernels stay simple). Count-style results (``accuracy_count``,
``top_k_count``) are 0-d int64 arrays, ``all_finite`` a 0-d int32, so that they
can stay on the device until the caller asks for them.
"""

from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from .._validate import normalize_dtype
from ..utils import draw_seed
from ._dispatch import (
    FLOAT_DTYPES,
    as_array,
    check_float,
    check_out,
    finish,
    route,
    scalar,
    to_compute,
)
from ._params import check_layout
from .optim import _check_tables

__all__ = [
    "add", "subtract", "multiply", "scale", "axpy", "sum", "mean", "argmax", "accuracy_count",
    "top_k_count", "cast", "cast_many", "CastMany", "fill", "zeros_like", "empty_like", "copy", "take", "all_finite",
    "random_crop_flip",
]

_SUPPORTED = frozenset(FLOAT_DTYPES + tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64,
                                                                   np.bool_)))


def _binary(op: str, ufunc: Any, a: Any, b: Any, out: Any, stream: Any) -> Any:
    a, b = as_array(a), as_array(b)
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        raise ValueError(
            f"{op}: a has shape {tuple(a.shape)} and dtype {a.dtype} but b has shape {tuple(b.shape)} and "
            f"dtype {b.dtype}; they must match"
        )
    check_out(op, out, a.shape, a.dtype)
    impl = route(op, "elementwise", a=a, b=b, out=out)
    if impl is not None:
        return getattr(impl, op)(a, b, out=out, stream=stream)
    ac = to_compute(a)
    if ac is a:
        return ufunc(a, b, out=out)
    return finish(ufunc(ac, to_compute(b)), out, a.dtype)


def add(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a + b``. CUDA: ``_cuda.elementwise.add(a, b, out=out, stream=stream)``."""
    return _binary("add", np.add, a, b, out, stream)


def subtract(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a - b``. CUDA: ``_cuda.elementwise.subtract(a, b, out=out, stream=stream)``."""
    return _binary("subtract", np.subtract, a, b, out, stream)


def multiply(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``a * b``. CUDA: ``_cuda.elementwise.multiply(a, b, out=out, stream=stream)``."""
    return _binary("multiply", np.multiply, a, b, out, stream)


def scale(x: Any, alpha: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``alpha * x``; ``alpha`` a number or a 0-d array. ``out`` may be ``x``.

    CUDA: ``_cuda.elementwise.scale(x, alpha, out=out, stream=stream)`` (alpha as given:
    a float or a 0-d DeviceArray).
    """
    op = "scale"
    x = as_array(x)
    check_float(op, "x", x)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.scale(x, alpha, out=out, stream=stream)
    a = scalar(alpha, op, "alpha")
    xc = to_compute(x)
    if xc is x:
        return np.multiply(x, x.dtype.type(a), out=out)
    return finish(xc * a, out, x.dtype)


def axpy(alpha: Any, x: Any, y: Any, *, stream: Any = None) -> Any:
    """``y += alpha * x`` in place; returns ``y``.

    CUDA: ``_cuda.elementwise.axpy(alpha, x, y, stream=stream)``.
    """
    op = "axpy"
    x, y = as_array(x), as_array(y)
    check_float(op, "x", x)
    if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
        raise ValueError(
            f"{op}: x has shape {tuple(x.shape)} and dtype {x.dtype} but y has shape {tuple(y.shape)} and "
            f"dtype {y.dtype}; they must match"
        )
    impl = route(op, "elementwise", x=x, y=y)
    if impl is not None:
        return impl.axpy(alpha, x, y, stream=stream)
    a = scalar(alpha, op, "alpha")
    if to_compute(y) is y:
        y += y.dtype.type(a) * x
    else:
        y[...] = to_compute(y) + a * to_compute(x)
    return y


def _axis(op: str, x: Any, axis: Any) -> "tuple[int, ...] | None":
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"{op}: axis {a} is out of range for an array of shape {tuple(x.shape)}")
        out.append(a % x.ndim)
    return tuple(out)


def _reduce(op: str, x: Any, axis: Any, keepdims: bool, out: Any, stream: Any) -> Any:
    x = as_array(x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: x must be a float array, got dtype {x.dtype}")
    axes = _axis(op, x, axis)
    kept = builtins.range(x.ndim) if axes is None else axes
    shape = tuple(1 if i in kept else d for i, d in enumerate(x.shape)) if keepdims else \
        tuple(d for i, d in enumerate(x.shape) if i not in kept)
    check_out(op, out, shape, x.dtype)
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return getattr(impl, op)(x, axis=axes, keepdims=bool(keepdims), out=out, stream=stream)
    r = getattr(to_compute(x), op)(axis=axes, keepdims=bool(keepdims))
    return finish(np.asarray(r), out, x.dtype)


def sum(x: Any, axis: Any = None, keepdims: bool = False, *, out: Any = None, stream: Any = None) -> Any:
    """Sum over ``axis`` (None: all), in ``x``'s dtype (low precision accumulates in float32).

    CUDA: ``_cuda.elementwise.sum(x, axis=axes, keepdims=keepdims, out=out, stream=stream)``
    with ``axes`` a tuple of non-negative ints or None.
    """
    return _reduce("sum", x, axis, keepdims, out, stream)


def mean(x: Any, axis: Any = None, keepdims: bool = False, *, out: Any = None, stream: Any = None) -> Any:
    """Mean over ``axis`` (None: all). CUDA: as :func:`sum`, ``_cuda.elementwise.mean(...)``."""
    return _reduce("mean", x, axis, keepdims, out, stream)


def argmax(x: Any, axis: int = -1, *, out: Any = None, stream: Any = None) -> Any:
    """Index of the maximum along ``axis`` (the first on ties), int64.

    CUDA: ``_cuda.elementwise.argmax(x, axis=axis, out=out, stream=stream)`` (axis non-negative).
    """
    op = "argmax"
    x = as_array(x)
    (ax,) = _axis(op, x, axis)
    check_out(op, out, tuple(d for i, d in enumerate(x.shape) if i != ax), np.dtype(np.int64))
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.argmax(x, axis=ax, out=out, stream=stream)
    return finish(np.asarray(np.argmax(to_compute(x), axis=ax)), out, np.dtype(np.int64))


def _check_scores_labels(op: str, scores: Any, labels: Any) -> None:
    if scores.ndim != 2:
        raise ValueError(f"{op}: scores must be 2-d (N, C), got shape {tuple(scores.shape)}")
    n, c = scores.shape
    if labels.dtype.kind in "iu":
        if tuple(labels.shape) not in ((n,), (n, 1)):
            raise ValueError(f"{op}: integer labels must have shape ({n},), got {tuple(labels.shape)}")
    elif tuple(labels.shape) != (n, c):
        raise ValueError(f"{op}: one-hot labels must have shape ({n}, {c}), got {tuple(labels.shape)}")


def _label_index(labels: np.ndarray, n: int) -> np.ndarray:
    if labels.dtype.kind in "iu":
        return labels.reshape(n).astype(np.intp, copy=False)
    return np.argmax(to_compute(labels), axis=1)


def accuracy_count(scores: Any, labels: Any, *, stream: Any = None) -> Any:
    """How many rows have ``argmax(scores) == label``: 0-d int64.

    ``labels`` are int ``(N,)`` or one-hot ``(N, C)`` (their argmax is used).

    CUDA: ``_cuda.elementwise.accuracy_count(scores, labels, stream=stream)``.
    """
    op = "accuracy_count"
    scores, labels = as_array(scores), as_array(labels)
    _check_scores_labels(op, scores, labels)
    impl = route(op, "elementwise", scores=scores, labels=labels)
    if impl is not None:
        return impl.accuracy_count(scores, labels, stream=stream)
    n = scores.shape[0]
    hits = np.argmax(to_compute(scores), axis=1) == _label_index(labels, n)
    return np.asarray(np.count_nonzero(hits), dtype=np.int64)


def top_k_count(scores: Any, labels: Any, k: int, *, stream: Any = None) -> Any:
    """How many rows have their label among the ``k`` highest scores: 0-d int64.

    As ``tf.math.in_top_k``: a label is in the top k when fewer than ``k`` classes
    score strictly higher, so ties at the boundary count as hits.

    CUDA: ``_cuda.elementwise.top_k_count(scores, labels, k, stream=stream)``.
    """
    op = "top_k_count"
    scores, labels = as_array(scores), as_array(labels)
    _check_scores_labels(op, scores, labels)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{op}: k must be a positive int, got {k!r}")
    impl = route(op, "elementwise", scores=scores, labels=labels)
    if impl is not None:
        return impl.top_k_count(scores, labels, int(k), stream=stream)
    n = scores.shape[0]
    s = to_compute(scores)
    target = s[np.arange(n), _label_index(labels, n)]
    higher = np.count_nonzero(s > target[:, None], axis=1)
    return np.asarray(np.count_nonzero(higher < k), dtype=np.int64)


def cast(x: Any, dtype: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``x`` converted to ``dtype`` (``"bfloat16"`` is ml_dtypes.bfloat16). Float to int truncates.

    CUDA: ``_cuda.elementwise.cast(x, dtype, out=out, stream=stream)`` with ``dtype`` a np.dtype.
    """
    op = "cast"
    x = as_array(x)
    if x.dtype not in _SUPPORTED:
        raise TypeError(f"{op}: x {x.dtype} is not supported; supported: {', '.join(sorted(map(str, _SUPPORTED)))}")
    dt = normalize_dtype(dtype, op, _SUPPORTED)
    check_out(op, out, x.shape, dt)
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.cast(x, dt, out=out, stream=stream)
    if out is not None:
        np.copyto(out, x, casting="unsafe")
        return out
    return x.astype(dt)


def cast_many(xs: Sequence[Any], dtype: Any, *, tables: Any = None, stream: Any = None) -> list:
    """``[cast(x, dtype) for x in xs]`` for float arrays of one dtype, converted to a float ``dtype``.

    CUDA: one launch for the whole list (a mixed-precision step casts every weight; a launch per
    tensor is launch-bound). The results are views of one new allocation (each starting on a
    256-byte boundary), freed when the last of them dies; the inputs must be contiguous and on one
    device. The launch reads a device table of the sources' addresses and sizes, kept in ``tables``
    (a :class:`dnnbind.kernels.UpdateTables`; None: kept with ``xs[0]``, as the optimizer updates keep
    theirs) and looked up by those addresses and shapes; while the stream is captured into a CUDA
    graph nothing is looked up or kept. The values are bitwise those of :func:`cast`.

    CUDA: ``_cuda.elementwise.cast_many(xs, dt, tables=tables, stream=stream)`` with ``xs`` a list
    and ``dt`` a np.dtype.
    """
    # owner None: the table is kept in ``tables`` (or with xs[0]), not in this throwaway CastMany
    return CastMany(xs, dtype)._run(tables, stream, None)


class CastMany:
    """:func:`cast_many`'s arguments checked once, for a caller that casts the same arrays again and
    again (a trainer's mixed-precision weight copies, every step): ``CastMany(xs, dtype)`` checks
    what :func:`cast_many` checks; ``cast(tables=None, stream=None)`` (or calling it) casts the
    arrays' current values. On CUDA the instance also keeps the device table of its arrays'
    addresses (valid while it holds them), so a call neither checks nor looks anything up; while the
    stream is captured it makes a table for the captured launch instead (see ``UpdateTables``)."""

    __slots__ = ("xs", "dtype", "_impl", "_entry")

    def __init__(self, xs: Sequence[Any], dtype: Any) -> None:
        op = "cast_many"
        if hasattr(xs, "shape"):
            raise TypeError(f"{op}: xs must be a list of arrays, got one array; use cast for one")
        items = [as_array(x) for x in xs]
        dt = normalize_dtype(dtype, op, FLOAT_DTYPES)
        impl = None
        if items:
            src = items[0].dtype
            check_float(op, "xs[0]", items[0])
            impl = route(op, "elementwise", **{f"xs[{i}]": a for i, a in enumerate(items)})
            device = getattr(items[0], "device_index", None)
            for i, a in enumerate(items):
                if a.dtype != src:
                    raise TypeError(f"{op}: every array must have one dtype; xs[0] is {src} but xs[{i}] is "
                                    f"{a.dtype} (cast each dtype's list separately)")
                if impl is not None and (a.device_index != device or not a.is_contiguous):
                    where = f"on device {a.device_index}" if a.device_index != device else "strided"
                    raise ValueError(f"{op}: xs[{i}] must be contiguous and on device {device} like xs[0] "
                                     f"(it is {where})")
        self.xs, self.dtype, self._impl, self._entry = items, dt, impl, None

    def __call__(self, *, tables: Any = None, stream: Any = None) -> list:
        # with ``tables`` given, the table is kept there (as cast_many keeps it); else by this instance
        return self._run(tables, stream, self if tables is None else None)

    def _run(self, tables: Any, stream: Any, owner: "CastMany | None") -> list:
        _check_tables("cast_many", tables)
        if not self.xs:
            return []
        if self._impl is None:
            return [x.astype(self.dtype) for x in self.xs]
        return self._impl.cast_many(self.xs, self.dtype, tables=tables, stream=stream, owner=owner)

    cast = __call__


def fill(x: Any, value: Any, *, stream: Any = None) -> Any:
    """Set every element of ``x`` to ``value`` in place; returns ``x``.

    CUDA: ``_cuda.elementwise.fill(x, value, stream=stream)`` with ``value`` a float.
    """
    op = "fill"
    x = as_array(x)
    v = scalar(value, op, "value")
    impl = route(op, "elementwise", x=x)
    if impl is not None:
        return impl.fill(x, v, stream=stream)
    x.fill(v)
    return x


def zeros_like(x: Any, *, dtype: Any = None, stream: Any = None) -> Any:
    """A new array of zeros with ``x``'s shape (and dtype unless given), on ``x``'s device.

    CUDA: ``_cuda.elementwise.zeros_like(x, dtype=dt, stream=stream)`` (dt a np.dtype).
    """
    x = as_array(x)
    dt = x.dtype if dtype is None else normalize_dtype(dtype, "zeros_like")
    impl = route("zeros_like", "elementwise", x=x)
    if impl is not None:
        return impl.zeros_like(x, dtype=dt, stream=stream)
    return np.zeros(x.shape, dtype=dt)


def empty_like(x: Any, *, dtype: Any = None, stream: Any = None) -> Any:
    """A new uninitialised array with ``x``'s shape (and dtype unless given), on ``x``'s device.

    CUDA: ``_cuda.elementwise.empty_like(x, dtype=dt, stream=stream)``.
    """
    x = as_array(x)
    dt = x.dtype if dtype is None else normalize_dtype(dtype, "empty_like")
    impl = route("empty_like", "elementwise", x=x)
    if impl is not None:
        return impl.empty_like(x, dtype=dt, stream=stream)
    return np.empty(x.shape, dtype=dt)


def copy(x: Any, *, out: Any = None, stream: Any = None) -> Any:
    """A copy of ``x`` (into ``out`` when given; same shape and dtype).

    CUDA: ``_cuda.elementwise.copy(x, out=out, stream=stream)``.
    """
    op = "copy"
    x = as_array(x)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.copy(x, out=out, stream=stream)
    if out is None:
        return x.copy()
    np.copyto(out, x)
    return out


def take(x: Any, indices: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Rows of ``x`` (axis 0) at ``indices`` (1-d ints): ``x[indices]``.

    CUDA: ``_cuda.elementwise.take(x, indices, out=out, stream=stream)``; ``indices`` may be a
    NumPy array (copied to the device) or an int DeviceArray.
    """
    op = "take"
    x = as_array(x)
    indices = as_array(indices)
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least 1 dimension")
    if indices.ndim != 1 or indices.dtype.kind not in "iu":
        raise ValueError(f"{op}: indices must be 1-d integers, got shape {tuple(indices.shape)} dtype {indices.dtype}")
    check_out(op, out, (indices.shape[0],) + tuple(x.shape[1:]), x.dtype)
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.take(x, indices, out=out, stream=stream)
    if indices.size and (indices.min() < -x.shape[0] or indices.max() >= x.shape[0]):
        raise IndexError(f"{op}: indices out of range for {x.shape[0]} rows")
    return np.take(x, indices, axis=0, out=out)


def all_finite(arrays: "Any | Sequence[Any]", *, stream: Any = None) -> Any:
    """1 (0-d int32) when no element of any array is inf or NaN, else 0.

    CUDA: ``_cuda.elementwise.all_finite(arrays, stream=stream)`` with ``arrays`` a list.
    """
    op = "all_finite"
    items = [arrays] if hasattr(arrays, "shape") else list(arrays)
    if not items:
        return np.asarray(1, dtype=np.int32)
    items = [as_array(a) for a in items]
    impl = route(op, "elementwise", **{f"arrays[{i}]": a for i, a in enumerate(items)})
    if impl is not None:
        return impl.all_finite(items, stream=stream)
    ok = builtins.all(bool(np.isfinite(to_compute(a)).all()) for a in items if a.dtype.kind == "f" or a.dtype in FLOAT_DTYPES)
    return np.asarray(int(ok), dtype=np.int32)


def random_crop_flip(
    x: Any,
    *,
    padding: int = 4,
    flip: bool = True,
    layout: str = "NCHW",
    seed: "int | np.random.Generator | None" = None,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Per-sample augmentation: zero-pad by ``padding`` pixels, crop back at a random offset, flip left-right
    with probability 1/2 (when ``flip``). The usual CIFAR recipe.

    ``seed`` is an int (the same int gives the same crops: pass e.g. ``epoch * steps + step``),
    a ``np.random.Generator`` (advanced by the call) or None (an int drawn from dnnbind's seed
    generator, :func:`dnnbind.utils.draw_seed`: reproducible after ``set_random_seed``).

    CUDA: ``_cuda.elementwise.random_crop_flip(x, padding=padding, flip=flip, layout=layout, seed=seed,
    out=out, stream=stream)``.
    """
    op = "random_crop_flip"
    x = as_array(x)
    layout = check_layout(layout)
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 4-d, got shape {tuple(x.shape)}")
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ValueError(f"{op}: padding must be an int >= 0, got {padding!r}")
    check_out(op, out, x.shape, x.dtype)
    if seed is None:
        seed = draw_seed()
    impl = route(op, "elementwise", x=x, out=out)
    if impl is not None:
        return impl.random_crop_flip(x, padding=int(padding), flip=bool(flip), layout=layout, seed=seed, out=out,
                                     stream=stream)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    xh = x.transpose(0, 2, 3, 1) if layout == "NCHW" else x  # work in NHWC
    n, h, w, c = xh.shape
    p = int(padding)
    xp = np.zeros((n, h + 2 * p, w + 2 * p, c), dtype=x.dtype)
    xp[:, p:p + h, p:p + w] = xh
    oy = rng.integers(0, 2 * p + 1, size=n)
    ox = rng.integers(0, 2 * p + 1, size=n)
    cols = ox[:, None] + np.arange(w)[None, :]
    if flip:
        flipped = rng.random(n) < 0.5
        cols[flipped] = cols[flipped][:, ::-1]
    rows = oy[:, None] + np.arange(h)[None, :]
    r = xp[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]  # (N, H, W, C)
    if layout == "NCHW":
        r = r.transpose(0, 3, 1, 2)
    if out is None:
        return np.ascontiguousarray(r)
    np.copyto(out, r)
    return out
