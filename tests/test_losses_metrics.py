"""Losses and metrics vs NumPy references; name lookup; Keras's choice of accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import losses, metrics, utils


def softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_crossentropies(rng):
    z = rng.normal(size=(6, 4)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    oh = utils.to_categorical(y, 4)
    p = softmax(z.astype(np.float64))
    ref = -np.mean(np.log(p[np.arange(6), y]))
    assert float(losses.SparseCategoricalCrossentropy(from_logits=True)(y, z)) == pytest.approx(ref, rel=1e-5)
    assert float(losses.SparseCategoricalCrossentropy()(y, p.astype(np.float32))) == pytest.approx(ref, rel=1e-5)
    assert float(losses.CategoricalCrossentropy(from_logits=True)(oh, z)) == pytest.approx(ref, rel=1e-5)
    # the functional forms return per-sample losses (Keras 3)
    assert float(np.mean(losses.categorical_crossentropy(oh, p.astype(np.float32)))) == pytest.approx(ref, rel=1e-5)
    ls = 0.1
    smooth = oh * (1 - ls) + ls / 4
    ref_ls = -np.mean((smooth * np.log(p)).sum(1))
    got = losses.CategoricalCrossentropy(from_logits=True, label_smoothing=ls)(oh, z)
    assert float(got) == pytest.approx(ref_ls, rel=1e-5)
    # the gradient is (softmax - y) / N
    _, grad = losses.SparseCategoricalCrossentropy(from_logits=True).compute(z, y.astype(np.int32))
    assert np.allclose(grad, (p - oh) / 6, atol=1e-6)


def test_binary_crossentropy_and_mse(rng):
    p = rng.uniform(0.05, 0.95, size=(8, 1)).astype(np.float32)
    t = rng.integers(0, 2, size=(8, 1)).astype(np.float32)
    ref = -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))
    assert float(losses.BinaryCrossentropy()(t, p)) == pytest.approx(ref, rel=1e-5)
    logits = np.log(p / (1 - p))
    assert float(losses.BinaryCrossentropy(from_logits=True)(t, logits)) == pytest.approx(ref, rel=1e-4)
    a, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(losses.mse(a, b)), np.mean((a - b) ** 2, axis=-1), rtol=1e-5)
    assert float(losses.MeanSquaredError()(a, b)) == pytest.approx(np.mean((a - b) ** 2), rel=1e-5)


def test_loss_lookup():
    assert isinstance(losses.get("mse"), losses.MeanSquaredError)
    assert isinstance(losses.get("sparse_categorical_crossentropy"), losses.SparseCategoricalCrossentropy)
    assert isinstance(losses.get("CategoricalCrossentropy"), losses.CategoricalCrossentropy)
    assert isinstance(losses.get(losses.binary_crossentropy), losses.BinaryCrossentropy)
    with pytest.raises(ValueError, match="unknown loss 'hinge'.*sparse_categorical_crossentropy"):
        losses.get("hinge")
    cfg = losses.serialize(losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2))
    clone = losses.get(cfg)
    assert clone.from_logits and clone.label_smoothing == 0.2


def test_label_checks():
    scce = losses.SparseCategoricalCrossentropy()
    assert scce.prepare_labels(np.array([[1], [2]]), (3,)).shape == (2,)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[0, 5\]"):
        scce.prepare_labels(np.array([0, 5]), (3,))
    with pytest.raises(ValueError, match="categorical_crossentropy"):
        scce.prepare_labels(np.eye(3), (3,))
    with pytest.raises(ValueError, match="one-hot of shape \\(batch, 3\\)"):
        losses.CategoricalCrossentropy().prepare_labels(np.array([0, 1]), (3,))
    # regression: noisy labels past 1 (keras-io's DCGAN adds 0.05 * U(0, 1) to its ones) were refused; Keras
    # takes them and so does dnnbind, with Keras's formula
    bce = losses.BinaryCrossentropy()
    noisy = np.array([[1.04], [0.02], [1.0], [0.0]], np.float32)
    np.testing.assert_array_equal(bce.prepare_labels(noisy, (1,)), noisy)
    p = np.array([[0.9], [0.2], [0.6], [0.3]], np.float32)
    want = np.mean(-noisy * np.log(p) - (1 - noisy) * np.log(1 - p))
    np.testing.assert_allclose(float(np.asarray(bce(noisy, p))), want, rtol=1e-5)


def test_accuracy_metrics(rng):
    scores = rng.normal(size=(10, 5)).astype(np.float32)
    y = rng.integers(0, 5, 10)
    y[:4] = scores[:4].argmax(1)
    want = np.mean(scores.argmax(1) == y)
    m = metrics.SparseCategoricalAccuracy()
    m.update_state(y[:6].astype(np.int32), scores[:6])
    m.update_state(y[6:].astype(np.int32), scores[6:])
    assert m.result() == pytest.approx(want)
    c = metrics.CategoricalAccuracy()
    c.update_state(utils.to_categorical(y, 5), scores)
    assert c.result() == pytest.approx(want)
    c.reset_state()
    assert c.result() == 0.0
    top = metrics.SparseTopKCategoricalAccuracy(k=2)
    top.update_state(y.astype(np.int32), scores)
    ranks = (scores > scores[np.arange(10), y][:, None]).sum(1)
    assert top.result() == pytest.approx(np.mean(ranks < 2))
    topc = metrics.TopKCategoricalAccuracy(k=3)
    topc.update_state(utils.to_categorical(y, 5), scores)
    assert topc.result() == pytest.approx(np.mean(ranks < 3))
    b = metrics.BinaryAccuracy()
    pb = np.array([[0.2], [0.7], [0.5], [0.9]], np.float32)
    tb = np.array([[0.0], [1.0], [1.0], [0.0]], np.float32)
    b.update_state(tb, pb)
    assert b.result() == pytest.approx(0.5)  # 0.5 is not > 0.5


def test_accuracy_resolution_as_keras():
    acc = metrics.get("accuracy")
    assert isinstance(acc.resolve((), (10,)), metrics.SparseCategoricalAccuracy)
    assert isinstance(acc.resolve((1,), (10,)), metrics.SparseCategoricalAccuracy)
    assert isinstance(acc.resolve((10,), (10,)), metrics.CategoricalAccuracy)
    assert isinstance(acc.resolve((1,), (1,)), metrics.BinaryAccuracy)
    assert metrics.get("acc").name == "acc"
    with pytest.raises(ValueError, match="unknown metric 'f1'.*accuracy"):
        metrics.get("f1")


def test_to_categorical():
    out = utils.to_categorical([0, 2, 1], 3)
    assert out.dtype == np.float32 and np.array_equal(out, np.eye(3)[[0, 2, 1]])
    assert utils.to_categorical(np.array([[1], [0]])).shape == (2, 2)
    with pytest.raises(ValueError, match="out of range"):
        utils.to_categorical([3], 3)
