"""CUDA pooling vs the NumPy reference, every mode, padding kind and layout; dnnbind's NHWC max-pool
kernels also against cuDNN's (``pooling.MAXPOOL_NHWC_KERNELS = False``)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from cases import POOL_CASES
from gpu_errlog import DTYPES, check, dev, dev_offset, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu



def _to(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 2, 3, 1)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("mode", ["max", "avg", "avg_include_pad"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, window, stride, padding", POOL_CASES)
def test_pool_forward_backward(rng, label, dtype, mode, layout, shape, window, stride, padding):
    x = quantize(_to(random(rng, shape), layout), dtype)
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, layout=layout)
    y_ref = kernels.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape), dtype)
    dx_ref = kernels.pool2d_backward(dy, x, y_ref, **kw)
    xd = dev(x, dtype)
    y = kernels.pool2d_forward(xd, out=poisoned(y_ref.shape, dtype), **kw)
    dx = kernels.pool2d_backward(dev(dy, dtype), xd, y, **kw)
    case = f"{mode} {layout} {shape} w{window} s{stride} p{padding}"
    tol = 1e-6 if label == "float32" else None
    check("pool2d_forward", label, y, y_ref, case, tol=tol)
    check("pool2d_backward", label, dx, dx_ref, case, tol=tol)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_avg_pool(rng, label, dtype, layout):
    x = quantize(_to(random(rng, (3, 5, 7, 6)), layout), dtype)
    y_ref = kernels.global_avg_pool2d_forward(x, layout=layout)
    dy = quantize(random(rng, y_ref.shape), dtype)
    y = kernels.global_avg_pool2d_forward(dev(x, dtype), layout=layout, out=poisoned(y_ref.shape, dtype))
    dx = kernels.global_avg_pool2d_backward(dev(dy, dtype), x.shape, layout=layout)
    tol = 1e-6 if label == "float32" else None
    check("global_avg_pool2d_forward", label, y, y_ref, layout, tol=tol)
    check("global_avg_pool2d_backward", label, dx, kernels.global_avg_pool2d_backward(dy, x.shape, layout=layout), layout,
          tol=tol)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("shape, window", [
    ((2, 8, 6, 16), 2), ((3, 6, 9, 24), 3), ((2, 4, 6, 12), (2, 3)),  # vector loads (C a multiple of 8 or 4)
    ((2, 9, 7, 20), 2), ((1, 4, 4, 512), 2), ((2, 6, 6, 5), 3)])      # leftovers; large C; odd C (scalar)
@pytest.mark.parametrize("offset", [0, 1])
def test_maxpool_nhwc_backward_kernel_with_ties_vectors_and_misaligned_inputs(rng, label, dtype, shape, window,
                                                                            offset):
    """Non-overlapping NHWC max pooling (dnnbind's own backward): values from {0, 1, 2} tie often,
    and the gradient goes to the first maximum in top-left-first order; offset 1 starts x and dy
    one item past a 16-byte boundary (the scalar path)."""
    x = rng.integers(0, 3, size=shape).astype(np.float64)
    kw = dict(mode="max", window=window, stride=None, padding=0, layout="NHWC")
    y_ref = kernels.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape, low=0.5, high=1.5), dtype)
    dx_ref = kernels.pool2d_backward(dy, x, y_ref, **kw)
    y = kernels.pool2d_forward(dev(x, dtype), out=poisoned(y_ref.shape, dtype), **kw)
    dx = kernels.pool2d_backward(dev_offset(dy, offset, dtype), dev_offset(x, offset, dtype), y, **kw)
    case = f"{shape} w{window} offset {offset}"
    check("pool2d_forward", label, y, y_ref, case, tol=0.0)
    assert np.array_equal(host(dx), dx_ref), f"max-pool backward {case}: gradient not at the first maximum"


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("shape, window", [((2, 8, 6, 16), 2), ((3, 7, 9, 24), 3), ((2, 5, 7, 8), (2, 3))])
@pytest.mark.parametrize("offset", [0, 1])
def test_maxpool_nhwc_forward_kernel_ties_leftovers_and_misaligned_input(rng, label, dtype, shape, window, offset):
    """dnnbind's NHWC max-pool forward: values from {0, 1, 2} tie often (y is a value of its window,
    bit for bit); leftover rows/columns are in no window; offset 1 starts x one item past a 16-byte
    boundary (the scalar path)."""
    x = rng.integers(0, 3, size=shape).astype(np.float64)
    x.flat[::7] += 0.5  # some non-integers too
    kw = dict(mode="max", window=window, stride=None, padding=0, layout="NHWC")
    y_ref = kernels.pool2d_forward(quantize(x, dtype), **kw)
    y = kernels.pool2d_forward(dev_offset(x, offset, dtype), out=poisoned(y_ref.shape, dtype), **kw)
    assert np.array_equal(host(y), y_ref), f"max-pool forward {shape} w{window} offset {offset}"


def _nan_windows(rng, shape):
    """Random data with about one NaN in 37, two of them surely inside windows."""
    x = random(rng, shape, low=-2, high=2)
    x.reshape(-1)[rng.choice(x.size, size=max(1, x.size // 37), replace=False)] = np.nan
    x[0, 0, 0, 0] = x[-1, 1, 1, -1] = np.nan
    return x


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("shape, window", [((2, 9, 7, 16), 2), ((2, 6, 6, 24), 3), ((1, 5, 5, 3), 2)])
def test_maxpool_nhwc_kernels_nan_semantics_equal_cudnn_and_the_reference(rng, monkeypatch, label, dtype, shape,
                                                                           window):
    """A window holding a NaN pools to NaN (CUDNN_PROPAGATE_NAN, as the cuDNN path set it, and
    np.maximum); its gradient goes nowhere (x == y is never true). The kernels and cuDNN agree
    on the NaN positions and on every other value."""
    from dnnbind.kernels._cuda import pooling

    x = quantize(_nan_windows(rng, shape), dtype)
    kw = dict(mode="max", window=window, stride=None, padding=0, layout="NHWC")
    y_ref = kernels.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape, low=0.5, high=1.5), dtype)
    dx_ref = kernels.pool2d_backward(dy, x, y_ref, **kw)
    xd, dyd = dev(x, dtype), dev(dy, dtype)
    results = {}
    for own in (True, False):
        monkeypatch.setattr(pooling, "MAXPOOL_NHWC_KERNELS", own)
        y = kernels.pool2d_forward(xd, out=poisoned(y_ref.shape, dtype), **kw)
        results[own] = (host(y), host(kernels.pool2d_backward(dyd, xd, y, **kw)))
    y_own, dx_own = results[True]
    assert np.isnan(y_ref).any() and not np.isnan(y_ref).all()
    assert np.array_equal(y_own, y_ref, equal_nan=True), "kernel forward vs the reference"
    assert np.array_equal(y_own, results[False][0], equal_nan=True), "kernel forward vs cuDNN"
    assert np.array_equal(dx_own, dx_ref), "kernel backward vs the reference"


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("shape, window", [((64, 31, 31, 64), 2), ((32, 15, 15, 256), 2), ((64, 3, 3, 256), 3)])
def test_maxpool_nhwc_kernels_at_airbench_shapes_match_cudnn_and_write_every_leftover(rng, monkeypatch, label, dtype,
                                                                                       shape, window):
    """airbench94's poolings (batch cut): the kernels' y equals cuDNN's bit for bit and dx the
    reference's; dx's memory is NaN-filled before the call, so a leftover row or column the
    backward failed to zero would show."""
    from dnnbind.kernels._cuda import pooling

    x = quantize(random(rng, shape, low=-3, high=3), dtype)
    kw = dict(mode="max", window=window, stride=None, padding=0, layout="NHWC")
    y_ref = kernels.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape, low=0.5, high=1.5), dtype)
    dx_ref = kernels.pool2d_backward(dy, x, y_ref, **kw)
    xd, dyd = dev(x, dtype), dev(dy, dtype)
    monkeypatch.setattr(pooling, "MAXPOOL_NHWC_KERNELS", False)
    y_cudnn = host(kernels.pool2d_forward(xd, out=poisoned(y_ref.shape, dtype), **kw))
    monkeypatch.setattr(pooling, "MAXPOOL_NHWC_KERNELS", True)
    y = kernels.pool2d_forward(xd, out=poisoned(y_ref.shape, dtype), **kw)
    # The stream-ordered pool hands the next allocation of this size the block just freed.
    stale = poisoned(shape, dtype)
    del stale
    dx = kernels.pool2d_backward(dyd, xd, y, **kw)
    assert np.array_equal(host(y), y_ref) and np.array_equal(host(y), y_cudnn)
    got = host(dx)
    assert np.array_equal(got, dx_ref), f"max-pool backward {shape}: {np.isnan(got).sum()} NaN left"


@pytest.mark.parametrize("shape, window", [((2, 9, 7, 6), 2), ((2, 6, 6, 5), 3)])
def test_maxpool_nhwc_kernels_float64(rng, shape, window):
    """float64 takes the kernels too (2 items a vector): exact against the reference."""
    x = random(rng, shape)
    kw = dict(mode="max", window=window, stride=None, padding=0, layout="NHWC")
    y_ref = kernels.pool2d_forward(x, **kw)
    dy = random(rng, y_ref.shape)
    xd = dev(x)
    y = kernels.pool2d_forward(xd, out=poisoned(y_ref.shape, np.float64), **kw)
    dx = kernels.pool2d_backward(dev(dy), xd, y, **kw)
    assert np.array_equal(host(y), y_ref)
    assert np.array_equal(host(dx), kernels.pool2d_backward(dy, x, y_ref, **kw))
