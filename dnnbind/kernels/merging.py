"""Ops of the merge layers: elementwise maximum/minimum and their gradient, concatenation and its
inverse.

Arrays are float (float16, bfloat16, float32, float64) and of one dtype; ``maximum``/``minimum``
take two arrays of one shape (no broadcasting). NaN propagates through ``maximum``/``minimum`` as
in NumPy. :func:`extremum_backward` is the gradient of ``y = maximum(x0, maximum(x1, ...))`` (or of
the minimum): each element's gradient goes to the *first* input equal to ``y`` there (TensorFlow's
convention for ties; JAX and PyTorch split ties instead).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._dispatch import as_array, check_float, check_out, route

__all__ = ["maximum", "minimum", "extremum_backward", "concatenate", "concatenate_backward"]


def _check_pair(op: str, a: Any, b: Any) -> None:
    check_float(op, "a", a)
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        raise ValueError(
            f"{op}: a has shape {tuple(a.shape)} and dtype {a.dtype} but b has shape {tuple(b.shape)} and "
            f"dtype {b.dtype}; they must match"
        )


def _extremum(op: str, ufunc: Any, a: Any, b: Any, out: Any, stream: Any) -> Any:
    a, b = as_array(a), as_array(b)
    _check_pair(op, a, b)
    check_out(op, out, a.shape, a.dtype)
    impl = route(op, "merging", a=a, b=b, out=out)
    if impl is not None:
        return getattr(impl, op)(a, b, out=out, stream=stream)
    # a selection: exact in every dtype, no compute-dtype round trip needed
    return ufunc(a, b, out=out)


def maximum(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Elementwise ``max(a, b)`` (NaN if either is NaN). ``out`` may be ``a``.

    CUDA: ``_cuda.merging.maximum(a, b, out=out, stream=stream)``.
    """
    return _extremum("maximum", np.maximum, a, b, out, stream)


def minimum(a: Any, b: Any, *, out: Any = None, stream: Any = None) -> Any:
    """Elementwise ``min(a, b)`` (NaN if either is NaN). ``out`` may be ``a``.

    CUDA: ``_cuda.merging.minimum(a, b, out=out, stream=stream)``.
    """
    return _extremum("minimum", np.minimum, a, b, out, stream)


def _check_inputs(op: str, name: str, arrays: Sequence[Any], shape: tuple, dtype: np.dtype) -> list:
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a list of arrays, got {type(arrays).__name__}")
    items = [as_array(a) for a in arrays]
    if not items:
        raise ValueError(f"{op}: {name} must hold at least one array")
    for i, a in enumerate(items):
        if tuple(a.shape) != shape or a.dtype != dtype:
            raise ValueError(f"{op}: {name}[{i}] has shape {tuple(a.shape)} and dtype {a.dtype}, expected shape "
                             f"{shape} and dtype {dtype}")
    return items


def extremum_backward(dy: Any, inputs: Sequence[Any], y: Any, *, stream: Any = None) -> list:
    """Gradients w.r.t. ``inputs`` of ``y``, their elementwise maximum or minimum.

    ``dx[i]`` is ``dy`` where ``inputs[i]`` is the first input equal to ``y``, else 0 (ties go to the
    earliest input; a NaN ``y`` sends no gradient anywhere). Every array has ``dy``'s shape and dtype.
    Returns a list of new arrays, one per input.

    CUDA: ``_cuda.merging.extremum_backward(dy, inputs, y, stream=stream)`` (inputs a list).
    """
    op = "extremum_backward"
    dy, y = as_array(dy), as_array(y)
    check_float(op, "dy", dy)
    (y,) = _check_inputs(op, "y", [y], tuple(dy.shape), dy.dtype)
    items = _check_inputs(op, "inputs", inputs, tuple(dy.shape), dy.dtype)
    impl = route(op, "merging", dy=dy, y=y, **{f"inputs[{i}]": a for i, a in enumerate(items)})
    if impl is not None:
        return impl.extremum_backward(dy, items, y, stream=stream)
    taken = np.zeros(dy.shape, dtype=bool)
    zero = np.zeros((), dtype=dy.dtype)
    grads = []
    for x in items:
        hit = (x == y) & ~taken
        taken |= hit
        grads.append(np.where(hit, dy, zero))
    return grads


def _axis(op: str, ndim: int, axis: Any) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise ValueError(f"{op}: axis {int(axis)} is out of range for {ndim}-d arrays")
    return int(axis) % ndim


def concatenate(arrays: Sequence[Any], axis: int = -1, *, out: Any = None, stream: Any = None) -> Any:
    """Join ``arrays`` (same dtype and rank; equal shapes except along ``axis``) along ``axis``.

    CUDA: ``_cuda.merging.concatenate(arrays, axis=axis, out=out, stream=stream)`` with ``arrays``
    a list and ``axis`` non-negative.
    """
    op = "concatenate"
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError(f"{op}: arrays must be a non-empty list of arrays, got {arrays!r}")
    items = [as_array(a) for a in arrays]
    first = items[0]
    if first.ndim < 1:
        raise ValueError(f"{op}: arrays must have at least 1 dimension, got a scalar")
    check_float(op, "arrays[0]", first)
    ax = _axis(op, first.ndim, axis)
    for i, a in enumerate(items[1:], 1):
        same = a.ndim == first.ndim and all(a.shape[d] == first.shape[d] for d in range(first.ndim) if d != ax)
        if not same or a.dtype != first.dtype:
            raise ValueError(f"{op}: arrays[{i}] has shape {tuple(a.shape)} and dtype {a.dtype}, but arrays[0] has "
                             f"shape {tuple(first.shape)} and dtype {first.dtype}; they may differ only along "
                             f"axis {ax}")
    shape = list(first.shape)
    shape[ax] = sum(int(a.shape[ax]) for a in items)
    check_out(op, out, tuple(shape), first.dtype)
    impl = route(op, "merging", **{f"arrays[{i}]": a for i, a in enumerate(items)}, out=out)
    if impl is not None:
        return impl.concatenate(items, axis=ax, out=out, stream=stream)
    return np.concatenate(items, axis=ax, out=out)


def concatenate_backward(dy: Any, sizes: Sequence[int], axis: int = -1, *, stream: Any = None) -> list:
    """The pieces of ``dy`` along ``axis`` of lengths ``sizes`` (the gradients of :func:`concatenate`'s
    inputs): a list of new contiguous arrays.

    CUDA: ``_cuda.merging.concatenate_backward(dy, sizes, axis=axis, stream=stream)`` (``sizes`` a
    tuple of ints, ``axis`` non-negative).
    """
    op = "concatenate_backward"
    dy = as_array(dy)
    if dy.ndim < 1:
        raise ValueError(f"{op}: dy must have at least 1 dimension, got a scalar")
    check_float(op, "dy", dy)
    ax = _axis(op, dy.ndim, axis)
    try:
        sizes = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: sizes must be a sequence of ints, got {sizes!r}") from None
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) != dy.shape[ax]:
        raise ValueError(f"{op}: sizes {sizes} must be non-negative and add up to dy.shape[{ax}] = {dy.shape[ax]}")
    impl = route(op, "merging", dy=dy)
    if impl is not None:
        return impl.concatenate_backward(dy, sizes, axis=ax, stream=stream)
    bounds = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(piece) for piece in np.split(dy, bounds, axis=ax)]
