"""NumPy batch normalization: statistics, running averages (Keras momentum), inference, finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
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
    y, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, momentum=0.9, epsilon=1e-3, mode=mode,
                                              layout=layout)
    mean, inv_std = saved.mean, saved.inv_std
    assert saved.path == "numpy" and saved.reserve is None and saved.x_shape == shape and saved.x_dtype == x.dtype
    bs = _bshape(x, axes)
    mu = x.mean(axis=axes)
    var = x.var(axis=axes)
    ref = gamma.reshape(bs) * (x - mu.reshape(bs)) / np.sqrt(var.reshape(bs) + 1e-3) + beta.reshape(bs)
    assert rel_error(y, ref) < 1e-13
    assert rel_error(mean, mu) < 1e-14 and rel_error(inv_std, 1 / np.sqrt(var + 1e-3)) < 1e-14
    assert rel_error(rm, 0.9 * rm0 + 0.1 * mu) < 1e-14
    assert rel_error(rv, 0.9 * rv0 + 0.1 * var) < 1e-14  # the biased variance, as Keras 3


@pytest.mark.parametrize("shape, mode, layout, axes", CASES)
def test_backward_finite_differences(rng, shape, mode, layout, axes):
    x = random(rng, shape, low=-2, high=3)
    gamma, beta, rm, rv = _params(rng, x, axes)
    kw = dict(epsilon=1e-3, mode=mode, layout=layout)
    y, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, **kw)
    g = random(rng, shape)

    def loss():
        return float(np.sum(g * kernels.batchnorm_forward_training(x, gamma, beta, rm.copy(), rv.copy(), **kw)[0]))

    dx, dgamma, dbeta = kernels.batchnorm_backward(g, x, gamma, saved, **kw)
    assert rel_error(dx, numerical_grad(loss, x)) < FD_TOL
    assert rel_error(dgamma, numerical_grad(loss, gamma)) < FD_TOL
    assert rel_error(dbeta, numerical_grad(loss, beta)) < FD_TOL


@pytest.mark.parametrize("shape, mode, layout, axes", CASES[:2])
def test_inference_uses_running_stats(rng, shape, mode, layout, axes):
    x = random(rng, shape)
    gamma, beta, _, _ = _params(rng, x, axes)
    rm = random(rng, gamma.shape)
    rv = random(rng, gamma.shape, low=0.5, high=2.0)
    y = kernels.batchnorm_forward_inference(x, gamma, beta, rm, rv, epsilon=1e-3, mode=mode, layout=layout)
    bs = _bshape(x, axes)
    ref = gamma.reshape(bs) * (x - rm.reshape(bs)) / np.sqrt(rv.reshape(bs) + 1e-3) + beta.reshape(bs)
    assert rel_error(y, ref) < 1e-14


def test_low_precision_input_float32_stats(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    y, saved = kernels.batchnorm_forward_training(x.astype(np.float16), gamma, beta, rm, rv)
    assert y.dtype == np.float16 and saved.mean.dtype == np.float32 and saved.inv_std.dtype == np.float32
    y32, _ = kernels.batchnorm_forward_training(x, gamma, beta, np.zeros(3, np.float32), np.ones(3, np.float32))
    assert rel_error(y, y32) < 1e-2


def test_validation(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    p = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"batchnorm_forward_training: gamma has shape \(4,\), expected \(3,\)"):
        kernels.batchnorm_forward_training(x, np.ones(4, np.float32), p, p.copy(), p.copy())
    with pytest.raises(TypeError, match="beta must be float32 for x of dtype float32, got float64"):
        kernels.batchnorm_forward_training(x, p, np.ones(3), p.copy(), p.copy())
    with pytest.raises(ValueError, match="mode must be 'spatial' or 'per_activation'"):
        kernels.batchnorm_forward_inference(x, p, p, p, p, mode="instance")
    with pytest.raises(ValueError, match=r"x must be 2-d \(N, C\) or 4-d"):
        kernels.batchnorm_forward_inference(x[0], p, p, p, p)


def test_backward_from_a_hand_built_record_matches_the_forwards(rng):
    """BatchNormSaved(mean, inv_std) (no path, no x shape) is a complete input to the backward."""
    x = random(rng, (6, 3, 2, 4), low=-2, high=3)
    gamma, beta, rm, rv = _params(rng, x, (0, 1, 2))
    _, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, layout="NHWC")
    dy = random(rng, x.shape)
    ref = kernels.batchnorm_backward(dy, x, gamma, saved, layout="NHWC")
    by_hand = kernels.BatchNormSaved(saved.mean.copy(), saved.inv_std.copy())
    assert by_hand.path is None and by_hand.reserve is None and by_hand.x_shape is None
    for got, want in zip(kernels.batchnorm_backward(dy, x, gamma, by_hand, layout="NHWC"), ref):
        assert rel_error(got, want) < 1e-15 and np.any(want != 0)


def test_saved_record_is_immutable_and_its_repr_names_the_path(rng):
    x = random(rng, (4, 3), np.float32)
    p = np.ones(3, np.float32)
    _, saved = kernels.batchnorm_forward_training(x, p, p - 1, p - 1, p.copy())
    with pytest.raises(AttributeError):
        saved.mean = p
    assert repr(saved) == "BatchNormSaved(path='numpy', x_shape=(4, 3), mean=(3,) float32, reserve=None)"


def test_backward_validation(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    p = np.ones(3, np.float32)
    _, saved = kernels.batchnorm_forward_training(x, p, p - 1, p - 1, p.copy())
    dy = random(rng, x.shape, np.float32)
    # an array where the record goes (the 0.x save_mean) is refused with what to pass instead
    with pytest.raises(TypeError, match=r"batchnorm_backward: saved must be the BatchNormSaved returned by "
                                        r"batchnorm_forward_training, got ndarray \(.*BatchNormSaved\(mean, inv_std\)"):
        kernels.batchnorm_backward(dy, x, p, saved.mean)
    with pytest.raises(ValueError, match=r"batchnorm_backward: saved comes from a forward on x of shape "
                                         r"\(4, 3, 2, 2\), got x of shape \(2, 3, 2, 2\)"):
        kernels.batchnorm_backward(dy[:2], x[:2], p, saved)
    bad = kernels.BatchNormSaved(np.zeros(4, np.float32), saved.inv_std)
    with pytest.raises(ValueError, match=r"batchnorm_backward: saved.mean has shape \(4,\), expected \(3,\)"):
        kernels.batchnorm_backward(dy, x, p, bad)
    bad = kernels.BatchNormSaved(saved.mean, saved.inv_std.astype(np.float16))
    with pytest.raises(TypeError, match="saved.inv_std must be float32 for x of dtype float32, got float16"):
        kernels.batchnorm_backward(dy, x, p, bad)


# ------------------------------------------------------------------- fused relu (issue 9)

def relu_safe_beta(x, gamma, axes, **kw):
    """beta that puts every pre-activation gamma * xhat + beta at least ``margin`` from 0 (the middle
    of each parameter's widest gap between sorted values), so relu's kink is never crossed by a
    finite-difference step or a rounding error; returns (beta, margin)."""
    pshape = gamma.shape
    scaled, _ = kernels.batchnorm_forward_training(x, gamma, np.zeros(pshape, gamma.dtype), np.zeros(pshape, gamma.dtype),
                                               np.ones(pshape, gamma.dtype), **kw)
    v = np.sort(np.moveaxis(np.asarray(scaled, np.float64), axes, tuple(range(len(axes)))).reshape(-1, *pshape),
                axis=0)
    gaps = np.diff(v, axis=0)
    k = np.argmax(gaps, axis=0)[None]
    mid = (np.take_along_axis(v, k, 0) + np.take_along_axis(v, k + 1, 0))[0] / 2
    return (-mid).astype(gamma.dtype), float(np.min(np.take_along_axis(gaps, k, 0)) / 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("shape, mode, layout, axes", CASES)
def test_fused_relu_equals_batchnorm_then_relu_exactly(rng, dtype, shape, mode, layout, axes):
    x = random(rng, shape, low=-2, high=3).astype(dtype)
    gamma, beta, rm, rv = (p.astype(np.float64 if dtype == np.float64 else np.float32)
                           for p in _params(rng, x, axes))
    kw = dict(momentum=0.9, epsilon=1e-3, mode=mode, layout=layout)
    rm2, rv2 = rm.copy(), rv.copy()
    y, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, activation="relu", **kw)
    pre, saved_plain = kernels.batchnorm_forward_training(x, gamma, beta, rm2, rv2, **kw)
    unfused = kernels.activation_forward(pre, "relu")
    assert y.dtype == x.dtype and np.array_equal(y, unfused)
    assert np.any(y == 0) and np.any(y > 0)  # both sides of the kink are exercised
    assert np.array_equal(rm, rm2) and np.array_equal(rv, rv2)
    assert saved.activation == "relu" and saved_plain.activation is None and saved.path == "numpy"
    dy = random(rng, shape).astype(dtype)
    bkw = dict(epsilon=1e-3, mode=mode, layout=layout)
    fused = kernels.batchnorm_backward(dy, x, gamma, saved, activation="relu", y=y, **bkw)
    plain = kernels.batchnorm_backward(kernels.activation_backward(dy, pre, unfused, "relu"), x, gamma, saved_plain, **bkw)
    for name, got, want in zip(("dx", "dgamma", "dbeta"), fused, plain):
        assert got.dtype == want.dtype and np.array_equal(got, want), name


@pytest.mark.parametrize("shape, mode, layout, axes", CASES)
def test_fused_relu_backward_finite_differences(rng, shape, mode, layout, axes):
    x = random(rng, shape, low=-2, high=3)
    gamma, _, rm, rv = _params(rng, x, axes)
    kw = dict(epsilon=1e-3, mode=mode, layout=layout)
    beta, margin = relu_safe_beta(x, gamma, axes, **kw)
    assert margin > 1e-3  # a step of 1e-6 in x, gamma or beta moves a pre-activation far less
    y, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, activation="relu", **kw)
    assert np.any(y == 0) and np.any(y > 0)
    g = random(rng, shape)

    def loss():
        return float(np.sum(g * kernels.batchnorm_forward_training(x, gamma, beta, rm.copy(), rv.copy(),
                                                               activation="relu", **kw)[0]))

    dx, dgamma, dbeta = kernels.batchnorm_backward(g, x, gamma, saved, activation="relu", y=y, **kw)
    assert rel_error(dx, numerical_grad(loss, x)) < FD_TOL
    assert rel_error(dgamma, numerical_grad(loss, gamma)) < FD_TOL
    assert rel_error(dbeta, numerical_grad(loss, beta)) < FD_TOL


def test_fused_relu_validation_and_record(rng):
    x = random(rng, (4, 3, 2, 2), np.float32)
    p = np.ones(3, np.float32)
    dy = random(rng, x.shape, np.float32)
    with pytest.raises(ValueError, match="batchnorm_forward_training: activation must be None or 'relu', got 'gelu'"):
        kernels.batchnorm_forward_training(x, p, p - 1, p - 1, p.copy(), activation="gelu")
    y, saved = kernels.batchnorm_forward_training(x, p, p - 1, p - 1, p.copy(), activation="relu")
    assert repr(saved) == ("BatchNormSaved(path='numpy', x_shape=(4, 3, 2, 2), mean=(3,) float32, reserve=None, "
                           "activation='relu')")
    with pytest.raises(ValueError, match="batchnorm_backward: activation='relu' needs y, the forward's activated"):
        kernels.batchnorm_backward(dy, x, p, saved, activation="relu")
    with pytest.raises(ValueError, match=r"batchnorm_backward: y has shape \(4, 3, 2, 2\) and dtype float16, "
                                         r"expected x's \(4, 3, 2, 2\), float32"):
        kernels.batchnorm_backward(dy, x, p, saved, activation="relu", y=y.astype(np.float16))
    with pytest.raises(ValueError, match="batchnorm_backward: saved comes from a forward with activation='relu', "
                                         "got activation=None"):
        kernels.batchnorm_backward(dy, x, p, saved)
    _, plain = kernels.batchnorm_forward_training(x, p, p - 1, p - 1, p.copy())
    with pytest.raises(ValueError, match="saved comes from a forward with activation=None, got activation='relu'"):
        kernels.batchnorm_backward(dy, x, p, plain, activation="relu", y=y)
    with pytest.raises(ValueError, match="batchnorm_backward: y is only read with activation='relu'"):
        kernels.batchnorm_backward(dy, x, p, plain, y=y)
    # a record built by hand carries no activation: the backward takes the caller's word
    by_hand = kernels.BatchNormSaved(saved.mean, saved.inv_std)
    for got, want in zip(kernels.batchnorm_backward(dy, x, p, by_hand, activation="relu", y=y),
                         kernels.batchnorm_backward(dy, x, p, saved, activation="relu", y=y)):
        assert np.array_equal(got, want)
