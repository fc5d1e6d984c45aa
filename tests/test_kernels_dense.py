"""NumPy dense/matmul, dropout: values and finite-difference gradients."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7


@pytest.mark.parametrize("x_shape", [(4, 3), (2, 3, 3)])
def test_dense_forward_and_gradients(rng, x_shape):
    x = random(rng, x_shape)
    w = random(rng, (3, 5))
    b = random(rng, (5,))
    y = kernels.dense_forward(x, w, b)
    assert rel_error(y, x @ w + b) < 1e-15
    g = random(rng, y.shape)

    def loss():
        return float(np.sum(g * kernels.dense_forward(x, w, b)))

    assert rel_error(kernels.dense_backward_input(g, w), numerical_grad(loss, x)) < FD_TOL
    assert rel_error(kernels.dense_backward_weight(x, g), numerical_grad(loss, w)) < FD_TOL
    assert rel_error(kernels.bias_backward(g.reshape(-1, 5)), numerical_grad(loss, b)) < FD_TOL


def test_dense_out_and_low_precision(rng):
    x = random(rng, (4, 3), np.float32)
    w = random(rng, (3, 5), np.float32)
    out = np.full((4, 5), np.nan, np.float32)
    assert kernels.dense_forward(x, w, out=out) is out and rel_error(out, x @ w) < 1e-6
    y = kernels.dense_forward(x.astype(np.float16), w.astype(np.float16))
    assert y.dtype == np.float16 and rel_error(y, x @ w) < 1e-2


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul(rng, ta, tb):
    a = random(rng, (3, 4) if not ta else (4, 3))
    b = random(rng, (4, 2) if not tb else (2, 4))
    c = random(rng, (3, 2))
    expected = 2.0 * ((a.T if ta else a) @ (b.T if tb else b)) + 0.5 * c
    r = kernels.matmul(a, b, transpose_a=ta, transpose_b=tb, alpha=2.0, beta=0.5, out=c)
    assert r is c and rel_error(c, expected) < 1e-15


def test_dense_validation(rng):
    x = random(rng, (4, 3), np.float32)
    with pytest.raises(ValueError, match=r"dense_forward: x has 3 features \(shape \(4, 3\)\) but w expects 4"):
        kernels.dense_forward(x, np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ"):
        kernels.matmul(x, x)
    with pytest.raises(ValueError, match="matmul: beta=1.0 needs out="):
        kernels.matmul(x, x.T, beta=1.0)


def test_dropout_statistics_and_scaling():
    state = kernels.DropoutState(0.25, seed=3)
    x = np.ones((200, 100), np.float32)
    y, reserve = kernels.dropout_forward(x, state)
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    assert np.allclose(y[kept], 1 / 0.75)
    dx = kernels.dropout_backward(np.full_like(x, 2.0), reserve, state)
    assert np.array_equal(dx != 0, kept) and np.allclose(dx[kept], 2 / 0.75)
    y2, _ = kernels.dropout_forward(x, state)
    assert not np.array_equal(y, y2)  # a fresh mask each call
    y3, _ = kernels.dropout_forward(x, kernels.DropoutState(0.25, seed=3))
    assert np.array_equal(y, y3)  # same seed, same mask


def test_dropout_backward_fixed_mask_finite_differences(rng):
    state = kernels.DropoutState(0.5, seed=0)
    x = random(rng, (3, 4))
    _, reserve = kernels.dropout_forward(x, state)
    g = random(rng, x.shape)
    # the forward with the mask held fixed is x * reserve
    num = numerical_grad(lambda: float(np.sum(g * x * reserve)), x)
    assert rel_error(kernels.dropout_backward(g, reserve, state), num) < FD_TOL


def test_dropout_rate_zero_is_identity(rng):
    x = random(rng, (3, 4), np.float32)
    state = kernels.DropoutState(0.0, seed=1)
    y, reserve = kernels.dropout_forward(x, state)
    assert np.array_equal(y, x) and reserve is None
    assert np.array_equal(kernels.dropout_backward(x, reserve, state), x)


def test_dropout_validation():
    with pytest.raises(ValueError, match=r"DropoutState: rate must be in \[0, 1\)"):
        kernels.DropoutState(1.0)
    with pytest.raises(TypeError, match="dropout_forward: state must be a dnnbind.kernels.DropoutState"):
        kernels.dropout_forward(np.ones(3, np.float32), 0.5)
