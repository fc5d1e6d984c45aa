"""Activations of ``keras.ops.nn`` (``relu``, ``sigmoid``, ``tanh``, ``softplus``, ``silu`` are in
``_elementwise``), ``softmax``/``log_softmax`` and ``sparsemax``, with Keras's (JAX backend's) formulas.

Where :mod:`dnnbind.kernels.activation` has the function (``relu6`` = ``clipped_relu``, ``elu``,
``selu``, ``celu``, ``leaky_relu``, ``gelu`` either way), the forward is one kernel and so is the
first-order backward (``activation_backward``); when an outer tape records that backward (higher-order
gradients) the VJP is the same derivative written in ops, differentiable again. ``softmax`` and
``log_softmax`` run ``kernels.softmax_forward``/``softmax_backward`` over the last axis (other axes:
moved there first), with the same two-way VJP. The rest are compositions of elementwise ops.
Integer and bool inputs compute in floatx, as Keras.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

from .. import kernels
from ..autodiff.engine import recording
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ._core import keras_op, make, tensors
from ._elementwise import (abs, add, cast, clip, divide, erf, exp, greater, less, less_equal, logical_and,
                           multiply, negative, sigmoid, softplus, sqrt, square, subtract, tanh, where)
from ._nn_common import as_float, op
from ._reductions import sum

__all__ = ["relu6", "elu", "selu", "celu", "gelu", "leaky_relu", "hard_sigmoid", "hard_silu", "hard_swish",
           "log_sigmoid", "softsign", "soft_shrink", "hard_shrink", "sparse_plus", "sparse_sigmoid", "squareplus",
           "tanh_shrink", "hard_tanh", "threshold", "glu", "softmax", "log_softmax", "sparsemax"]

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _float_input(x: Any) -> Tensor:
    (t,) = tensors(x)
    return as_float(t)


def kernel_activation(t: Tensor, kind: str, alpha: "float | None", composed_vjp: Callable, name: str) -> Tensor:
    """``kernels.activation_forward(t, kind)`` as a recorded op (``t`` a float tensor): the backward is
    ``activation_backward``, or ``composed_vjp(x, y, g)`` (ops, differentiable) when a tape records it."""
    y = kernels.activation_forward(t.data, kind, alpha=alpha)

    def backward(node: Any, g: Tensor) -> tuple:
        if recording():
            return (composed_vjp(t, node.output(0), g),)
        gd = g.data if g.dtype == t.dtype else cast(g, t.dtype).data
        return (Tensor(kernels.activation_backward(gd, t.data, node.outputs_raw[0], kind, alpha=alpha)),)

    return make(y, (t,), backward, name, keep_outputs=True)


def _affine(t: Tensor, scale: float, shift: float) -> Tensor:
    """``t * scale + shift`` in one kernel (differentiable)."""
    out = N.unary("scale_shift", t.data, p0=scale, p1=shift)
    return make(out, (t,), lambda node, g: (multiply(g, scale),), "affine")


# ------------------------------------------------------------------------------- kernel-backed
@keras_op(family="nn")
def relu6(x: Any) -> Tensor:
    """``keras.ops.relu6``: ``min(max(x, 0), 6)`` (the gradient passes for ``0 < x < 6``, as JAX)."""
    t = _float_input(x)
    return kernel_activation(t, "clipped_relu", 6.0, lambda x, y, g: where(
        logical_and(greater(x, 0.0), less(x, 6.0)), g, 0.0), "relu6")


def _elu_vjp(alpha: float) -> Callable:
    return lambda x, y, g: where(greater(x, 0.0), g, multiply(g, add(y, alpha)))


@keras_op(family="nn")
def elu(x: Any, alpha: float = 1.0) -> Tensor:
    """``keras.ops.elu``: ``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    t = _float_input(x)
    return kernel_activation(t, "elu", float(alpha), _elu_vjp(float(alpha)), "elu")


@keras_op(family="nn")
def selu(x: Any) -> Tensor:
    """``keras.ops.selu``: ``scale * elu(x, alpha)`` with the self-normalising constants."""
    t = _float_input(x)
    return multiply(kernel_activation(t, "elu", _SELU_ALPHA, _elu_vjp(_SELU_ALPHA), "selu"), _SELU_SCALE)


@keras_op(family="nn")
def celu(x: Any, alpha: float = 1.0) -> Tensor:
    """``keras.ops.celu``: ``max(x, 0) + alpha * expm1(min(x, 0) / alpha)`` (``= alpha * elu(x / alpha)``)."""
    t = _float_input(x)
    alpha = float(alpha)
    if alpha == 1.0:
        return kernel_activation(t, "elu", 1.0, _elu_vjp(1.0), "celu")
    return multiply(kernel_activation(multiply(t, 1.0 / alpha), "elu", 1.0, _elu_vjp(1.0), "celu"), alpha)


def _gelu_tanh_vjp(x: Tensor, y: Tensor, g: Tensor) -> Tensor:
    c = tanh(multiply(add(x, multiply(multiply(square(x), x), 0.044715)), _SQRT_2_OVER_PI))
    dc = multiply(multiply(subtract(1.0, square(c)), _SQRT_2_OVER_PI), add(multiply(square(x), 3 * 0.044715), 1.0))
    return multiply(g, add(multiply(add(c, 1.0), 0.5), multiply(multiply(x, dc), 0.5)))


def _gelu_erf_vjp(x: Tensor, y: Tensor, g: Tensor) -> Tensor:
    cdf = multiply(add(erf(multiply(x, _INV_SQRT_2)), 1.0), 0.5)
    pdf = multiply(exp(multiply(square(x), -0.5)), _INV_SQRT_2PI)
    return multiply(g, add(cdf, multiply(x, pdf)))


@keras_op(family="nn")
def gelu(x: Any, approximate: bool = True) -> Tensor:
    """``keras.ops.gelu``: ``x * Phi(x)``; ``approximate=True`` (Keras's default) is the tanh form."""
    t = _float_input(x)
    if approximate:
        return kernel_activation(t, "gelu_tanh", None, _gelu_tanh_vjp, "gelu")
    return kernel_activation(t, "gelu", None, _gelu_erf_vjp, "gelu")


@keras_op(family="nn")
def leaky_relu(x: Any, negative_slope: float = 0.2) -> Tensor:
    """``keras.ops.leaky_relu``: ``x`` for ``x >= 0``, else ``negative_slope * x``."""
    t = _float_input(x)
    slope = float(negative_slope)
    return kernel_activation(t, "leaky_relu", slope, lambda x, y, g: where(greater(x, 0.0), g, multiply(g, slope)),
                             "leaky_relu")


# -------------------------------------------------------------------------------- compositions
@keras_op(family="nn")
def hard_sigmoid(x: Any) -> Tensor:
    """``keras.ops.hard_sigmoid``: ``relu6(x + 3) / 6``."""
    t = _float_input(x)
    return clip(_affine(t, 1.0 / 6.0, 0.5), 0.0, 1.0)


@keras_op(family="nn")
def hard_silu(x: Any) -> Tensor:
    """``keras.ops.hard_silu`` (also ``hard_swish``): ``x * hard_sigmoid(x)``."""
    t = _float_input(x)
    return multiply(t, hard_sigmoid(t))


@keras_op(family="nn")
def hard_swish(x: Any) -> Tensor:
    """``keras.ops.hard_swish``: an alias of :func:`hard_silu`."""
    return hard_silu(x)


@keras_op(family="nn")
def log_sigmoid(x: Any) -> Tensor:
    """``keras.ops.log_sigmoid``: ``-softplus(-x)`` (no overflow either way)."""
    t = _float_input(x)
    return negative(softplus(negative(t)))


@keras_op(family="nn")
def softsign(x: Any) -> Tensor:
    """``keras.ops.softsign``: ``x / (|x| + 1)``."""
    t = _float_input(x)
    return divide(t, add(abs(t), 1.0))


@keras_op(family="nn")
def soft_shrink(x: Any, threshold: float = 0.5) -> Tensor:
    """``keras.ops.soft_shrink``: ``x - threshold`` above it, ``x + threshold`` below ``-threshold``, else 0
    (``x - clip(x, -threshold, threshold)``)."""
    t = _float_input(x)
    th = float(threshold)
    return subtract(t, clip(t, -th, th))


@keras_op(family="nn")
def hard_shrink(x: Any, threshold: float = 0.5) -> Tensor:
    """``keras.ops.hard_shrink``: ``x`` where ``|x| > threshold``, else 0."""
    t = _float_input(x)
    return where(greater(abs(t), float(threshold)), t, 0.0)


@keras_op(family="nn")
def sparse_plus(x: Any) -> Tensor:
    """``keras.ops.sparse_plus``: 0 for ``x <= -1``, ``x`` for ``x >= 1``, ``(x + 1)**2 / 4`` between."""
    t = _float_input(x)
    return where(less_equal(t, -1.0), 0.0, where(less(t, 1.0), multiply(square(add(t, 1.0)), 0.25), t))


@keras_op(family="nn")
def sparse_sigmoid(x: Any) -> Tensor:
    """``keras.ops.sparse_sigmoid``: ``clip((x + 1) / 2, 0, 1)``."""
    t = _float_input(x)
    return clip(_affine(t, 0.5, 0.5), 0.0, 1.0)


@keras_op(family="nn")
def squareplus(x: Any, b: float = 4) -> Tensor:
    """``keras.ops.squareplus``: ``(x + sqrt(x**2 + b)) / 2``."""
    t = _float_input(x)
    return multiply(add(t, sqrt(add(square(t), float(b)))), 0.5)


@keras_op(family="nn")
def tanh_shrink(x: Any) -> Tensor:
    """``keras.ops.tanh_shrink``: ``x - tanh(x)``."""
    t = _float_input(x)
    return subtract(t, tanh(t))


@keras_op(family="nn")
def hard_tanh(x: Any) -> Tensor:
    """``keras.ops.hard_tanh``: ``clip(x, -1, 1)``."""
    t = _float_input(x)
    return clip(t, -1.0, 1.0)


@keras_op(family="nn")
def threshold(x: Any, threshold: float, default_value: float) -> Tensor:
    """``keras.ops.threshold``: ``x`` where ``x > threshold``, else ``default_value``."""
    t = _float_input(x)
    return where(greater(t, threshold), t, default_value)


@keras_op(family="nn")
def glu(x: Any, axis: int = -1) -> Tensor:
    """``keras.ops.glu``: ``a * sigmoid(b)`` for the two halves ``a``, ``b`` of ``x`` along ``axis``."""
    t = _float_input(x)
    ax = _axis(axis, t.ndim, "glu")
    if t.shape[ax] % 2:
        raise ValueError(f"glu: axis size must be divisible by 2. Received: x.shape={tuple(t.shape)} with axis={axis}")
    a, b = op("split")(t, 2, axis=ax)
    return multiply(a, sigmoid(b))


def _axis(axis: Any, ndim: int, owner: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{owner}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{owner}: axis {axis} is out of bounds for a tensor of rank {ndim}")
    return axis % ndim


# ------------------------------------------------------------------------------------- softmax
def softmax_last(t: Tensor, log: bool) -> Tensor:
    """(log-)softmax of float ``t`` over its last axis: ``kernels.softmax_forward`` and, for the backward,
    ``softmax_backward``, or the same derivative in ops when a tape records it."""
    y = kernels.softmax_forward(t.data, log=log)
    name = "log_softmax" if log else "softmax"

    def backward(node: Any, g: Tensor) -> tuple:
        if recording():
            out = node.output(0)
            if log:
                return (subtract(g, multiply(exp(out), sum(g, axis=-1, keepdims=True))),)
            return (multiply(out, subtract(g, sum(multiply(g, out), axis=-1, keepdims=True))),)
        gd = g.data if g.dtype == t.dtype else cast(g, t.dtype).data
        return (Tensor(kernels.softmax_backward(gd, node.outputs_raw[0], log=log)),)

    return make(y, (t,), backward, name, keep_outputs=True)


def _over_axes(t: Tensor, axis: Any, fn: Callable[[Tensor], Tensor], owner: str) -> Tensor:
    """``fn`` (which works on the last axis) applied over ``axis``: an int, or a tuple of axes flattened
    into one (Keras's ``softmax(x, axis=(1, 2))``)."""
    nd = t.ndim
    if nd == 0:
        raise ValueError(f"{owner}: x must have at least one dimension, got a scalar")
    axes = (axis,) if isinstance(axis, int) and not isinstance(axis, bool) else tuple(axis)
    axes = tuple(_axis(a, nd, owner) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{owner}: axis {axis!r} repeats an axis")
    keep = [i for i in range(nd) if i not in axes]
    perm = keep + list(axes)
    if perm == list(range(nd)) and len(axes) == 1:
        return fn(t)
    moved = op("transpose")(t, perm)
    merged = op("reshape")(moved, tuple(t.shape[i] for i in keep) + (-1,))
    out = op("reshape")(fn(merged), tuple(moved.shape))
    inverse = [perm.index(i) for i in range(nd)]
    return op("transpose")(out, inverse)


def _warn_size_one(t: Tensor, axis: Any) -> None:
    if isinstance(axis, int) and -t.ndim <= axis < t.ndim and t.shape[axis] == 1:
        warnings.warn(f"You are using a softmax over axis {axis} of a tensor of shape {tuple(t.shape)}. This axis "
                      "has size 1. The softmax operation will always return the value 1, which is likely not what "
                      "you intended. Did you mean to use a sigmoid instead?", stacklevel=3)


@keras_op(family="nn")
def softmax(x: Any, axis: Any = -1) -> Tensor:
    """``keras.ops.softmax`` over ``axis`` (an int or a tuple of axes); one kernel each way on the last axis."""
    t = _float_input(x)
    _warn_size_one(t, axis)
    return _over_axes(t, axis, lambda v: softmax_last(v, False), "softmax")


@keras_op(family="nn")
def log_softmax(x: Any, axis: Any = -1) -> Tensor:
    """``keras.ops.log_softmax`` over ``axis`` (an int or a tuple of axes)."""
    t = _float_input(x)
    return _over_axes(t, axis, lambda v: softmax_last(v, True), "log_softmax")


def _sparsemax_last(t: Tensor) -> Tensor:
    """Sparsemax over the last axis (Martins & Astudillo, 2016): ``max(x - tau, 0)`` with ``tau`` from the
    sorted row; the VJP on the support ``S``: ``g - mean_S(g)``, 0 elsewhere."""
    x = t.data
    c = int(t.shape[-1])
    srt = N.sort(x, -1, descending=True)
    csum = N.cumulative("cumsum", srt, -1)
    ranks = N.iota(c, 1, 1, t.dtype, device=t.device)
    support = N.binary("greater", N.binary("subtract", srt, N.binary("divide", N.binary("subtract", csum, 1.0),
                                                                       ranks)), 0.0)
    k = N.reduce("sum", N.where(support, 1.0, 0.0, dtype=t.dtype), -1, True)
    # tau = (sum of the sorted logits over the support - 1) / k. Keras 3.15 sums the cumulative sums there
    # instead (keras-team/keras#23425, fixed upstream by #23469): wrong whenever the support has 2+ entries
    tau = N.binary("divide", N.binary("subtract", N.reduce("sum", N.where(support, srt, 0.0), -1, True), 1.0), k)
    out = N.binary("maximum", N.binary("subtract", x, tau), 0.0)

    def backward(node: Any, g: Tensor) -> tuple:
        mask = cast(greater(node.output(0), 0.0), g.dtype)
        gs = multiply(g, mask)
        mean_s = divide(sum(gs, axis=-1, keepdims=True), sum(mask, axis=-1, keepdims=True))
        return (multiply(subtract(g, mean_s), mask),)

    return make(out, (t,), backward, "sparsemax", keep_outputs=True)


@keras_op(family="nn")
def sparsemax(x: Any, axis: int = -1) -> Tensor:
    """``keras.ops.sparsemax``: the Euclidean projection onto the probability simplex along ``axis`` (the
    threshold as Martins & Astudillo define it, which Keras 3.15 miscomputes for supports of 2 or more)."""
    t = _float_input(x)
    return _over_axes(t, axis, _sparsemax_last, "sparsemax")

