"""What the registry harness cannot see of ``dnnbind/ops/_statistics.py`` and ``dnnbind/kernels/special.py``:
error messages, special values, rules where NumPy and JAX differ, second derivatives, the CUDA source."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.cuda.kernel import compile_kernel
from dnnbind.kernels import special as S
from dnnbind.kernels._cuda import _common as cm
from dnnbind.kernels._cuda.special import KERNELS

pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def _grad(fn, x):
    t = ops.convert_to_tensor(np.asarray(x, np.float64))
    with GradientTape() as tape:
        tape.watch(t)
        y = ops.sum(fn(t))
    return np.asarray(tape.gradient(y, t))


def _second(fn, x):
    """d/dx of sum(d/dx sum(fn(x))): the diagonal second derivative of an elementwise ``fn``."""
    t = ops.convert_to_tensor(np.asarray(x, np.float64))
    with GradientTape() as outer:
        outer.watch(t)
        with GradientTape() as inner:
            inner.watch(t)
            y = ops.sum(fn(t))
        g = ops.sum(inner.gradient(y, t))
    return np.asarray(outer.gradient(g, t))


# ------------------------------------------------------------------------------ special functions
def test_bessel_i1_matches_scipy_over_both_expansions():
    special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.linspace(-40, 40, 161), [0.0, 1e-8, -1e-8, 7.999, 8.0, 8.001, 700.0]])
    got = S.special("bessel_i1", x)
    np.testing.assert_allclose(got, special.i1(x), rtol=2e-15, atol=0)
    assert got.dtype == np.float64
    for dt, rtol in (("float32", 2e-6), ("float16", 1e-3), ("bfloat16", 1e-2)):
        low = S.special("bessel_i1", x[np.abs(x) < 10].astype(dt))
        assert str(low.dtype) == dt
        np.testing.assert_allclose(low.astype(np.float64), special.i1(x[np.abs(x) < 10].astype(dt).astype(np.float64)),
                                   rtol=rtol, atol=1e-30)


def test_the_cuda_source_holds_the_same_chebyshev_coefficients():
    text = cm.source("special.cu")
    for name, want in (("I1_SMALL", S.I1_CHEBYSHEV_SMALL), ("I1_LARGE", S.I1_CHEBYSHEV_LARGE)):
        body = re.search(name + r"\[(\d+)\] = \{([^}]*)\}", text)
        assert int(body.group(1)) == len(want)
        assert tuple(float(v) for v in body.group(2).replace("\n", " ").split(",")) == want


def test_special_kernel_refuses_unknown_names_and_ints():
    with pytest.raises(ValueError, match="unknown op 'i2'; known: bessel_i1, sinc"):
        S.special("i2", np.ones(3))
    with pytest.raises(TypeError, match="bessel_i1: x must be a float dtype"):
        S.special("bessel_i1", np.ones(3, np.int32))
    with pytest.raises(ValueError, match="out has shape"):
        S.special("sinc", np.ones(3), out=np.ones(2))


def test_special_cuda_source_compiles_for_sm90_and_exports_every_kernel():
    cubin = compile_kernel(cm.source("special.cu"), arch="sm_90", options=cm.KERNEL_OPTIONS)
    names = [f"{k}_{t}" for k in KERNELS for t in ("f32", "f64", "f16", "bf16")]
    assert set(KERNELS) == set(S.SPECIAL)
    assert [n for n in names if n.encode() + b"\x00" not in cubin] == []


def test_i0_derivatives_are_i1_and_its_slope():
    special = pytest.importorskip("scipy.special")
    x = np.array([0.0, 1.3, -0.7, 9.0])
    np.testing.assert_allclose(_grad(ops.i0, x), special.i1(x), rtol=1e-14, atol=1e-300)
    slope = np.where(x == 0, 0.5, special.i0(x) - special.i1(x) / np.where(x == 0, 1, x))
    np.testing.assert_allclose(_second(ops.i0, x), slope, rtol=1e-13)


def test_sinc_derivatives_at_and_near_zero():
    x = np.array([0.0, 1e-3, 0.5, -1.5])
    px = np.pi * x
    first = np.where(x == 0, 0.0, (np.cos(px) - np.sinc(x)) / np.where(x == 0, 1, x))
    np.testing.assert_allclose(_grad(ops.sinc, x), first, rtol=1e-9, atol=1e-12)
    # d2/dx2 sinc(0) = -pi^2/3 (JAX's Maclaurin rule); elsewhere the exact second derivative
    second = _second(ops.sinc, x)
    assert second[0] == pytest.approx(-np.pi ** 2 / 3, rel=1e-12)
    num = (_grad(ops.sinc, x[1:] + 1e-6) - _grad(ops.sinc, x[1:] - 1e-6)) / 2e-6
    np.testing.assert_allclose(second[1:], num, rtol=1e-6, atol=1e-6)


def test_dtypes_of_the_special_functions():
    assert ops.i0(np.arange(3, dtype=np.int64)).dtype == np.float64  # Keras: int64 -> float64
    assert ops.i0(np.arange(3, dtype=np.int32)).dtype == np.float32
    assert ops.deg2rad(np.ones(2, np.float16)).dtype == np.float16
    assert ops.sinc(np.arange(3, dtype=np.int64)).dtype == np.float32  # Keras: int64 -> floatx
    assert ops.corrcoef(np.ones((2, 3), np.int64)).dtype == np.float64
    assert ops.correlate(np.ones(3, np.int64), np.ones(2, np.int64)).dtype == np.float64
    assert ops.correlate(np.ones(3, np.uint8), np.ones(2, np.int8)).dtype == np.float32


def test_nan_to_num_gradient_and_bounds():
    x = np.array([np.nan, np.inf, -np.inf, 2.0, -3.0])
    np.testing.assert_array_equal(_grad(ops.nan_to_num, x), [0, 0, 0, 1, 1])
    for dt in (np.float16, np.float32, np.float64):
        got = np.asarray(ops.nan_to_num(x.astype(dt)))
        np.testing.assert_array_equal(got, np.nan_to_num(x.astype(dt)))
    got = np.asarray(ops.nan_to_num(x, nan=7.0, posinf=1e300))
    np.testing.assert_array_equal(got, [7.0, 1e300, np.finfo(np.float64).min, 2.0, -3.0])


def test_divide_no_nan_is_zero_with_a_zero_gradient_where_the_divisor_is_zero():
    a = ops.convert_to_tensor(np.array([1.0, -2.0, 3.0]))
    b = ops.convert_to_tensor(np.array([0.0, 4.0, 0.0]))
    with GradientTape() as tape:
        tape.watch(a)
        tape.watch(b)
        y = ops.sum(ops.divide_no_nan(a, b))
    ga, gb = tape.gradient(y, [a, b])
    np.testing.assert_array_equal(np.asarray(ops.divide_no_nan(a, b)), [0.0, -0.5, 0.0])
    np.testing.assert_array_equal(np.asarray(ga), [0.0, 0.25, 0.0])
    np.testing.assert_array_equal(np.asarray(gb), [0.0, 2.0 / 16.0, 0.0])
    assert ops.divide_no_nan(1, 0).dtype == np.float32 and float(ops.divide_no_nan(1, 0)) == 0.0


def test_isclose_special_values_and_allclose_is_a_0d_tensor():
    a = np.array([np.inf, np.inf, 1.0, np.nan, 1.0])
    b = np.array([np.inf, -np.inf, np.inf, np.nan, 1.0 + 1e-9])
    np.testing.assert_array_equal(np.asarray(ops.isclose(a, b)), [True, False, False, False, True])
    np.testing.assert_array_equal(np.asarray(ops.isclose(a, b, equal_nan=True)), [True, False, False, True, True])
    np.testing.assert_array_equal(np.asarray(ops.isclose(np.array([1.0]), np.array([np.inf]), rtol=0.0)), [False])
    res = ops.allclose(a, a, equal_nan=True)
    assert isinstance(res, ops.Tensor) and res.shape == () and res.dtype == np.bool_ and bool(res)
    assert not bool(ops.allclose(a, b))


# -------------------------------------------------------------------------------- order statistics
def test_quantile_nearest_breaks_ties_downwards_as_jax():
    # positions 0.5 and 1.5: JAX takes the lower neighbour, NumPy the even index
    got = np.asarray(ops.quantile(np.arange(5.0), [0.125, 0.375], method="nearest"))
    np.testing.assert_array_equal(got, [0.0, 1.0])


def test_quantile_nan_rules_and_dtypes():
    x = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(np.isnan(np.asarray(ops.quantile(x, 0.5, axis=1))), [True, True, False])
    nq = np.asarray(ops.nanquantile(x, [0.0, 1.0], axis=1))
    np.testing.assert_array_equal(nq[:, 0], [1.0, 3.0])
    assert np.isnan(nq[:, 1]).all()
    np.testing.assert_array_equal(nq[:, 2], [4.0, 6.0])
    assert ops.quantile(x, 0.5).dtype == np.float64  # float64 stays float64 (DESIGN: 64-bit kept)
    assert ops.median(np.arange(6, dtype=np.int64)).dtype == np.float32
    assert ops.percentile(np.ones(3, np.float16), 50).dtype == np.float16
    q = ops.quantile(np.arange(5.0), ops.convert_to_tensor(np.array([0.0, 1.0])))  # a tensor q is not read
    np.testing.assert_array_equal(np.asarray(q), [0.0, 4.0])


def test_quantile_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"quantile: Quantiles must be in the range \[0, 1\]"):
        ops.quantile(np.ones(3), 1.5)
    with pytest.raises(ValueError, match=r"percentile: Percentiles must be in the range \[0, 100\]"):
        ops.percentile(np.ones(3), [50, -1])
    with pytest.raises(ValueError, match=r"nanquantile: q must be a number or a 1-d sequence, got shape \(1, 1\)"):
        ops.nanquantile(np.ones(3), [[0.5]])
    with pytest.raises(ValueError, match="quantile: method must be one of"):
        ops.quantile(np.ones(3), 0.5, method="inverted_cdf")
    with pytest.raises(ValueError, match="median: axis 2 is out of bounds for a tensor of rank 2"):
        ops.median(np.ones((2, 2)), axis=2)
    with pytest.raises(ValueError, match="quantile: cannot take a quantile over an empty axis"):
        ops.quantile(np.ones((2, 0)), 0.5, axis=1)


def test_median_gradient_splits_between_the_middle_pair_and_follows_the_stable_sort():
    np.testing.assert_array_equal(_grad(lambda t: ops.median(t), [3.0, 1.0, 4.0, 2.0]), [0.5, 0, 0, 0.5])
    np.testing.assert_array_equal(_grad(lambda t: ops.median(t), [3.0, 1.0, 2.0]), [0, 0, 1])
    # tied values: the stable sort's order picks the element (as JAX's sort)
    np.testing.assert_array_equal(_grad(lambda t: ops.median(t), [2.0, 2.0, 1.0]), [1, 0, 0])


# ------------------------------------------------------------------------- other statistics: errors
def test_statistics_refuse_bad_arguments_by_name():
    with pytest.raises(ValueError, match=r"average: `weights` must have the same shape as `x` when `axis=None`"):
        ops.average(np.ones((2, 3)), weights=np.ones(3))
    with pytest.raises(ValueError, match=r"average: `weights` must have the same size as `x` at `axis=1`"):
        ops.average(np.ones((2, 3)), axis=1, weights=np.ones(2))
    with pytest.raises(ValueError, match="diff: order must be non-negative but got -1"):
        ops.diff(np.ones(3), n=-1)
    with pytest.raises(ValueError, match="diff: diff requires input that is at least one dimensional"):
        ops.diff(np.float64(1.0))
    with pytest.raises(ValueError, match="correlate: `mode` must be either `valid`, `same`, or `full`"):
        ops.correlate(np.ones(3), np.ones(2), mode="circular")
    with pytest.raises(ValueError, match=r"correlate: `x1` must be a 1-dimensional tensor, but received shape \(2, "):
        ops.correlate(np.ones((2, 2)), np.ones(2))
    with pytest.raises(ValueError, match="correlate: `x2` must not be empty"):
        ops.correlate(np.ones(3), np.ones(0))
    with pytest.raises(TypeError, match="ptp: x must be numeric, got dtype bool"):
        ops.ptp(np.array([True, False]))
    with pytest.raises(ValueError, match=r"corrcoef: x must be 1-d or 2-d"):
        ops.corrcoef(np.ones((2, 2, 2)))
    with pytest.raises(TypeError, match=r"nanargmax: axis must be an int, got \(0, 1\)"):
        ops.nanargmax(np.ones((2, 2)), axis=(0, 1))
    with pytest.raises(ValueError, match="trapezoid: x has 2 sample points but y has 3"):
        ops.trapezoid(np.ones(3), x=np.ones(2))


def test_average_with_zero_weights_is_nan_not_an_error():
    got = np.asarray(ops.average(np.ones((2, 2)), axis=1, weights=np.zeros(2)))
    assert np.isnan(got).all()
