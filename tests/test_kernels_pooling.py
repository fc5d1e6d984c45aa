"""NumPy pooling: forward against direct window loops, backward against finite differences (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from cases import POOL_CASES
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7


def naive_pool_nchw(x, mode, window, stride, pad):
    n, c, h, w = x.shape
    t, b, l, r = pad
    oh = (h + t + b - window[0]) // stride[0] + 1
    ow = (w + l + r - window[1]) // stride[1] + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * stride[0] - t, j * stride[1] - l
            hs = slice(max(h0, 0), min(h0 + window[0], h))
            ws = slice(max(w0, 0), min(w0 + window[1], w))
            patch = x[:, :, hs, ws]
            if mode == "max":
                y[:, :, i, j] = patch.max(axis=(2, 3))
            elif mode == "avg":
                y[:, :, i, j] = patch.mean(axis=(2, 3))
            else:
                y[:, :, i, j] = patch.sum(axis=(2, 3)) / (window[0] * window[1])
    return y


MODES = ["max", "avg", "avg_include_pad"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("xs, window, stride, padding", POOL_CASES)
def test_pool_forward_matches_naive(rng, mode, xs, window, stride, padding):
    x = random(rng, xs)
    y = kernels.pool2d_forward(x, mode=mode, window=window, stride=stride, padding=padding)
    p, _ = kernels.pooling.pool_params("t", xs, mode=mode, window=window, stride=stride, padding=padding, layout="NCHW")
    ref = naive_pool_nchw(x, mode, p.window, p.stride, p.pad)
    assert rel_error(y, ref) < 1e-14
    y_nhwc = kernels.pool2d_forward(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), mode=mode, window=window,
                                stride=stride, padding=padding, layout="NHWC")
    assert rel_error(y_nhwc.transpose(0, 3, 1, 2), ref) < 1e-14


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("xs, window, stride, padding", POOL_CASES)
def test_pool_backward_finite_differences(rng, layout, mode, xs, window, stride, padding):
    x = random(rng, xs)
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, layout=layout)
    y = kernels.pool2d_forward(x, **kw)
    g = random(rng, y.shape)
    dx = kernels.pool2d_backward(g, x, y, **kw)
    num = numerical_grad(lambda: float(np.sum(g * kernels.pool2d_forward(x, **kw))), x)
    assert rel_error(dx, num) < FD_TOL


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride", [None, 1])
def test_max_pool_ties_go_to_the_first_maximum(layout, stride):
    x = np.zeros((1, 1, 2, 2))
    x[0, 0] = [[1.0, 3.0], [3.0, 3.0]]
    x2 = np.zeros((1, 1, 2, 2))
    x2[0, 0] = [[0.0, 0.0], [0.0, 0.0]]  # an all-zero window (after a relu, say)
    x = np.concatenate([x, x2], axis=1)
    if layout == "NHWC":
        x = x.transpose(0, 2, 3, 1).copy()
    y = kernels.pool2d_forward(x, mode="max", window=2, stride=stride, layout=layout)
    dx = kernels.pool2d_backward(np.ones_like(y), x, y, mode="max", window=2, stride=stride, layout=layout)
    if layout == "NHWC":
        dx = dx.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(dx[0, 0], [[0, 1], [0, 0]])
    np.testing.assert_array_equal(dx[0, 1], [[1, 0], [0, 0]])


def test_max_pool_padding_never_wins():
    x = -np.ones((1, 1, 3, 3)) * np.arange(1, 10).reshape(1, 1, 3, 3)
    y = kernels.pool2d_forward(x, mode="max", window=3, stride=1, padding=1)
    assert y.max() < 0  # zero padding would give 0 here


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_avg_pool(rng, layout):
    x = random(rng, (2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3))
    y = kernels.global_avg_pool2d_forward(x, layout=layout)
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    assert y.shape == (2, 3) and rel_error(y, x.mean(axis=axes)) < 1e-15
    g = random(rng, (2, 3))
    dx = kernels.global_avg_pool2d_backward(g, x.shape, layout=layout)
    num = numerical_grad(lambda: float(np.sum(g * kernels.global_avg_pool2d_forward(x, layout=layout))), x)
    assert rel_error(dx, num) < FD_TOL


def test_pool_float16_keeps_dtype(rng):
    x = random(rng, (2, 3, 4, 4), np.float32)
    y16 = kernels.pool2d_forward(x.astype(np.float16), mode="avg", window=2)
    assert y16.dtype == np.float16
    assert rel_error(y16, kernels.pool2d_forward(x, mode="avg", window=2)) < 1e-3


def test_pool_validation(rng):
    x = random(rng, (2, 3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="pool2d_forward: mode must be one of max, avg, avg_include_pad"):
        kernels.pool2d_forward(x, mode="median")
    with pytest.raises(ValueError, match="pool2d_forward: the output would be empty"):
        kernels.pool2d_forward(x, window=5)
    with pytest.raises(ValueError, match=r"pool2d_backward: dy has shape \(2, 3, 4, 4\) .* expected the forward "
                                         r"output shape \(2, 3, 2, 2\)"):
        kernels.pool2d_backward(x, x, x[:, :, :2, :2].copy(), window=2)
    with pytest.raises(ValueError, match="smaller than the window"):
        kernels.pool2d_forward(x, window=2, padding=2)


@pytest.mark.parametrize("shape, window", [((3, 11, 11, 5), 2), ((2, 9, 10, 3), (3, 2)), ((2, 7, 7, 4), 3)])
def test_nhwc_fast_path_matches_the_general_path_with_many_ties(rng, shape, window):
    # ReLU-like inputs rounded to one decimal: many windows hold several equal maxima (zeros
    # above all), and the fast NHWC path must route each window's gradient to the first.
    x = np.maximum(random(rng, shape), 0).round(1).astype(np.float32)
    y = kernels.pool2d_forward(x, window=window, layout="NHWC")
    dy = random(rng, y.shape).astype(np.float32)
    dx = kernels.pool2d_backward(dy, x, y, window=window, layout="NHWC")
    nchw = [np.ascontiguousarray(a.transpose(0, 3, 1, 2)) for a in (dy, x, y)]
    assert np.array_equal(kernels.pool2d_forward(nchw[1], window=window).transpose(0, 2, 3, 1), y)
    assert np.array_equal(dx, kernels.pool2d_backward(*nchw, window=window).transpose(0, 2, 3, 1))
    assert np.count_nonzero(dx) <= y.size
