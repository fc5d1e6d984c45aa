"""CUDA dropout (cuDNN): mask statistics, scaling, backward with the same mask, fresh masks."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from gpu_errlog import BF16, dev, host, poisoned
from testutil import random

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])  # bf16 runs through float32
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_forward_backward(rng, dtype, rate):
    x = random(rng, (64, 1000), low=0.5, high=1.5).astype(dtype)
    state = kernels.DropoutState(rate, seed=3)
    y, reserve = kernels.dropout_forward(dev(x), state, out=poisoned(x.shape, np.dtype(dtype)))
    rtol = 1e-2 if np.dtype(dtype) == BF16 else 2e-3
    yh = host(y)
    kept = yh != 0
    assert abs(1 - kept.mean() - rate) < 0.01
    np.testing.assert_allclose(yh[kept], x.astype(np.float64)[kept] / (1 - rate), rtol=rtol)
    dy = random(rng, x.shape, low=0.5, high=1.5).astype(dtype)
    dx = host(kernels.dropout_backward(dev(dy), reserve, state))
    assert np.array_equal(dx != 0, kept)
    np.testing.assert_allclose(dx[kept], dy.astype(np.float64)[kept] / (1 - rate), rtol=rtol)
    y2, _ = kernels.dropout_forward(dev(x), state)
    assert not np.array_equal(host(y2) != 0, kept), "the second forward reused the mask"


def test_dropout_rate_zero_is_identity(rng):
    x = random(rng, (10, 3)).astype(np.float32)
    state = kernels.DropoutState(0.0, seed=1)
    y, reserve = kernels.dropout_forward(dev(x), state)
    assert reserve is None and np.array_equal(host(y), x.astype(np.float64))
    assert np.array_equal(host(kernels.dropout_backward(dev(x), None, state)), x.astype(np.float64))
