"""NumPy-like primitives on either backend: the layer :mod:`dnnbind.ops` (``keras.ops``) is built on.

Each function takes raw arrays (``numpy.ndarray`` for the CPU backend, :class:`dnnbind.cuda.DeviceArray`
for CUDA; Python numbers where a scalar operand is allowed), validates them, and routes on the first
array, as every kernel does (``_dispatch.route``): the NumPy code here is the reference, and
``dnnbind.kernels._cuda.numeric`` implements the same signature with NVRTC kernels (and cuBLAS for
``matmul``) on the call's stream, never synchronising.

Conventions shared by every function:

* **dtypes.** The caller (``dnnbind.ops``) decides the result dtype by Keras's promotion rules and
  passes it as ``dtype``; ``None`` means "the first array's dtype" (bool for comparisons and
  predicates). Inputs of other dtypes are converted on load. float16 and bfloat16 compute in float32,
  every other type in itself (ints wrap as C does on the device; the NumPy reference wraps the same).
* **broadcasting** is NumPy's, over every array operand; Python numbers broadcast as scalars and
  never change the result dtype.
* **results** are new C-contiguous arrays (``out=`` where given must match shape and dtype exactly).
  Empty arrays are valid everywhere and launch nothing on the device.
* **devices.** Every array argument of one call is on one backend (``TypeError`` otherwise).

The op tables (:data:`UNARY`, :data:`BINARY`, :data:`REDUCTIONS`) are the contract with the CUDA side:
each name there has a device expression of the same meaning (``_cuda/numeric.py``'s tables), and
``tests/test_kernels_numeric.py`` checks that the two tables list the same names.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend
from .._validate import BFLOAT16, normalize_dtype
from ._dispatch import _cuda_module, as_array, check_out, route

__all__ = [
    "UNARY", "BINARY", "REDUCTIONS", "CUMULATIVE", "RANDOM_KINDS", "PAD_MODES",
    "unary", "binary", "where", "reduce", "cumulative", "strided_copy", "strided_assign", "matmul",
    "take", "take_along_axis", "index_add", "gather_nd", "scatter_nd", "pad", "full", "iota",
    "sort", "argsort", "top_k", "random", "advance_counter", "philox_uint32", "broadcast_shapes",
]

_BOOL = np.dtype(np.bool_)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW = (np.dtype(np.float16), BFLOAT16)
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)


def _compute(dtype: np.dtype) -> np.dtype:
    return _F32 if dtype in _LOW else dtype


def _is_float(dtype: np.dtype) -> bool:
    """A float dtype, bfloat16 included (ml_dtypes' bfloat16 has NumPy kind 'V', not 'f')."""
    return dtype.kind in "fc" or dtype == BFLOAT16


def _load(x: Any, dtype: np.dtype) -> Any:
    """An operand converted to the compute type of ``dtype`` (a Python number stays a number)."""
    if isinstance(x, np.ndarray):
        want = _compute(dtype)
        if x.dtype in _LOW:
            x = x.astype(_F32)
        return x.astype(want, copy=False) if x.dtype != want and want.kind in "fc" else x
    return x


def _result(value: Any, dtype: np.dtype, out: Any) -> np.ndarray:
    value = np.asarray(value)
    if value.dtype != dtype:
        with np.errstate(invalid="ignore", over="ignore"):
            value = value.astype(dtype)
    if not value.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d result into 1-d)
        value = np.array(value, order="C")
    if out is not None:
        np.copyto(out, value, casting="unsafe")
        return out
    return value


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast") -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes``; ``ValueError`` naming ``op`` and the shapes when they do not fit."""
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"{op}: shapes {', '.join(str(tuple(s)) for s in shapes)} cannot be broadcast "
                         "together (NumPy rules: trailing axes must be equal or 1)") from None


def _dtype_of(x: Any, default: "np.dtype | None" = None) -> np.dtype:
    if hasattr(x, "dtype"):
        return x.dtype
    if default is not None:
        return default
    if isinstance(x, bool):
        return _BOOL
    if isinstance(x, int):
        return np.dtype(np.int32)
    return _F32


def _first_array(op: str, *values: Any) -> Any:
    for v in values:
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return v
    raise TypeError(f"{op}: needs at least one array operand, got only Python numbers")


def _check_number(op: str, name: str, value: Any) -> None:
    if not isinstance(value, (bool, int, float, np.number, np.bool_)):
        raise TypeError(f"{op}: {name} must be an array or a Python number, got {type(value).__name__}")


def _norm_axes(op: str, axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"{op}: axis {a} is out of range for an array of rank {ndim}")
        a %= max(ndim, 1)
        if a in out:
            raise ValueError(f"{op}: axis {a} is repeated in {axis!r}")
        out.append(a)
    return tuple(sorted(out))


# ------------------------------------------------------------------------------ elementwise
def _erfinv_giles(x: np.ndarray) -> np.ndarray:
    """erfinv by M. Giles' single-precision approximation ("Approximating the erfinv function", 2010)."""
    x = np.asarray(x, np.float64)
    w = -np.log((1.0 - x) * (1.0 + x))
    small = w < 5.0
    ws = w - 2.5
    ps = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        ps = c + ps * ws
    wl = np.sqrt(np.maximum(w, 0.0)) - 3.0
    pl = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        pl = c + pl * wl
    return np.where(small, ps, pl) * x


def _erfinv(x: np.ndarray) -> np.ndarray:
    """erfinv to float64 accuracy: Giles' approximation refined by two Newton steps on erf."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        y = _erfinv_giles(x)
        inner = np.abs(x) < 1
        for _ in range(2):
            err = _np_erf(np.where(inner, y, 0.0)) - x
            y = np.where(inner, y - err / (2.0 / math.sqrt(math.pi) * np.exp(-y * y)), y)
        y = np.where(x == 1, np.inf, np.where(x == -1, -np.inf, np.where(np.abs(x) > 1, np.nan, y)))
    return y


def _np_erf(x: np.ndarray) -> np.ndarray:
    # math.erf per element: exact to float64, and NumPy has no erf of its own
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def _np_erfc(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erfc, otypes=[x.dtype])(x) if x.size else x.copy()


def _lgamma_or_inf(v: float) -> float:
    try:
        return math.lgamma(v)
    except ValueError:  # the poles 0, -1, -2, ...: math raises where log|gamma| is +inf
        return math.inf


def _np_lgamma(x: np.ndarray) -> np.ndarray:
    return np.vectorize(_lgamma_or_inf, otypes=[x.dtype])(x) if x.size else x.copy()


def _round_half_even(x: np.ndarray) -> np.ndarray:
    return np.round(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x, 0).astype(x.dtype) if x.dtype.kind == "f" else np.logaddexp(x, 0)


def _i0(x: np.ndarray) -> np.ndarray:
    return np.i0(x)


#: name -> NumPy function on the compute-type array (params p0, p1 where the name takes them)
UNARY: dict[str, Callable[..., np.ndarray]] = {
    "negative": lambda x, p0, p1: np.negative(x),
    "positive": lambda x, p0, p1: np.positive(x),
    "abs": lambda x, p0, p1: np.abs(x),
    "sign": lambda x, p0, p1: np.sign(x),
    "square": lambda x, p0, p1: np.square(x),
    "sqrt": lambda x, p0, p1: np.sqrt(x),
    "rsqrt": lambda x, p0, p1: 1 / np.sqrt(x),
    "cbrt": lambda x, p0, p1: np.cbrt(x),
    "reciprocal": lambda x, p0, p1: np.reciprocal(x),
    "exp": lambda x, p0, p1: np.exp(x),
    "exp2": lambda x, p0, p1: np.exp2(x),
    "expm1": lambda x, p0, p1: np.expm1(x),
    "log": lambda x, p0, p1: np.log(x),
    "log2": lambda x, p0, p1: np.log2(x),
    "log10": lambda x, p0, p1: np.log10(x),
    "log1p": lambda x, p0, p1: np.log1p(x),
    "sin": lambda x, p0, p1: np.sin(x),
    "cos": lambda x, p0, p1: np.cos(x),
    "tan": lambda x, p0, p1: np.tan(x),
    "arcsin": lambda x, p0, p1: np.arcsin(x),
    "arccos": lambda x, p0, p1: np.arccos(x),
    "arctan": lambda x, p0, p1: np.arctan(x),
    "sinh": lambda x, p0, p1: np.sinh(x),
    "cosh": lambda x, p0, p1: np.cosh(x),
    "tanh": lambda x, p0, p1: np.tanh(x),
    "arcsinh": lambda x, p0, p1: np.arcsinh(x),
    "arccosh": lambda x, p0, p1: np.arccosh(x),
    "arctanh": lambda x, p0, p1: np.arctanh(x),
    "floor": lambda x, p0, p1: np.floor(x),
    "ceil": lambda x, p0, p1: np.ceil(x),
    "round": lambda x, p0, p1: _round_half_even(x),
    "trunc": lambda x, p0, p1: np.trunc(x),
    "erf": lambda x, p0, p1: _np_erf(x),
    "erfc": lambda x, p0, p1: _np_erfc(x),
    "erfinv": lambda x, p0, p1: _erfinv(x).astype(x.dtype),
    "lgamma": lambda x, p0, p1: _np_lgamma(x),
    "i0": lambda x, p0, p1: _i0(x),
    "sigmoid": lambda x, p0, p1: _sigmoid(x),
    "softplus": lambda x, p0, p1: _softplus(x),
    "relu": lambda x, p0, p1: np.maximum(x, 0),
    "isnan": lambda x, p0, p1: np.isnan(x),
    "isinf": lambda x, p0, p1: np.isinf(x),
    "isfinite": lambda x, p0, p1: np.isfinite(x),
    "isposinf": lambda x, p0, p1: np.isposinf(x),
    "isneginf": lambda x, p0, p1: np.isneginf(x),
    "signbit": lambda x, p0, p1: np.signbit(x),
    "logical_not": lambda x, p0, p1: np.logical_not(x),
    "bitwise_invert": lambda x, p0, p1: np.invert(x),
    # parametrised: p0 (and p1) are Python floats
    "scale_shift": lambda x, p0, p1: x * p0 + p1,           # x * p0 + p1
    "power_scalar": lambda x, p0, p1: np.power(x, p0),      # x ** p0
    "clip": lambda x, p0, p1: np.minimum(np.maximum(x, p0), p1),  # NaN propagates
    "leaky_relu": lambda x, p0, p1: np.where(x >= 0, x, x * p0),
    "elu": lambda x, p0, p1: np.where(x > 0, x, p0 * np.expm1(np.minimum(x, 0))),
}

#: name -> NumPy function on the two compute-type operands
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.true_divide,
    "floor_divide": np.floor_divide,
    "mod": np.mod,            # Python's sign rule (the divisor's)
    "fmod": np.fmod,          # C's (the dividend's)
    "power": np.power,
    "maximum": np.maximum,    # NaN propagates
    "minimum": np.minimum,
    "fmax": np.fmax,          # NaN ignored
    "fmin": np.fmin,
    "arctan2": np.arctan2,
    "hypot": np.hypot,
    "copysign": np.copysign,
    "nextafter": np.nextafter,
    "logaddexp": np.logaddexp,
    "logaddexp2": np.logaddexp2,
    "heaviside": np.heaviside,
    "ldexp": lambda a, b: np.ldexp(a, np.asarray(b).astype(np.int32)),
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
    "gcd": np.gcd,
    "lcm": np.lcm,
}

_BOOL_RESULT = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
                          "logical_or", "logical_xor", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
                          "signbit", "logical_not"})


def unary(op: str, x: Any, *, p0: float = 0.0, p1: float = 0.0, dtype: Any = None, out: Any = None,
          stream: Any = None) -> Any:
    """``op`` (a name of :data:`UNARY`) applied to every element of ``x``; ``p0``/``p1`` are the
    parameters of the parametrised names (``clip``: low, high; ``scale_shift``: scale, shift;
    ``power_scalar``: exponent; ``leaky_relu``/``elu``: alpha). Result dtype ``dtype`` (default: bool
    for predicates, else ``x.dtype``)."""
    name = "unary"
    fn = UNARY.get(op)
    if fn is None:
        raise ValueError(f"{name}: unknown op {op!r}; known: {', '.join(sorted(UNARY))}")
    x = as_array(x)
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else (_BOOL if op in _BOOL_RESULT else x.dtype)
    check_out(op, out, x.shape, dt)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.unary(op, x, p0=float(p0), p1=float(p1), dtype=dt, out=out, stream=stream)
    src = x if op in _BOOL_RESULT else _load(x.astype(dt) if _is_float(dt) and not _is_float(x.dtype) else x, dt)
    with np.errstate(all="ignore"):
        return _result(fn(src, float(p0), float(p1)), dt, out)


def binary(op: str, a: Any, b: Any, *, dtype: Any = None, out: Any = None, stream: Any = None) -> Any:
    """``op`` (a name of :data:`BINARY`) of ``a`` and ``b`` with NumPy broadcasting; either may be a
    Python number. Result dtype ``dtype`` (default: bool for comparisons and logical ops, else the
    first array's dtype). Both operands are converted to ``dtype``'s compute type first, except for a
    bool result: comparisons and logical ops then compare the operands in a type that holds both
    exactly (NumPy's ``result_type`` of the two; float64 for a mix of integers and floats)."""
    fn = BINARY.get(op)
    if fn is None:
        raise ValueError(f"binary: unknown op {op!r}; known: {', '.join(sorted(BINARY))}")
    first = _first_array(op, a, b)
    for name, v in (("a", a), ("b", b)):
        if not hasattr(v, "shape"):
            _check_number(op, name, v)
    shape = broadcast_shapes(*(v.shape for v in (a, b) if hasattr(v, "shape")), op=op)
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else (
        _BOOL if op in _BOOL_RESULT else first.dtype)
    check_out(op, out, shape, dt)
    arrays = {k: v for k, v in (("a", a), ("b", b)) if hasattr(v, "shape")}
    impl = route(op, "numeric", **arrays, out=out)
    if impl is not None:
        return impl.binary(op, a, b, dtype=dt, out=out, stream=stream)
    # comparisons and logical ops compare in the operands' own promoted type
    work = np.result_type(*(v.dtype if hasattr(v, "dtype") else type(v) for v in (a, b))) if dt == _BOOL else dt
    work = _compute(np.dtype(work))
    la = a.astype(work) if isinstance(a, np.ndarray) else work.type(a) if work.kind in "fciu" else a
    lb = b.astype(work) if isinstance(b, np.ndarray) else work.type(b) if work.kind in "fciu" else b
    with np.errstate(all="ignore"):
        return _result(np.broadcast_to(fn(la, lb), shape), dt, out)


def where(condition: Any, a: Any, b: Any, *, dtype: Any = None, out: Any = None, stream: Any = None) -> Any:
    """``a`` where ``condition`` (any dtype, nonzero is true) else ``b``, broadcast; ``a``/``b`` may be numbers."""
    op = "where"
    condition = as_array(condition)
    for name, v in (("a", a), ("b", b)):
        if not hasattr(v, "shape"):
            _check_number(op, name, v)
    shape = broadcast_shapes(*(v.shape for v in (condition, a, b) if hasattr(v, "shape")), op=op)
    first = next((v for v in (a, b) if hasattr(v, "dtype")), None)
    dt = normalize_dtype(dtype, "where: dtype") if dtype is not None else (
        first.dtype if first is not None else _F32)
    check_out(op, out, shape, dt)
    arrays = {k: v for k, v in (("a", a), ("b", b)) if hasattr(v, "shape")}
    impl = route(op, "numeric", condition=condition, **arrays, out=out)
    if impl is not None:
        return impl.where(condition, a, b, dtype=dt, out=out, stream=stream)
    la = a.astype(dt) if isinstance(a, np.ndarray) else a
    lb = b.astype(dt) if isinstance(b, np.ndarray) else b
    return _result(np.broadcast_to(np.where(condition.astype(bool), la, lb), shape), dt, out)


# ------------------------------------------------------------------------------- reductions
#: name -> NumPy reduction (axis tuple, keepdims) on the compute-type array
REDUCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "sum": lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims),
    "prod": lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims),
    "max": lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims),
    "min": lambda x, axis, keepdims: np.min(x, axis=axis, keepdims=keepdims),
    "mean": lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims),
    "any": lambda x, axis, keepdims: np.any(x, axis=axis, keepdims=keepdims),
    "all": lambda x, axis, keepdims: np.all(x, axis=axis, keepdims=keepdims),
    "argmax": None,  # one axis: below
    "argmin": None,
}


def reduce(op: str, x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None, out: Any = None,
           stream: Any = None) -> Any:
    """Reduce ``x`` over ``axis`` (None: every axis; an int or a tuple) with ``op`` (:data:`REDUCTIONS`).

    ``sum``/``prod``/``mean`` accumulate in float32 for float16/bfloat16 (float64 for float64, the
    integer type itself for ints) and return ``dtype`` (default ``x.dtype``); ``max``/``min`` of an
    empty axis is a ``ValueError`` (NumPy's rule); NaN propagates through ``max``/``min``. ``any``/
    ``all`` return bool. ``argmax``/``argmin`` take one axis (or None: the flattened array), return
    int32 (``dtype`` may say int64), the first index of the extremum, a NaN counting as the extremum."""
    if op not in REDUCTIONS:
        raise ValueError(f"reduce: unknown op {op!r}; known: {', '.join(sorted(REDUCTIONS))}")
    x = as_array(x)
    if op in ("argmax", "argmin"):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{op}: axis must be an int or None, got {axis!r}")
        axes = _norm_axes(op, axis, x.ndim) if axis is not None else None
        if x.size == 0:
            raise ValueError(f"{op}: attempt to get {op} of an empty sequence")
        dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else np.dtype(np.int32)
        if axes is None:
            shape = (1,) * x.ndim if keepdims else ()
        else:
            shape = tuple(1 if i == axes[0] else s for i, s in enumerate(x.shape)) if keepdims else tuple(
                s for i, s in enumerate(x.shape) if i != axes[0])
        check_out(op, out, shape, dt)
        impl = route(op, "numeric", x=x, out=out)
        if impl is not None:
            return impl.reduce(op, x, None if axes is None else axes[0], keepdims, dtype=dt, out=out, stream=stream)
        fn = np.argmax if op == "argmax" else np.argmin
        src = x.astype(_F32) if x.dtype in _LOW else x
        res = fn(src, axis=None if axes is None else axes[0], keepdims=keepdims)
        return _result(np.reshape(res, shape), dt, out)
    axes = _norm_axes(op, axis, x.ndim)
    keepdims = bool(keepdims)
    shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape)) if keepdims else tuple(
        s for i, s in enumerate(x.shape) if i not in axes)
    if op in ("any", "all"):
        dt = _BOOL if dtype is None else normalize_dtype(dtype, f"{op}: dtype")
    else:
        dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else x.dtype
    if op in ("max", "min") and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"{op}: zero-size array to reduction operation {op}imum which has no identity "
                         f"(shape {tuple(x.shape)}, axis {axis!r})")
    check_out(op, out, shape, dt)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.reduce(op, x, axes, keepdims, dtype=dt, out=out, stream=stream)
    if op in ("any", "all"):
        src = x
    else:
        src = x.astype(_compute(dt) if _is_float(dt) else dt, copy=False) if x.dtype != dt or x.dtype in _LOW \
            else x
    with np.errstate(all="ignore"):
        res = REDUCTIONS[op](src, axes, keepdims)
        if op == "mean" and dt.kind in "iu":
            # the float64 mean back to the integer type saturates (as the device's conversion does), where a
            # plain cast of a value past the type's range is undefined (x86 gives the minimum)
            info = np.iinfo(dt)
            res = np.where(res >= float(info.max), info.max,
                           np.where(res <= float(info.min), info.min, np.asarray(res).astype(dt)))
        return _result(res, dt, out)


CUMULATIVE = ("cumsum", "cumprod", "cummax", "cummin")


def cumulative(op: str, x: Any, axis: int = -1, *, reverse: bool = False, dtype: Any = None, out: Any = None,
               stream: Any = None) -> Any:
    """Inclusive scan of ``x`` along ``axis`` (``cumsum``, ``cumprod``, ``cummax``, ``cummin``), from the end
    when ``reverse``. Accumulates in the compute type of ``dtype`` (default ``x.dtype``), in index order."""
    if op not in CUMULATIVE:
        raise ValueError(f"cumulative: unknown op {op!r}; known: {', '.join(CUMULATIVE)}")
    x = as_array(x)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs an array of rank >= 1, got a scalar")
    (ax,) = _norm_axes(op, axis, x.ndim)
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else x.dtype
    check_out(op, out, x.shape, dt)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.cumulative(op, x, ax, reverse=bool(reverse), dtype=dt, out=out, stream=stream)
    src = x.astype(_compute(dt) if _is_float(dt) else dt)
    if reverse:
        src = np.flip(src, ax)
    fn = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
          "cummin": np.minimum.accumulate}[op]
    with np.errstate(all="ignore"):
        res = fn(src, axis=ax)
    if reverse:
        res = np.flip(res, ax)
    return _result(res, dt, out)


# --------------------------------------------------------------------------- strided views
def _check_view(op: str, x: Any, shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple:
    shape = tuple(int(s) for s in shape)
    strides = tuple(int(s) for s in strides)
    offset = int(offset)
    if len(shape) != len(strides):
        raise ValueError(f"{op}: shape {shape} and strides {strides} must have the same length")
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: shape {shape} has a negative extent")
    if not x.is_contiguous if hasattr(x, "is_contiguous") else not x.flags.c_contiguous:
        raise ValueError(f"{op}: the base array must be C-contiguous")
    if 0 not in shape:
        low = offset + builtins.sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
        high = offset + builtins.sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
        if low < 0 or high >= max(int(x.size), 0) or x.size == 0:
            raise IndexError(f"{op}: the view (shape {shape}, element strides {strides}, offset {offset}) reaches "
                             f"elements [{low}, {high}] outside the base array of {int(x.size)} elements")
    return shape, strides, offset


def _as_view(flat: np.ndarray, shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    item = flat.itemsize
    base = flat[offset:] if flat.size else flat
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=tuple(s * item for s in strides),
                                           writeable=False)


def strided_copy(x: Any, shape: Sequence[int], strides: Sequence[int], offset: int = 0, *, out: Any = None,
                 stream: Any = None) -> Any:
    """A contiguous copy of the view of ``x``'s elements at ``offset + sum(i_k * strides[k])`` (positions in
    ``x``'s C order) for every index of ``shape`` (element strides, possibly 0 or negative): basic slicing,
    transposes, ``broadcast_to``, flips and diagonals are all such views. A DeviceArray must be contiguous; a
    strided NumPy array is read in its C order (one copy). ``IndexError`` when the view leaves ``x``."""
    op = "strided_copy"
    x = as_array(x)
    if isinstance(x, np.ndarray) and not x.flags.c_contiguous:
        x = np.array(x, order="C")
    shape, strides, offset = _check_view(op, x, shape, strides, offset)
    check_out(op, out, shape, x.dtype)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.strided_copy(x, shape, strides, offset, out=out, stream=stream)
    if 0 in shape:
        return _result(np.empty(shape, x.dtype), x.dtype, out)
    return _result(_as_view(x.reshape(-1), shape, strides, offset).copy(), x.dtype, out)


def strided_assign(x: Any, shape: Sequence[int], strides: Sequence[int], offset: int, value: Any, *,
                   stream: Any = None) -> Any:
    """Write ``value`` (an array broadcastable to ``shape``, or a number), converted to ``x.dtype``, into the
    view of ``x`` described as in :func:`strided_copy`, **in place**; returns ``x``. The view must not
    reach an element twice (no zero strides over extents > 1): ``ValueError`` otherwise."""
    op = "strided_assign"
    x = as_array(x)
    shape, strides, offset = _check_view(op, x, shape, strides, offset)
    if any(s == 0 and n > 1 for s, n in zip(strides, shape)):
        raise ValueError(f"{op}: the view (strides {strides}) reaches some element twice")
    if hasattr(value, "shape"):
        broadcast_shapes(value.shape, shape, op=op)
        if tuple(broadcast_shapes(value.shape, shape)) != shape:
            raise ValueError(f"{op}: a value of shape {tuple(value.shape)} does not broadcast to the view's {shape}")
    else:
        _check_number(op, "value", value)
    arrays = {"value": value} if hasattr(value, "shape") else {}
    impl = route(op, "numeric", x=x, **arrays)
    if impl is not None:
        return impl.strided_assign(x, shape, strides, offset, value, stream=stream)
    if 0 in shape:
        return x
    item = x.itemsize
    flat = x.reshape(-1)
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=shape, strides=tuple(s * item for s in strides))
    with np.errstate(all="ignore"):
        view[...] = np.asarray(value).astype(x.dtype) if hasattr(value, "dtype") else value
    return x


# ------------------------------------------------------------------------------------ matmul
def matmul(a: Any, b: Any, *, transpose_a: bool = False, transpose_b: bool = False, dtype: Any = None,
           out: Any = None, stream: Any = None) -> Any:
    """``numpy.matmul(a, b)`` (batch axes broadcast; 1-d operands promoted and the added axis dropped), with
    the last two axes of ``a``/``b`` transposed first when asked (rank >= 2 only). Both are converted to
    ``dtype`` (default ``a.dtype``); float16/bfloat16 accumulate in float32, float32 may use TF32 on the GPU
    when ``kernels.config.allow_tf32``; ints multiply exactly in their type."""
    op = "matmul"
    a, b = as_array(a), as_array(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: operands must have rank >= 1, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if (transpose_a and a.ndim < 2) or (transpose_b and b.ndim < 2):
        raise ValueError(f"{op}: transpose_a/transpose_b need rank >= 2 operands")
    sa, sb = list(a.shape), list(b.shape)
    if transpose_a:
        sa[-1], sa[-2] = sa[-2], sa[-1]
    if transpose_b:
        sb[-1], sb[-2] = sb[-2], sb[-1]
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        raise ValueError(f"{op}: inner dimensions differ: a {tuple(a.shape)}{' (transposed)' if transpose_a else ''} "
                         f"and b {tuple(b.shape)}{' (transposed)' if transpose_b else ''} ({ka} != {kb})")
    batch = broadcast_shapes(sa[:-2], sb[:-2], op=op)
    shape = list(batch) + ([sa[-2]] if len(sa) >= 2 else []) + ([sb[-1]] if len(sb) >= 2 else [])
    shape = tuple(shape)
    dt = normalize_dtype(dtype, "matmul: dtype") if dtype is not None else a.dtype
    check_out(op, out, shape, dt)
    impl = route(op, "numeric", a=a, b=b, out=out)
    if impl is not None:
        return impl.matmul(a, b, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b), dtype=dt, out=out,
                           stream=stream)
    ca = a.astype(_compute(dt))
    cb = b.astype(_compute(dt))
    if transpose_a:
        ca = np.swapaxes(ca, -1, -2)
    if transpose_b:
        cb = np.swapaxes(cb, -1, -2)
    return _result(np.matmul(ca, cb), dt, out)


# ----------------------------------------------------------------------------------- gathers
def _check_indices(op: str, indices: Any, name: str = "indices") -> Any:
    indices = as_array(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must be an integer array, got dtype {indices.dtype}")
    return indices


def _bounds(op: str, idx: np.ndarray, n: int, what: str) -> np.ndarray:
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"{op}: index {int(idx.max()) if idx.max() >= n else int(idx.min())} is out of bounds for "
                         f"{what} of size {n}")
    return np.where(idx < 0, idx + n, idx)


def take(x: Any, indices: Any, axis: "int | None" = None, *, out: Any = None, stream: Any = None) -> Any:
    """``numpy.take(x, indices, axis)``: result shape ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``
    (``axis=None``: of the flattened ``x``). Negative indices count from the end. Out-of-range indices
    raise ``IndexError`` on NumPy; on the device (which cannot raise without synchronising) they are
    clamped into range."""
    op = "take"
    x = as_array(x)
    indices = _check_indices(op, indices)
    if axis is None:
        flat_shape = (int(x.size),)
        ax = 0
        src_shape = flat_shape
    else:
        (ax,) = _norm_axes(op, axis, x.ndim)
        src_shape = tuple(x.shape)
    shape = tuple(src_shape[:ax]) + tuple(indices.shape) + tuple(src_shape[ax + 1:])
    check_out(op, out, shape, x.dtype)
    impl = route(op, "numeric", x=x, indices=indices, out=out)
    if impl is not None:
        return impl.take(x, indices, axis if axis is None else ax, out=out, stream=stream)
    src = x.reshape(-1) if axis is None else x
    idx = _bounds(op, indices.astype(np.int64), src_shape[ax], f"axis {ax}")
    return _result(np.take(src, idx, axis=ax), x.dtype, out)


def take_along_axis(x: Any, indices: Any, axis: int, *, out: Any = None, stream: Any = None) -> Any:
    """``numpy.take_along_axis`` (``indices`` broadcast against ``x`` on the other axes; negative indices from
    the end; out-of-range as :func:`take`)."""
    op = "take_along_axis"
    x = as_array(x)
    indices = _check_indices(op, indices)
    if indices.ndim != x.ndim:
        raise ValueError(f"{op}: indices must have the rank of x ({x.ndim}), got shape {tuple(indices.shape)}")
    (ax,) = _norm_axes(op, axis, x.ndim)
    other = [s for i, s in enumerate(x.shape) if i != ax]
    iother = [s for i, s in enumerate(indices.shape) if i != ax]
    bshape = broadcast_shapes(other, iother, op=op)
    shape = tuple(bshape[:ax]) + (int(indices.shape[ax]),) + tuple(bshape[ax:])
    check_out(op, out, shape, x.dtype)
    impl = route(op, "numeric", x=x, indices=indices, out=out)
    if impl is not None:
        return impl.take_along_axis(x, indices, ax, out=out, stream=stream)
    idx = _bounds(op, indices.astype(np.int64), x.shape[ax], f"axis {ax}")
    xs = list(bshape[:ax]) + [x.shape[ax]] + list(bshape[ax:])
    src = np.broadcast_to(x, xs)
    idx = np.broadcast_to(idx, shape)
    return _result(np.take_along_axis(src, idx, axis=ax), x.dtype, out)


def index_add(x: Any, indices: Any, updates: Any, axis: int = 0, *, stream: Any = None) -> Any:
    """A copy of ``x`` with ``updates`` added at ``indices`` along ``axis`` (duplicates accumulate): the
    transpose of :func:`take` (``updates`` has ``take(x, indices, axis)``'s shape; ``indices`` any shape).
    float16/bfloat16 accumulate in float32 on NumPy; on the device in float32 atomics (the order of
    duplicate additions is not fixed there)."""
    op = "index_add"
    x = as_array(x)
    indices = _check_indices(op, indices)
    updates = as_array(updates)
    (ax,) = _norm_axes(op, axis, x.ndim)
    want = tuple(x.shape[:ax]) + tuple(indices.shape) + tuple(x.shape[ax + 1:])
    if tuple(updates.shape) != want:
        raise ValueError(f"{op}: updates must have shape {want} (x {tuple(x.shape)}, indices "
                         f"{tuple(indices.shape)}, axis {ax}), got {tuple(updates.shape)}")
    impl = route(op, "numeric", x=x, indices=indices, updates=updates)
    if impl is not None:
        return impl.index_add(x, indices, updates, ax, stream=stream)
    idx = _bounds(op, indices.astype(np.int64).reshape(-1), x.shape[ax], f"axis {ax}")
    acc = x.astype(_compute(x.dtype)) if _is_float(x.dtype) else x.copy()
    moved = np.moveaxis(acc, ax, 0)
    upd = np.moveaxis(updates.reshape(tuple(x.shape[:ax]) + (-1,) + tuple(x.shape[ax + 1:])), ax, 0)
    np.add.at(moved, idx, upd.astype(acc.dtype))
    return _result(acc, x.dtype, None)


def gather_nd(x: Any, indices: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``x[tuple(indices[..., k] for k)]``: ``indices`` of shape ``(..., K)`` index the first ``K`` axes;
    result shape ``indices.shape[:-1] + x.shape[K:]``. Negative indices from the end; out-of-range as
    :func:`take`."""
    op = "gather_nd"
    x = as_array(x)
    indices = _check_indices(op, indices)
    if indices.ndim < 1 or indices.shape[-1] > x.ndim:
        raise ValueError(f"{op}: indices must have shape (..., K) with K <= x.ndim ({x.ndim}), got "
                         f"{tuple(indices.shape)}")
    k = int(indices.shape[-1])
    shape = tuple(indices.shape[:-1]) + tuple(x.shape[k:])
    check_out(op, out, shape, x.dtype)
    impl = route(op, "numeric", x=x, indices=indices, out=out)
    if impl is not None:
        return impl.gather_nd(x, indices, out=out, stream=stream)
    idx = tuple(_bounds(op, indices[..., i].astype(np.int64), x.shape[i], f"axis {i}") for i in range(k))
    return _result(x[idx], x.dtype, out)


def scatter_nd(x: Any, indices: Any, updates: Any, *, mode: str = "add", stream: Any = None) -> Any:
    """A copy of ``x`` with ``updates`` written at ``indices`` (shape ``(..., K)``, as :func:`gather_nd`):
    ``mode="add"`` accumulates (duplicates add up), ``"set"`` replaces (with duplicates, one of the
    values wins: the last on NumPy, unspecified on the device). ``updates`` has shape
    ``indices.shape[:-1] + x.shape[K:]`` (or broadcasts to it)."""
    op = "scatter_nd"
    if mode not in ("add", "set"):
        raise ValueError(f"{op}: mode must be 'add' or 'set', got {mode!r}")
    x = as_array(x)
    indices = _check_indices(op, indices)
    if indices.ndim < 1 or indices.shape[-1] > x.ndim:
        raise ValueError(f"{op}: indices must have shape (..., K) with K <= x.ndim ({x.ndim}), got "
                         f"{tuple(indices.shape)}")
    k = int(indices.shape[-1])
    want = tuple(indices.shape[:-1]) + tuple(x.shape[k:])
    if hasattr(updates, "shape"):
        if broadcast_shapes(updates.shape, want, op=op) != want:
            raise ValueError(f"{op}: updates of shape {tuple(updates.shape)} do not broadcast to {want}")
    else:
        _check_number(op, "updates", updates)
    arrays = {"updates": updates} if hasattr(updates, "shape") else {}
    impl = route(op, "numeric", x=x, indices=indices, **arrays)
    if impl is not None:
        return impl.scatter_nd(x, indices, updates, mode=mode, stream=stream)
    idx = tuple(_bounds(op, indices[..., i].astype(np.int64), x.shape[i], f"axis {i}") for i in range(k))
    acc = x.astype(_compute(x.dtype)) if _is_float(x.dtype) else x.copy()
    upd = np.broadcast_to(np.asarray(updates), want).astype(acc.dtype)
    if mode == "add":
        np.add.at(acc, idx, upd)
    else:
        acc[idx] = upd
    return _result(acc, x.dtype, None)


# ------------------------------------------------------------------------------------ padding
PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(x: Any, pad_width: Sequence[Sequence[int]], *, mode: str = "constant", constant_value: float = 0.0,
        out: Any = None, stream: Any = None) -> Any:
    """``numpy.pad(x, pad_width, mode)`` for ``mode`` in :data:`PAD_MODES`: ``pad_width`` one ``(before,
    after)`` pair of non-negative ints per axis; ``constant_value`` fills ``"constant"``."""
    op = "pad"
    if mode not in PAD_MODES:
        raise ValueError(f"{op}: mode must be one of {PAD_MODES}, got {mode!r}")
    x = as_array(x)
    widths = tuple((int(p[0]), int(p[1])) for p in pad_width)
    if len(widths) != x.ndim or any(p < 0 for w in widths for p in w):
        raise ValueError(f"{op}: pad_width must be one (before, after) pair of non-negative ints per axis of x "
                         f"({x.ndim}), got {pad_width!r}")
    for (lo, hi), n in zip(widths, x.shape):
        if mode != "constant" and (lo or hi) and n == 0:
            raise ValueError(f"{op}: mode {mode!r} cannot pad an empty axis")
    shape = tuple(n + lo + hi for (lo, hi), n in zip(widths, x.shape))
    check_out(op, out, shape, x.dtype)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.pad(x, widths, mode=mode, constant_value=float(constant_value), out=out, stream=stream)
    if mode == "constant":
        res = np.pad(x, widths, mode="constant", constant_values=np.asarray(constant_value).astype(x.dtype))
    else:
        res = np.pad(x, widths, mode=mode)
    return _result(res, x.dtype, out)


# ------------------------------------------------------------------------------ constructors
def _placement(device: Any) -> "tuple[bool, Any]":
    """(on CUDA, the device) for a constructor's ``device`` (a ``backend.Device``; None: the default one)."""
    dev = backend.resolve_device(device) if device is not None else backend.default_device()
    return dev.is_cuda, dev


def full(shape: Sequence[int], value: Any, dtype: Any, *, device: Any = None, stream: Any = None) -> Any:
    """A new array of ``shape`` filled with ``value`` (a Python number, converted to ``dtype``), on
    ``device`` (a ``backend.Device`` or its string; default: the default device)."""
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"full: shape {shape} has a negative extent")
    _check_number("full", "value", value)
    dt = normalize_dtype(dtype, "full: dtype")
    cuda_dev, dev = _placement(device)
    if cuda_dev:
        return _cuda_module("numeric").full(shape, value, dt, device=dev, stream=stream)
    with np.errstate(all="ignore"):
        return np.full(shape, value, dtype=dt)


def iota(n: int, start: float, step: float, dtype: Any, *, device: Any = None, stream: Any = None) -> Any:
    """``[start + i * step for i in range(n)]`` as a 1-d array of ``dtype`` (computed in float64 for float
    dtypes, then rounded; exactly in the integer type for int dtypes with integer start and step)."""
    n = int(n)
    if n < 0:
        raise ValueError(f"iota: n must be >= 0, got {n}")
    dt = normalize_dtype(dtype, "iota: dtype")
    cuda_dev, dev = _placement(device)
    if cuda_dev:
        return _cuda_module("numeric").iota(n, start, step, dt, device=dev, stream=stream)
    if dt.kind in "iub":
        return (np.asarray(start, np.int64) + np.arange(n, dtype=np.int64) * np.asarray(step, np.int64)).astype(dt)
    return (float(start) + np.arange(n, dtype=np.float64) * float(step)).astype(dt)


# ------------------------------------------------------------------------------------ sorting
def _sort_axis(op: str, x: Any, axis: int) -> int:
    if x.ndim == 0:
        raise ValueError(f"{op}: needs an array of rank >= 1")
    return _norm_axes(op, axis, x.ndim)[0]


def sort(x: Any, axis: int = -1, *, descending: bool = False, out: Any = None, stream: Any = None) -> Any:
    """``x`` sorted along ``axis`` (NaN last ascending, first descending, as NumPy's sort then flip)."""
    op = "sort"
    x = as_array(x)
    ax = _sort_axis(op, x, axis)
    check_out(op, out, x.shape, x.dtype)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.sort(x, ax, descending=bool(descending), out=out, stream=stream)
    res = np.sort(x.astype(_F32) if x.dtype in _LOW else x, axis=ax, kind="stable")
    if descending:
        res = np.flip(res, ax)
    return _result(res, x.dtype, out)


def argsort(x: Any, axis: int = -1, *, descending: bool = False, dtype: Any = None, out: Any = None,
            stream: Any = None) -> Any:
    """The indices that sort ``x`` along ``axis``, stably (equal elements keep their order; descending: equal
    elements still in increasing index order); int32 (``dtype`` may say int64)."""
    op = "argsort"
    x = as_array(x)
    ax = _sort_axis(op, x, axis)
    dt = normalize_dtype(dtype, f"{op}: dtype") if dtype is not None else np.dtype(np.int32)
    check_out(op, out, x.shape, dt)
    impl = route(op, "numeric", x=x, out=out)
    if impl is not None:
        return impl.argsort(x, ax, descending=bool(descending), dtype=dt, out=out, stream=stream)
    src = x.astype(_F32) if x.dtype in _LOW else x
    if descending:
        if src.dtype.kind == "b":
            src = src.astype(np.int8)
        if src.dtype.kind == "u":
            src = src.astype(np.int64)
        neg = -src if src.dtype.kind in "fi" or src.dtype == BFLOAT16 else src
        # NaN first when descending (NumPy's sort puts NaN last ascending)
        if src.dtype.kind == "f" or src.dtype == BFLOAT16:
            neg = np.where(np.isnan(src), -np.inf, neg)
        res = np.argsort(neg, axis=ax, kind="stable")
    else:
        res = np.argsort(src, axis=ax, kind="stable")
    return _result(res, dt, out)


def top_k(x: Any, k: int, *, sorted: bool = True, stream: Any = None) -> "tuple[Any, Any]":
    """``(values, indices)`` of the ``k`` largest entries along the last axis (ties: lower index first),
    in decreasing order; indices int32."""
    op = "top_k"
    x = as_array(x)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs an array of rank >= 1")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= int(k) <= x.shape[-1]:
        raise ValueError(f"{op}: k must be an int in [0, {x.shape[-1]}] (the last axis), got {k!r}")
    impl = route(op, "numeric", x=x)
    if impl is not None:
        return impl.top_k(x, int(k), stream=stream)
    idx = argsort(x, -1, descending=True)[..., : int(k)]
    vals = np.take_along_axis(x, idx.astype(np.int64), axis=-1)
    return np.ascontiguousarray(vals), np.ascontiguousarray(idx)


# ------------------------------------------------------------------------------------- random
RANDOM_KINDS = ("bits", "uniform", "normal", "truncated_normal")

_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = np.uint32(0x9E3779B9)
_PHILOX_W1 = np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox_uint32(key: int, counter: int, n: int) -> np.ndarray:
    """The first ``n`` uint32 words of Philox4x32-10 (Salmon et al., 2011; the generator cuRAND and JAX
    use) for the 64-bit ``key``, counting blocks from ``counter``: block ``j`` (counter word pair
    ``(counter + j)``'s low and high 32 bits, then ``(0, 0)``) gives words ``4j..4j+3``. The device
    computes the same words, so random draws agree bit for bit across backends."""
    blocks = (int(n) + 3) // 4
    j = np.arange(blocks, dtype=np.uint64) + np.uint64(int(counter) & 0xFFFFFFFFFFFFFFFF)
    c0 = (j & _MASK32).astype(np.uint32)
    c1 = (j >> np.uint64(32)).astype(np.uint32)
    c2 = np.zeros(blocks, np.uint32)
    c3 = np.zeros(blocks, np.uint32)
    k0 = np.uint32(int(key) & 0xFFFFFFFF)
    k1 = np.uint32((int(key) >> 32) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = c0.astype(np.uint64) * _PHILOX_M0
            p1 = c2.astype(np.uint64) * _PHILOX_M1
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _MASK32).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _MASK32).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0 = np.uint32((int(k0) + int(_PHILOX_W0)) & 0xFFFFFFFF)
            k1 = np.uint32((int(k1) + int(_PHILOX_W1)) & 0xFFFFFFFF)
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1)[: int(n)]


def _uniform01(bits: np.ndarray) -> np.ndarray:
    """float32 in [0, 1) from the top 24 bits: ``(bits >> 8) * 2**-24`` (exact)."""
    return (bits >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def _counter_value(counter: Any) -> int:
    if isinstance(counter, np.ndarray):
        if counter.shape != () or counter.dtype != _U64:
            raise TypeError(f"random: counter must be a 0-d uint64 array, got shape {counter.shape} and dtype "
                            f"{counter.dtype}")
        return int(counter)
    if isinstance(counter, (int, np.integer)) and not isinstance(counter, bool):
        return int(counter)
    raise TypeError(f"random: counter must be an int or a 0-d uint64 array, got {type(counter).__name__}")


def random(kind: str, shape: Sequence[int], key: int, counter: Any, dtype: Any = np.float32, *,
           p0: float = 0.0, p1: float = 1.0, device: Any = None, stream: Any = None) -> Any:
    """Counter-based random numbers of ``shape``: element ``i`` uses Philox word ``i`` of the stream
    (``key``, ``counter``) (:func:`philox_uint32`; ``normal`` takes words ``2i`` and ``2i + 1``).

    ``kind``: ``"bits"`` (uint32 words; ``dtype`` ignored), ``"uniform"`` in ``[p0, p1)``, ``"normal"``
    with mean ``p0`` and standard deviation ``p1`` (Box-Muller in float32), ``"truncated_normal"`` (within
    two standard deviations, by the inverse CDF: no rejection, so one word per element). ``counter`` is a
    Python int, or a 0-d uint64 array on the same device as the result: the device kernel then reads it
    there, so a captured graph replayed later draws from the counter's value at replay time (the caller
    advances it with :func:`advance_counter`). The result is ``dtype`` (float kinds), rounded from float32."""
    if kind not in RANDOM_KINDS:
        raise ValueError(f"random: kind must be one of {RANDOM_KINDS}, got {kind!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"random: shape {shape} has a negative extent")
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"random: key must be an int, got {type(key).__name__}")
    dt = np.dtype(np.uint32) if kind == "bits" else normalize_dtype(dtype, "random: dtype")
    if kind != "bits" and not _is_float(dt):
        raise TypeError(f"random: {kind} draws need a float dtype, got {dt}")
    if hasattr(counter, "shape") and not isinstance(counter, np.ndarray):
        return _cuda_module("numeric").random(kind, shape, int(key), counter, dt, p0=float(p0), p1=float(p1),
                                              stream=stream)
    cuda_dev, dev = _placement(device)
    if cuda_dev and not isinstance(counter, np.ndarray):
        return _cuda_module("numeric").random(kind, shape, int(key), int(counter), dt, p0=float(p0), p1=float(p1),
                                              device=dev, stream=stream)
    n = math.prod(shape)
    start = _counter_value(counter)
    if kind == "normal":
        bits = philox_uint32(key, start, 2 * n)
        u1 = _uniform01(bits[0::2]) + np.float32(2.0 ** -25)  # (0, 1): log never sees 0
        u2 = _uniform01(bits[1::2])
        z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
        vals = (z.astype(np.float32) * np.float32(p1) + np.float32(p0))
    else:
        bits = philox_uint32(key, start, n)
        if kind == "bits":
            return bits.reshape(shape)
        u = _uniform01(bits)
        if kind == "uniform":
            vals = u * (np.float32(p1) - np.float32(p0)) + np.float32(p0)
        else:
            lo = math.erf(-2.0 / math.sqrt(2.0))
            t = np.float32(lo) + u * np.float32(-2.0 * lo)
            z = np.float32(math.sqrt(2.0)) * _erfinv_giles(t).astype(np.float32)
            vals = np.clip(z, -2.0, 2.0).astype(np.float32) * np.float32(p1) + np.float32(p0)
    return vals.astype(dt).reshape(shape)


def advance_counter(counter: Any, amount: int, *, stream: Any = None) -> Any:
    """``counter += amount`` in place (a 0-d uint64 array; on the device one thread, stream-ordered, so a
    captured graph advances it on every replay); returns ``counter``."""
    if not hasattr(counter, "shape") or counter.shape != () or counter.dtype != _U64:
        raise TypeError("advance_counter: counter must be a 0-d uint64 array")
    impl = route("advance_counter", "numeric", counter=counter)
    if impl is not None:
        return impl.advance_counter(counter, int(amount), stream=stream)
    counter[...] = np.uint64((int(counter) + int(amount)) & 0xFFFFFFFFFFFFFFFF)
    return counter
