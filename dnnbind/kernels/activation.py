"""Pointwise activations, forward and backward.

Kinds (``alpha`` in brackets where it matters):

==============  ======================================================  ==========================
kind            forward                                                 backward uses
==============  ======================================================  ==========================
relu            ``max(x, 0)``                                           x
sigmoid         ``1 / (1 + exp(-x))``                                   y
tanh            ``tanh(x)``                                             y
elu             ``x if x > 0 else alpha*(exp(x) - 1)``  [alpha=1.0]     x, y
clipped_relu    ``min(max(x, 0), alpha)``                 [alpha=6.0]   x
swish           ``x * sigmoid(x)``                                      x
gelu            ``x * Phi(x)`` with the exact erf                       x
gelu_tanh       ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))``         x
leaky_relu      ``x if x > 0 else alpha*x``               [alpha=0.2]   x
softplus        ``log(1 + exp(x))``                                     x
linear          ``x``                                                   -
==============  ======================================================  ==========================

The derivative at a kink (relu, clipped_relu, leaky_relu at 0 and at the
ceiling) is taken from the right-open side: 1 only for ``0 < x (< alpha)``.
The backward takes both ``x`` and ``y`` (as cuDNN does); the NumPy reference
reads only the column above.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._dispatch import as_array, check_float, check_out, finish, route, to_compute

__all__ = ["ACTIVATIONS", "activation_forward", "activation_backward", "resolve_activation", "erf"]

ACTIVATIONS = (
    "relu", "sigmoid", "tanh", "elu", "clipped_relu", "swish", "gelu", "gelu_tanh",
    "leaky_relu", "softplus", "linear",
)
_ALIASES = {"identity": "linear", "silu": "swish", "relu6": "clipped_relu", "gelu_erf": "gelu", None: "linear"}
_DEFAULT_ALPHA = {"elu": 1.0, "clipped_relu": 6.0, "leaky_relu": 0.2}


def resolve_activation(op: str, kind: Any, alpha: Any) -> "tuple[str, float | None]":
    """Normalise ``kind`` (case, aliases such as ``"silu"``) and fill in its default ``alpha``.

    Returns ``(kind, alpha)``; ``alpha`` is ``None`` for kinds without a parameter.
    """
    name = _ALIASES.get(kind, kind)
    if not isinstance(name, str) or _ALIASES.get(name.lower(), name.lower()) not in ACTIVATIONS:
        raise ValueError(f"{op}: unknown activation {kind!r}; known: {', '.join(ACTIVATIONS)}")
    name = _ALIASES.get(name.lower(), name.lower())
    if name in _DEFAULT_ALPHA:
        value = _DEFAULT_ALPHA[name] if alpha is None else float(alpha)
        if name == "clipped_relu" and value <= 0:
            raise ValueError(f"{op}: clipped_relu needs a positive ceiling alpha, got {alpha!r}")
        return name, value
    if alpha is not None:
        raise ValueError(f"{op}: activation {name!r} takes no alpha, got alpha={alpha!r}")
    return name, None


# --------------------------------------------------------------------------------------------
# erf: NumPy has none. A table of Taylor coefficients on a grid of step 1/32 over [0, 6]
# (computed once from math.erf and Hermite polynomials) gives float64 accuracy (~1e-16)
# with one gather and a short Horner loop, far faster than math.erf element by element.
_ERF_STEP = 1.0 / 32.0
_ERF_LIMIT = 6.0  # erf(6) = 1 - 2e-17: 1.0 in float64
_ERF_TERMS = 12


def _erf_table() -> np.ndarray:
    grid = np.arange(int(_ERF_LIMIT / _ERF_STEP) + 1) * _ERF_STEP
    table = np.empty((grid.size, _ERF_TERMS))
    table[:, 0] = [math.erf(v) for v in grid]
    scale = 2.0 / math.sqrt(math.pi) * np.exp(-grid * grid)
    h_prev, h = np.zeros_like(grid), np.ones_like(grid)  # H_{-1} (unused), H_0
    for k in range(1, _ERF_TERMS):
        n = k - 1  # d^k/dx^k erf = 2/sqrt(pi) (-1)^n H_n(x) exp(-x^2)
        table[:, k] = scale * (-1) ** n * h / math.factorial(k)
        h_prev, h = h, 2 * grid * h - 2 * n * h_prev
    return table


_ERF_TABLE = {
    np.dtype(np.float64): np.ascontiguousarray(_erf_table().T),
    np.dtype(np.float32): np.ascontiguousarray(_erf_table().T.astype(np.float32)),
}  # (terms, grid): one contiguous row per Taylor term makes each gather a fast np.take


def erf(x: np.ndarray) -> np.ndarray:
    """The error function of a float array, to about 1 ulp in float64 (float32 is exact to rounding)."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    terms = _ERF_TERMS if dtype == np.float64 else 7
    ax = np.minimum(np.abs(x, dtype=dtype), _ERF_LIMIT)
    idx = np.rint(ax * (1.0 / _ERF_STEP)).astype(np.intp)
    d = ax - idx * dtype.type(_ERF_STEP)
    table = _ERF_TABLE[dtype]
    res = table[terms - 1].take(idx)
    for k in range(terms - 2, -1, -1):
        res *= d
        res += table[k].take(idx)
    return np.copysign(res, x, out=res)


# --------------------------------------------------------------------------------------------
# NumPy reference (inputs already in the compute dtype).

def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-log(1 + exp(-x))) never overflows and keeps relative precision in both tails.
    out = np.logaddexp(0, -x)
    np.negative(out, out=out)
    return np.exp(out, out=out)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _forward(x: np.ndarray, kind: str, alpha: "float | None", out: "np.ndarray | None") -> np.ndarray:
    """Compute into ``out`` when given (it may be ``x`` itself for an in-place activation)."""
    if kind == "relu":
        return np.maximum(x, 0, out=out)
    if kind == "sigmoid":
        r = _sigmoid(x)
    elif kind == "tanh":
        return np.tanh(x, out=out)
    elif kind == "elu":
        r = np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))
    elif kind == "clipped_relu":
        return np.clip(x, 0, alpha, out=out)
    elif kind == "swish":
        r = x * _sigmoid(x)
    elif kind == "gelu":
        r = erf(x * _INV_SQRT_2)
        r += 1
        r *= x
        r *= 0.5
    elif kind == "gelu_tanh":
        r = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
        r += 1
        r *= x
        r *= 0.5
    elif kind == "leaky_relu":
        r = np.where(x > 0, x, alpha * x)
    elif kind == "softplus":
        r = np.logaddexp(0, x)
    else:  # linear
        r = x.copy() if out is None else x
    if out is None:
        return r
    np.copyto(out, r, casting="unsafe")
    return out


def _backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, kind: str, alpha: "float | None") -> np.ndarray:
    if kind == "relu":
        # dy * (x > 0), but with the mask turned into floats in one vectorised cast first:
        # NumPy's float-by-bool multiply casts inside its loop and is ~25% slower overall.
        dx = np.greater(x, 0).view(np.uint8).astype(dy.dtype)
        dx *= dy
        return dx
    if kind == "sigmoid":
        return dy * y * (1 - y)
    if kind == "tanh":
        return dy * (1 - y * y)
    if kind == "elu":
        return dy * np.where(x > 0, 1, y + alpha)
    if kind == "clipped_relu":
        return dy * ((x > 0) & (x < alpha))
    if kind == "swish":
        s = _sigmoid(x)
        return dy * (s * (1 + x * (1 - s)))
    if kind == "gelu":
        cdf = erf(x * _INV_SQRT_2)
        cdf += 1
        cdf *= 0.5
        return dy * (cdf + x * np.exp(-0.5 * x * x) * _INV_SQRT_2PI)
    if kind == "gelu_tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = np.tanh(inner)
        grad = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return dy * grad
    if kind == "leaky_relu":
        return dy * np.where(x > 0, 1, alpha).astype(dy.dtype, copy=False)
    if kind == "softplus":
        return dy * _sigmoid(x)
    return dy.copy()  # linear


# --------------------------------------------------------------------------------------------
# Public ops.

def activation_forward(
    x: Any, kind: str, *, alpha: "float | None" = None, out: Any = None, stream: Any = None
) -> Any:
    """``y = f(x)`` elementwise, any shape, the same dtype as ``x``.

    ``alpha`` is elu's scale (default 1.0), clipped_relu's ceiling (6.0) or
    leaky_relu's negative slope (0.2); other kinds take none. ``out`` may be
    ``x`` itself (in place). float16/bfloat16 compute in float32.

    CUDA: ``_cuda.activation.activation_forward(x, kind, alpha=alpha, out=out, stream=stream)``
    with ``kind`` normalised (lower case, aliases resolved) and ``alpha`` a float for
    elu/clipped_relu/leaky_relu, ``None`` otherwise.
    """
    op = "activation_forward"
    x = as_array(x)
    kind, alpha = resolve_activation(op, kind, alpha)
    check_float(op, "x", x)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "activation", x=x, out=out)
    if impl is not None:
        return impl.activation_forward(x, kind, alpha=alpha, out=out, stream=stream)
    xc = to_compute(x)
    if xc is x:
        return _forward(x, kind, alpha, out)
    return finish(_forward(xc, kind, alpha, None), out, x.dtype)


def activation_backward(
    dy: Any, x: Any, y: Any, kind: str, *, alpha: "float | None" = None, stream: Any = None
) -> Any:
    """``dx = dy * f'(x)`` for the activation ``kind``; ``x`` is the forward input, ``y`` its output.

    All three have one shape and dtype. Returns a new array of that dtype.

    CUDA: ``_cuda.activation.activation_backward(dy, x, y, kind, alpha=alpha, stream=stream)``
    (``kind``/``alpha`` normalised as in :func:`activation_forward`).
    """
    op = "activation_backward"
    dy, x, y = as_array(dy), as_array(x), as_array(y)
    kind, alpha = resolve_activation(op, kind, alpha)
    check_float(op, "dy", dy)
    for name, arr in (("x", x), ("y", y)):
        if tuple(arr.shape) != tuple(dy.shape) or arr.dtype != dy.dtype:
            raise ValueError(
                f"{op}: {name} has shape {tuple(arr.shape)} and dtype {arr.dtype}, expected shape "
                f"{tuple(dy.shape)} and dtype {dy.dtype} (those of dy)"
            )
    impl = route(op, "activation", dy=dy, x=x, y=y)
    if impl is not None:
        return impl.activation_backward(dy, x, y, kind, alpha=alpha, stream=stream)
    dx = _backward(to_compute(dy), to_compute(x), to_compute(y), kind, alpha)
    return finish(dx, None, dy.dtype)
