"""kernels.spatial_dropout_* on NumPy: one mask per (sample, channel), scaling, backward with the same
mask, seeded reproducibility, argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels, utils
from testutil import random


def _mask(y, x, layout):
    ratio = y / x
    return ratio[:, :, 0, 0] if layout == "NCHW" else ratio[:, 0, 0, :]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_one_draw_per_sample_and_channel_scaled(rng, layout):
    shape = (16, 5, 4, 32) if layout == "NHWC" else (16, 32, 5, 4)
    x = random(rng, shape, low=0.5, high=1.5)  # never zero: y / x recovers the mask
    state = kernels.DropoutState(0.25, seed=3)
    y, reserve = kernels.spatial_dropout_forward(x, state, layout=layout)
    m = _mask(y, x, layout)
    full = m[:, :, None, None] if layout == "NCHW" else m[:, None, None, :]
    assert np.allclose(y, x * full)  # the same factor at every spatial position
    assert set(np.round(np.unique(m), 12)) <= {0.0, round(1 / 0.75, 12)}
    assert 0.15 < np.mean(m == 0) < 0.35  # 512 draws at rate 0.25
    assert reserve.shape == (16, 32) and np.allclose(reserve, m)
    dy = random(rng, shape)
    dx = kernels.spatial_dropout_backward(dy, reserve, layout=layout)
    assert np.allclose(dx, dy * full)


def test_seeded_states_repeat_and_fresh_masks_per_call(rng):
    x = random(rng, (8, 3, 3, 16), low=0.5, high=1.5)
    a, b = kernels.DropoutState(0.5, seed=11), kernels.DropoutState(0.5, seed=11)
    ya1, _ = kernels.spatial_dropout_forward(x, a)
    yb1, _ = kernels.spatial_dropout_forward(x, b)
    ya2, _ = kernels.spatial_dropout_forward(x, a)
    assert np.array_equal(ya1, yb1) and not np.array_equal(ya1, ya2)
    utils.set_random_seed(5)
    c = kernels.DropoutState(0.5)
    utils.set_random_seed(5)
    d = kernels.DropoutState(0.5)
    assert c.seed == d.seed


def test_rate_zero_and_low_precision(rng):
    x = random(rng, (2, 3, 3, 4)).astype(np.float16)
    y, reserve = kernels.spatial_dropout_forward(x, kernels.DropoutState(0.0, seed=1))
    assert reserve is None and np.array_equal(y, x) and y is not x
    y, reserve = kernels.spatial_dropout_forward(x, kernels.DropoutState(0.5, seed=1))
    assert y.dtype == np.float16 and reserve.dtype == np.float32
    assert np.array_equal(kernels.spatial_dropout_backward(x, None), x)


def test_bad_arguments(rng):
    x = random(rng, (2, 3, 3, 4))
    state = kernels.DropoutState(0.5, seed=1)
    with pytest.raises(TypeError, match="state must be a dnnbind.kernels.DropoutState"):
        kernels.spatial_dropout_forward(x, 0.5)
    with pytest.raises(ValueError, match="x must be 4-d"):
        kernels.spatial_dropout_forward(x[0], state)
    _, reserve = kernels.spatial_dropout_forward(x, state)
    with pytest.raises(ValueError, match="reserve has shape \\(2, 4\\) and dtype float64, expected \\(2, 3\\)"):
        kernels.spatial_dropout_backward(x, reserve, layout="NCHW")
