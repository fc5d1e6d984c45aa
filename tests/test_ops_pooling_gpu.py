"""CUDA pooling vs the NumPy reference, every mode, padding kind and layout."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import ops
from cases import POOL_CASES
from gpu_errlog import DTYPES, check, dev, poisoned, quantize
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
