"""NumPy activations: forward against direct formulas, backward against finite differences (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels.activation import erf
from cases import ACTIVATION_CASES
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7


def reference(kind, x, alpha):
    sig = 1 / (1 + np.exp(-x))
    phi = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x.ravel()]).reshape(x.shape))
    return {
        "relu": np.maximum(x, 0),
        "sigmoid": sig,
        "tanh": np.tanh(x),
        "elu": np.where(x > 0, x, (alpha or 1.0) * (np.exp(x) - 1)),
        "clipped_relu": np.minimum(np.maximum(x, 0), alpha or 6.0),
        "swish": x * sig,
        "gelu": x * phi,
        "gelu_tanh": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
        "leaky_relu": np.where(x > 0, x, (alpha or 0.2) * x),
        "softplus": np.log(1 + np.exp(x)),
        "linear": x,
    }[kind]


def _input(rng, shape=(2, 3, 4)):
    x = random(rng, shape, low=-3, high=3)
    # keep finite differences away from the kinks (0 and the clipped_relu ceilings)
    x[np.abs(x) < 1e-3] = 0.5
    for c in (1.5, 6.0):
        x[np.abs(x - c) < 1e-3] = 0.7
    return x


@pytest.mark.parametrize("kind, alpha", ACTIVATION_CASES)
def test_forward_matches_formula(rng, kind, alpha):
    x = _input(rng) * 3  # reach the clipped_relu ceiling of 6
    y = kernels.activation_forward(x, kind, alpha=alpha)
    assert y.dtype == x.dtype and rel_error(y, reference(kind, x, alpha)) < 1e-14


@pytest.mark.parametrize("kind, alpha", ACTIVATION_CASES)
def test_backward_finite_differences(rng, kind, alpha):
    x = _input(rng)
    if kind == "clipped_relu":
        x *= 1.0 if alpha else 3.0
    g = random(rng, x.shape)
    y = kernels.activation_forward(x, kind, alpha=alpha)
    dx = kernels.activation_backward(g, x, y, kind, alpha=alpha)
    num = numerical_grad(lambda: float(np.sum(g * kernels.activation_forward(x, kind, alpha=alpha))), x)
    assert rel_error(dx, num) < FD_TOL


def test_erf_is_float64_accurate():
    x = np.linspace(-7, 7, 20001)
    ref = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(erf(x) - ref)) < 5e-16


def test_sigmoid_and_softplus_are_stable_for_large_inputs():
    x = np.array([-800.0, -40.0, 0.0, 40.0, 800.0])
    s = kernels.activation_forward(x, "sigmoid")
    assert np.all(np.isfinite(s)) and s[0] == 0 and s[-1] == 1 and s[2] == 0.5
    sp = kernels.activation_forward(x, "softplus")
    assert np.all(np.isfinite(sp)) and sp[-1] == 800.0


def test_in_place_and_low_precision(rng):
    x = random(rng, (3, 5), np.float32)
    expected = np.maximum(x, 0)
    r = kernels.activation_forward(x, "relu", out=x)
    assert r is x and np.array_equal(x, expected)
    h = random(rng, (3, 5), np.float16)
    y = kernels.activation_forward(h, "gelu")
    assert y.dtype == np.float16
    assert rel_error(y, reference("gelu", h.astype(np.float64), None)) < 1e-3


def test_validation():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="activation_forward: unknown activation 'mish'"):
        kernels.activation_forward(x, "mish")
    with pytest.raises(ValueError, match="activation_forward: activation 'relu' takes no alpha"):
        kernels.activation_forward(x, "relu", alpha=0.1)
    with pytest.raises(ValueError, match=r"activation_backward: y has shape \(2, 3\)"):
        kernels.activation_backward(x, x, np.ones((2, 3), np.float32), "relu")
    assert kernels.activation_forward(x, "SiLU").dtype == np.float32  # aliases are case-insensitive
