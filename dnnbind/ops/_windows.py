"""Sequences and windows of ``keras.ops``: ``linspace``, ``logspace``, ``geomspace``, ``vander`` and the
window functions ``bartlett``, ``blackman``, ``hamming``, ``hanning``, ``kaiser``.

Every one is computed on the device from an iota (no host array is uploaded). ``linspace`` is JAX's
formula, ``start * (1 - t) + stop * t`` with ``t = i / div`` and ``stop`` itself appended as the last
sample, so both endpoints are exact and it is differentiable in tensor ``start``/``stop``; ``logspace``
and ``geomspace`` are powers of it. The windows compute in float64 and return floatx (Keras's dtype); a
window length given as a tensor is read on the host (it is the result's length).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from . import _core
from ._core import is_float, keras_op, np_dtype, result_type, tensors
from ._elementwise import (absolute, add, cast, cos, divide, floor, log10, multiply, power, sign, sqrt, subtract)
from ._shape import broadcast_to, concatenate, moveaxis, reshape

__all__ = ["linspace", "logspace", "geomspace", "vander", "bartlett", "blackman", "hamming", "hanning", "kaiser"]

_F64 = np.dtype(np.float64)
_numeric = N  # vander's argument ``N`` (Keras's name) hides the module alias there


def _count(op: str, num: Any) -> int:
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)):
        raise TypeError(f"{op}: num must be an int, got {num!r}")
    if num < 0:
        raise ValueError(f"{op}: num must be non-negative, got {num}")
    return int(num)


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """The float type a sequence of ``dt`` is computed in (64-bit integers in float64, as NumPy)."""
    if is_float(dt):
        return dt
    return _F64 if dt.itemsize == 8 else _core.floatx()


def _bounds(start: Any, stop: Any, dtype: Any) -> "tuple[Tensor, Tensor, np.dtype, np.dtype]":
    """``start``/``stop`` as tensors of the compute dtype, the result dtype (Keras: ``result_type(start,
    stop, float)`` when ``dtype`` is None) and the compute dtype."""
    a, b = tensors(start, stop)
    dt = np_dtype(dtype) if dtype is not None else np_dtype(result_type(
        start if isinstance(start, (int, float)) and not isinstance(start, bool) else a,
        stop if isinstance(stop, (int, float)) and not isinstance(stop, bool) else b, float))
    comp = _compute_dtype(dt)
    return (a if a.dtype == comp else cast(a, comp)), (b if b.dtype == comp else cast(b, comp)), dt, comp


def _finish(out: Tensor, dt: np.dtype) -> Tensor:
    if dt.kind in "iu" and is_float(out.dtype):
        out = floor(out)
    return out if out.dtype == dt else cast(out, dt)


@keras_op
def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, retstep: bool = False, dtype: Any = None,
             axis: int = 0) -> Any:
    """``keras.ops.linspace``: ``num`` evenly spaced samples from ``start`` to ``stop`` (excluded unless
    ``endpoint``), along a new ``axis`` when ``start``/``stop`` are tensors (broadcast). Integer dtypes
    floor the samples. ``retstep`` also returns the spacing (NaN for one sample with ``endpoint``)."""
    num = _count("linspace", num)
    a, b, dt, comp = _bounds(start, stop, dtype)
    bounds = N.broadcast_shapes(a.shape, b.shape, op="linspace")
    ax = int(axis)
    if not -(len(bounds) + 1) <= ax <= len(bounds):
        raise ValueError(f"linspace: axis={axis} is out of bounds for a result of rank {len(bounds) + 1}")
    ax %= len(bounds) + 1
    shape = bounds[:ax] + (1,) + bounds[ax:]
    a = reshape(broadcast_to(a, bounds), shape)
    b = reshape(broadcast_to(b, bounds), shape)
    div = num - 1 if endpoint else num
    if num > 1:
        steps = [1] * len(shape)
        steps[ax] = div
        t = reshape(Tensor(N.iota(div, 0.0, 1.0 / div, comp, device=a.device)), tuple(steps))
        out = add(multiply(a, subtract(1.0, t)), multiply(b, t))
        if endpoint:
            out = concatenate([out, b], axis=ax)
        delta = divide(subtract(b, a), float(div)) if retstep else None
    elif num == 1:
        out = a
        delta = subtract(b, a) if retstep and not endpoint else None
        if retstep and endpoint:
            delta = Tensor(N.full(bounds, math.nan, comp, device=a.device))
    else:
        out = Tensor(N.full(bounds[:ax] + (0,) + bounds[ax:], 0, comp, device=a.device))
        delta = Tensor(N.full(bounds, math.nan, comp, device=a.device)) if retstep else None
    out = _finish(out, dt)
    if not retstep:
        return out
    return out, reshape(delta, bounds)


@keras_op
def logspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, base: Any = 10, dtype: Any = None,
             axis: int = 0) -> Tensor:
    """``keras.ops.logspace``: ``base ** linspace(start, stop, num, endpoint, axis=axis)``."""
    a, b, dt, comp = _bounds(start, stop, dtype)
    lin = linspace(a, b, num, endpoint=endpoint, dtype=comp, axis=axis)
    return _finish(power(float(base) if isinstance(base, (int, float)) else base, lin), dt)


@keras_op
def geomspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None, axis: int = 0) -> Tensor:
    """``keras.ops.geomspace``: ``num`` samples in geometric progression from ``start`` to ``stop`` (same sign,
    non-zero): ``sign(start) * logspace(log10(|start|), log10(|stop|))``. A zero Python bound raises; a zero
    in a tensor bound gives NaN (it is not read on the host)."""
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, (int, float)) and v == 0:
            raise ValueError(f"geomspace: {name} must not be zero (a geometric sequence cannot include zero)")
    a, b, dt, comp = _bounds(start, stop, dtype)
    s = sign(a)
    res = multiply(s, logspace(log10(divide(a, s)), log10(divide(b, s)), num, endpoint=endpoint, base=10.0,
                               dtype=comp, axis=0))
    ax = int(axis)
    if not -res.ndim <= ax < res.ndim:
        raise ValueError(f"geomspace: axis={axis} is out of bounds for a result of rank {res.ndim}")
    return _finish(moveaxis(res, 0, ax) if ax % res.ndim else res, dt)


@keras_op
def vander(x: Any, N: "int | None" = None, increasing: bool = False) -> Tensor:  # noqa: N803 (Keras's name)
    """``keras.ops.vander``: the Vandermonde matrix of the 1-d ``x``, columns ``x ** (N - 1), ..., x, 1``
    (``increasing`` reverses them), in ``x``'s dtype. The constant column does not depend on ``x``, so the
    gradient is finite at ``x == 0``."""
    (t,) = tensors(x)
    if t.ndim != 1:
        raise ValueError(f"Input tensor must be 1-dimensional. Received: input.shape={t.shape}")
    if N is not None:
        if isinstance(N, bool) or not isinstance(N, (int, np.integer)):
            raise TypeError(f"Argument `N` must be of type `int`. Received: N={N} of type {type(N)}")
        if N < 0:
            raise ValueError(f"Argument 'N' must be nonnegative. Received: N={N}")
    if not isinstance(increasing, bool):
        raise TypeError(f"Argument `increasing` must be of type `bool`. Received: increasing={increasing} of type "
                        f"{type(increasing)}")
    n = int(t.shape[0]) if N is None else int(N)
    dt = t.dtype
    src = t if dt.kind != "b" else cast(t, _core.floatx())
    ones = Tensor(_numeric.full((int(t.shape[0]), min(n, 1)), 1, src.dtype, device=src.device))
    cols = [ones]
    if n > 1:  # exponents 1 .. n-1 (the constant column is the ones)
        exps = reshape(Tensor(_numeric.iota(n - 1, 1, 1, src.dtype, device=src.device)), (1, n - 1))
        cols.append(power(reshape(src, (-1, 1)), exps))
    out = concatenate(cols, axis=1) if len(cols) > 1 else ones
    if not increasing:
        out = _core.REGISTRY["flip"]["fn"](out, 1)
    return out if out.dtype == dt else cast(out, dt)


# ---------------------------------------------------------------------------------------- windows
def _window_length(op: str, x: Any) -> "tuple[int, Any]":
    """The window length (a tensor is read on the host: it is the result's length) and its device."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x), None
    if isinstance(x, np.ndarray) and x.size == 1 and x.dtype.kind in "iu":  # host data already
        return int(x.reshape(-1)[0]), None
    (t,) = tensors(x)
    if t.size != 1 or t.dtype.kind not in "iu":
        raise TypeError(f"{op}: x (the window length) must be an int or an integer scalar tensor, got shape "
                        f"{t.shape} and dtype {t.dtype}")
    return int(t.numpy().reshape(-1)[0]), t.device


def _window(op: str, x: Any, body: Any) -> Tensor:
    m, device = _window_length(op, x)
    if m < 1:
        return Tensor(N.full((0,), 0, _core.floatx(), device=device))
    if m == 1:
        return Tensor(N.full((1,), 1, _core.floatx(), device=device))
    n = Tensor(N.iota(m, 0.0, 1.0, _F64, device=device))
    return cast(body(n, m), _core.floatx())


def _cosines(n: Tensor, m: int, *coefficients: float) -> Tensor:
    """``sum_k (-1)**k c_k cos(2 pi k n / (m - 1))`` (the generalised cosine windows)."""
    out = None
    for k, c in enumerate(coefficients[1:], 1):
        term = multiply(cos(multiply(n, 2.0 * math.pi * k / (m - 1))), c * (-1) ** k)
        out = term if out is None else add(out, term)
    return add(out, coefficients[0])


@keras_op(differentiable=False)
def bartlett(x: Any) -> Tensor:
    """``keras.ops.bartlett``: the triangular window of length ``x`` (floatx)."""
    return _window("bartlett", x, lambda n, m: subtract(1.0, divide(absolute(subtract(multiply(n, 2.0), m - 1.0)),
                                                                    m - 1.0)))


@keras_op(differentiable=False)
def blackman(x: Any) -> Tensor:
    """``keras.ops.blackman``: ``0.42 - 0.5 cos(2 pi n / (M - 1)) + 0.08 cos(4 pi n / (M - 1))`` (floatx)."""
    return _window("blackman", x, lambda n, m: _cosines(n, m, 0.42, 0.5, 0.08))


@keras_op(differentiable=False)
def hamming(x: Any) -> Tensor:
    """``keras.ops.hamming``: ``0.54 - 0.46 cos(2 pi n / (M - 1))`` (floatx)."""
    return _window("hamming", x, lambda n, m: _cosines(n, m, 0.54, 0.46))


@keras_op(differentiable=False)
def hanning(x: Any) -> Tensor:
    """``keras.ops.hanning``: ``0.5 - 0.5 cos(2 pi n / (M - 1))`` (floatx)."""
    return _window("hanning", x, lambda n, m: _cosines(n, m, 0.5, 0.5))


@keras_op(differentiable=False)
def kaiser(x: Any, beta: Any) -> Tensor:
    """``keras.ops.kaiser``: ``I0(beta sqrt(1 - (2n / (M - 1) - 1)^2)) / I0(beta)`` (floatx)."""
    def body(n: Tensor, m: int) -> Tensor:
        (b,) = tensors(beta)
        b = cast(b, _F64) if b.dtype != _F64 else b
        ratio = subtract(divide(n, (m - 1) / 2.0), 1.0)
        arg = multiply(b, sqrt(subtract(1.0, multiply(ratio, ratio))))
        i0 = Tensor(N.unary("i0", arg.data))
        return divide(i0, Tensor(N.unary("i0", b.data)))

    return _window("kaiser", x, body)
