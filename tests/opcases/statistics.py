"""Cases of the statistics and special-math family (``dnnbind/ops/_statistics.py``)."""

import dataclasses

import numpy as np

from . import A, B, Case, I

NAN, INF = float("nan"), float("inf")


@dataclasses.dataclass(frozen=True)
class F(A):
    """Fixed float values (NaN, infinities, zeros, ties a random spec cannot place), in the dtype the test
    asks for (float64 for gradients, float32 for Keras), so they can be differentiated like ``A``."""

    values: tuple = ()

    def make(self, rng, dtype=None):
        return np.asarray(self.values, dtype=dtype or self.dtype)


X = A((3, 5))
X3 = A((2, 3, 4))
POS = A((3, 5), 0.5, 2.0)
# NaN-holding data: every row keeps finite values (gradients need finite outputs); WITH_ALL_NAN has an
# all-NaN row (values only)
WITH_NAN = F((3, 4), values=((0.3, NAN, -0.7, 0.1), (NAN, 0.9, 0.2, -0.4), (0.5, -0.2, NAN, NAN)))
WITH_ALL_NAN = F((3, 4), values=((0.3, NAN, -0.7, 0.1), (NAN, NAN, NAN, NAN), (0.5, -0.2, NAN, 0.8)))
SPECIAL = F((6,), values=(NAN, INF, -INF, 0.5, -2.0, 0.0))
WITH_ZERO = F((5,), values=(0.0, 0.5, -1.25, 0.0, 2.0))


def _trapz(y, x=None, dx=1.0, axis=-1):
    return np.trapezoid(y, x=x, dx=dx, axis=axis)


def _nanarg(fn, fill):
    def ref(x, axis=None, keepdims=False):
        mask = np.isnan(x)
        idx = fn(np.where(mask, fill, x), axis=axis, keepdims=keepdims)
        return np.where(np.all(mask, axis=axis, keepdims=keepdims), -1, idx).astype(np.int32)
    return ref


def _quantile_ref(fn):
    def ref(x, q, axis=None, method="linear", keepdims=False):
        return fn(x, q, axis=axis, method=method, keepdims=keepdims)
    return ref


CASES = [
    # closeness
    Case("isclose", (X, A((5,))), ref=np.isclose, name="broadcast"),
    Case("isclose", (SPECIAL, F((6,), values=(NAN, INF, INF, 0.5 + 1e-7, -2.0, 1e-9))), ref=np.isclose,
         name="special"),
    Case("isclose", (SPECIAL, F((6,), values=(NAN, INF, -INF, 0.6, -2.1, 0.0))), {"equal_nan": True, "rtol": 0.1},
         ref=lambda a, b, equal_nan, rtol: np.isclose(a, b, rtol=rtol, equal_nan=equal_nan), name="equal_nan"),
    Case("isclose", (I((3, 4)), I((4,))), {"atol": 1}, ref=lambda a, b, atol: np.isclose(a, b, atol=atol),
         name="int"),
    Case("isclose", (X, 0.25), {"atol": 0.3}, ref=lambda a, b, atol: np.isclose(a, b, atol=atol), name="scalar"),
    Case("allclose", (X, A((5,))), ref=np.allclose, name="different"),
    Case("allclose", (F((2,), values=(1.0, 2.0)), F((2,), values=(1.0 + 1e-6, 2.0))), ref=np.allclose,
         name="close"),
    Case("allclose", (SPECIAL, SPECIAL), {"equal_nan": True},
         ref=lambda a, b, equal_nan: np.allclose(a, b, equal_nan=equal_nan), name="equal_nan"),
    Case("isreal", (X,), ref=np.isreal),
    Case("isreal", (np.array([1 + 0j, 2 - 1j, 0j], np.complex64),), ref=np.isreal, name="complex", gpu_dtypes=()),
    # elementwise special functions
    Case("i0", (A((3, 5), -4.0, 4.0),), grad=(0,), ref=np.i0),
    Case("i0", (F((5,), values=(0.0, 9.5, -12.0, 1e-3, 30.0)),), grad=(0,), ref=np.i0, name="large"),
    Case("i0", (I((3, 4), -3, 4),), ref=lambda x: np.i0(x.astype(np.float64)).astype(np.float32), name="int"),
    Case("sinc", (A((3, 5), -3.0, 3.0),), grad=(0,), ref=np.sinc),
    Case("sinc", (WITH_ZERO,), grad=(0,), ref=np.sinc, name="zero"),
    Case("sinc", (I((4,), -2, 3),), ref=lambda x: np.sinc(x.astype(np.float32)), name="int"),
    Case("deg2rad", (A((3, 4), -360, 360),), grad=(0,), ref=np.deg2rad),
    Case("deg2rad", (I((3, 4), -180, 180),), ref=lambda x: np.deg2rad(x).astype(np.float32), name="int"),
    Case("rad2deg", (A((3, 4), -4, 4),), grad=(0,), ref=np.rad2deg),
    Case("rad2deg", (I((3, 4), -3, 3, "int64"),), ref=np.rad2deg, name="int64", keras=False),  # (64-bit kept)
    Case("nan_to_num", (SPECIAL,), ref=np.nan_to_num),  # (no finite differences across the dtype's max)
    Case("nan_to_num", (SPECIAL,), {"nan": 1.5, "posinf": 9.0, "neginf": -9.0}, grad=(0,), name="values",
         ref=lambda x, nan, posinf, neginf: np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)),
    Case("nan_to_num", (I((3, 4)),), ref=np.nan_to_num, name="int"),
    Case("divide_no_nan", (A((5,)), WITH_ZERO), grad=(0,),  # (x2 jumps at 0: test_ops_statistics checks it)
         ref=lambda a, b: np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b))),
    Case("divide_no_nan", (X, A((5,), 0.5, 2.0)), grad=(0, 1), ref=np.divide, name="broadcast"),
    Case("divide_no_nan", (I((3, 4), -3, 3), I((4,), 0, 3)), name="int",
         ref=lambda a, b: np.where(b == 0, 0.0, a / np.where(b == 0, 1, b)).astype(np.float32)),
    # order statistics
    Case("median", (X,), grad=(0,), ref=np.median),
    Case("median", (X3,), {"axis": (0, 2), "keepdims": True}, grad=(0,), name="axes",
         ref=lambda x, axis, keepdims: np.median(x, axis=axis, keepdims=keepdims)),
    Case("median", (A((4, 6)),), {"axis": 1}, grad=(0,), name="even", ref=lambda x, axis: np.median(x, axis=axis)),
    Case("median", (WITH_NAN,), {"axis": 1}, name="nan", ref=lambda x, axis: np.median(x, axis=axis)),
    Case("median", (I((3, 5), -5, 5),), {"axis": 0}, name="int",
         ref=lambda x, axis: np.median(x, axis=axis).astype(np.float32)),
    Case("quantile", (X, 0.3), grad=(0,), ref=np.quantile),
    Case("quantile", (X, [0.1, 0.65, 0.9]), {"axis": 1}, grad=(0,), ref=_quantile_ref(np.quantile), name="list"),
    *[Case("quantile", (X, np.array([0.1, 0.65, 0.9], np.float32)), {"axis": 1, "method": m}, grad=(0,),
           ref=_quantile_ref(np.quantile), name=m) for m in ("lower", "higher", "midpoint", "nearest")],
    Case("quantile", (X3, [0.2, 0.8]), {"axis": (0, 1), "keepdims": True}, grad=(0,), name="keepdims",
         ref=_quantile_ref(np.quantile)),
    Case("quantile", (A((2, 4, 3)), A((), 0.1, 0.9)), {"axis": -2}, grad=(0, 1), name="grad_q",
         ref=_quantile_ref(np.quantile)),
    Case("quantile", (WITH_NAN, 0.5), {"axis": 1}, name="nan", ref=_quantile_ref(np.quantile)),
    Case("quantile", (I((3, 5), -5, 5), [0.25, 0.5]), {"axis": 0}, name="int",
         ref=lambda x, q, axis: np.quantile(x, q, axis=axis).astype(np.float32)),
    Case("percentile", (X, [10.0, 65.0, 90.0]), {"axis": 0}, grad=(0,), ref=_quantile_ref(np.percentile)),
    Case("percentile", (X3, 35.0), {"axis": (1, 2), "method": "higher", "keepdims": True}, grad=(0,),
         name="higher", ref=_quantile_ref(np.percentile)),
    Case("nanquantile", (WITH_NAN, [0.2, 0.7]), {"axis": 1}, grad=(0,), ref=_quantile_ref(np.nanquantile)),
    Case("nanquantile", (WITH_ALL_NAN, 0.4), {"axis": 1, "method": "nearest"}, name="all_nan",
         ref=_quantile_ref(np.nanquantile)),
    Case("nanquantile", (X3, 0.6), {"axis": (0, 2), "method": "lower"}, grad=(0,), name="no_nan",
         ref=_quantile_ref(np.nanquantile)),
    Case("nanpercentile", (WITH_NAN, 40.0), {"axis": 0, "keepdims": True}, grad=(0,),
         ref=_quantile_ref(np.nanpercentile)),
    Case("nanpercentile", (WITH_NAN, [25.0, 80.0]), {"method": "midpoint"}, grad=(0,), name="flat",
         ref=_quantile_ref(np.nanpercentile)),
    Case("nanmedian", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nanmedian(x, axis=axis)),
    Case("nanmedian", (WITH_ALL_NAN,), {"axis": 1}, name="all_nan", ref=lambda x, axis: np.nanmedian(x, axis=axis)),
    Case("nanmedian", (WITH_NAN,), grad=(0,), name="flat", ref=np.nanmedian),
    # NaN-ignoring reductions and scans
    Case("nansum", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nansum(x, axis=axis)),
    Case("nansum", (WITH_NAN,), {"keepdims": True}, grad=(0,), name="keepdims",
         ref=lambda x, keepdims: np.nansum(x, keepdims=keepdims)),
    Case("nansum", (I((3, 4), 0, 5, "int8"),), {"axis": 0}, name="int8",
         ref=lambda x, axis: np.sum(x, axis=axis).astype(np.int32)),
    Case("nanprod", (WITH_NAN,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.nanprod(x, axis=axis)),
    Case("nanprod", (B((3, 4)),), {"axis": 1}, name="bool", ref=lambda x, axis: np.prod(x, axis=axis).astype(np.int32)),
    Case("nanmax", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nanmax(x, axis=axis)),
    Case("nanmax", (WITH_ALL_NAN,), {"axis": 1, "keepdims": True}, name="all_nan",
         ref=lambda x, axis, keepdims: np.nanmax(x, axis=axis, keepdims=keepdims)),
    Case("nanmax", (I((3, 4), -5, 5),), ref=np.max, name="int"),
    Case("nanmin", (WITH_NAN,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.nanmin(x, axis=axis)),
    Case("nanmin", (WITH_ALL_NAN,), {"axis": 1}, name="all_nan", ref=lambda x, axis: np.nanmin(x, axis=axis)),
    Case("nanmean", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nanmean(x, axis=axis)),
    Case("nanmean", (WITH_NAN,), grad=(0,), name="flat", ref=np.nanmean),
    Case("nanmean", (I((3, 4)),), {"axis": 0}, name="int",
         ref=lambda x, axis: np.mean(x, axis=axis).astype(np.float32)),
    Case("nanvar", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nanvar(x, axis=axis)),
    Case("nanvar", (X3,), {"axis": (0, 2), "keepdims": True}, grad=(0,), name="keepdims",
         ref=lambda x, axis, keepdims: np.nanvar(x, axis=axis, keepdims=keepdims)),
    Case("nanvar", (I((3, 4)),), name="int", ref=lambda x: np.var(x).astype(np.float32)),
    Case("nanstd", (WITH_NAN,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.nanstd(x, axis=axis)),
    Case("nanstd", (np.array([[1.0, np.nan], [3.0, 0.5]], np.float16),), {"axis": 1}, name="float16",
         ref=lambda x, axis: np.nanstd(x.astype(np.float32), axis=axis).astype(np.float16), gpu_dtypes=()),
    Case("nanargmax", (WITH_ALL_NAN,), {"axis": 1}, ref=_nanarg(np.argmax, -np.inf)),
    Case("nanargmax", (WITH_NAN,), {"keepdims": True}, ref=_nanarg(np.argmax, -np.inf), name="flat"),
    Case("nanargmax", (I((3, 4), -5, 5),), {"axis": 0}, name="int",
         ref=lambda x, axis: np.argmax(x, axis=axis).astype(np.int32)),
    Case("nanargmin", (WITH_ALL_NAN,), {"axis": 1, "keepdims": True}, ref=_nanarg(np.argmin, np.inf)),
    Case("nanargmin", (WITH_NAN,), {"axis": 0}, ref=_nanarg(np.argmin, np.inf), name="axis0"),
    Case("nancumsum", (WITH_NAN,), {"axis": 1}, grad=(0,), ref=lambda x, axis: np.nancumsum(x, axis=axis)),
    Case("nancumsum", (WITH_NAN,), grad=(0,), name="flat", ref=np.nancumsum),
    Case("nancumsum", (B((3, 4)),), {"axis": 0}, name="bool",
         ref=lambda x, axis: np.cumsum(x, axis=axis).astype(np.int32)),
    Case("nancumsum", (I((3, 4)),), {"axis": 1, "dtype": "float32"}, name="dtype",
         ref=lambda x, axis, dtype: np.cumsum(x, axis=axis).astype(np.float32)),
    Case("nancumprod", (WITH_NAN,), {"axis": 0}, grad=(0,), ref=lambda x, axis: np.nancumprod(x, axis=axis)),
    Case("nancumprod", (I((3, 4), 1, 4),), {"axis": 1}, name="int", ref=lambda x, axis: np.cumprod(x, axis=axis)),
    # other statistics
    Case("average", (X,), grad=(0,), ref=np.average),
    Case("average", (X, 1, A((5,), 0.1, 1.0)), grad=(0, 2), ref=lambda x, a, w: np.average(x, a, w), name="weights"),
    Case("average", (X, 0, A((3, 5), 0.1, 1.0)), grad=(0, 2), ref=lambda x, a, w: np.average(x, a, w),
         name="full_weights"),
    Case("average", (X, None, A((3, 5), 0.1, 1.0)), grad=(0, 2), ref=lambda x, a, w: np.average(x, a, w),
         name="all"),
    Case("average", (I((3, 4)),), {"axis": 1}, name="int", ref=lambda x, axis: np.average(x, axis).astype(np.float32)),
    Case("ptp", (X,), grad=(0,), ref=np.ptp),
    Case("ptp", (X3,), {"axis": (0, 2), "keepdims": True}, grad=(0,), name="axes",
         ref=lambda x, axis, keepdims: np.ptp(x, axis=axis, keepdims=keepdims)),
    Case("ptp", (I((3, 4), -5, 5),), {"axis": 1}, name="int", ref=lambda x, axis: np.ptp(x, axis=axis)),
    Case("corrcoef", (A((3, 6)),), grad=(0,), ref=np.corrcoef),
    Case("corrcoef", (A((7,)),), grad=(0,), ref=np.corrcoef, name="vector"),
    Case("corrcoef", (I((2, 5), 0, 9),), name="int", ref=lambda x: np.corrcoef(x).astype(np.float32)),
    Case("correlate", (A((7,)), A((3,))), grad=(0, 1), ref=np.correlate),
    *[Case("correlate", (A((6,)), A((4,))), {"mode": m}, grad=(0, 1), name=m,
           ref=lambda a, v, mode: np.correlate(a, v, mode)) for m in ("same", "full")],
    Case("correlate", (A((3,)), A((6,))), {"mode": "same"}, grad=(0, 1), name="swapped",
         ref=lambda a, v, mode: np.correlate(a, v, mode)),
    Case("correlate", (A((4,)), A((5,))), {"mode": "full"}, grad=(0, 1), name="swapped_full",
         ref=lambda a, v, mode: np.correlate(a, v, mode)),
    Case("correlate", (I((5,), -3, 3), I((2,), -3, 3)), name="int",
         ref=lambda a, v: np.correlate(a, v).astype(np.float32)),
    Case("diff", (X,), grad=(0,), ref=np.diff),
    Case("diff", (X3,), {"n": 2, "axis": 1}, grad=(0,), name="n2", ref=lambda a, n, axis: np.diff(a, n, axis)),
    Case("diff", (A((3,)),), {"n": 5}, grad=(0,), name="beyond", ref=lambda a, n: np.diff(a, n)),
    Case("diff", (X,), {"n": 0}, grad=(0,), name="n0", ref=lambda a, n: np.diff(a, n)),
    Case("diff", (B((6,)),), name="bool", ref=np.diff),
    Case("diff", (I((3, 4), -9, 9),), {"axis": 0}, name="int", ref=lambda a, axis: np.diff(a, axis=axis)),
    Case("trapezoid", (X,), grad=(0,), ref=_trapz),
    Case("trapezoid", (X3, F((3,), values=(0.0, 0.4, 1.5))), {"axis": 1}, grad=(0, 1), name="x",
         ref=lambda y, x, axis: np.trapezoid(y, x, axis=axis)),
    Case("trapezoid", (X3, A((2, 3, 4))), {"axis": 0}, grad=(0, 1), name="x_full",
         ref=lambda y, x, axis: np.trapezoid(y, x, axis=axis)),
    Case("trapezoid", (X,), {"dx": 0.25, "axis": 0}, grad=(0,), name="dx",
         ref=lambda y, dx, axis: np.trapezoid(y, dx=dx, axis=axis)),
    Case("trapezoid", (X, None, A((4,), 0.1, 1.0)), grad=(0, 2), name="dx_array",
         ref=lambda y, x, dx: np.trapezoid(y, dx=dx)),
    Case("trapezoid", (I((3, 4)),), name="int", ref=lambda y: np.trapezoid(y).astype(np.float32)),
]
