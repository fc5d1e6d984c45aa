"""Reductions and scans of ``keras.ops``: ``sum``, ``mean``, ``max``/``min`` (``amax``/``amin``), ``prod``,
``any``/``all``, ``argmax``/``argmin``, ``var``/``std``, ``logsumexp``, ``cumsum``/``cumprod``, with
Keras's dtype rules and VJPs (a max's gradient is shared equally among tied maxima, as JAX does)."""

from __future__ import annotations

import builtins
from typing import Any, Callable

import numpy as np

from ..autodiff.tensor import FilledTensor, Tensor
from ..kernels import numeric as N
from . import _core
from ._core import filled, is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import (add, cast, divide, equal, exp, log, multiply, sqrt, square, subtract, where)

__all__ = ["sum", "mean", "max", "min", "amax", "amin", "prod", "any", "all", "argmax", "argmin", "var", "std",
           "logsumexp", "cumsum", "cumprod", "count_nonzero"]


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, an int, a list or tuple) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = []
    for a in items:
        a = int(a)
        if not -builtins.max(ndim, 1) <= a < builtins.max(ndim, 1):
            raise ValueError(f"axis {a} is out of bounds for a tensor of rank {ndim}")
        out.append(a % builtins.max(ndim, 1))
    return tuple(sorted(set(out)))


def _kept_shape(shape: tuple, axes: tuple) -> tuple:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _expand_back(g: Tensor, shape: tuple, axes: tuple, keepdims: bool) -> Tensor:
    """A reduction's output gradient broadcast back to the input ``shape``."""
    kept = _kept_shape(shape, axes)
    if isinstance(g, FilledTensor):
        return filled(g.value, shape, g.dtype, g.device)
    reshape = _core.REGISTRY["reshape"]["fn"]
    broadcast_to = _core.REGISTRY["broadcast_to"]["fn"]
    if not keepdims and tuple(g.shape) != kept:
        g = reshape(g, kept)
    return broadcast_to(g, shape)


def _sum_dtype(dt: np.dtype) -> np.dtype:
    name = _core.standardize_dtype(dt)
    if name in ("bool", "int8", "int16"):
        return np.dtype(np.int32)
    if name in ("uint8", "uint16"):
        return np.dtype(np.uint32)
    return dt


@keras_op
def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """``keras.ops.sum``: bool and small ints sum in int32 (uint32 for small unsigned), as Keras."""
    (t,) = tensors(x)
    axes = _axes(axis, t.ndim)
    dt = _sum_dtype(t.dtype)
    if isinstance(t, FilledTensor) and t._node is None:
        n = 1
        for a in axes:
            n *= t.shape[a]
        shape = _kept_shape(t.shape, axes) if keepdims else tuple(s for i, s in enumerate(t.shape) if i not in axes)
        return filled(t.value * n, shape, dt, t.device)
    src = t if t.dtype == dt or t.dtype.kind == "b" else cast(t, dt)
    out = N.reduce("sum", src.data, axes, bool(keepdims), dtype=dt)
    if not is_float(dt):
        return Tensor(out)
    shape = tuple(t.shape)
    return make(out, (src,), lambda node, g: (_expand_back(g, shape, axes, keepdims),), "sum")


@keras_op
def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``keras.ops.mean``: ints and bool average in float32 (``result_type(x, float32)``)."""
    (t,) = tensors(x)
    axes = _axes(axis, t.ndim)
    dt = t.dtype if is_float(t.dtype) else np_dtype(result_type(t.dtype, "float32"))
    src = t if t.dtype == dt else cast(t, dt)
    n = 1
    for a in axes:
        n *= int(t.shape[a])
    out = N.reduce("mean", src.data, axes, bool(keepdims), dtype=dt)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        return (_expand_back(divide(g, float(n)) if n else g, shape, axes, keepdims),)

    return make(out, (src,), backward, "mean")


def _extremum(op: str, t: Tensor, axis: Any, keepdims: bool, initial: Any = None) -> Tensor:
    axes = _axes(axis, t.ndim)
    out = N.reduce(op, t.data, axes, bool(keepdims))
    if initial is not None:
        fn = _core.REGISTRY["maximum" if op == "max" else "minimum"]["fn"]
        res = fn(Tensor(out), initial)
        return res
    if not is_float(t.dtype):
        return Tensor(out)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        y = _expand_back(node.output(0), shape, axes, keepdims)
        mask = cast(equal(t, y), g.dtype)
        count = _expand_back(sum(mask, axis=axes, keepdims=True), shape, axes, True)
        return (multiply(_expand_back(g, shape, axes, keepdims), divide(mask, count)),)

    return make(out, (t,), backward, op, keep_outputs=True)


@keras_op
def max(x: Any, axis: Any = None, keepdims: bool = False, initial: Any = None) -> Tensor:  # noqa: A001
    """``keras.ops.max``: NaN propagates; tied maxima share the gradient equally."""
    (t,) = tensors(x)
    return _extremum("max", t, axis, keepdims, initial)


@keras_op
def min(x: Any, axis: Any = None, keepdims: bool = False, initial: Any = None) -> Tensor:  # noqa: A001
    """``keras.ops.min`` (see :func:`max`)."""
    (t,) = tensors(x)
    return _extremum("min", t, axis, keepdims, initial)


@keras_op
def amax(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return max(x, axis=axis, keepdims=keepdims)


@keras_op
def amin(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return min(x, axis=axis, keepdims=keepdims)


@keras_op
def prod(x: Any, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
    """``keras.ops.prod``: bool and small ints multiply in int32 (uint32 unsigned), unless ``dtype``."""
    (t,) = tensors(x)
    axes = _axes(axis, t.ndim)
    dt = np_dtype(dtype) if dtype is not None else _sum_dtype(t.dtype)
    src = t if t.dtype == dt else cast(t, dt)
    out = N.reduce("prod", src.data, axes, bool(keepdims), dtype=dt)
    if not is_float(dt):
        return Tensor(out)
    shape = tuple(t.shape)

    def backward(node: Any, g: Tensor) -> tuple:
        # d prod / d x_i = prod of the others; computed without dividing (zeros are fine)
        reshape = _core.REGISTRY["reshape"]["fn"]
        transpose = _core.REGISTRY["transpose"]["fn"]
        rest = tuple(i for i in range(len(shape)) if i not in axes)
        perm = rest + axes
        moved = transpose(src, perm)
        lead = tuple(shape[i] for i in rest)
        n = 1
        for a in axes:
            n *= shape[a]
        flat = reshape(moved, lead + (n,))
        left = cumprod(flat, axis=-1, exclusive=True)
        right = cumprod(flat, axis=-1, exclusive=True, reverse=True)
        others = multiply(left, right)
        gexp = reshape(_expand_back(g, shape, axes, keepdims), shape)
        gmoved = reshape(transpose(gexp, perm), lead + (n,))
        res = reshape(multiply(gmoved, others), tuple(shape[i] for i in perm))
        inverse = tuple(int(i) for i in np.argsort(perm))
        return (transpose(res, inverse),)

    return make(out, (src,), backward, "prod")


@keras_op(differentiable=False)
def any(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    (t,) = tensors(x)
    return Tensor(N.reduce("any", t.data, _axes(axis, t.ndim), bool(keepdims)))


@keras_op(differentiable=False)
def all(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    (t,) = tensors(x)
    return Tensor(N.reduce("all", t.data, _axes(axis, t.ndim), bool(keepdims)))


def _arg(op: str, x: Any, axis: Any, keepdims: bool) -> Tensor:
    (t,) = tensors(x)
    if t.ndim == 0:
        return Tensor(N.full((), 0, np.int32, device=t.device))
    if axis is not None and not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int or None, got {axis!r}")
    src = t
    if is_float(t.dtype):
        # Keras: -0.0 counts below +0.0
        src = where(_core.REGISTRY["logical_and"]["fn"](equal(t, 0.0), _core.REGISTRY["signbit"]["fn"](t)),
                    -float(np.finfo(np.float32).tiny), t)
    return Tensor(N.reduce(op, src.data, None if axis is None else int(axis), bool(keepdims)))


@keras_op(differentiable=False)
def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``keras.ops.argmax``: int32, the first maximum (axis None: of the flattened tensor)."""
    return _arg("argmax", x, axis, keepdims)


@keras_op(differentiable=False)
def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _arg("argmin", x, axis, keepdims)


def _var(t: Tensor, axis: Any, keepdims: bool) -> Tensor:
    dt = t.dtype if is_float(t.dtype) else _core.floatx()
    src = t if t.dtype == dt else cast(t, dt)
    axes = _axes(axis, t.ndim)
    m = mean(src, axis=axes, keepdims=True)
    return mean(square(subtract(src, m)), axis=axes, keepdims=keepdims)


@keras_op
def var(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``keras.ops.var``: the biased variance (two passes: mean, then mean of squared deviations)."""
    (t,) = tensors(x)
    return _var(t, axis, keepdims)


@keras_op
def std(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    (t,) = tensors(x)
    return sqrt(_var(t, axis, keepdims))


@keras_op(family="math")
def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``keras.ops.logsumexp``: ``log(sum(exp(x)))`` computed from the maximum (no overflow)."""
    (t,) = tensors(x)
    if not is_float(t.dtype):
        t = cast(t, _core.floatx())
    axes = _axes(axis, t.ndim)
    REGISTRY = _core.REGISTRY
    stop = REGISTRY["stop_gradient"]["fn"]
    isfinite = REGISTRY["isfinite"]["fn"]
    m = stop(max(t, axis=axes, keepdims=True))
    m = where(isfinite(m), m, 0.0)
    s = sum(exp(subtract(t, m)), axis=axes, keepdims=True)
    out = add(log(s), m)
    if not keepdims:
        out = REGISTRY["squeeze"]["fn"](out, axes) if axes else out
    return out


def _scan(op: str, x: Any, axis: Any, dtype: Any, reverse: bool = False, exclusive: bool = False) -> Tensor:
    (t,) = tensors(x)
    if axis is None:
        t = _core.REGISTRY["reshape"]["fn"](t, (-1,))
        axis = 0
    dt = np_dtype(dtype) if dtype is not None else (np.dtype(np.int32) if t.dtype.kind == "b" else t.dtype)
    src = t if t.dtype == dt else cast(t, dt)
    ax = int(axis) % src.ndim
    if exclusive:
        pad = _core.REGISTRY["pad"]["fn"]
        width = [(0, 0)] * src.ndim
        width[ax] = (0, 1) if reverse else (1, 0)
        ident = 0 if op == "cumsum" else 1
        idx = [slice(None)] * src.ndim
        idx[ax] = slice(1, None) if reverse else slice(0, -1)
        shifted = _core.REGISTRY["get_item"]["fn"](pad(src, width, constant_values=ident), tuple(idx))
        return _scan(op, shifted, ax, dt, reverse=reverse)
    out = N.cumulative(op, src.data, ax, reverse=bool(reverse), dtype=dt)
    if not is_float(dt):
        return Tensor(out)
    if op == "cumsum":
        return make(out, (src,), lambda node, g: (cumsum(g, axis=ax, reverse=not reverse),), "cumsum")

    def backward(node: Any, g: Tensor) -> tuple:
        # dy_k/dx_i = prod_{j<i} x_j * prod_{i<j<=k} x_j for k >= i: summed against g without dividing, so
        # zeros in x are exact; an (n, n) triangle per row, so long scans (n > 2048) divide instead
        reg = _core.REGISTRY
        reshape, moveaxis, flip, tri = (reg[k]["fn"] for k in ("reshape", "moveaxis", "flip", "tri"))
        n = int(src.shape[ax])
        xm, gm = moveaxis(src, ax, -1), moveaxis(g, ax, -1)
        if reverse:
            xm, gm = flip(xm, -1), flip(gm, -1)
        if n > 2048:
            y = cumprod(xm, axis=-1)
            res = divide(cumsum(multiply(gm, y), axis=-1, reverse=True), xm)
        else:
            lead = tuple(xm.shape[:-1])
            lower = tri(n, n, k=0, dtype=src.dtype)  # j <= i
            m = add(multiply(reshape(xm, lead + (1, n)), subtract(1.0, lower)), lower)
            c = cumprod(m, axis=-1)  # c[i, k] = prod_{i<j<=k} x_j
            k_ge_i = subtract(1.0, tri(n, n, k=-1, dtype=src.dtype))
            gsum = sum(multiply(reshape(gm, lead + (1, n)), multiply(c, k_ge_i)), axis=-1)
            res = multiply(cumprod(xm, axis=-1, exclusive=True), gsum)
        if reverse:
            res = flip(res, -1)
        return (moveaxis(res, -1, ax),)

    return make(out, (src,), backward, "cumprod")


@keras_op
def cumsum(x: Any, axis: Any = None, dtype: Any = None, reverse: bool = False, exclusive: bool = False) -> Tensor:
    """``keras.ops.cumsum`` (``axis=None``: of the flattened tensor; bool sums in int32).
    ``reverse``/``exclusive`` are dnnbind extensions used by VJPs."""
    return _scan("cumsum", x, axis, dtype, reverse, exclusive)


@keras_op
def cumprod(x: Any, axis: Any = None, dtype: Any = None, reverse: bool = False, exclusive: bool = False) -> Tensor:
    """``keras.ops.cumprod`` (see :func:`cumsum`)."""
    return _scan("cumprod", x, axis, dtype, reverse, exclusive)


@keras_op(differentiable=False)
def count_nonzero(x: Any, axis: Any = None) -> Tensor:
    """``keras.ops.count_nonzero``: int32 counts."""
    (t,) = tensors(x)
    ne = _core.REGISTRY["not_equal"]["fn"](t, 0)
    return sum(cast(ne, "int32"), axis=axis)
