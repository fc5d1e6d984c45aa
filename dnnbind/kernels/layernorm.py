"""Layer normalization over the trailing axes of each sample (Keras LayerNormalization).

``x`` is viewed as ``(rows, cols)``: ``cols`` is the product of its last ``norm_ndim``
axes, ``rows`` the product of the others. Each row is normalised with its own biased
mean and variance::

    y = (x - mean) / sqrt(var + epsilon) * gamma + beta

``gamma``/``beta`` have the shape of the normalised axes, ``x.shape[-norm_ndim:]``, and
are float32 (float64 when ``x`` is float64) whatever ``x``'s dtype; ``None`` stands for
ones / zeros (Keras ``scale=False`` / ``center=False``). The saved statistics ``mean`` and
``inv_std = 1 / sqrt(var + epsilon)`` have the shape of the other axes, ``x.shape[:-norm_ndim]``,
in the same parameter dtype. float16/bfloat16 data accumulate in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, finish, param_dtype, route, to_compute

__all__ = ["layernorm_forward", "layernorm_backward"]


def _geometry(op: str, x: Any, norm_ndim: Any) -> tuple[int, int, int]:
    """(norm_ndim, rows, cols) after checking ``x`` and ``norm_ndim``."""
    check_float(op, "x", x)
    if isinstance(norm_ndim, bool) or not isinstance(norm_ndim, (int, np.integer)):
        raise TypeError(f"{op}: norm_ndim must be an int, got {norm_ndim!r}")
    k = int(norm_ndim)
    if not 1 <= k <= x.ndim - 1:
        raise ValueError(
            f"{op}: norm_ndim must be in [1, x.ndim - 1] = [1, {x.ndim - 1}] (the batch axis is never "
            f"normalised), got {k} for x of shape {tuple(x.shape)}"
        )
    cols = math.prod(int(d) for d in x.shape[x.ndim - k:])
    rows = math.prod(int(d) for d in x.shape[:x.ndim - k])
    return k, rows, cols


def _check_param(op: str, name: str, p: Any, shape: tuple[int, ...], x: Any) -> None:
    if p is None:
        return
    want = param_dtype(x.dtype)
    if tuple(p.shape) != shape:
        raise ValueError(f"{op}: {name} has shape {tuple(p.shape)}, expected {shape} for x of shape {tuple(x.shape)}")
    if p.dtype != want:
        raise TypeError(f"{op}: {name} must be {want} for x of dtype {x.dtype}, got {p.dtype}")


def _epsilon(op: str, epsilon: Any) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: epsilon must be a number, got {epsilon!r}") from None
    if not eps > 0 or not math.isfinite(eps):
        raise ValueError(f"{op}: epsilon must be a finite number > 0, got {epsilon!r}")
    return eps


def layernorm_forward(
    x: Any,
    gamma: Any = None,
    beta: Any = None,
    *,
    epsilon: float = 1e-3,
    norm_ndim: int = 1,
    out: Any = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """Normalise each row of ``x`` over its last ``norm_ndim`` axes.

    Returns ``(y, mean, inv_std)``: ``y`` like ``x`` (written into ``out`` when given); ``mean``
    and ``inv_std`` of shape ``x.shape[:-norm_ndim]`` in the parameter dtype, for the backward.

    CUDA: ``_cuda.layernorm.layernorm_forward(x, gamma, beta, epsilon=epsilon, norm_ndim=norm_ndim,
    rows=rows, cols=cols, out=out, stream=stream)`` (one block per row, fixed-order sums: deterministic).
    """
    op = "layernorm_forward"
    x, gamma, beta = as_array(x), _opt(gamma), _opt(beta)
    k, rows, cols = _geometry(op, x, norm_ndim)
    pshape = tuple(int(d) for d in x.shape[x.ndim - k:])
    _check_param(op, "gamma", gamma, pshape, x)
    _check_param(op, "beta", beta, pshape, x)
    eps = _epsilon(op, epsilon)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "layernorm", x=x, gamma=gamma, beta=beta, out=out)
    if impl is not None:
        return impl.layernorm_forward(x, gamma, beta, epsilon=eps, norm_ndim=k, rows=rows, cols=cols, out=out,
                                      stream=stream)
    xc = to_compute(x).reshape(rows, cols)
    mean = xc.mean(axis=1)
    y = xc - mean[:, None]
    var = np.square(y).mean(axis=1)
    inv_std = 1.0 / np.sqrt(var + eps)
    y *= inv_std[:, None]
    if gamma is not None:
        y *= gamma.reshape(cols).astype(y.dtype, copy=False)
    if beta is not None:
        y += beta.reshape(cols).astype(y.dtype, copy=False)
    stats_shape = tuple(x.shape[:x.ndim - k])
    pdt = param_dtype(x.dtype)
    return (finish(y.reshape(x.shape), out, x.dtype), mean.astype(pdt).reshape(stats_shape),
            inv_std.astype(pdt).reshape(stats_shape))


def layernorm_backward(
    dy: Any,
    x: Any,
    gamma: Any,
    mean: Any,
    inv_std: Any,
    *,
    norm_ndim: int = 1,
    param_grads: bool = True,
    out: Any = None,
    dgamma_out: Any = None,
    dbeta_out: Any = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """Gradients of :func:`layernorm_forward`: ``(dx, dgamma, dbeta)``.

    ``mean``/``inv_std`` are the forward's; ``gamma`` is the forward's (``None``: ones).
    With ``xhat = (x - mean) * inv_std`` and ``g = dy * gamma``, per row of ``cols`` values::

        dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat        dbeta = sum over rows of dy

    ``dgamma``/``dbeta`` (the parameter shape and dtype) are ``None`` when ``param_grads`` is
    False. ``out``, ``dgamma_out`` and ``dbeta_out`` receive the results when given.

    CUDA: ``_cuda.layernorm.layernorm_backward(dy, x, gamma, mean, inv_std, norm_ndim=norm_ndim, rows=rows,
    cols=cols, param_grads=param_grads, out=out, dgamma_out=dgamma_out, dbeta_out=dbeta_out, stream=stream)``
    (dx one block per row; the parameter sums in two passes over fixed row blocks: deterministic).
    """
    op = "layernorm_backward"
    dy, x, gamma, mean, inv_std = as_array(dy), as_array(x), _opt(gamma), as_array(mean), as_array(inv_std)
    k, rows, cols = _geometry(op, x, norm_ndim)
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise ValueError(
            f"{op}: dy has shape {tuple(dy.shape)} and dtype {dy.dtype}, expected x's {tuple(x.shape)}, {x.dtype}"
        )
    pshape = tuple(int(d) for d in x.shape[x.ndim - k:])
    stats_shape = tuple(int(d) for d in x.shape[:x.ndim - k])
    _check_param(op, "gamma", gamma, pshape, x)
    _check_param(op, "mean", mean, stats_shape, x)
    _check_param(op, "inv_std", inv_std, stats_shape, x)
    param_grads = bool(param_grads)
    check_out(op, out, x.shape, x.dtype)
    pdt = param_dtype(x.dtype)
    if param_grads:
        check_out(op, dgamma_out, pshape, pdt)
        check_out(op, dbeta_out, pshape, pdt)
    elif dgamma_out is not None or dbeta_out is not None:
        raise ValueError(f"{op}: dgamma_out/dbeta_out were given but param_grads is False")
    impl = route(op, "layernorm", dy=dy, x=x, gamma=gamma, mean=mean, inv_std=inv_std, out=out,
                 dgamma_out=dgamma_out, dbeta_out=dbeta_out)
    if impl is not None:
        return impl.layernorm_backward(dy, x, gamma, mean, inv_std, norm_ndim=k, rows=rows, cols=cols,
                                       param_grads=param_grads, out=out, dgamma_out=dgamma_out, dbeta_out=dbeta_out, stream=stream)
    g, xc = to_compute(dy).reshape(rows, cols), to_compute(x).reshape(rows, cols)
    cdt = xc.dtype
    inv = inv_std.reshape(rows, 1).astype(cdt, copy=False)
    xhat = (xc - mean.reshape(rows, 1).astype(cdt, copy=False)) * inv
    dgamma = dbeta = None
    if param_grads:
        dgamma = finish((g * xhat).sum(axis=0).reshape(pshape), dgamma_out, pdt)
        dbeta = finish(g.sum(axis=0).reshape(pshape), dbeta_out, pdt)
    gg = g * gamma.reshape(1, cols).astype(cdt, copy=False) if gamma is not None else g
    dx = gg - gg.mean(axis=1, keepdims=True)
    dx -= xhat * (gg * xhat).mean(axis=1, keepdims=True)
    dx *= inv
    return finish(dx.reshape(x.shape), out, x.dtype), dgamma, dbeta


def _opt(a: Any) -> Any:
    return None if a is None else as_array(a)
