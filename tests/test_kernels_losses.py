"""NumPy softmax and losses: values against direct formulas, gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7


@pytest.mark.parametrize("log", [False, True])
def test_softmax_forward_backward(rng, log):
    x = random(rng, (3, 5), low=-4, high=4)
    y = kernels.softmax_forward(x, log=log)
    ref = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    assert rel_error(y, np.log(ref) if log else ref) < 1e-14
    g = random(rng, x.shape)
    dx = kernels.softmax_backward(g, y, log=log)
    num = numerical_grad(lambda: float(np.sum(g * kernels.softmax_forward(x, log=log))), x)
    assert rel_error(dx, num) < FD_TOL


def test_softmax_is_stable():
    y = kernels.softmax_forward(np.array([[1000.0, 0.0, -1000.0]], np.float32))
    assert np.all(np.isfinite(y)) and y[0, 0] == 1.0


def _targets(labels, n, c, ls):
    y = np.eye(c)[labels] if labels.dtype.kind == "i" else labels.copy()
    return y * (1 - ls) + ls / c


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_softmax_cross_entropy(rng, sparse, ls):
    n, c = 4, 5
    x = random(rng, (n, c), low=-3, high=3)
    labels = rng.integers(0, c, n)
    if not sparse:
        labels = rng.dirichlet(np.ones(c), n)  # soft labels
    loss, dx = kernels.softmax_cross_entropy(x, labels, label_smoothing=ls, grad_scale=2.0)
    y = _targets(labels, n, c, ls)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    assert loss.shape == () and abs(float(loss) + np.sum(y * logp) / n) < 1e-14
    num = numerical_grad(lambda: float(kernels.softmax_cross_entropy(x, labels, label_smoothing=ls)[0]), x)
    assert rel_error(dx, 2.0 * num) < FD_TOL


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_softmax_cross_entropy_unnormalised_dense_labels_match_finite_differences(rng, ls):
    # rows summing to 3.7, 0.25, 0 and 1: the loss is sum(t) logsumexp(z) - t.z per row and its
    # gradient softmax(z) sum(t) - t (the CUDA kernel's formula), not softmax(z) - t
    n, c = 4, 5
    x = random(rng, (n, c), low=-3, high=3)
    labels = rng.uniform(0.0, 1.0, (n, c))
    labels *= np.array([3.7, 0.25, 0.0, 1.0])[:, None] / labels.sum(axis=1, keepdims=True)
    w = np.array([1.0, 2.0, 0.5, 1.5])
    loss, dx = kernels.softmax_cross_entropy(x, labels, label_smoothing=ls, grad_scale=2.0, sample_weight=w)
    t = _targets(labels, n, c, ls)
    lse = np.log(np.exp(x).sum(axis=1))
    assert abs(float(loss) - np.sum(w * (t.sum(axis=1) * lse - (t * x).sum(axis=1))) / n) < 1e-14
    num = numerical_grad(lambda: float(kernels.softmax_cross_entropy(x, labels, label_smoothing=ls,
                                                                     sample_weight=w)[0]), x)
    assert rel_error(dx, 2.0 * num) < FD_TOL
    softmax = np.exp(x - lse[:, None])
    assert rel_error(dx, 2.0 * w[:, None] * (softmax * t.sum(axis=1, keepdims=True) - t) / n) < 1e-13


def test_softmax_cross_entropy_float32_loss_and_scale(rng):
    x = random(rng, (8, 10), np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    loss, dx = kernels.softmax_cross_entropy(x, labels, grad_scale=np.asarray(128.0, np.float32))
    assert loss.dtype == np.float32 and loss.shape == () and dx.dtype == np.float32
    loss1, dx1 = kernels.softmax_cross_entropy(x, labels)
    assert float(loss) == float(loss1) and rel_error(dx, 128 * dx1) < 1e-6


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_crossentropy_from_probs(rng, sparse, ls):
    n, c = 3, 4
    p = rng.uniform(0.1, 1.0, (n, c))
    p /= p.sum(axis=1, keepdims=True)
    labels = rng.integers(0, c, n) if sparse else np.eye(c)[rng.integers(0, c, n)]
    loss, dp = kernels.crossentropy_from_probs(p, labels, label_smoothing=ls)
    y = _targets(labels, n, c, ls)
    assert abs(float(loss) + np.sum(y * np.log(p)) / n) < 1e-14
    num = numerical_grad(lambda: float(kernels.crossentropy_from_probs(p, labels, label_smoothing=ls)[0]), p)
    assert rel_error(dp, num) < FD_TOL


def test_crossentropy_from_probs_clips_like_keras():
    p = np.array([[1.0, 0.0]])
    loss, dp = kernels.crossentropy_from_probs(p, np.array([1]))
    assert abs(float(loss) + np.log(1e-7)) < 1e-9
    assert np.all(np.isfinite(dp))


@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_binary_crossentropy(rng, from_logits, ls):
    x = random(rng, (4, 3), low=-2, high=2) if from_logits else rng.uniform(0.05, 0.95, (4, 3))
    t = rng.uniform(0, 1, (4, 3))
    loss, dx = kernels.binary_crossentropy(x, t, from_logits=from_logits, label_smoothing=ls)
    ts = t * (1 - ls) + 0.5 * ls
    p = 1 / (1 + np.exp(-x)) if from_logits else x
    ref = -np.mean(ts * np.log(p) + (1 - ts) * np.log(1 - p))
    assert abs(float(loss) - ref) < 1e-13
    num = numerical_grad(lambda: float(kernels.binary_crossentropy(x, t, from_logits=from_logits, label_smoothing=ls)[0]), x)
    assert rel_error(dx, num) < FD_TOL


def test_binary_crossentropy_accepts_n_vs_n1(rng):
    x = random(rng, (5, 1))
    t = (rng.uniform(size=5) > 0.5).astype(np.float64)
    loss, dx = kernels.binary_crossentropy(x, t, from_logits=True)
    loss2, _ = kernels.binary_crossentropy(x, t.reshape(5, 1), from_logits=True)
    assert float(loss) == float(loss2) and dx.shape == (5, 1)


def test_mean_squared_error(rng):
    x = random(rng, (3, 4))
    t = random(rng, (3, 4))
    loss, dx = kernels.mean_squared_error(x, t, grad_scale=3.0)
    assert abs(float(loss) - np.mean((x - t) ** 2)) < 1e-15
    num = numerical_grad(lambda: float(kernels.mean_squared_error(x, t)[0]), x)
    assert rel_error(dx, 3.0 * num) < FD_TOL


def test_loss_validation(rng):
    x = random(rng, (4, 5), np.float32)
    with pytest.raises(ValueError, match=r"softmax_cross_entropy: integer labels must have shape \(4,\)"):
        kernels.softmax_cross_entropy(x, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"float labels must have the predictions' shape \(4, 5\)"):
        kernels.softmax_cross_entropy(x, np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        kernels.softmax_cross_entropy(x, np.zeros(4, np.int64), label_smoothing=1.5)
    with pytest.raises(ValueError, match="class indices in"):
        kernels.softmax_cross_entropy(x, np.array([0, 1, 2, 5]))
    with pytest.raises(ValueError, match=r"mean_squared_error: target has shape \(4, 4\)"):
        kernels.mean_squared_error(x, np.zeros((4, 4), np.float32))


# ------------------------------------------------------------------ per-sample weights (Keras 3 reduction)

_WEIGHTED = {
    "softmax_cross_entropy": lambda x, t, **kw: kernels.softmax_cross_entropy(x, t, label_smoothing=0.1, **kw),
    "crossentropy_from_probs": lambda x, t, **kw: kernels.crossentropy_from_probs(x, t, **kw),
    "binary_crossentropy": lambda x, t, **kw: kernels.binary_crossentropy(x, t, from_logits=True, **kw),
    "mean_squared_error": lambda x, t, **kw: kernels.mean_squared_error(x, t, **kw),
}


def _weighted_case(rng, op):
    n, c = 5, 4
    if op == "crossentropy_from_probs":
        x = rng.uniform(0.1, 1.0, (n, c))
        x /= x.sum(axis=1, keepdims=True)
    else:
        x = random(rng, (n, c), low=-2, high=2)
    t = rng.integers(0, c, n) if "entropy" in op and op != "binary_crossentropy" else rng.uniform(0, 1, (n, c))
    return x, t


@pytest.mark.parametrize("op", sorted(_WEIGHTED))
def test_weighted_loss_is_sum_of_weighted_sample_losses_over_batch_size(rng, op):
    fn = _WEIGHTED[op]
    x, t = _weighted_case(rng, op)
    n = len(x)
    w = np.array([0.5, 2.0, 0.0, 1.0, 3.0])
    # each sample's own loss: the op on that row alone (a batch of one is its own mean)
    per_sample = np.array([float(fn(x[i:i + 1], t[i:i + 1])[0]) for i in range(n)])
    loss, dx = fn(x, t, sample_weight=w, grad_scale=2.0)
    # Keras 3 sum_over_batch_size: divided by the batch size, not by sum(w) = 6.5
    assert abs(float(loss) - np.sum(w * per_sample) / n) < 1e-14
    num = numerical_grad(lambda: float(fn(x, t, sample_weight=w)[0]), x)
    assert rel_error(dx, 2.0 * num) < FD_TOL
    assert np.all(dx[2] == 0)  # a zero weight sends no gradient
    loss_col, dx_col = fn(x, t, sample_weight=w.reshape(n, 1).astype(np.float32), grad_scale=2.0)
    assert float(loss_col) == float(loss) and np.array_equal(dx_col, dx)
    unweighted = fn(x, t)
    ones = fn(x, t, sample_weight=np.ones(n))
    assert float(ones[0]) == float(unweighted[0]) and np.array_equal(ones[1], unweighted[1])


def test_sample_weight_validation(rng):
    x = random(rng, (4, 5), np.float32)
    labels = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"softmax_cross_entropy: sample_weight must have shape \(4,\) or \(4, 1\).*"
                                         r"got \(3,\)"):
        kernels.softmax_cross_entropy(x, labels, sample_weight=np.ones(3))
    with pytest.raises(TypeError, match="mean_squared_error: sample_weight must be numeric"):
        kernels.mean_squared_error(x, x, sample_weight=np.array(["a"] * 4))
