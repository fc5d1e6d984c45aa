"""Softmax and log-softmax over the last axis, forward and backward (numerically stable)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, finish, route, to_compute

__all__ = ["softmax_forward", "softmax_backward"]


def _softmax(x: np.ndarray, log: bool) -> np.ndarray:
    # Shifting by the row maximum keeps exp() from overflowing.
    shifted = x - x.max(axis=-1, keepdims=True)
    if log:
        shifted -= np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        return shifted
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=-1, keepdims=True)
    return shifted


def softmax_forward(x: Any, *, log: bool = False, out: Any = None, stream: Any = None) -> Any:
    """``softmax(x)`` (or ``log_softmax(x)`` when ``log``) over the last axis; any rank >= 1.

    CUDA: ``_cuda.softmax.softmax_forward(x, log=log, out=out, stream=stream)``.
    """
    op = "softmax_forward"
    x = as_array(x)
    check_float(op, "x", x)
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least 1 dimension, got a 0-d array")
    check_out(op, out, x.shape, x.dtype)
    log = bool(log)
    impl = route(op, "softmax", x=x, out=out)
    if impl is not None:
        return impl.softmax_forward(x, log=log, out=out, stream=stream)
    return finish(_softmax(to_compute(x), log), out, x.dtype)


def softmax_backward(dy: Any, y: Any, *, log: bool = False, stream: Any = None) -> Any:
    """Gradient of :func:`softmax_forward` from ``dy`` and the forward output ``y``.

    softmax: ``dx = y * (dy - sum(dy * y))``; log-softmax: ``dx = dy - exp(y) * sum(dy)``
    (sums over the last axis).

    CUDA: ``_cuda.softmax.softmax_backward(dy, y, log=log, stream=stream)``.
    """
    op = "softmax_backward"
    dy, y = as_array(dy), as_array(y)
    check_float(op, "dy", dy)
    if tuple(y.shape) != tuple(dy.shape) or y.dtype != dy.dtype:
        raise ValueError(
            f"{op}: y has shape {tuple(y.shape)} and dtype {y.dtype}, expected those of dy: "
            f"{tuple(dy.shape)}, {dy.dtype}"
        )
    log = bool(log)
    impl = route(op, "softmax", dy=dy, y=y)
    if impl is not None:
        return impl.softmax_backward(dy, y, log=log, stream=stream)
    g, yc = to_compute(dy), to_compute(y)
    if log:
        dx = g - np.exp(yc) * g.sum(axis=-1, keepdims=True)
    else:
        dx = yc * (g - (g * yc).sum(axis=-1, keepdims=True))
    return finish(dx, None, dy.dtype)
