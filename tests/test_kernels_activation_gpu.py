"""CUDA activations (NVRTC kernels, and cuDNN behind CUDNN_ACTIVATIONS) vs the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels._cuda.activation import CUDNN_KINDS
from cases import ACTIVATION_CASES
from gpu_errlog import DTYPES, check, dev, dev_offset, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind, alpha", ACTIVATION_CASES)
@pytest.mark.parametrize("shape", [(3, 5, 7, 2), (1000,), (1, 1)])
def test_activation_forward_backward(rng, label, dtype, kind, alpha, shape):
    x = quantize(random(rng, shape, low=-4, high=4), dtype)
    dy = quantize(random(rng, shape), dtype)
    y_ref = kernels.activation_forward(x, kind, alpha=alpha)
    dx_ref = kernels.activation_backward(dy, x, y_ref, kind, alpha=alpha)
    xd = dev(x, dtype)
    y = kernels.activation_forward(xd, kind, alpha=alpha, out=poisoned(shape, dtype))
    dx = kernels.activation_backward(dev(dy, dtype), xd, y, kind, alpha=alpha)
    tol = 1e-6 if label == "float32" else None
    check("activation_forward", label, y, y_ref, f"{kind} {shape}", tol=tol)
    # cuDNN's backward reads y as stored in `dtype` (sigmoid's y(1-y) and tanh's 1-y^2 cancel badly
    # when y is rounded to bfloat16), so the reference gradient is taken at the same stored y.
    dx_ref = kernels.activation_backward(dy, x, y.to_host().astype(np.float64), kind, alpha=alpha)
    check("activation_backward", label, dx, dx_ref, f"{kind} {shape}", tol=1e-5 if label == "float32" else None)


def test_activation_in_place_and_float64_kernels(rng):
    x = random(rng, (50,), low=-3, high=3)
    xd = dev(x)
    kernels.activation_forward(xd, "gelu", out=xd)
    check("activation_forward", "float64", xd, kernels.activation_forward(x, "gelu"), "gelu f64 in place", tol=1e-12)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind, alpha", ACTIVATION_CASES)
def test_activation_kernels_misaligned_arrays_take_the_scalar_path(rng, label, dtype, kind, alpha):
    """x and dy one element past a 16-byte boundary: every element done one by one, same numbers."""
    shape = (203,)
    x = quantize(random(rng, shape, low=-4, high=4), dtype)
    dy = quantize(random(rng, shape), dtype)
    xd = dev_offset(x, 1, dtype)
    y = kernels.activation_forward(xd, kind, alpha=alpha, out=poisoned(shape, dtype))
    y_ref = kernels.activation_forward(x, kind, alpha=alpha)
    dx = kernels.activation_backward(dev_offset(dy, 1, dtype), xd, y, kind, alpha=alpha)
    dx_ref = kernels.activation_backward(dy, x, host(y), kind, alpha=alpha)
    tol = 1e-6 if label == "float32" else None
    check("activation_forward", label, y, y_ref, f"{kind} misaligned", tol=tol)
    check("activation_backward", label, dx, dx_ref, f"{kind} misaligned", tol=1e-5 if label == "float32" else None)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind", ["relu", "gelu"])
def test_activation_kernels_large_arrays_stride_the_grid_and_run_in_place(rng, label, dtype, kind):
    """More elements than one pass of the capped grid (32 blocks of 256 per SM, 8 bf16 a thread on
    an H200: ~8.7M) and a tail of 5; the forward in place over x."""
    n = 9_000_005
    x = quantize(random(rng, (n,), low=-4, high=4), dtype)
    dy = quantize(random(rng, (n,)), dtype)
    y_ref = kernels.activation_forward(x, kind)
    dx_ref = kernels.activation_backward(dy, x, y_ref, kind)
    xd = dev(x, dtype)
    dx = kernels.activation_backward(dev(dy, dtype), xd, xd, kind)  # before xd is overwritten below
    kernels.activation_forward(xd, kind, out=xd)
    tol = 1e-6 if label == "float32" else None
    check("activation_forward", label, xd, y_ref, f"{kind} {n} in place", tol=tol)
    check("activation_backward", label, dx, dx_ref, f"{kind} {n}", tol=1e-5 if label == "float32" else None)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind, alpha", ACTIVATION_CASES)
def test_activation_forward_propagates_nan(label, dtype, kind, alpha):
    """A NaN input gives a NaN output for every kind (cuDNN's PROPAGATE_NAN, NumPy's arithmetic);
    the other elements are unchanged (the reference takes only those: its erf table cannot index NaN)."""
    x = np.array([-2.0, np.nan, 0.5, 3.0, np.nan, -0.25, 1.0, 2.0, np.nan], dtype=np.float64)
    y = host(kernels.activation_forward(dev(x, dtype), kind, alpha=alpha, out=poisoned(x.shape, dtype)))
    finite = ~np.isnan(x)
    assert np.array_equal(np.isnan(y), ~finite), f"{kind}: NaN at {np.isnan(y)}"
    check("activation_forward", label, y[finite], kernels.activation_forward(x[finite], kind, alpha=alpha),
          f"{kind} with NaN", tol=1e-6 if label == "float32" else None)


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(CUDNN_KINDS))
def test_activation_cudnn_route_behind_the_switch_matches_the_kernels(rng, monkeypatch, label, dtype, kind):
    """CUDNN_ACTIVATIONS = True (cudnnActivationForward/Backward, kept for comparison) gives the
    reference's numbers too (bfloat16 clipped_relu stays on its kernel)."""
    from dnnbind.kernels._cuda import activation

    shape = (3, 5, 7, 2)
    x = quantize(random(rng, shape, low=-4, high=4), dtype)
    dy = quantize(random(rng, shape), dtype)
    xd = dev(x, dtype)
    y_kernel = host(kernels.activation_forward(xd, kind))
    monkeypatch.setattr(activation, "CUDNN_ACTIVATIONS", True)
    y = kernels.activation_forward(xd, kind, out=poisoned(shape, dtype))
    dx = kernels.activation_backward(dev(dy, dtype), xd, y, kind)
    tol = 1e-6 if label == "float32" else None
    check("activation_forward", label, y, kernels.activation_forward(x, kind), f"{kind} cudnn", tol=tol)
    check("activation_forward", label, y, y_kernel, f"{kind} cudnn vs kernel", tol=tol)
    dx_ref = kernels.activation_backward(dy, x, host(y), kind)
    check("activation_backward", label, dx, dx_ref, f"{kind} cudnn", tol=1e-5 if label == "float32" else None)
