"""NumPy batch normalization: statistics, running averages (Keras momentum), inference, finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import ops
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7

# (x shape, mode, layout, reduction axes)
CASES = [
    ((3, 2, 3, 3), "spatial", "NCHW", (0, 2, 3)),
    ((3, 3, 3, 2), "spatial", "NHWC", (0, 1, 2)),
    ((4, 2, 2, 3), "per_activation", "NCHW", (0,)),
    ((4, 2, 3, 2), "per_activation", "NHWC", (0,)),
    ((5, 3), "spatial", "NCHW", (0,)),
    ((5, 3), "per_activation", "NHWC", (0,)),
]


def _params(rng, x, axes):
    pshape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    gamma = random(rng, pshape, low=0.5, high=1.5)
    beta = random(rng, pshape)
    return gamma, beta, np.zeros(pshape), np.ones(pshape)


def _bshape(x, axes):
    return [1 if i in axes else d for i, d in enumerate(x.shape)]


@pytest.mark.parametrize("shape, mode, layout, axes", CASES)
def test_training_forward_and_running_stats(rng, shape, mode, layout, axes):
    x = random(rng, shape, low=-2, high=3)
    gamma, beta, rm, rv = _params(rng, x, axes)
    rm0, rv0 = rm.copy(), rv.copy()
    y, mean, inv_std = ops.batchnorm_forward_training(x, gamma, beta, rm, rv, momentum=0.9, epsilon=1e-3,
                                                      mode=mode, layout=layout)
    bs = _bshape(x, axes)
    mu = x.mean(axis=axes)
    var = x.var(axis=axes)
    ref = gamma.reshape(bs) * (x - mu.reshape(bs)) / np.sqrt(var.reshape(bs) + 1e-3) + beta.reshape(bs)
    assert rel_error(y, ref) < 1e-13
    assert rel_error(mean, mu) < 1e-14 and rel_error(inv_std, 1 / np.sqrt(var + 1e-3)) < 1e-14
    m = x.size // mu.size
    assert rel_error(rm, 0.9 * rm0 + 0.1 * mu) < 1e-14
    assert rel_error(rv, 0.9 * rv0 + 0.1 * var * m / (m - 1)) < 1e-14  # unbiased, as cuDNN


@pytest.mark.parametrize("shape, mode, layout, axes", CASES)
def test_backward_finite_differences(rng, shape, mode, layout, axes):
    x = random(rng, shape, low=-2, high=3)
    gamma, beta, rm, rv = _params(rng, x, axes)
    kw = dict(epsilon=1e-3, mode=mode, layout=layout)
    y, mean, inv_std = ops.batchnorm_forward_training(x, gamma, beta, rm, rv, **kw)
    g = random(rng, shape)

    def loss():
        return float(np.sum(g * ops.batchnorm_forward_training(x, gamma, beta, rm.copy(), rv.copy(), **kw)[0]))

    dx, dgamma, dbeta = ops.batchnorm_backward(g, x, gamma, mean, inv_std, **kw)
    assert rel_error(dx, numerical_grad(loss, x)) < FD_TOL
    assert rel_error(dgamma, numerical_grad(loss, gamma)) < FD_TOL
    assert rel_error(dbeta, numerical_grad(loss, beta)) < FD_TOL


@pytest.mark.parametrize("shape, mode, layout, axes", CASES[:2])
def test_inference_uses_running_stats(rng, shape, mode, layout, axes):
    x = random(rng, shape)
    gamma, beta, _, _ = _params(rng, x, axes)
    rm = random(rng, gamma.shape)
    rv = random(rng, gamma.shape, low=0.5, high=2.0)
    y = ops.batchnorm_forward_inference(x, gamma, beta, rm, rv, epsilon=1e-3, mode=mode, layout=layout)
    bs = _bshape(x, axes)
    ref = gamma.reshape(bs) * (x - rm.reshape(bs)) / np.sqrt(rv.reshape(bs) + 1e-3) + beta.reshape(bs)
    assert rel_error(y, ref) < 1e-14


def test_low_precision_input_float32_stats(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    y, mean, inv_std = ops.batchnorm_forward_training(x.astype(np.float16), gamma, beta, rm, rv)
    assert y.dtype == np.float16 and mean.dtype == np.float32 and inv_std.dtype == np.float32
    y32, _, _ = ops.batchnorm_forward_training(x, gamma, beta, np.zeros(3, np.float32), np.ones(3, np.float32))
    assert rel_error(y, y32) < 1e-2


def test_validation(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    p = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"batchnorm_forward_training: gamma has shape \(4,\), expected \(3,\)"):
        ops.batchnorm_forward_training(x, np.ones(4, np.float32), p, p.copy(), p.copy())
    with pytest.raises(TypeError, match="beta must be float32 for x of dtype float32, got float64"):
        ops.batchnorm_forward_training(x, p, np.ones(3), p.copy(), p.copy())
    with pytest.raises(ValueError, match="mode must be 'spatial' or 'per_activation'"):
        ops.batchnorm_forward_inference(x, p, p, p, p, mode="instance")
    with pytest.raises(ValueError, match=r"x must be 2-d \(N, C\) or 4-d"):
        ops.batchnorm_forward_inference(x[0], p, p, p, p)
