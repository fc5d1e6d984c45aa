"""CUDA softmax / log-softmax (cuDNN) vs the NumPy reference."""

from __future__ import annotations

import pytest

from dnnbind import kernels
from gpu_errlog import DTYPES, check, dev, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(1, 10), (37, 13), (2, 3, 1001)])
def test_softmax_forward_backward(rng, label, dtype, log, shape):
    x = quantize(random(rng, shape, low=-5, high=5), dtype)
    dy = quantize(random(rng, shape), dtype)
    y_ref = kernels.softmax_forward(x, log=log)
    dx_ref = kernels.softmax_backward(dy, y_ref, log=log)
    y = kernels.softmax_forward(dev(x, dtype), log=log, out=poisoned(shape, dtype))
    dx = kernels.softmax_backward(dev(dy, dtype), y, log=log)
    tol = 1e-5 if label == "float32" else None
    check("softmax_forward", label, y, y_ref, f"log={log} {shape}", tol=tol)
    check("softmax_backward", label, dx, dx_ref, f"log={log} {shape}", tol=tol)
