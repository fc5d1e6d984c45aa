"""Regressions of the ops machinery (``dnnbind/ops/_core.py``, ``_matmul.py``) that the nn family met."""

from __future__ import annotations

import pytest

import dnnbind
from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import numeric as N
from dnnbind.ops._core import filled
from testutil import numerical_grad, random, rel_error


@pytest.fixture(autouse=True)
def _cpu():
    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)


def test_an_operand_that_is_a_filled_tensor_is_not_made(rng, monkeypatch):
    """``tensors()`` looks for the operands' device without reading a FilledTensor's data, so ``x * filled``
    stays one scale kernel (and ``x * ones`` none): no fill."""
    x = ops.convert_to_tensor(random(rng, (3, 4)))
    calls = []
    original = N.full
    monkeypatch.setattr(N, "full", lambda *a, **k: calls.append(a) or original(*a, **k))
    assert ops.multiply(x, filled(1.0, (3, 4), x.dtype, x.device)) is x
    y = ops.multiply(x, filled(0.5, (3, 4), x.dtype, x.device))
    assert calls == [] and rel_error(y, x.numpy() * 0.5) == 0


def test_second_derivative_through_matmul_with_transposed_operands(rng):
    a, b = random(rng, (3, 4)), random(rng, (4, 2))

    def penalty(at, bt):
        with GradientTape() as tape:
            tape.watch(at)
            y = ops.sum(ops.sin(ops.matmul(at, bt)))
        return ops.sum(ops.square(tape.gradient(y, at)))

    at, bt = ops.convert_to_tensor(a), ops.convert_to_tensor(b)
    with GradientTape() as outer:
        outer.watch(bt)
        p = penalty(at, bt)
    grad = outer.gradient(p, bt)
    num = numerical_grad(lambda: float(penalty(ops.convert_to_tensor(a), ops.convert_to_tensor(b))), b)
    assert rel_error(grad, num) < 1e-7
