"""Normalisation of ``keras.ops.nn``: ``moments``, ``batch_normalization``, ``layer_normalization``,
``rms_normalization`` and ``normalize``, with Keras's formulas and dtype rules.

``batch_normalization`` over the channel axis of a 2-d ``(N, C)`` or 4-d (NCHW/NHWC) tensor runs
``kernels.batchnorm_forward_inference`` (one pass; cuDNN, or dnnbind's channels-last kernel, on the
device), and ``layer_normalization`` over trailing axes ``kernels.layernorm_forward``/``layernorm_backward``
(NVRTC, one block per row). Their VJPs are the derivatives written in ops where a kernel has none, or
where a tape records the backward itself (higher-order gradients: the statistics are recomputed in
ops so that their derivatives are part of it). Everything else is composed from ops.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from .. import backend, kernels
from ..autodiff.engine import recording
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ..kernels._dispatch import param_dtype
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import add, clip, divide, maximum, minimum, multiply, negative, rsqrt, square, subtract
from ._nn_common import as_float, op, to_dtype
from ._reductions import mean as _mean
from ._reductions import sum as _sum
from ._reductions import var as _var

__all__ = ["moments", "batch_normalization", "layer_normalization", "rms_normalization", "normalize"]

_F16_MAX = float(np.finfo(np.float16).max)


def _axes(axes: Any, ndim: int, owner: str) -> tuple:
    items = [axes] if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool) else list(axes)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{owner}: axes must be ints, got {axes!r}")
        if not -ndim <= int(a) < max(ndim, 1):
            raise ValueError(f"{owner}: axis {a} is out of bounds for a tensor of rank {ndim}")
        out.append(int(a) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{owner}: axes {axes!r} repeat an axis")
    return tuple(sorted(out))


def _compute_dtype(t: Tensor) -> np.dtype:
    """At least float32 (Keras normalises half-precision inputs in float32), float64 kept."""
    return np_dtype(result_type(t.dtype, "float32"))


# --------------------------------------------------------------------------------------- moments
@keras_op(family="nn")
def moments(x: Any, axes: Any, keepdims: bool = False, synchronized: bool = False) -> tuple:
    """``keras.ops.moments``: ``(mean, variance)`` over ``axes`` (biased variance; float16 and bfloat16 are
    computed in float32, clipped to float16's range and cast back, as Keras's JAX backend)."""
    if synchronized:
        raise NotImplementedError("moments: synchronized=True (statistics summed across replicas) is not supported "
                                  "by the ops; SyncBatchNormalization does it")
    (t,) = tensors(x)
    ax = _axes(axes, t.ndim, "moments")
    low = t.dtype in (np.dtype(np.float16), _core.np_dtype("bfloat16"))
    src = to_dtype(t, "float32") if low else as_float(t)
    m = _mean(src, axis=ax, keepdims=True)
    v = _mean(square(subtract(src, m)), axis=ax, keepdims=True)  # two passes, the mean shared
    if not keepdims:
        squeeze = op("squeeze")
        m, v = squeeze(m, ax), squeeze(v, ax)
    if low:
        m = to_dtype(clip(m, -_F16_MAX, _F16_MAX), t.dtype)
        v = to_dtype(clip(v, -_F16_MAX, _F16_MAX), t.dtype)
    return m, v


# --------------------------------------------------------------------------- batch_normalization
def _check_vector(name: str, p: Tensor, c: int) -> None:
    if tuple(p.shape) != (c,):
        raise ValueError(f"batch_normalization: Arguments `{name}` must be a vector of length `x.shape[axis]`. "
                         f"Expected: `{(c,)}`. Received: `{tuple(p.shape)}`.")


def _bn_layout(x: Tensor, ax: int) -> "str | None":
    """The kernels' layout for normalising ``x`` over the channel axis ``ax``, or None when no kernel fits."""
    if x.ndim == 2 and ax == 1:
        return "NHWC"
    if x.ndim == 4 and ax in (1, 3):
        return "NCHW" if ax == 1 else "NHWC"
    return None


@keras_op(family="nn")
def batch_normalization(x: Any, mean: Any, variance: Any, axis: int, offset: Any = None, scale: Any = None,
                        epsilon: float = 1e-3) -> Tensor:
    """``keras.ops.batch_normalization``: ``(x - mean) * scale / sqrt(variance + epsilon) + offset`` with the
    vectors (length ``x.shape[axis]``) broadcast along ``axis``. 2-d or 4-d with ``axis`` the channel axis:
    one inference batch-norm kernel; the gradient reaches every argument."""
    given = [v for v in (x, mean, variance, offset, scale) if v is not None]
    ts = iter(tensors(*given))
    t, m, v = next(ts), next(ts), next(ts)
    off = next(ts) if offset is not None else None
    sc = next(ts) if scale is not None else None
    params = [p for p in (m, v, off, sc) if p is not None]
    dt = np_dtype(result_type(t, *params))
    if not is_float(dt):
        dt = _core.floatx()
    t, m, v = to_dtype(t, dt), to_dtype(m, dt), to_dtype(v, dt)
    off = None if off is None else to_dtype(off, dt)
    sc = None if sc is None else to_dtype(sc, dt)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -t.ndim <= int(axis) < t.ndim:
        raise ValueError(f"batch_normalization: axis must be an int in [-{t.ndim}, {t.ndim}), got {axis!r}")
    ax = int(axis) % t.ndim
    c = int(t.shape[ax])
    for name, p in (("mean", m), ("variance", v), ("offset", off), ("scale", sc)):
        if p is not None:
            _check_vector(name, p, c)
    eps = float(epsilon)
    layout = _bn_layout(t, ax)
    if layout is None or eps < 1e-5:
        return _batch_norm_composed(t, m, v, off, sc, ax, eps)
    pdt = param_dtype(dt)
    raw = [kernels.cast(p.data, pdt) if p.dtype != pdt else p.data for p in (m, v)]
    gamma = kernels.cast(sc.data, pdt) if sc is not None and sc.dtype != pdt else (
        sc.data if sc is not None else N.full((c,), 1.0, pdt, device=t.device))
    beta = kernels.cast(off.data, pdt) if off is not None and off.dtype != pdt else (
        off.data if off is not None else N.full((c,), 0.0, pdt, device=t.device))
    y = kernels.batchnorm_forward_inference(t.data, gamma, beta, raw[0], raw[1], epsilon=eps, mode="spatial",
                                            layout=layout)
    other = tuple(i for i in range(t.ndim) if i != ax)

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        bshape = [1] * t.ndim
        bshape[ax] = c
        bshape = tuple(bshape)
        reshape = op("reshape")
        inv = rsqrt(add(reshape(v, bshape), eps))
        inv_scaled = multiply(inv, reshape(sc, bshape)) if sc is not None else inv
        centred = subtract(t, reshape(m, bshape)) if (need[2] or (sc is not None and need[4])) else None
        gx = multiply(g, inv_scaled) if need[0] else None
        gm = negative(_sum(multiply(g, inv_scaled), axis=other)) if need[1] else None
        gv = None
        if need[2]:
            # d/dv of (x - m) * s * (v + eps)^-1/2 = -(x - m) * s * (v + eps)^-3/2 / 2
            gv = multiply(_sum(multiply(g, centred), axis=other),
                          reshape(multiply(multiply(inv_scaled, square(inv)), -0.5), (c,)))
        goff = _sum(g, axis=other) if off is not None and need[3] else None
        gsc = _sum(multiply(g, multiply(centred, inv)), axis=other) if sc is not None and need[4] else None
        return gx, gm, gv, goff, gsc

    return make(y, (t, m, v, off, sc), backward, "batch_normalization")


def _batch_norm_composed(t: Tensor, m: Tensor, v: Tensor, off: "Tensor | None", sc: "Tensor | None", ax: int,
                         eps: float) -> Tensor:
    """Keras's formula in ops: ``x * inv + (offset - mean * inv)``, ``inv = scale / sqrt(variance + eps)``."""
    shape = [1] * t.ndim
    shape[ax] = int(t.shape[ax])
    reshape = op("reshape")
    inv = rsqrt(add(reshape(v, tuple(shape)), eps))
    if sc is not None:
        inv = multiply(inv, reshape(sc, tuple(shape)))
    res = negative(multiply(reshape(m, tuple(shape)), inv))
    if off is not None:
        res = add(res, reshape(off, tuple(shape)))
    return add(multiply(t, inv), res)


# --------------------------------------------------------------------------- layer_normalization
def _broadcast_param(p: "Tensor | None", ndim: int, axes: tuple, shape: Sequence[int]) -> "Tensor | None":
    """Keras's ``_broadcast``: a parameter of the normalised axes' shape reshaped to broadcast over ``x``."""
    if p is None or p.ndim == ndim or axes == (ndim - 1,):
        return p
    bshape = [1] * ndim
    for a in axes:
        bshape[a] = int(shape[a])
    return op("reshape")(p, tuple(bshape))


def _layer_norm_composed(x: Tensor, gamma: "Tensor | None", beta: "Tensor | None", axes: tuple, eps: float,
                         rms_scaling: bool) -> Tensor:
    """Keras's ``_layer_normalization`` in ops (``x`` in the compute dtype)."""
    gb = _broadcast_param(gamma, x.ndim, axes, x.shape)
    bb = _broadcast_param(beta, x.ndim, axes, x.shape)
    if rms_scaling:
        out = multiply(x, rsqrt(add(_var(x, axis=axes, keepdims=True), eps)))
        return multiply(out, gb) if gb is not None else out
    m = _mean(x, axis=axes, keepdims=True)
    inv = rsqrt(add(_var(x, axis=axes, keepdims=True), eps))
    if gb is not None:
        inv = multiply(inv, gb)
    res = negative(multiply(m, inv))
    if bb is not None:
        res = add(res, bb)
    return add(multiply(x, inv), res)


def _layer_norm_grad(x: Tensor, gamma: "Tensor | None", axes: tuple, eps: float, g: Tensor) -> tuple:
    """``(dx, dgamma, dbeta)`` of layer normalisation written in ops (the statistics recomputed from ``x``,
    so this is differentiable again); ``dgamma``/``dbeta`` summed over the other axes, in the shape
    ``x.shape[axes]``."""
    other = tuple(i for i in range(x.ndim) if i not in axes)
    pshape = tuple(int(x.shape[a]) for a in axes)
    m = _mean(x, axis=axes, keepdims=True)
    inv = rsqrt(add(_var(x, axis=axes, keepdims=True), eps))
    xhat = multiply(subtract(x, m), inv)
    reshape = op("reshape")
    gxhat = g if gamma is None else multiply(g, _broadcast_param(reshape(gamma, pshape), x.ndim, axes, x.shape))
    dx = multiply(inv, subtract(subtract(gxhat, _mean(gxhat, axis=axes, keepdims=True)),
                                multiply(xhat, _mean(multiply(gxhat, xhat), axis=axes, keepdims=True))))
    dgamma = reshape(_sum(multiply(g, xhat), axis=other), pshape) if other else multiply(g, xhat)
    dbeta = reshape(_sum(g, axis=other), pshape) if other else g
    return dx, dgamma, dbeta


def _layer_norm_kernel(x: Tensor, gamma: "Tensor | None", beta: "Tensor | None", axes: tuple, eps: float,
                       out_dtype: np.dtype) -> Tensor:
    """``kernels.layernorm_forward`` over the trailing ``axes`` of float ``x`` (a leading axis of 1 added when
    every axis is normalised); the output in ``out_dtype``."""
    k = len(axes)
    shape = tuple(int(s) for s in x.shape)
    pshape = shape[x.ndim - k:]
    src = x if k < x.ndim else op("reshape")(x, (1,) + shape)
    pdt = param_dtype(src.dtype)
    params = []
    for p in (gamma, beta):
        if p is None:
            params.append(None)
            continue
        raw = p.data.reshape(*pshape) if tuple(p.shape) != pshape else p.data
        params.append(kernels.cast(raw, pdt) if raw.dtype != pdt else raw)
    y, mean_raw, inv_raw = kernels.layernorm_forward(src.data, params[0], params[1], epsilon=eps, norm_ndim=k)
    y = y.reshape(*shape) if src is not x else y

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        if recording():
            xc = to_dtype(x, _compute_dtype(x))
            dx, dgamma, dbeta = _layer_norm_grad(xc, None if gamma is None else to_dtype(gamma, xc.dtype), axes, eps,
                                                 to_dtype(g, xc.dtype))
            dx = to_dtype(dx, x.dtype)
        else:
            gd = g.data if g.dtype == x.dtype else op("cast")(g, x.dtype).data
            if src is not x:
                gd = gd.reshape(*src.shape)
            dxr, dgr, dbr = kernels.layernorm_backward(gd, src.data, params[0], mean_raw, inv_raw, norm_ndim=k,
                                                       param_grads=bool((gamma is not None and need[1])
                                                                        or (beta is not None and need[2])))
            dx = Tensor(dxr.reshape(*shape) if src is not x else dxr)
            dgamma = None if dgr is None else Tensor(dgr)
            dbeta = None if dbr is None else Tensor(dbr)
        outs = [dx if need[0] else None]
        for p, d, i in ((gamma, dgamma, 1), (beta, dbeta, 2)):
            if p is None or not need[i] or d is None:
                outs.append(None)
                continue
            outs.append(op("reshape")(to_dtype(d, p.dtype), tuple(p.shape)))
        return tuple(outs)

    result = make(y, (x, gamma, beta), backward, "layer_normalization")
    return to_dtype(result, out_dtype)


@keras_op(family="nn")
def layer_normalization(x: Any, gamma: Any = None, beta: Any = None, axis: Any = -1, epsilon: Any = None,
                        **kwargs: Any) -> Tensor:
    """``keras.ops.layer_normalization``: each sample normalised over ``axis`` (biased variance), times
    ``gamma`` plus ``beta``; computed in at least float32, returned in ``x``'s dtype. Trailing axes: the
    layer-norm kernels each way."""
    rms_scaling = kwargs.pop("rms_scaling", False)
    if kwargs:
        raise TypeError(f"layer_normalization: unexpected keyword arguments {sorted(kwargs)}")
    if rms_scaling:
        warnings.warn("You passed `rms_scaling=True`, which is deprecated. This argument incorrectly scales the "
                      "input by the variance, not the root mean square. To correctly use RMS Normalization, please "
                      "use `keras.ops.rms_normalization` / `keras.ops.nn.rms_normalization` instead.", stacklevel=3)
    given = [v for v in (x, gamma, beta) if v is not None]
    ts = iter(tensors(*given))
    t = next(ts)
    g = next(ts) if gamma is not None else None
    b = next(ts) if beta is not None else None
    eps = backend.epsilon() if epsilon is None else float(epsilon)
    original = t.dtype if is_float(t.dtype) else _core.floatx()
    cdt = _compute_dtype(t)
    axes = _axes(axis, t.ndim, "layer_normalization")
    g = None if g is None else to_dtype(g, cdt)
    b = None if b is None else to_dtype(b, cdt)
    k = len(axes)
    trailing = axes == tuple(range(t.ndim - k, t.ndim)) and t.ndim >= 1
    pshape = tuple(int(t.shape[a]) for a in axes)
    fits = all(p is None or p.size == int(np.prod(pshape)) and _broadcasts(tuple(p.shape), pshape)
               for p in (g, b))
    if trailing and fits and eps > 0 and not rms_scaling:
        src = t if is_float(t.dtype) else to_dtype(t, cdt)
        return _layer_norm_kernel(src, g, b, axes, eps, np.dtype(original))
    return to_dtype(_layer_norm_composed(to_dtype(t, cdt), g, b, axes, eps, rms_scaling), original)


def _broadcasts(p_shape: tuple, pshape: tuple) -> bool:
    """Whether a parameter of ``p_shape`` holds exactly the normalised axes' ``pshape`` (ones elsewhere)."""
    return tuple(s for s in p_shape if s != 1) == tuple(s for s in pshape if s != 1)


# ----------------------------------------------------------------------------- rms_normalization
@keras_op(family="nn")
def rms_normalization(x: Any, scale: Any = None, axis: Any = -1, epsilon: Any = None) -> Tensor:
    """``keras.ops.rms_normalization``: ``x / sqrt(mean(x**2, axis) + epsilon) * scale``, computed in at least
    float32 and returned in ``x``'s dtype."""
    given = [v for v in (x, scale) if v is not None]
    ts = tensors(*given)
    t = ts[0]
    original = t.dtype if is_float(t.dtype) else _core.floatx()
    cdt = _compute_dtype(t)
    eps = backend.epsilon() if epsilon is None else float(epsilon)
    xc = to_dtype(t, cdt)
    if xc.ndim == 0:
        xc = op("expand_dims")(xc, 0)
    axes = _axes(axis, xc.ndim, "rms_normalization")
    out = multiply(xc, rsqrt(add(_mean(square(xc), axis=axes, keepdims=True), eps)))
    if scale is not None:
        out = multiply(out, to_dtype(ts[1], cdt))
    return to_dtype(out, original)


# --------------------------------------------------------------------------------------- normalize
@keras_op(family="nn")
def normalize(x: Any, axis: Any = -1, order: int = 2, epsilon: Any = None) -> Tensor:
    """``keras.ops.normalize``: ``x`` divided by its ``order``-norm along ``axis`` (at least ``epsilon``;
    order 2: ``x * min(rsqrt(sum(x**2)), 1 / epsilon)``, as Keras)."""
    if isinstance(order, bool) or not isinstance(order, int) or not order >= 1:
        raise ValueError(f"normalize: Argument `order` must be an int >= 1. Received: order={order}")
    (t,) = tensors(x)
    t = as_float(t)
    if t.ndim == 0:
        t = op("expand_dims")(t, 0)
    eps = backend.epsilon() if epsilon is None else float(epsilon)
    axes = None if axis is None else _axes(axis, t.ndim, "normalize")
    if order == 2:
        inv = minimum(rsqrt(_sum(square(t), axis=axes, keepdims=True)), 1.0 / eps)
        return multiply(t, inv)
    absolute = op("abs")(t)
    norm_axes = tuple(range(t.ndim)) if axes is None else axes
    if len(norm_axes) == 1:  # a vector norm
        if order == 1:
            norm = _sum(absolute, axis=norm_axes, keepdims=True)
        else:
            norm = op("power")(_sum(op("power")(absolute, float(order)), axis=norm_axes, keepdims=True), 1.0 / order)
    elif len(norm_axes) == 2 and order == 1:  # the matrix 1-norm: the largest column sum (NumPy's linalg.norm)
        rows, cols = (norm_axes if axis is None else (int(axis[0]) % t.ndim, int(axis[1]) % t.ndim))
        norm = op("max")(_sum(absolute, axis=rows, keepdims=True), axis=cols, keepdims=True)
    else:
        raise ValueError(f"normalize: Invalid norm order {order} for the axes {axis!r} of a tensor of rank {t.ndim} "
                         "(order 1 or 2 for matrices; vectors take any order)")
    return divide(t, maximum(norm, eps))
