"""CUDA loss kernels vs the NumPy reference: loss and gradient, sparse and dense labels."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from gpu_errlog import DTYPES, check, dev, host, quantize
from testutil import random

pytestmark = pytest.mark.gpu


def _labels(rng, n, c, kind):
    if kind == "dense":
        p = rng.uniform(0.1, 1.0, size=(n, c))
        return p / p.sum(axis=1, keepdims=True)
    return rng.integers(0, c, size=n).astype(np.int32 if kind == "int32" else np.int64)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind", ["int32", "int64", "dense"])
@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("n, c", [(1, 10), (128, 10), (7, 1000)])
def test_softmax_cross_entropy(rng, label, dtype, kind, ls, n, c):
    logits = quantize(random(rng, (n, c), low=-6, high=6), dtype)
    labels = _labels(rng, n, c, kind)
    loss_ref, d_ref = kernels.softmax_cross_entropy(logits, labels, label_smoothing=ls, grad_scale=3.0)
    loss, d = kernels.softmax_cross_entropy(dev(logits, dtype), dev(labels), label_smoothing=ls, grad_scale=3.0)
    assert loss.shape == () and loss.dtype == np.float32
    case = f"{kind} ls={ls} ({n},{c})"
    check("softmax_cross_entropy.loss", label, host(loss), loss_ref, case, tol=1e-5 if label == "float32" else None)
    check("softmax_cross_entropy.grad", label, d, d_ref, case, tol=1e-5 if label == "float32" else None)


def test_softmax_cross_entropy_device_grad_scale_and_determinism(rng):
    logits = random(rng, (64, 10)).astype(np.float32)
    labels = rng.integers(0, 10, size=64)
    gs = dev(np.asarray(128.0, dtype=np.float32))
    runs = [kernels.softmax_cross_entropy(dev(logits), dev(labels), grad_scale=gs) for _ in range(2)]
    _, d_ref = kernels.softmax_cross_entropy(logits.astype(np.float64), labels, grad_scale=128.0)
    check("softmax_cross_entropy.grad", "float32", runs[0][1], d_ref, "device grad_scale")
    assert host(runs[0][0]) == host(runs[1][0]) and np.array_equal(host(runs[0][1]), host(runs[1][1]))


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind", ["int64", "dense"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_crossentropy_from_probs(rng, label, dtype, kind, ls):
    n, c = 16, 7
    q = rng.uniform(0.05, 1.0, size=(n, c))
    q[0, 0] = 1e-9  # exercises the clip
    q = quantize(q / q.sum(axis=1, keepdims=True), dtype)
    labels = _labels(rng, n, c, kind)
    loss_ref, d_ref = kernels.crossentropy_from_probs(q, labels, label_smoothing=ls)
    loss, d = kernels.crossentropy_from_probs(dev(q, dtype), dev(labels), label_smoothing=ls)
    check("crossentropy_from_probs.loss", label, host(loss), loss_ref, f"{kind} ls={ls}")
    check("crossentropy_from_probs.grad", label, d, d_ref, f"{kind} ls={ls}")


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_binary_crossentropy(rng, label, dtype, from_logits, ls):
    shape = (33, 3)
    pred = random(rng, shape, low=-4, high=4) if from_logits else rng.uniform(0.01, 0.99, size=shape)
    pred = quantize(pred, dtype)
    target = (rng.uniform(size=shape) > 0.5).astype(np.float64)
    loss_ref, d_ref = kernels.binary_crossentropy(pred, target, from_logits=from_logits, label_smoothing=ls,
                                              grad_scale=2.0)
    loss, d = kernels.binary_crossentropy(dev(pred, dtype), dev(target, dtype), from_logits=from_logits,
                                      label_smoothing=ls, grad_scale=2.0)
    case = f"from_logits={from_logits} ls={ls}"
    check("binary_crossentropy.loss", label, host(loss), loss_ref, case)
    check("binary_crossentropy.grad", label, d, d_ref, case)


@pytest.mark.parametrize("label, dtype", DTYPES)
# (20, 4): one block sums the element losses; (300, 301) and (2, 700, 1201): fixed chunks, then one block over
# their partials (one chunk short at the end), the path of a sequence model's million-element losses
@pytest.mark.parametrize("shape", [(20, 4), (300, 301), (2, 700, 1201)])
def test_mean_squared_error(rng, label, dtype, shape):
    pred, target = quantize(random(rng, shape), dtype), quantize(random(rng, shape, low=-2, high=1), dtype)
    loss_ref, d_ref = kernels.mean_squared_error(pred, target)
    loss, d = kernels.mean_squared_error(dev(pred, dtype), dev(target, dtype))
    check("mean_squared_error.loss", label, host(loss), loss_ref, str(shape))
    # the gradient 2 (pred - target) / N of 1.7M elements is ~1e-6: a float16 subnormal, with fewer mantissa bits
    check("mean_squared_error.grad", label, d, d_ref, str(shape),
          tol=3e-2 if label == "float16" and d_ref.size > 2**20 else None)
    again, _ = kernels.mean_squared_error(dev(pred, dtype), dev(target, dtype))
    assert host(again) == host(loss)  # the fixed-order sum is bitwise reproducible


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax_cross_entropy", "crossentropy_from_probs", "binary_crossentropy",
                                "mean_squared_error"])
def test_sample_weighted_losses_match_numpy(rng, label, dtype, op):
    n, c = 37, 6
    if op == "crossentropy_from_probs":
        q = rng.uniform(0.05, 1.0, size=(n, c))
        pred = quantize(q / q.sum(axis=1, keepdims=True), dtype)
    else:
        pred = quantize(random(rng, (n, c), low=-3, high=3), dtype)
    if op in ("softmax_cross_entropy", "crossentropy_from_probs"):
        target, target_dev = (labels := rng.integers(0, c, size=n).astype(np.int32)), dev(labels)
    else:
        target = quantize(rng.uniform(0, 1, size=(n, c)), dtype)
        target_dev = dev(target, dtype)
    w = rng.uniform(0.0, 3.0, size=n).astype(np.float32)
    w[3] = 0.0
    kw = {"from_logits": True} if op == "binary_crossentropy" else {}
    fn = getattr(kernels, op)
    loss_ref, d_ref = fn(pred, target, sample_weight=w, grad_scale=2.0, **kw)
    loss, d = fn(dev(pred, dtype), target_dev, sample_weight=dev(w), grad_scale=2.0, **kw)
    check(f"{op}.weighted.loss", label, host(loss), loss_ref, tol=1e-5 if label == "float32" else None)
    check(f"{op}.weighted.grad", label, d, d_ref, tol=1e-5 if label == "float32" else None)
    assert np.all(host(d)[3] == 0)
    # (N, 1) float64 weights are cast to float32 on the device: the same numbers
    loss2, d2 = fn(dev(pred, dtype), target_dev, sample_weight=dev(w.astype(np.float64).reshape(n, 1)),
                   grad_scale=2.0, **kw)
    assert host(loss2) == host(loss) and np.array_equal(host(d2), host(d))
