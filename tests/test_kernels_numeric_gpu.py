"""kernels.numeric on the GPU against its NumPy reference.

Every function and every table op, per dtype, on non-trivial random data, outputs NaN-poisoned first
(``out=`` where the function takes one); broadcasting, scalars, strided and odd-offset views, sizes
that take the vector and multi-block paths; reductions over every axis combination of a 4-d array;
random numbers bit for bit and a captured graph that draws fresh numbers on each replay.

Each failure names the op, the dtypes and the shapes. Float results are compared element by element
(NaN where NaN, the infinities equal, finite values within a per-dtype tolerance relative to the
magnitude of the reference); integer and bool results exactly. ``$DNNBIND_ERRLOG`` collects the
errors (tests/gpu_errlog.py).

    python3 -m pytest -q tests/test_kernels_numeric_gpu.py
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from dnnbind import cuda
from dnnbind.cuda.array import DeviceArray
from dnnbind.kernels import config
from dnnbind.kernels import numeric as nm
from dnnbind.kernels._cuda import numeric as dn
from gpu_errlog import BF16, dev_offset, record

pytestmark = pytest.mark.gpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I16, U16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16)
I32, U32, I64, U64 = np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64)
BOOL = np.dtype(np.bool_)
FLOATS = [F32, F16, BF16, F64]
INTS = [I32, I64, I8, U8]
DTYPES = FLOATS + INTS + [BOOL]
EXTRA_INTS = [I16, U16, U32, U64]
# element-wise relative tolerance of a result of this dtype (GPU libm vs NumPy's, a few ulps of float32;
# float16/bfloat16: one rounding of a float32 that may differ in its last bits)
TOL = {F64: 1e-13, F32: 4e-6, F16: 2e-3, BF16: 1.6e-2}


DEVICE = "cuda"  # where the constructors (full, iota, random with an int counter) put their results


def _name(dt) -> str:
    return str(np.dtype(dt))


@pytest.fixture(scope="module", autouse=True)
def _kernels_compiled():
    """Compile the module's kernels into the disk cache in parallel first (NVRTC one by one on first use
    would dominate the run)."""
    dn.precompile()


# --------------------------------------------------------------------------------------- helpers
def up(x, offset=0):
    x = np.asarray(x)
    return dev_offset(x, offset) if offset else cuda.to_device(x)


def poisoned(shape, dtype):
    return cuda.empty(tuple(shape), np.dtype(dtype)).fill_bytes(0xFF)


def view(parent, shape, elem_strides, offset=0):
    """A strided DeviceArray view of ``parent``'s memory (element strides, element offset)."""
    item = parent.itemsize
    return DeviceArray(parent.base, tuple(shape), parent.dtype, parent.ptr + offset * item,
                       strides=tuple(s * item for s in elem_strides), device_index=parent.device_index,
                       stream=parent.stream)


def host(a) -> np.ndarray:
    return a.to_host() if hasattr(a, "to_host") else np.asarray(a)


def expect(what, got, want, tol=None, scale=None):
    """Compare a device result with the reference: shape, dtype, then values (see the module docstring).
    ``scale``: per-element magnitude the error is relative to (default |want|, floored at 1e-3 of its max)."""
    g = host(got)
    w = np.asarray(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape}, expected {w.shape}"
    assert g.dtype == w.dtype, f"{what}: dtype {g.dtype}, expected {w.dtype}"
    if w.dtype.kind in "biu":
        bad = g != w
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at {i}: "
                                 f"{g[i]!r} != {w[i]!r}")
        record(what.split(" ")[0], _name(w.dtype), 0.0, what)
        return
    gf, wf = g.astype(np.float64), w.astype(np.float64)
    gn, wn = np.isnan(gf), np.isnan(wf)
    if (gn != wn).any():
        i = tuple(int(v) for v in np.argwhere(gn != wn)[0])
        raise AssertionError(f"{what}: NaN where the reference has none or the reverse; first at {i}: {g[i]!r} vs "
                             f"{w[i]!r} ({int((gn != wn).sum())} elements)")
    inf = np.isinf(wf)
    if (gf[inf] != wf[inf]).any() or np.isinf(gf[~inf & ~wn]).any():
        i = tuple(int(v) for v in np.argwhere((inf & (gf != wf)) | (~inf & ~wn & np.isinf(gf)))[0])
        raise AssertionError(f"{what}: infinities differ; first at {i}: {g[i]!r} vs {w[i]!r}")
    fin = ~inf & ~wn
    if not fin.any():
        return
    limit = TOL.get(w.dtype, 4e-6) if tol is None else tol
    mag = np.abs(wf) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), wf.shape)
    floor = 1e-3 * max(float(np.abs(wf[fin]).max()), 1e-30)
    err = np.abs(gf - wf)[fin] / np.maximum(mag[fin], floor)
    worst = float(err.max())
    record(what.split(" ")[0], _name(w.dtype), worst, what)
    if worst > limit:
        k = int(err.argmax())
        i = tuple(int(v) for v in np.argwhere(fin)[k])
        raise AssertionError(f"{what}: relative error {worst:.3e} > {limit:.1e} at {i}: {g[i]!r} vs {w[i]!r}")


def reference(fn, *args, **kwargs):
    """The NumPy reference's result, or the exception it raises (the device must then refuse too or be
    outside the contract)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)


# --------------------------------------------------------------------------------------- data
_DOMAIN = {"sqrt": (0.1, 4), "rsqrt": (0.1, 4), "log": (0.1, 4), "log2": (0.1, 4), "log10": (0.1, 4),
           "log1p": (-0.5, 3), "arcsin": (-0.9, 0.9), "arccos": (-0.9, 0.9), "arctanh": (-0.9, 0.9),
           "arccosh": (1.1, 4), "erfinv": (-0.9, 0.9), "lgamma": (0.1, 0.9), "tan": (-1.2, 1.2),
           "power_scalar": (0.1, 3), "reciprocal": (0.25, 3), "cbrt": (-3, 3), "i0": (-3, 3)}
# ops whose NumPy and device results agree on NaN and infinite inputs too
_SPECIALS = {"isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "logical_not", "negative", "positive",
             "abs", "sign", "square", "relu", "clip", "floor", "ceil", "trunc", "round", "exp", "sigmoid", "softplus",
             "tanh", "leaky_relu", "elu", "scale_shift"}
# unary ops an integer computes in its own type (the rest compute in floating point)
_INT_CLOSED = {"negative", "positive", "abs", "sign", "square", "reciprocal", "floor", "ceil", "round", "trunc", "relu",
               "bitwise_invert", "logical_not", "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
               "clip", "scale_shift", "leaky_relu"}
_PARAMS = {"clip": (-0.5, 1.25), "scale_shift": (1.5, -0.25), "power_scalar": (2.5, 0.0), "leaky_relu": (0.25, 0.0),
           "elu": (1.5, 0.0)}
# integer inputs of the parametrised ops compute in float64 and convert back: keep results in range (an
# out-of-range float -> int conversion is undefined; NumPy and the device differ there)
_INT_PARAMS = {"scale_shift": (0.5, -0.25)}
_VIA_FLOAT = {"clip", "scale_shift", "leaky_relu", "elu", "power_scalar"}


def _floats(rng, shape, dtype, low=-3.0, high=3.0, specials=False):
    x = rng.uniform(low, high, size=shape)
    if specials and x.size >= 8:
        flat = x.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    return x.astype(dtype)


def _ints(rng, shape, dtype, low=None, high=None):
    info = np.iinfo(dtype)
    lo = max(info.min, -100 if low is None else low)
    hi = min(info.max, 100 if high is None else high)
    x = rng.integers(lo, hi + 1, size=shape).astype(dtype)
    if x.size >= 4 and low is None:
        x.reshape(-1)[:2] = [info.min, info.max]
    return x


def _data(rng, shape, dtype, op=None):
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        x = _ints(rng, shape, dtype, -100 if op in _VIA_FLOAT else None, 100 if op in _VIA_FLOAT else None)
        if op == "reciprocal":  # of integer 0: 0 here, INT_MIN from NumPy on x86 (1.0 / 0 cast to an int)
            x[x == 0] = 1
        return x
    if op in ("round", "floor", "ceil", "trunc"):
        return (rng.integers(-20, 21, size=shape) / 2 + rng.choice([0, 0.25], size=shape)).astype(dtype)
    low, high = _DOMAIN.get(op, (-3.0, 3.0))
    return _floats(rng, shape, dtype, low, high, specials=op in _SPECIALS)


# ================================================================================== elementwise
@pytest.mark.parametrize("op", sorted(nm.UNARY))
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_unary(rng, op, dtype):
    if dtype.kind in "biu" and op not in _INT_CLOSED:
        pytest.skip("float functions of integers: see test_unary_integer_to_float")
    x = _data(rng, (7, 129), dtype, op)
    p0, p1 = (_INT_PARAMS if dtype.kind in "iu" else _PARAMS).get(op, _PARAMS.get(op, (0.0, 0.0)))
    try:
        want = reference(nm.unary, op, x, p0=p0, p1=p1)
    except TypeError:
        if op not in dn._INTEGER_ONLY:
            pytest.skip(f"NumPy refuses {op} of {_name(dtype)}; the device defines it (bool as 0/1)")
        with pytest.raises(TypeError, match=op):
            nm.unary(op, up(x), p0=p0, p1=p1)
        return
    out = poisoned(want.shape, want.dtype)
    got = nm.unary(op, up(x), p0=p0, p1=p1, out=out)
    assert got is out
    expect(f"unary {op} x {x.shape} {_name(dtype)}", got, want)
    # the scalar path of the same kernel family: an odd element offset breaks the vector alignment
    expect(f"unary {op} x {x.shape} {_name(dtype)} at an odd offset", nm.unary(op, up(x, 1), p0=p0, p1=p1), want)


@pytest.mark.parametrize("op", ["sqrt", "exp", "sigmoid", "log1p", "sin", "erf", "softplus"])
@pytest.mark.parametrize("src, dtype", [(I32, F32), (I8, F16), (U8, BF16), (BOOL, F32), (I64, F64), (I16, F32)],
                         ids=lambda v: _name(v))
def test_unary_integer_to_float(rng, op, src, dtype):
    x = _ints(rng, (5, 33), src, 0, 5) if src != BOOL else rng.integers(0, 2, (5, 33)).astype(bool)
    want = reference(nm.unary, op, x, dtype=dtype)
    got = nm.unary(op, up(x), dtype=dtype, out=poisoned(x.shape, dtype))
    expect(f"unary {op} x {_name(src)} -> {_name(dtype)}", got, want)


@pytest.mark.parametrize("dtype", EXTRA_INTS, ids=_name)
def test_unary_and_binary_on_the_other_integer_types(rng, dtype):
    x, y = _ints(rng, (3, 50), dtype), _ints(rng, (3, 50), dtype)
    for op in ("negative", "abs", "sign", "square", "bitwise_invert", "signbit"):
        expect(f"unary {op} {_name(dtype)}", nm.unary(op, up(x)), reference(nm.unary, op, x))
    for op in ("add", "multiply", "floor_divide", "mod", "maximum", "less", "bitwise_xor", "right_shift", "gcd"):
        b = y if op != "right_shift" else _ints(rng, (3, 50), dtype, 0, 9)
        if op == "gcd":  # no MIN: |MIN| wraps, and NumPy takes it unsigned
            x, b = _ints(rng, (3, 50), dtype, -60, 60), _ints(rng, (3, 50), dtype, -60, 60)
        expect(f"binary {op} {_name(dtype)}", nm.binary(op, up(x), up(b)), reference(nm.binary, op, x, b))


def _binary_data(rng, op, dtype, shape_a, shape_b):
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return (rng.integers(0, 2, shape_a).astype(bool), rng.integers(0, 2, shape_b).astype(bool))
    if dtype.kind in "iu":
        bits = dtype.itemsize * 8
        if op in ("left_shift", "right_shift"):
            return _ints(rng, shape_a, dtype), _ints(rng, shape_b, dtype, 0, bits + 1)
        if op == "power":
            return _ints(rng, shape_a, dtype, -4, 4), _ints(rng, shape_b, dtype, 0, 5)
        if op in ("gcd", "lcm"):
            return _ints(rng, shape_a, dtype, -60, 60), _ints(rng, shape_b, dtype, -60, 60)
        a, b = _ints(rng, shape_a, dtype), _ints(rng, shape_b, dtype)
        if b.size > 4:
            b.reshape(-1)[2:4] = [0, -1 if dtype.kind == "i" else 1]
        return a, b
    if op == "power":
        return _floats(rng, shape_a, dtype, 0.1, 3), _floats(rng, shape_b, dtype, -2, 2)
    if op == "ldexp":
        return _floats(rng, shape_a, dtype), rng.integers(-4, 5, shape_b).astype(dtype)
    specials = op in ("maximum", "minimum", "fmax", "fmin", "equal", "not_equal", "less", "less_equal", "greater",
                      "greater_equal", "heaviside", "copysign", "logical_and", "logical_or", "logical_xor", "add",
                      "multiply")
    a = _floats(rng, shape_a, dtype, specials=specials)
    b = _floats(rng, shape_b, dtype, specials=False)
    if op in ("floor_divide", "mod", "fmod", "divide", "heaviside") and b.size > 4:
        b.reshape(-1)[1:3] = 0  # division by zero and heaviside's x2 at 0
        a.reshape(-1)[3] = 0
    if op == "heaviside":
        a.reshape(-1)[5:9] = 0
    return a, b


_FLOAT_ONLY_BINARY = {"divide", "arctan2", "hypot", "copysign", "nextafter", "logaddexp", "logaddexp2", "heaviside",
                      "ldexp"}


def _binary_scale(op, a, b):
    """What an element's error is relative to: logaddexp's result near 0 is a difference of terms as large as
    its operands (max(a, b) + log1p(exp(-|a - b|))), so a few ulps of those, not of the result."""
    if op not in ("logaddexp", "logaddexp2") or np.dtype(a.dtype).kind in "biu":
        return None
    x, y = np.broadcast_arrays(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    return np.maximum(x, y) + 1.0


@pytest.mark.parametrize("op", sorted(nm.BINARY))
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_binary(rng, op, dtype):
    if dtype.kind in "biu" and op in _FLOAT_ONLY_BINARY:
        pytest.skip("float functions of integers: see test_binary_integer_operands_float_result")
    a, b = _binary_data(rng, op, dtype, (6, 67), (6, 67))
    try:
        want = reference(nm.binary, op, a, b)
    except (TypeError, ValueError):
        if op not in dn._INTEGER_ONLY or dtype == BOOL:
            pytest.skip(f"NumPy refuses {op} of {_name(dtype)}; the device defines it (bool as int8 0/1)")
        with pytest.raises(TypeError, match=op):
            nm.binary(op, up(a), up(b))
        return
    out = poisoned(want.shape, want.dtype)
    assert nm.binary(op, up(a), up(b), out=out) is out
    expect(f"binary {op} {a.shape} {_name(dtype)}", out, want, scale=_binary_scale(op, a, b))
    expect(f"binary {op} {a.shape} {_name(dtype)}, a at an odd offset", nm.binary(op, up(a, 1), up(b)), want,
           scale=_binary_scale(op, a, b))
    # broadcasting: a row and a column
    col = b[:, :1].copy()
    expect(f"binary {op} {a.shape} with {col.shape} {_name(dtype)}", nm.binary(op, up(a), up(col)),
           reference(nm.binary, op, a, col), scale=_binary_scale(op, a, col))
    expect(f"binary {op} {a[:1].shape} with {b.shape} {_name(dtype)}", nm.binary(op, up(a[:1].copy()), up(b)),
           reference(nm.binary, op, a[:1].copy(), b), scale=_binary_scale(op, a[:1], b))
    # Python numbers on either side (kernel parameters)
    for scalar in ((True,) if dtype == BOOL else (3,) if dtype.kind in "iu" else (1.5, 0.0)):
        for left in (False, True):
            args = (scalar, a) if left else (a, scalar)
            try:
                want_s = reference(nm.binary, op, *args)
            except (TypeError, ValueError, OverflowError):
                continue
            dargs = (scalar, up(a)) if left else (up(a), scalar)
            expect(f"binary {op} {'scalar, ' if left else ''}{_name(dtype)}{'' if left else ', scalar'} {scalar}",
                   nm.binary(op, *dargs), want_s)


@pytest.mark.parametrize("op", sorted(_FLOAT_ONLY_BINARY | {"add", "floor_divide", "power", "maximum"}))
@pytest.mark.parametrize("ta, tb, dtype", [(I32, F32, F32), (I8, U8, F16), (I64, I64, F64), (BOOL, F32, BF16)],
                         ids=lambda v: _name(v))
def test_binary_integer_operands_float_result(rng, op, ta, tb, dtype):
    a = _ints(rng, (4, 31), ta, 1, 6) if ta != BOOL else rng.integers(0, 2, (4, 31)).astype(bool)
    b = _ints(rng, (4, 31), tb, 1, 4) if tb.kind in "iu" else _floats(rng, (4, 31), tb, 0.5, 2)
    want = reference(nm.binary, op, a, b, dtype=dtype)
    expect(f"binary {op} {_name(ta)}, {_name(tb)} -> {_name(dtype)}", nm.binary(op, up(a), up(b), dtype=dtype), want)


def test_comparisons_promote_like_numpy(rng):
    x = np.array([0.1, 0.5, 1.0, np.nan] * 8, np.float32)
    for op in ("equal", "less", "greater_equal", "not_equal"):
        # float64 compare with the number, float32 with the 0-d array
        for other in (0.1, 1, np.asarray(0.1, np.float32)):
            want = reference(nm.binary, op, x, other)
            dother = up(other) if isinstance(other, np.ndarray) else other
            expect(f"binary {op} float32 vs {type(other).__name__} {other}", nm.binary(op, up(x), dother), want)
    i = _ints(rng, (40,), I32)
    f = _floats(rng, (40,), F32) * 50
    expect("binary less int32 vs float32", nm.binary("less", up(i), up(f)), reference(nm.binary, "less", i, f))
    u, s8 = _ints(rng, (40,), U8), _ints(rng, (40,), I8)
    expect("binary greater uint8 vs int8", nm.binary("greater", up(u), up(s8)), reference(nm.binary, "greater", u, s8))


def test_integer_only_ops_refuse_floats():
    x = up(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="bitwise_and"):
        nm.binary("bitwise_and", x, x)
    with pytest.raises(TypeError, match="bitwise_invert"):
        nm.unary("bitwise_invert", x)


@pytest.mark.parametrize("n, offset", [((1 << 22) + 3, 0), ((1 << 22) + 3, 1), (1001, 3), (1, 0)])
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64, U8], ids=_name)
def test_large_contiguous_vector_and_scalar_paths(rng, n, offset, dtype):
    a = _floats(rng, (n,), dtype) if dtype.kind != "u" else _ints(rng, (n,), dtype)
    b = _floats(rng, (n,), dtype) if dtype.kind != "u" else _ints(rng, (n,), dtype)
    da, db = up(a, offset), up(b)
    expect(f"binary add {n} {_name(dtype)} offset {offset}", nm.binary("add", da, db),
           reference(nm.binary, "add", a, b))
    op = "negative" if dtype.kind == "u" else "exp"
    expect(f"unary {op} {n} {_name(dtype)} offset {offset}", nm.unary(op, da), reference(nm.unary, op, a))


def test_broadcasting_strided_and_high_rank_operands(rng):
    a = _floats(rng, (2, 3, 4, 5, 6), F32)
    b = _floats(rng, (3, 1, 5, 1), BF16)
    expect("binary multiply rank 5 with broadcast bf16", nm.binary("multiply", up(a), up(b), dtype=F32),
           reference(nm.binary, "multiply", a, b, dtype=F32))
    base = _floats(rng, (40, 30), F32)
    d = up(base)
    t = view(d, (30, 40), (1, 30))  # a transposed view
    expect("binary subtract transposed view", nm.binary("subtract", t, 1.0), base.T - np.float32(1.0))
    flip = view(d, (40, 30), (30, -1), 29)  # x[:, ::-1]
    expect("unary abs reversed view", nm.unary("abs", flip), np.abs(base[:, ::-1]))
    big = _floats(rng, (1500, 1700), F32)
    row = _floats(rng, (1700,), F32)
    expect("binary add (1500, 1700) + (1700,)", nm.binary("add", up(big), up(row)), big + row)
    # a strided out: the rows of a wider array
    wide = poisoned((40, 60), F32)
    out = view(wide, (40, 30), (60, 1), 7)
    nm.unary("square", d, out=out)
    expect("unary square into a strided out", nm.strided_copy(wide, (40, 30), (60, 1), 7), np.square(base))


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_where(rng, dtype):
    c = rng.integers(0, 2, (5, 1, 7)).astype(np.int8)
    a = _data(rng, (1, 4, 7), dtype)
    b = _data(rng, (5, 4, 1), dtype)
    want = reference(nm.where, c, a, b)
    out = poisoned(want.shape, dtype)
    expect(f"where int8 cond, {_name(dtype)}", nm.where(up(c), up(a), up(b), out=out), want)
    expect(f"where float cond, {_name(dtype)}, scalar b", nm.where(up(c.astype(np.float32)), up(a), 1),
           reference(nm.where, c.astype(np.float32), a, 1))
    expect(f"where bool cond, scalars -> {_name(dtype)}", nm.where(up(c.astype(bool)), 0, 1, dtype=dtype),
           reference(nm.where, c.astype(bool), 0, 1, dtype=dtype))
    expect(f"where {_name(dtype)} -> float32", nm.where(up(c), up(a), up(b), dtype=F32),
           reference(nm.where, c, a, b, dtype=F32))


# ==================================================================================== reductions
def _reduce_input(rng, op, dtype, shape):
    if op == "prod" and dtype.kind not in "biu":
        return _floats(rng, shape, dtype, 0.7, 1.4)
    if op in ("argmax", "argmin") and dtype.kind not in "biu":
        return np.round(_floats(rng, shape, dtype), 1)  # ties: the first index wins
    x = _data(rng, shape, dtype)
    if op == "mean" and dtype in (I64, U64):
        # a 64-bit integer mean accumulates in float64 (both sides): exact below 2**53, order-dependent above
        x = (x >> 12).astype(dtype)
    return x


def _reduce_tol(op, x, axes, want):
    """Sums and means are compared relative to the sum of |x| over the reduced axes."""
    if op not in ("sum", "mean", "prod") or want.dtype.kind in "biu":
        return None
    ax = axes if axes is not None else None
    mag = np.sum(np.abs(x.astype(np.float64)), axis=ax, keepdims=False)
    if op == "mean":
        count = x.size // max(mag.size, 1)
        mag = mag / max(count, 1)
    if op == "prod":
        mag = np.abs(want.astype(np.float64)) * 10
    return mag


@pytest.mark.parametrize("op", sorted(nm.REDUCTIONS))
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_reduce_every_axis_combination_of_a_4d_array(rng, op, dtype):
    x = _reduce_input(rng, op, dtype, (3, 4, 5, 6))
    if op in ("argmax", "argmin"):
        cases = [(None, kd) for kd in (False, True)] + [((a,), False) for a in range(4)]
    else:
        cases = [(axes, kd) for r in range(5) for axes in itertools.combinations(range(4), r) for kd in (False, True)]
    dx = up(x)
    for axes, keepdims in cases:
        axis = (None if axes is None else axes[0]) if op.startswith("arg") else axes
        try:
            want = reference(nm.reduce, op, x, axis, keepdims)
        except (TypeError, ValueError):
            continue
        out = poisoned(np.shape(want), want.dtype)
        got = nm.reduce(op, dx, axis, keepdims, out=out)
        scale = _reduce_tol(op, x, axes if not op.startswith("arg") else None, want)
        if scale is not None and keepdims:
            scale = np.reshape(scale, np.shape(want))
        expect(f"reduce {op} {_name(dtype)} {x.shape} axes {axes} keepdims {keepdims}", got, want,
               tol=1e-5 if dtype == F32 else None, scale=scale)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax", "argmin", "prod", "any"])
@pytest.mark.parametrize("shape, axis", [((3, 300000), 1), ((300000, 3), 0), ((64, 5000), 1), ((2000, 300), 1),
                                         ((5, 3000, 7), 1), ((10_000_000,), 0), ((1, 17), 1)])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=_name)
def test_reduce_long_extents_split_and_multi_block(rng, op, shape, axis, dtype):
    x = _reduce_input(rng, op, dtype, shape)
    if op == "prod":
        x = (np.sign(x) * 1 if dtype.kind == "i" else x)
        x = x.astype(dtype)
        if dtype.kind == "f" or dtype == BF16:
            x = _floats(rng, shape, dtype, 0.9999, 1.0001)
    ax = axis if op.startswith("arg") else (axis,)
    want = reference(nm.reduce, op, x, ax)
    scale = _reduce_tol(op, x, (axis,), want)
    if op == "prod" and scale is not None:  # a product of n roundings: error grows with n on both sides
        scale = scale * max(1.0, shape[axis] / 1000)
    expect(f"reduce {op} {_name(dtype)} {shape} axis {axis}", nm.reduce(op, up(x), ax), want,
           tol=2e-5 if dtype == F32 else None, scale=scale)


@pytest.mark.parametrize("shape, axes", [((86528, 32), (0,)), ((128, 11, 11, 64), (0, 1, 2)), ((3, 5, 7), (0, 1)),
                                         ((1000, 48), (0,)), ((300, 2), (0,)), ((4, 6, 10), (0, 1))])
@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_reduce_sum_of_leading_axes_takes_the_column_sums(rng, shape, axes, dtype, keepdims, offset):
    # the broadcast add's VJP (sum over every axis but the last): layout.cu's column sums, vector loads only
    # where aligned (offset 1 breaks the alignment), into a poisoned output, per float dtype
    x = _reduce_input(rng, "sum", dtype, shape)
    want = reference(nm.reduce, "sum", x, axes, keepdims)
    scale = _reduce_tol("sum", x, axes, want)
    if keepdims:
        scale = np.reshape(scale, np.shape(want))
    got = nm.reduce("sum", up(x, offset), axes, keepdims, out=poisoned(np.shape(want), want.dtype))
    expect(f"reduce sum {_name(dtype)} {shape} axes {axes} keepdims {keepdims} offset {offset}", got, want,
           tol=1e-5 if dtype == F32 else None, scale=scale)
    fresh = nm.reduce("sum", up(x, offset), axes, keepdims)  # no out: a new array
    expect(f"reduce sum {_name(dtype)} {shape} axes {axes} (new output)", fresh, want,
           tol=1e-5 if dtype == F32 else None, scale=scale)


def test_reduce_nan_propagation_and_dtypes(rng):
    x = _floats(rng, (6, 50), F32)
    x[1, 7] = np.nan
    x[3, 0] = np.nan
    x[3, 40] = np.nan
    d = up(x)
    for op in ("max", "min"):
        expect(f"reduce {op} with NaN", nm.reduce(op, d, (1,)), reference(nm.reduce, op, x, (1,)))
    for op in ("argmax", "argmin"):
        expect(f"reduce {op} with NaN", nm.reduce(op, d, 1), reference(nm.reduce, op, x, 1))
        expect(f"reduce {op} with NaN int64", nm.reduce(op, d, 1, dtype=I64), reference(nm.reduce, op, x, 1, dtype=I64))
    b = rng.integers(0, 2, (40, 300)).astype(bool)
    expect("reduce sum bool -> int32", nm.reduce("sum", up(b), (1,), dtype=I32), reference(nm.reduce, "sum", b, (1,),
                                                                                          dtype=I32))
    expect("reduce sum bool", nm.reduce("sum", up(b), (1,)), reference(nm.reduce, "sum", b, (1,)))
    i8 = _ints(rng, (40, 300), I8)
    expect("reduce sum int8 wraps", nm.reduce("sum", up(i8), (1,)), reference(nm.reduce, "sum", i8, (1,)))
    expect("reduce mean int8 -> float32", nm.reduce("mean", up(i8), (0, 1), dtype=F32),
           reference(nm.reduce, "mean", i8, (0, 1), dtype=F32))
    h = np.full((3, 5000), 1.0, np.float16)
    expect("reduce sum float16 accumulates in float32", nm.reduce("sum", up(h), (1,)), reference(nm.reduce, "sum", h,
                                                                                                 (1,)))
    e = np.zeros((0, 4), np.float32)
    for op in ("sum", "prod", "any", "all"):
        expect(f"reduce {op} of an empty axis", nm.reduce(op, up(e), (0,)), reference(nm.reduce, op, e, (0,)))
    expect("reduce mean of an empty axis", nm.reduce("mean", up(e), (0,)), reference(nm.reduce, "mean", e, (0,)))
    t = view(up(x), (50, 6), (1, 50))  # non-contiguous input
    expect("reduce sum of a transposed view", nm.reduce("sum", t, (1,)), x.T.sum(axis=1), tol=1e-5)


# =================================================================================== cumulative
@pytest.mark.parametrize("op", nm.CUMULATIVE)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape, axis", [((5, 37), 1), ((3, 20000), 1), ((20000, 3), 0), ((40, 50, 60), 1),
                                         ((7, 1000), 0)])
def test_cumulative(rng, op, dtype, shape, axis):
    if op == "cumprod" and dtype.kind not in "biu":
        x = _floats(rng, shape, dtype, 0.999, 1.001)
    elif op == "cumprod" and dtype.kind in "iu":
        x = _ints(rng, shape, dtype, 0, 2)
    else:
        x = _data(rng, shape, dtype)
        if dtype.kind not in "biu" and op in ("cummax", "cummin"):
            x.reshape(-1)[5] = np.nan
    for reverse in (False, True):
        want = reference(nm.cumulative, op, x, axis, reverse=reverse)
        scale = None
        if op == "cumsum" and want.dtype.kind not in "biu":
            ax = np.abs(x.astype(np.float64))
            ax = np.flip(np.cumsum(np.flip(ax, axis), axis), axis) if reverse else np.cumsum(ax, axis)
            scale = ax
        if op == "cumprod" and want.dtype.kind not in "biu":
            scale = np.abs(want.astype(np.float64)) * 20
        out = poisoned(x.shape, want.dtype)
        got = nm.cumulative(op, up(x), axis, reverse=reverse, out=out)
        expect(f"cumulative {op} {_name(dtype)} {shape} axis {axis} reverse {reverse}", got, want,
               tol=2e-5 if dtype == F32 else None, scale=scale)


# ================================================================================= strided views
@pytest.mark.parametrize("dtype", DTYPES + EXTRA_INTS, ids=_name)
def test_strided_copy_views(rng, dtype):
    base = _data(rng, (3000,), dtype)
    d = up(base)
    cases = [((50, 60), (1, 50), 0), ((50, 60), (60, -1), 59), ((7, 60), (0, 1), 120), ((40,), (61,), 5),
             ((4, 5, 6), (1, 4, 20), 3), ((2, 3, 4, 5, 6), (360, 120, 1, 4, 20), 11), ((3000,), (1,), 0),
             ((0, 5), (5, 1), 0), ((30, 40, 2), (80, 2, 1), 1)]
    for shape, strides, offset in cases:
        want = nm.strided_copy(base, shape, strides, offset)
        out = poisoned(shape, dtype)
        expect(f"strided_copy {_name(dtype)} {shape} strides {strides} offset {offset}",
               nm.strided_copy(d, shape, strides, offset, out=out), want)


@pytest.mark.parametrize("dtype", [F32, BF16, F64, I8, BOOL], ids=_name)
def test_strided_copy_large_transposes(rng, dtype):
    x = _data(rng, (1000, 1200), dtype)
    flat = up(x.reshape(-1))
    expect(f"strided_copy transpose (1200, 1000) {_name(dtype)}", nm.strided_copy(flat, (1200, 1000), (1, 1200)), x.T)
    x3 = x.reshape(10, 100, 1200)
    expect(f"strided_copy batched transpose {_name(dtype)}", nm.strided_copy(flat, (10, 1200, 100), (120000, 1, 1200)),
           np.ascontiguousarray(np.transpose(x3, (0, 2, 1))))
    expect(f"strided_copy transpose at an odd offset {_name(dtype)}",
           nm.strided_copy(flat, (1199, 999), (1, 1200), 1201), np.ascontiguousarray(x[1:, 1:].T))


@pytest.mark.parametrize("dtype", [F32, BF16, I32, BOOL, U64], ids=_name)
def test_strided_assign(rng, dtype):
    base = _data(rng, (40, 30), dtype)
    for shape, strides, offset, value in [((4, 6), (60, 2), 3, None), ((30,), (31,), 0, "scalar"),
                                          ((5, 30), (30, 1), 60, "row"), ((40, 30), (30, 1), 0, "float32")]:
        if value is None:
            v = _data(rng, shape, dtype)
        elif value == "scalar":
            v = 1 if dtype.kind in "biu" else 2.5
        elif value == "row":
            v = _data(rng, (30,), dtype)
        else:
            v = np.abs(_floats(rng, shape, F32)) * 10  # no negative floats into unsigned types (undefined)
        x, h = up(base), base.copy()
        nm.strided_assign(h, shape, strides, offset, v)
        assert nm.strided_assign(x, shape, strides, offset, up(v) if hasattr(v, "shape") else v) is x
        expect(f"strided_assign {_name(dtype)} {shape} {strides} {offset} {value}", x, h)
    # the value overlaps the view: NumPy copies it first
    x, h = up(base), base.copy()
    src = view(x, (39, 30), (30, 1), 30)
    nm.strided_assign(x, (39, 30), (30, 1), 0, src)
    nm.strided_assign(h, (39, 30), (30, 1), 0, h[1:].copy())
    expect(f"strided_assign of an overlapping view {_name(dtype)}", x, h)


# ======================================================================================== matmul
@pytest.mark.parametrize("sa, sb, ta, tb", [
    ((2, 1, 33, 40), (5, 40, 17), False, False), ((7, 33, 40), (40,), False, False), ((40,), (3, 40, 9), False, False),
    ((40, 33), (17, 40), True, True), ((2, 33, 40), (2, 17, 40), False, True), ((65, 129), (129, 1), False, False),
    ((40,), (40,), False, False), ((4, 0), (0, 5), False, False)])
@pytest.mark.parametrize("dtype, tf32", [(F32, False), (F32, True), (F16, False), (BF16, False), (F64, False)],
                         ids=["fp32", "tf32", "fp16", "bf16", "fp64"])
def test_matmul_float(rng, sa, sb, ta, tb, dtype, tf32):
    a, b = _floats(rng, sa, dtype), _floats(rng, sb, dtype)
    want = reference(nm.matmul, a, b, transpose_a=ta, transpose_b=tb)
    ca = np.swapaxes(a.astype(np.float64), -1, -2) if ta else a.astype(np.float64)
    cb = np.swapaxes(b.astype(np.float64), -1, -2) if tb else b.astype(np.float64)
    scale = np.matmul(np.abs(ca), np.abs(cb)) if want.size else None
    tol = {F64: 1e-12, F32: 5e-3 if tf32 else 1e-5, F16: 4e-3, BF16: 2e-2}[dtype]
    with config.override(allow_tf32=tf32):
        out = poisoned(want.shape, dtype)
        got = nm.matmul(up(a), up(b), transpose_a=ta, transpose_b=tb, out=out)
    expect(f"matmul {_name(dtype)}{' tf32' if tf32 else ''} {sa}{'^T' if ta else ''} @ {sb}{'^T' if tb else ''}",
           got, want, tol=tol, scale=scale)


@pytest.mark.parametrize("dtype", INTS + [BOOL, U16], ids=_name)
def test_matmul_integer(rng, dtype):
    for sa, sb in (((2, 1, 9, 20), (3, 20, 11)), ((20,), (20, 7)), ((33, 65), (65, 17))):
        a = _ints(rng, sa, dtype, -3, 3) if dtype != BOOL else rng.integers(0, 2, sa).astype(bool)
        b = _ints(rng, sb, dtype, -3, 3) if dtype != BOOL else rng.integers(0, 2, sb).astype(bool)
        want = reference(nm.matmul, a, b)
        expect(f"matmul {_name(dtype)} {sa} @ {sb}", nm.matmul(up(a), up(b), out=poisoned(want.shape, dtype)), want)
    a, b = _ints(rng, (30, 40), I8), _ints(rng, (30, 40), I8)
    expect("matmul int8 wrapping, b transposed", nm.matmul(up(a), up(b), transpose_b=True),
           reference(nm.matmul, a, b, transpose_b=True))


def test_matmul_mixed_dtypes(rng):
    a, b = _ints(rng, (8, 30), I32, -5, 5), _floats(rng, (30, 6), F32)
    for dtype in (F32, F16, F64):
        want = reference(nm.matmul, a, b, dtype=dtype)
        scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        with config.override(allow_tf32=False):
            expect(f"matmul int32 @ float32 -> {_name(dtype)}", nm.matmul(up(a), up(b), dtype=dtype), want,
                   tol=TOL[dtype] if dtype != F32 else 1e-5, scale=scale)
    f = _floats(rng, (8, 30), F32) * 3
    expect("matmul float32 @ int32 -> int32 (truncated first)", nm.matmul(up(f), up(a.T.copy()), dtype=I32),
           reference(nm.matmul, f, a.T.copy(), dtype=I32))


# ============================================================================ gathers and scatters
_INDEX = [I32, I64, U8, I16]


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("itype", _INDEX, ids=_name)
def test_take_and_take_along_axis(rng, dtype, itype):
    x = _data(rng, (6, 7, 5), dtype)
    d = up(x)
    for axis in (0, 1, 2, None):
        n = x.size if axis is None else x.shape[axis]
        ii = rng.integers(0 if itype.kind == "u" else -n, n, (3, 4)).astype(itype)  # negative: from the end
        want = reference(nm.take, x, ii, axis)
        out = poisoned(np.shape(want), dtype)
        expect(f"take {_name(dtype)} indices {_name(itype)} axis {axis}", nm.take(d, up(ii), axis, out=out), want)
    ta = rng.integers(0, 7, (6, 3, 1)).astype(itype)
    want = reference(nm.take_along_axis, x, ta, 1)
    expect(f"take_along_axis {_name(dtype)} indices {_name(itype)}", nm.take_along_axis(d, up(ta), 1,
                                                                                       out=poisoned(want.shape, dtype)),
           want)
    nd = np.stack([rng.integers(0, 6, 9), rng.integers(0, 7, 9)], axis=1).astype(itype)
    want = reference(nm.gather_nd, x, nd)
    expect(f"gather_nd {_name(dtype)} indices {_name(itype)}", nm.gather_nd(d, up(nd), out=poisoned(want.shape, dtype)),
           want)


def test_out_of_range_indices_are_clamped_on_the_device(rng):
    x = _floats(rng, (5, 6), F32)
    idx = np.array([-1, -6, 5, 6, 100, -100], np.int64)
    clamped = np.clip(np.where(idx < 0, idx + 6, idx), 0, 5)
    expect("take clamps", nm.take(up(x), up(idx), 1), x[:, clamped])
    nd = np.array([[9, 9], [-9, 2], [1, -1]], np.int64)
    expect("gather_nd clamps", nm.gather_nd(up(x), up(nd)), x[[4, 0, 1], [5, 2, 5]])
    with pytest.raises(IndexError, match="size 0"):
        nm.take(up(np.zeros((3, 0), np.float32)), up(np.array([0])), 1)


@pytest.mark.parametrize("dtype", DTYPES + EXTRA_INTS, ids=_name)
def test_index_add_and_scatter_nd(rng, dtype):
    x = _data(rng, (6, 7, 5), dtype)
    if dtype.kind in "iu":
        x = _ints(rng, (6, 7, 5), dtype, 0, 20)
    idx = np.array([1, 4, 1, 6, 1], np.int64)  # duplicates accumulate
    upd = _data(rng, (6, 5, 5), dtype) if dtype.kind not in "iu" else _ints(rng, (6, 5, 5), dtype, 0, 9)
    want = reference(nm.index_add, x, idx, upd, 1)
    scale = np.abs(x.astype(np.float64)) + 3 * np.abs(upd.astype(np.float64)).max() if want.dtype.kind == "f" or \
        want.dtype == BF16 else None
    expect(f"index_add {_name(dtype)}", nm.index_add(up(x), up(idx), up(upd), 1), want, scale=scale)
    nd = np.array([[0, 1], [5, 6], [0, 1], [2, 3]], np.int32)
    u2 = _data(rng, (4, 5), dtype) if dtype.kind not in "iu" else _ints(rng, (4, 5), dtype, 0, 9)
    want = reference(nm.scatter_nd, x, nd, u2, mode="add")
    expect(f"scatter_nd add {_name(dtype)}", nm.scatter_nd(up(x), up(nd), up(u2), mode="add"), want,
           scale=None if scale is None else np.abs(x.astype(np.float64)) + 3)
    unique = nd[[0, 1, 3]]
    want = reference(nm.scatter_nd, x, unique, u2[[0, 1, 3]], mode="set")
    expect(f"scatter_nd set {_name(dtype)}", nm.scatter_nd(up(x), up(unique), up(u2[[0, 1, 3]]), mode="set"), want)
    want = reference(nm.scatter_nd, x, unique, 2, mode="set")
    expect(f"scatter_nd set scalar {_name(dtype)}", nm.scatter_nd(up(x), up(unique), 2, mode="set"), want)
    rows = np.ascontiguousarray(np.broadcast_to(u2[0], (7, 5)))  # broadcast over the 4 index rows
    want = reference(nm.scatter_nd, x, nd[:, :1].copy(), rows, mode="add")
    got = nm.scatter_nd(up(x), up(nd[:, :1].copy()), up(rows), mode="add")
    expect(f"scatter_nd add broadcast rows {_name(dtype)}", got, want, scale=None if scale is None else
           np.abs(x.astype(np.float64)) + 5 * np.abs(rows.astype(np.float64)).max() + 1)


# ======================================================================================= padding
@pytest.mark.parametrize("mode", nm.PAD_MODES)
@pytest.mark.parametrize("dtype", DTYPES + [U16], ids=_name)
def test_pad(rng, mode, dtype):
    x = _data(rng, (3, 4, 5), dtype)
    for widths in (((1, 2), (0, 0), (3, 1)), ((0, 0), (9, 11), (0, 7)), ((2, 2), (1, 1), (1, 1))):
        want = reference(nm.pad, x, widths, mode=mode, constant_value=-2.0)
        out = poisoned(want.shape, dtype)
        expect(f"pad {mode} {_name(dtype)} {widths}", nm.pad(up(x), widths, mode=mode, constant_value=-2.0, out=out),
               want)
    if mode == "constant":
        e = np.zeros((0, 3), dtype)
        expect(f"pad an empty array {_name(dtype)}", nm.pad(up(e), ((1, 1), (0, 2))), reference(nm.pad, e, ((1, 1),
                                                                                                          (0, 2))))


# ================================================================================== constructors
@pytest.mark.parametrize("dtype", DTYPES + EXTRA_INTS, ids=_name)
def test_full_and_iota(dtype):
    for value in ((True, False) if dtype == BOOL else (0, 7, -3) if dtype.kind == "i" else (0, 7, 200) if
                  dtype.kind == "u" else (0.0, 2.5, -1e-3)):
        expect(f"full {_name(dtype)} {value}", nm.full((3, 70), value, dtype, device=DEVICE),
               reference(nm.full, (3, 70), value, dtype, device="cpu"))
    for start, step in ((0, 1), (5, -2), (1.5, 0.25)):
        if dtype.kind in "iub" and isinstance(start, float):
            continue
        expect(f"iota {_name(dtype)} {start} {step}", nm.iota(1000, start, step, dtype, device=DEVICE),
               reference(nm.iota, 1000, start, step, dtype, device="cpu"), tol=0.0 if dtype in (F32, F64) else None)


# ======================================================================================= sorting
def _sort_data(rng, dtype, shape):
    if dtype == BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min + 1, -50), min(info.max, 50), shape).astype(dtype)  # ties; no MIN
    x = np.round(_floats(rng, shape, dtype), 1)
    flat = x.reshape(-1)
    specials = [np.nan, -0.0, 0.0, np.inf, np.nan]
    flat[:len(specials)] = specials[:flat.size]
    return x


@pytest.mark.parametrize("dtype", DTYPES + [U16, U64], ids=_name)
@pytest.mark.parametrize("shape, axis", [((6, 37), 1), ((3, 4096), 1), ((2, 5000), 1), ((40, 9), 0), ((1, 1), 1),
                                         ((4, 20000), 1)])
def test_sort_argsort_top_k(rng, dtype, shape, axis):
    x = _sort_data(rng, dtype, shape)
    d = up(x)
    for descending in (False, True):
        want = reference(nm.sort, x, axis, descending=descending)
        expect(f"sort {_name(dtype)} {shape} axis {axis} desc {descending}",
               nm.sort(d, axis, descending=descending, out=poisoned(x.shape, dtype)), want)
        for idt in (I32, I64):
            want = reference(nm.argsort, x, axis, descending=descending, dtype=idt)
            expect(f"argsort {_name(dtype)} {shape} axis {axis} desc {descending} {_name(idt)}",
                   nm.argsort(d, axis, descending=descending, dtype=idt, out=poisoned(x.shape, idt)), want)
    if axis == x.ndim - 1:
        for k in sorted({0, 1, min(5, shape[-1]), shape[-1]}):
            vals, idx = nm.top_k(d, k)
            want_v, want_i = reference(nm.top_k, x, k)
            expect(f"top_k {_name(dtype)} {shape} k {k} indices", idx, want_i)
            expect(f"top_k {_name(dtype)} {shape} k {k} values", vals, want_v)


# ======================================================================================== random
@pytest.mark.parametrize("kind", nm.RANDOM_KINDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
@pytest.mark.parametrize("shape", [(3, 5), (1001,), (256, 1024)])
def test_random_matches_the_reference(kind, dtype, shape):
    key, counter = 0x1234_5678_9ABC_DEF0, (1 << 32) - 3  # the counter's low word wraps inside the draw
    p0, p1 = (-1.5, 2.0) if kind == "uniform" else (0.5, 2.0)
    want = reference(nm.random, kind, shape, key, counter, dtype, p0=p0, p1=p1, device="cpu")
    got = nm.random(kind, shape, key, counter, dtype, p0=p0, p1=p1, device=DEVICE)
    c = cuda.to_device(np.array(counter, np.uint64))
    got_dev = nm.random(kind, shape, key, c, dtype, p0=p0, p1=p1)
    exact = kind in ("bits", "uniform")
    for what, g in (("int counter", got), ("device counter", got_dev)):
        if exact:  # Philox words bit for bit, uniform's float32 arithmetic too
            assert g.dtype == want.dtype
            gh = host(g)
            bad = gh.view(np.uint8).reshape(gh.shape + (-1,)) != want.view(np.uint8).reshape(want.shape + (-1,))
            assert not bad.any(), f"random {kind} {_name(want.dtype)} {shape} ({what}): differs at " \
                                  f"{np.argwhere(bad.any(axis=-1))[0]}"
        else:
            expect(f"random {kind} {_name(dtype)} {shape} ({what})", g, want,
                   tol=2e-5 if dtype in (F32, F64) else None, scale=np.maximum(np.abs(want.astype(np.float64)), 1.0))


def test_random_in_a_captured_graph_draws_fresh_numbers_on_each_replay():
    s = cuda.Stream()
    key, c0, n = 99, 5, 10_000
    blocks = -(-n // 4)  # uniform takes one Philox word per element, four per counter value
    counter = cuda.to_device(np.array(c0, np.uint64), stream=s)
    buf = cuda.empty((n,), np.float32, stream=s)
    # eager once: every kernel compiled and loaded before the capture
    nm.random("uniform", (n,), key, counter, np.float32, stream=s)
    nm.advance_counter(counter, 0, stream=s)
    with cuda.capture(s) as graph:
        r = nm.random("uniform", (n,), key, counter, np.float32, stream=s)
        buf.copy_from(r, stream=s)
        del r
        nm.advance_counter(counter, blocks, stream=s)
    assert graph.outstanding_allocations == []
    draws = []
    for _ in range(2):
        graph.launch(s)
        s.synchronize()
        draws.append(buf.to_host(s))
    assert not np.array_equal(draws[0], draws[1])
    for i, d in enumerate(draws):
        assert np.array_equal(d, nm.random("uniform", (n,), key, c0 + i * blocks, np.float32, device="cpu")), \
            f"replay {i}"
    assert int(counter.to_host(s)) == c0 + 2 * blocks
    graph.close()


def test_advance_counter_wraps_and_device_counter_checks():
    c = cuda.to_device(np.array(2**64 - 2, np.uint64))
    assert nm.advance_counter(c, 5) is c
    assert int(c.to_host()) == 3
    nm.advance_counter(c, -1)
    assert int(c.to_host()) == 2
    with pytest.raises(TypeError, match="0-d uint64"):
        nm.random("bits", (4,), 1, cuda.to_device(np.zeros((), np.int64)))


def test_empty_arrays_everywhere():
    e = up(np.zeros((0, 5), np.float32))
    assert nm.unary("exp", e).shape == (0, 5)
    assert nm.binary("add", e, 1.0).shape == (0, 5)
    assert host(nm.reduce("sum", e, (0,))).tolist() == [0.0] * 5
    assert nm.cumulative("cumsum", e, 0).shape == (0, 5)
    assert nm.sort(e, 0).shape == (0, 5)
    assert nm.matmul(e, up(np.ones((5, 3), np.float32))).shape == (0, 3)
    assert nm.random("normal", (0, 3), 1, 1, device=DEVICE).shape == (0, 3)
    assert nm.take(e, up(np.zeros((2,), np.int32)), 1).shape == (0, 2)
