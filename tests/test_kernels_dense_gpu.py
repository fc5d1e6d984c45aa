"""CUDA dense/matmul (cuBLAS) vs the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels import config
from gpu_errlog import PRECISIONS, check, dev, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("x_shape, n_out", [((1, 7), 5), ((33, 17), 9), ((4, 3, 20), 13), ((128, 784), 10)])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_forward_and_backward(rng, label, dtype, overrides, x_shape, n_out, bias):
    x = quantize(random(rng, x_shape), dtype)
    w = quantize(random(rng, (x_shape[-1], n_out)), dtype)
    b = quantize(random(rng, (n_out,)), dtype) if bias else None
    dy = quantize(random(rng, x_shape[:-1] + (n_out,)), dtype)
    with config.override(**overrides):
        y = kernels.dense_forward(dev(x, dtype), dev(w, dtype), None if b is None else dev(b, dtype),
                              out=poisoned(x_shape[:-1] + (n_out,), dtype))
        dx = kernels.dense_backward_input(dev(dy, dtype), dev(w, dtype), out=poisoned(x_shape, dtype))
        dw = kernels.dense_backward_weight(dev(x, dtype), dev(dy, dtype), out=poisoned(w.shape, dtype))
    case = f"x{x_shape} out{n_out} bias={bias}"
    check("dense_forward", label, y, kernels.dense_forward(x, w, b), case)
    check("dense_backward_input", label, dx, kernels.dense_backward_input(dy, w), case)
    check("dense_backward_weight", label, dw, kernels.dense_backward_weight(x, dy), case)


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_transposes_alpha_beta(rng, label, dtype, overrides, ta, tb):
    m, k, n = 7, 11, 5
    a = quantize(random(rng, (k, m) if ta else (m, k)), dtype)
    b = quantize(random(rng, (n, k) if tb else (k, n)), dtype)
    c0 = quantize(random(rng, (m, n)), dtype)
    ref = kernels.matmul(a, b, transpose_a=ta, transpose_b=tb, alpha=0.5, beta=2.0, out=c0.copy())
    out = dev(c0, dtype)
    with config.override(**overrides):
        got = kernels.matmul(dev(a, dtype), dev(b, dtype), transpose_a=ta, transpose_b=tb, alpha=0.5, beta=2.0, out=out)
    check("matmul", label, got, ref, f"ta={ta} tb={tb}")
