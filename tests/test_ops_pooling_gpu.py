"""CUDA pooling vs the NumPy reference, every mode, padding kind and layout."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import ops
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
    y_ref = ops.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape), dtype)
    dx_ref = ops.pool2d_backward(dy, x, y_ref, **kw)
    xd = dev(x, dtype)
    y = ops.pool2d_forward(xd, out=poisoned(y_ref.shape, dtype), **kw)
    dx = ops.pool2d_backward(dev(dy, dtype), xd, y, **kw)
    case = f"{mode} {layout} {shape} w{window} s{stride} p{padding}"
    tol = 1e-6 if label == "float32" else None
    check("pool2d_forward", label, y, y_ref, case, tol=tol)
    check("pool2d_backward", label, dx, dx_ref, case, tol=tol)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_avg_pool(rng, label, dtype, layout):
    x = quantize(_to(random(rng, (3, 5, 7, 6)), layout), dtype)
    y_ref = ops.global_avg_pool2d_forward(x, layout=layout)
    dy = quantize(random(rng, y_ref.shape), dtype)
    y = ops.global_avg_pool2d_forward(dev(x, dtype), layout=layout, out=poisoned(y_ref.shape, dtype))
    dx = ops.global_avg_pool2d_backward(dev(dy, dtype), x.shape, layout=layout)
    tol = 1e-6 if label == "float32" else None
    check("global_avg_pool2d_forward", label, y, y_ref, layout, tol=tol)
    check("global_avg_pool2d_backward", label, dx, ops.global_avg_pool2d_backward(dy, x.shape, layout=layout), layout,
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
    y_ref = ops.pool2d_forward(x, **kw)
    dy = quantize(random(rng, y_ref.shape, low=0.5, high=1.5), dtype)
    dx_ref = ops.pool2d_backward(dy, x, y_ref, **kw)
    y = ops.pool2d_forward(dev(x, dtype), out=poisoned(y_ref.shape, dtype), **kw)
    dx = ops.pool2d_backward(dev_offset(dy, offset, dtype), dev_offset(x, offset, dtype), y, **kw)
    case = f"{shape} w{window} offset {offset}"
    check("pool2d_forward", label, y, y_ref, case, tol=0.0)
    assert np.array_equal(host(dx), dx_ref), f"max-pool backward {case}: gradient not at the first maximum"
