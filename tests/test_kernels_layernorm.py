"""kernels.layernorm_* on NumPy: forward vs a direct reference, backward vs finite differences (float64),
low-precision inputs, out= buffers and argument checks (before any computation)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dnnbind import kernels
from testutil import numerical_grad, random, rel_error


def reference(x, gamma, beta, eps, k):
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y, mean.reshape(x.shape[:x.ndim - k]), (1 / np.sqrt(var + eps)).reshape(x.shape[:x.ndim - k])


@pytest.mark.parametrize("shape, k", [((5, 7), 1), ((3, 4, 6), 1), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_forward_matches_reference(rng, shape, k, affine):
    x = random(rng, shape, low=-2, high=3)
    gamma = random(rng, shape[len(shape) - k:], low=0.5, high=1.5) if affine else None
    beta = random(rng, shape[len(shape) - k:]) if affine else None
    y, mean, inv = kernels.layernorm_forward(x, gamma, beta, epsilon=1e-3, norm_ndim=k)
    y_ref, mean_ref, inv_ref = reference(x, gamma, beta, 1e-3, k)
    assert y.dtype == np.float64 and mean.shape == shape[:len(shape) - k] == inv.shape
    assert rel_error(y, y_ref) < 1e-12 and rel_error(mean, mean_ref) < 1e-12 and rel_error(inv, inv_ref) < 1e-12


@pytest.mark.parametrize("shape, k", [((4, 6), 1), ((2, 3, 2, 3), 2)])
@pytest.mark.parametrize("with_gamma", [True, False])
def test_backward_matches_finite_differences(rng, shape, k, with_gamma):
    x = random(rng, shape, low=-2, high=2)
    pshape = shape[len(shape) - k:]
    gamma = random(rng, pshape, low=0.5, high=1.5) if with_gamma else None
    beta = random(rng, pshape)
    r = random(rng, shape)

    def f():
        return float((kernels.layernorm_forward(x, gamma, beta, epsilon=1e-3, norm_ndim=k)[0] * r).sum())

    _, mean, inv = kernels.layernorm_forward(x, gamma, beta, epsilon=1e-3, norm_ndim=k)
    dx, dgamma, dbeta = kernels.layernorm_backward(r, x, gamma, mean, inv, norm_ndim=k)
    assert rel_error(dx, numerical_grad(f, x)) < 1e-7
    assert rel_error(dbeta, numerical_grad(f, beta)) < 1e-7
    if with_gamma:
        assert rel_error(dgamma, numerical_grad(f, gamma)) < 1e-7
    else:  # dgamma is still the gradient w.r.t. an implicit gamma of ones
        ones = np.ones(pshape)
        g = numerical_grad(lambda: float((kernels.layernorm_forward(x, ones, beta, norm_ndim=k)[0] * r).sum()), ones)
        assert rel_error(dgamma, g) < 1e-7
    dx2, dg2, db2 = kernels.layernorm_backward(r, x, gamma, mean, inv, norm_ndim=k, param_grads=False)
    assert dg2 is None and db2 is None and np.array_equal(dx2, dx)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_low_precision_computes_in_float32(rng, dtype):
    x = random(rng, (6, 40), low=-3, high=3).astype(dtype)
    gamma = random(rng, (40,), low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, (40,)).astype(np.float32)
    y, mean, inv = kernels.layernorm_forward(x, gamma, beta)
    assert y.dtype == np.dtype(dtype) and mean.dtype == np.float32 and inv.dtype == np.float32
    y_ref, _, _ = reference(x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64), 1e-3, 1)
    assert rel_error(y.astype(np.float64), y_ref) < (1e-6 if dtype == np.float32 else 1e-2)
    dx, dgamma, dbeta = kernels.layernorm_backward(x, x, gamma, mean, inv)
    assert dx.dtype == np.dtype(dtype) and dgamma.dtype == np.float32 and dbeta.dtype == np.float32


def test_out_buffers_are_written(rng):
    x = random(rng, (3, 5))
    gamma, beta = random(rng, (5,)), random(rng, (5,))
    out = np.full_like(x, np.nan)
    y, mean, inv = kernels.layernorm_forward(x, gamma, beta, out=out)
    assert y is out and rel_error(out, reference(x, gamma, beta, 1e-3, 1)[0]) < 1e-12
    dx_out, dg_out, db_out = np.full_like(x, np.nan), np.full(5, np.nan), np.full(5, np.nan)
    dx, dg, db = kernels.layernorm_backward(x, x, gamma, mean, inv, out=dx_out, dgamma_out=dg_out, dbeta_out=db_out)
    assert dx is dx_out and dg is dg_out and db is db_out
    assert np.all(np.isfinite(dx_out)) and rel_error(db_out, x.sum(axis=0)) < 1e-12


def test_bad_arguments_raise_before_computing(rng):
    x = random(rng, (3, 4))
    with pytest.raises(ValueError, match="layernorm_forward: gamma has shape \\(3,\\), expected \\(4,\\)"):
        kernels.layernorm_forward(x, np.ones(3))
    with pytest.raises(TypeError, match="gamma must be float64 for x of dtype float64, got float32"):
        kernels.layernorm_forward(x, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="norm_ndim must be in .* = \\[1, 1\\]"):
        kernels.layernorm_forward(x, norm_ndim=2)
    with pytest.raises(TypeError, match="norm_ndim must be an int"):
        kernels.layernorm_forward(x, norm_ndim=1.0)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        kernels.layernorm_forward(x, epsilon=0.0)
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64"):
        kernels.layernorm_forward(np.ones((3, 4), np.int32))
    _, mean, inv = kernels.layernorm_forward(x)
    with pytest.raises(ValueError, match="dy has shape \\(3, 5\\)"):
        kernels.layernorm_backward(np.ones((3, 5)), x, None, mean, inv)
    with pytest.raises(ValueError, match="mean has shape \\(4,\\), expected \\(3,\\)"):
        kernels.layernorm_backward(x, x, None, np.ones(4), inv)
    with pytest.raises(ValueError, match="dgamma_out/dbeta_out were given but param_grads is False"):
        kernels.layernorm_backward(x, x, None, mean, inv, param_grads=False, dgamma_out=np.ones(4))
    with pytest.raises(ValueError, match="out has shape"):
        kernels.layernorm_forward(x, out=np.ones((3, 5)))
