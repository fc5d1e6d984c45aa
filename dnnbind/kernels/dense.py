"""Dense (fully connected) layers and a general matmul.

The weight is ``(in, out)`` (the Keras layout): ``y = x @ w + b``. ``x`` may have
more than 2 dimensions; the last is the feature axis (as Keras Dense).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, check_same_dtype, finish, route, scalar, to_compute

__all__ = ["dense_forward", "dense_backward_input", "dense_backward_weight", "matmul"]


def _check_x_w(op: str, x_name: str, x: Any, w: Any) -> None:
    check_float(op, x_name, x)
    check_same_dtype(op, x_name, x, "w", w)
    if w.ndim != 2:
        raise ValueError(f"{op}: w must be 2-d (in, out), got shape {tuple(w.shape)}")
    if x.ndim < 1:
        raise ValueError(f"{op}: {x_name} must have at least 1 dimension")


def dense_forward(x: Any, w: Any, b: Any = None, *, out: Any = None, stream: Any = None) -> Any:
    """``y = x @ w (+ b)``: ``x`` ``(..., in)``, ``w`` ``(in, out)``, ``b`` ``(out,)`` -> ``(..., out)``.

    CUDA: ``_cuda.dense.dense_forward(x, w, b, out=out, stream=stream)``.
    """
    op = "dense_forward"
    x, w = as_array(x), as_array(w)
    _check_x_w(op, "x", x, w)
    if x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"{op}: x has {x.shape[-1]} features (shape {tuple(x.shape)}) but w expects {w.shape[0]} "
            f"(w shape {tuple(w.shape)}, layout (in, out))"
        )
    if b is not None:
        b = as_array(b)
        check_same_dtype(op, "x", x, "b", b)
        if tuple(b.shape) != (w.shape[1],):
            raise ValueError(f"{op}: b has shape {tuple(b.shape)}, expected ({w.shape[1]},)")
    y_shape = tuple(x.shape[:-1]) + (w.shape[1],)
    check_out(op, out, y_shape, x.dtype)
    impl = route(op, "dense", x=x, w=w, b=b, out=out)
    if impl is not None:
        return impl.dense_forward(x, w, b, out=out, stream=stream)
    xc, wc = to_compute(x), to_compute(w)
    if xc is x and (out is None or x.ndim == 2):
        y = np.matmul(x, w, out=out)
        if b is not None:
            y += b
        return y
    y = np.matmul(xc, wc)
    if b is not None:
        y += to_compute(b)
    return finish(y, out, x.dtype)


def dense_backward_input(dy: Any, w: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``dx = dy @ w.T``: ``dy`` ``(..., out)`` -> ``(..., in)``.

    CUDA: ``_cuda.dense.dense_backward_input(dy, w, out=out, stream=stream)``.
    """
    op = "dense_backward_input"
    dy, w = as_array(dy), as_array(w)
    _check_x_w(op, "dy", dy, w)
    if dy.shape[-1] != w.shape[1]:
        raise ValueError(f"{op}: dy has {dy.shape[-1]} features but w (shape {tuple(w.shape)}) has {w.shape[1]} outputs")
    check_out(op, out, tuple(dy.shape[:-1]) + (w.shape[0],), dy.dtype)
    impl = route(op, "dense", dy=dy, w=w, out=out)
    if impl is not None:
        return impl.dense_backward_input(dy, w, out=out, stream=stream)
    return finish(np.matmul(to_compute(dy), to_compute(w).T), out, dy.dtype)


def dense_backward_weight(x: Any, dy: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``dw = x.T @ dy`` over all leading axes: ``(in, out)``. (The bias gradient is ``kernels.bias_backward(dy)``.)

    CUDA: ``_cuda.dense.dense_backward_weight(x, dy, out=out, stream=stream)``.
    """
    op = "dense_backward_weight"
    x, dy = as_array(x), as_array(dy)
    check_float(op, "x", x)
    check_same_dtype(op, "x", x, "dy", dy)
    if x.ndim < 1 or tuple(x.shape[:-1]) != tuple(dy.shape[:-1]):
        raise ValueError(
            f"{op}: x (shape {tuple(x.shape)}) and dy (shape {tuple(dy.shape)}) must agree on every axis but the last"
        )
    check_out(op, out, (x.shape[-1], dy.shape[-1]), x.dtype)
    impl = route(op, "dense", x=x, dy=dy, out=out)
    if impl is not None:
        return impl.dense_backward_weight(x, dy, out=out, stream=stream)
    x2 = to_compute(x).reshape(-1, x.shape[-1])
    dy2 = to_compute(dy).reshape(-1, dy.shape[-1])
    return finish(np.matmul(x2.T, dy2), out, x.dtype)


def matmul(
    a: Any,
    b: Any,
    *,
    transpose_a: bool = False,
    transpose_b: bool = False,
    alpha: Any = 1.0,
    beta: Any = 0.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """``alpha * op(a) @ op(b) + beta * out`` for 2-d ``a``, ``b`` (``op`` transposes when asked).

    ``beta != 0`` needs ``out`` (it is read, then overwritten).

    CUDA: ``_cuda.dense.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, alpha=alpha,
    beta=beta, out=out, stream=stream)`` with ``alpha``/``beta`` floats.
    """
    op = "matmul"
    a, b = as_array(a), as_array(b)
    check_float(op, "a", a)
    check_same_dtype(op, "a", a, "b", b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{op}: a and b must be 2-d, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    m, k = (a.shape[1], a.shape[0]) if transpose_a else tuple(a.shape)
    k2, n = (b.shape[1], b.shape[0]) if transpose_b else tuple(b.shape)
    if k != k2:
        raise ValueError(
            f"{op}: inner dimensions differ: op(a) is ({m}, {k}) and op(b) is ({k2}, {n}) "
            f"(transpose_a={transpose_a}, transpose_b={transpose_b})"
        )
    alpha, beta = scalar(alpha, op, "alpha"), scalar(beta, op, "beta")
    if beta != 0.0 and out is None:
        raise ValueError(f"{op}: beta={beta} needs out= (the C it accumulates into)")
    check_out(op, out, (m, n), a.dtype)
    impl = route(op, "dense", a=a, b=b, out=out)
    if impl is not None:
        return impl.matmul(a, b, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b), alpha=alpha,
                           beta=beta, out=out, stream=stream)
    ac, bc = to_compute(a), to_compute(b)
    r = np.matmul(ac.T if transpose_a else ac, bc.T if transpose_b else bc)
    if alpha != 1.0:
        r *= alpha
    if beta != 0.0:
        r += beta * to_compute(out)
    return finish(r, out, a.dtype)
