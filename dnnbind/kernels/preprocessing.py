"""Ops of the preprocessing layers: per-channel rescaling and (inverse) normalization, with backward.

Parameters (``scale``/``offset``, ``mean``/``variance``) broadcast against ``x`` by NumPy's rules,
with one restriction that keeps the kernel a plain ``(outer, C, inner)`` walk: the parameter's axes
longer than 1 must be neighbours, matching ``x``'s sizes there. So ``(C,)``, ``(1, 1, 1, C)``,
``(1, H, W, 1)``, ``(H, W, C)`` and scalars ``()`` work on an ``(N, H, W, C)`` input;
``(H, 1, C)`` does not. Two parameters of one op share a shape.

Arithmetic runs in float32 for float16/bfloat16/float32 data (float64 for float64); the
parameters are cast to that type when they are not in it already.

* ``rescale``: ``y = x * scale + offset`` (Keras ``Rescaling``); its backward is
  ``rescale(dy, scale)``.
* ``normalize``: ``y = (x - mean) / max(sqrt(variance), epsilon)``, or with ``invert=True``
  ``y = mean + x * max(sqrt(variance), epsilon)`` (Keras ``Normalization``, ``epsilon`` 1e-7).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._dispatch import as_array, check_float, check_out, compute_dtype, finish, route, to_compute

__all__ = ["rescale", "normalize", "normalize_backward", "channel_run"]


def channel_run(op: str, name: str, x_shape: Sequence[int], p_shape: Sequence[int]) -> "tuple[int, int]":
    """``(C, inner)``: how a parameter of shape ``p_shape`` broadcasts over ``x_shape`` as the middle
    axis of ``(outer, C, inner)``; a clear ValueError when it cannot."""
    x_shape, p_shape = tuple(int(d) for d in x_shape), tuple(int(d) for d in p_shape)
    lead = len(x_shape) - len(p_shape)
    aligned = (1,) * lead + p_shape if lead >= 0 else None
    if aligned is None or any(p not in (1, d) for p, d in zip(aligned, x_shape)):
        raise ValueError(f"{op}: {name} of shape {p_shape} does not broadcast against x of shape {x_shape}")
    long_axes = [k for k, p in enumerate(aligned) if p > 1]
    if not long_axes:
        return 1, 1
    k0, k1 = long_axes[0], long_axes[-1]
    if any(aligned[k] != x_shape[k] for k in range(k0, k1 + 1)):
        raise ValueError(f"{op}: {name} of shape {p_shape} repeats along an axis between two of its own over x of "
                         f"shape {x_shape}; its axes longer than 1 must be neighbours")
    c = int(np.prod(x_shape[k0:k1 + 1]))
    inner = int(np.prod(x_shape[k1 + 1:]))
    return c, inner


def _params(op: str, x: Any, names: Sequence[str], values: Sequence[Any]) -> "tuple[list, int, int]":
    arrays = [as_array(v) for v in values]
    for name, a in zip(names, arrays):
        check_float(op, name, a)
    for name, a in zip(names[1:], arrays[1:]):
        if tuple(a.shape) != tuple(arrays[0].shape):
            raise ValueError(f"{op}: {name} has shape {tuple(a.shape)} but {names[0]} has {tuple(arrays[0].shape)}; "
                             "they must match")
    c, inner = channel_run(op, names[0], x.shape, arrays[0].shape)
    return arrays, c, inner


def _param_dtype(x: Any) -> np.dtype:
    return compute_dtype(x.dtype)


def rescale(x: Any, scale: Any, offset: Any = None, *, out: Any = None, stream: Any = None) -> Any:
    """``x * scale + offset`` (``offset=None``: no offset); see the module docstring for the shapes.

    CUDA: ``_cuda.preprocessing.rescale(x, scale, offset, channels=(C, inner), out=out, stream=stream)``.
    """
    op = "rescale"
    x = as_array(x)
    check_float(op, "x", x)
    names, values = ("scale", "offset"), (scale, offset)
    if offset is None:
        names, values = names[:1], values[:1]
    params, c, inner = _params(op, x, names, values)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "preprocessing", x=x, scale=params[0], offset=params[1] if len(params) > 1 else None, out=out)
    if impl is not None:
        return impl.rescale(x, params[0], params[1] if len(params) > 1 else None, channels=(c, inner), out=out,
                            stream=stream)
    cd = _param_dtype(x)
    y = to_compute(x) * np.asarray(params[0], dtype=cd)
    if len(params) > 1:
        y = y + np.asarray(params[1], dtype=cd)
    return finish(np.asarray(y, dtype=cd), out, x.dtype)


def _std(variance: Any, cd: np.dtype, epsilon: float) -> np.ndarray:
    return np.maximum(np.sqrt(np.asarray(variance, dtype=cd)), cd.type(epsilon))


def _epsilon(op: str, epsilon: Any) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: epsilon must be a number, got {epsilon!r}") from None
    if not eps >= 0.0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {epsilon!r}")
    return eps


def normalize(x: Any, mean: Any, variance: Any, *, invert: bool = False, epsilon: float = 1e-7, out: Any = None,
              stream: Any = None) -> Any:
    """``(x - mean) / max(sqrt(variance), epsilon)``, or ``mean + x * max(sqrt(variance), epsilon)``
    when ``invert``.

    CUDA: ``_cuda.preprocessing.normalize(x, mean, variance, channels=(C, inner), invert=invert,
    epsilon=epsilon, out=out, stream=stream)``.
    """
    op = "normalize"
    x = as_array(x)
    check_float(op, "x", x)
    (mean, variance), c, inner = _params(op, x, ("mean", "variance"), (mean, variance))
    eps = _epsilon(op, epsilon)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "preprocessing", x=x, mean=mean, variance=variance, out=out)
    if impl is not None:
        return impl.normalize(x, mean, variance, channels=(c, inner), invert=bool(invert), epsilon=eps, out=out,
                              stream=stream)
    cd = _param_dtype(x)
    sd, m, xc = _std(variance, cd, eps), np.asarray(mean, dtype=cd), to_compute(x)
    y = m + xc * sd if invert else (xc - m) / sd
    return finish(np.asarray(y, dtype=cd), out, x.dtype)


def normalize_backward(dy: Any, variance: Any, *, invert: bool = False, epsilon: float = 1e-7,
                       stream: Any = None) -> Any:
    """Gradient w.r.t. ``x`` of :func:`normalize`: ``dy / max(sqrt(variance), epsilon)`` (times it
    when ``invert``).

    CUDA: ``_cuda.preprocessing.normalize_backward(dy, variance, channels=(C, inner), invert=invert,
    epsilon=epsilon, stream=stream)``.
    """
    op = "normalize_backward"
    dy = as_array(dy)
    check_float(op, "dy", dy)
    (variance,), c, inner = _params(op, dy, ("variance",), (variance,))
    eps = _epsilon(op, epsilon)
    impl = route(op, "preprocessing", dy=dy, variance=variance)
    if impl is not None:
        return impl.normalize_backward(dy, variance, channels=(c, inner), invert=bool(invert), epsilon=eps,
                                       stream=stream)
    cd = _param_dtype(dy)
    sd, g = _std(variance, cd, eps), to_compute(dy)
    return finish(np.asarray(g * sd if invert else g / sd, dtype=cd), None, dy.dtype)
