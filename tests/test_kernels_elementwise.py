"""NumPy elementwise ops, reductions, counts, casts and augmentation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dnnbind import kernels
from testutil import random, rel_error


def test_arithmetic(rng):
    a = random(rng, (3, 4), np.float32)
    b = random(rng, (3, 4), np.float32)
    assert np.array_equal(kernels.add(a, b), a + b)
    assert np.array_equal(kernels.subtract(a, b), a - b)
    assert np.array_equal(kernels.multiply(a, b), a * b)
    assert rel_error(kernels.scale(a, 2.5), 2.5 * a) < 1e-7
    assert rel_error(kernels.scale(a, np.asarray(2.5)), 2.5 * a) < 1e-7
    y = b.copy()
    assert kernels.axpy(0.5, a, y) is y and rel_error(y, b + 0.5 * a) < 1e-7
    out = np.empty_like(a)
    assert kernels.add(a, b, out=out) is out
    with pytest.raises(ValueError, match=r"add: a has shape \(3, 4\) and dtype float32 but b has shape \(4, 3\)"):
        kernels.add(a, b.T)


def test_reductions(rng):
    x = random(rng, (2, 3, 4))
    assert abs(float(kernels.sum(x)) - x.sum()) < 1e-12
    assert rel_error(kernels.sum(x, axis=(0, 2)), x.sum(axis=(0, 2))) < 1e-15
    assert rel_error(kernels.mean(x, axis=-1, keepdims=True), x.mean(axis=-1, keepdims=True)) < 1e-15
    h = x.astype(np.float16)
    assert kernels.mean(h).dtype == np.float16
    with pytest.raises(ValueError, match="sum: axis 3 is out of range"):
        kernels.sum(x, axis=3)


def test_argmax_and_counts():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.4, 0.4, 0.2]], np.float32)
    labels = np.array([1, 2, 2, 1])
    am = kernels.argmax(scores)
    assert am.dtype == np.int64 and list(am) == [1, 0, 2, 0]  # first maximum on ties
    acc = kernels.accuracy_count(scores, labels)
    assert acc.shape == () and acc.dtype == np.int64 and int(acc) == 2
    assert int(kernels.accuracy_count(scores, np.eye(3, dtype=np.float32)[labels])) == 2
    # in_top_k semantics: row 3's label ties the maximum, so it counts even for k=1
    assert int(kernels.top_k_count(scores, labels, 1)) == 3
    assert int(kernels.top_k_count(scores, labels, 2)) == 3  # row 1: label 2 has two higher scores
    assert int(kernels.top_k_count(scores, np.array([1, 1, 0, 1]), 2)) == 4
    with pytest.raises(ValueError, match="top_k_count: k must be a positive int"):
        kernels.top_k_count(scores, labels, 0)


def test_top_k_matches_rank_definition(rng):
    scores = rng.normal(size=(50, 7))
    labels = rng.integers(0, 7, 50)
    rank = (scores > scores[np.arange(50), labels][:, None]).sum(axis=1)
    for k in (1, 3, 7):
        assert int(kernels.top_k_count(scores, labels, k)) == int((rank < k).sum())


def test_cast_fill_copy_like(rng):
    x = random(rng, (3, 4), np.float32)
    bf = kernels.cast(x, "bfloat16")
    assert bf.dtype == np.dtype(ml_dtypes.bfloat16) and rel_error(bf.astype(np.float32), x) < 1e-2
    assert np.array_equal(kernels.cast(bf, np.float32), bf.astype(np.float32))
    assert kernels.cast(x, np.float16).dtype == np.float16
    assert kernels.cast(np.array([1.7, -1.7]), np.int32).tolist() == [1, -1]
    with pytest.raises(TypeError, match="cast: dtype complex64 is not supported"):
        kernels.cast(x, np.complex64)
    y = x.copy()
    assert kernels.fill(y, 3.0) is y and np.all(y == 3.0)
    z = kernels.zeros_like(x, dtype=np.float16)
    assert z.dtype == np.float16 and z.shape == x.shape and not z.any()
    assert kernels.empty_like(x).shape == x.shape
    c = kernels.copy(x)
    assert c is not x and np.array_equal(c, x)


def test_take_and_all_finite(rng):
    x = random(rng, (5, 2), np.float32)
    assert np.array_equal(kernels.take(x, np.array([4, 0, 0])), x[[4, 0, 0]])
    with pytest.raises(IndexError, match="take: indices out of range"):
        kernels.take(x, np.array([5]))
    ok = kernels.all_finite([x, np.arange(3)])
    assert ok.dtype == np.int32 and int(ok) == 1
    bad = x.copy()
    bad[1, 1] = np.inf
    assert int(kernels.all_finite([x, bad])) == 0
    assert int(kernels.all_finite(np.array([np.nan], np.float16))) == 0


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_random_crop_flip(rng, layout):
    x = random(rng, (16, 3, 5, 5) if layout == "NCHW" else (16, 5, 5, 3))
    y = kernels.random_crop_flip(x, padding=2, layout=layout, seed=7)
    assert y.shape == x.shape
    assert np.array_equal(y, kernels.random_crop_flip(x, padding=2, layout=layout, seed=7))  # seeded
    xn = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    yn = y if layout == "NCHW" else y.transpose(0, 3, 1, 2)
    # every output is a shifted (and maybe mirrored) window of the zero-padded input
    padded = np.pad(xn, ((0, 0), (0, 0), (2, 2), (2, 2)))
    flips = 0
    for i in range(16):
        found = None
        for dy in range(5):
            for dx in range(5):
                win = padded[i, :, dy:dy + 5, dx:dx + 5]
                if np.array_equal(yn[i], win):
                    found = "plain"
                elif np.array_equal(yn[i], win[:, :, ::-1]):
                    found = "flip"
        assert found is not None
        flips += found == "flip"
    assert 0 < flips < 16
    assert np.array_equal(kernels.random_crop_flip(x, padding=0, flip=False, layout=layout, seed=1), x)


def test_cast_many_is_cast_per_array_and_checks_before_running(rng):
    xs = [random(rng, (3, 4), np.float32), random(rng, (7,), np.float32), np.zeros((0, 2), np.float32),
          random(rng, (2, 1, 5), np.float32)]
    for dt in (np.float16, ml_dtypes.bfloat16, np.float64):
        got = kernels.cast_many(xs, dt)
        assert len(got) == len(xs)
        for g, x in zip(got, xs):
            assert g.dtype == np.dtype(dt) and g.shape == x.shape
            assert np.array_equal(g.view(np.uint8), kernels.cast(x, dt).view(np.uint8))  # bitwise
    assert kernels.cast_many([], np.float16) == []
    with pytest.raises(TypeError, match="every array must have one dtype; xs\\[0\\] is float32 but xs\\[1\\] is "
                                        "float64"):
        kernels.cast_many([xs[0], xs[1].astype(np.float64)], np.float16)
    with pytest.raises(TypeError, match="cast_many: xs\\[0\\] must be float16, bfloat16, float32 or float64"):
        kernels.cast_many([np.arange(3)], np.float32)
    with pytest.raises(TypeError, match="cast_many: xs must be a list of arrays, got one array"):
        kernels.cast_many(xs[0], np.float16)
    with pytest.raises(TypeError, match="tables must be a dnnbind.kernels.UpdateTables or None"):
        kernels.cast_many(xs, np.float16, tables={})
    with pytest.raises(TypeError, match="cast_many: dtype int32 is not supported; supported: bfloat16, float16"):
        kernels.cast_many(xs, np.int32)


def test_cast_many_prepared_casts_the_current_values(rng):
    xs = [random(rng, (5,), np.float32), random(rng, (2, 3), np.float32)]
    prepared = kernels.elementwise.CastMany(xs, np.float16)
    first = prepared()
    xs[0] *= 3  # the same arrays, new values: the next call reads them
    second = prepared()
    assert np.array_equal(second[0], xs[0].astype(np.float16)) and not np.array_equal(first[0], second[0])
    assert np.array_equal(second[1], xs[1].astype(np.float16))
