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


def test_engine_raw_results_match_the_tensor_results_and_reach_on_leaf_as_arrays(rng):
    """``engine.gradient(..., raw=True)`` (the trainer's backward): the same gradients as raw arrays, a shared
    layer's weight summed over its applications (two raw deliveries to one leaf), ``on_leaf`` given the final
    array; a recorded-tensor source comes back raw too."""
    import numpy as np

    from dnnbind import layers
    from dnnbind.autodiff import Tensor, engine
    from dnnbind.ops._core import ones_like_seed

    dnnbind.mixed_precision.set_global_policy("float64")  # (finite differences below)
    try:
        _check_raw_results(rng, np, layers, Tensor, engine, ones_like_seed)
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")


def _check_raw_results(rng, np, layers, Tensor, engine, ones_like_seed):
    dnnbind.utils.set_random_seed(3)
    shared, head = layers.Dense(4, activation="tanh", name="shared_raw"), layers.Dense(2, name="head_raw")
    inp = dnnbind.Input((4,))
    model = dnnbind.Model(inp, head(shared(shared(inp))))
    x = random(rng, (5, 4))

    def run(raw):
        xt = ops.convert_to_tensor(x)
        with GradientTape() as tape:
            tape.watch(xt)
            h = ops.sin(xt)  # a recorded tensor: a source that is no leaf
            (out,) = model._run_forward([h], training=True, logits=[False])
            out = ops.multiply(out, out)
        reported = {}
        sources = list(model.trainable_weights) + [h]
        got = engine.gradient([out], [ones_like_seed(out)], sources, tape=tape, raw=raw,
                              on_leaf=lambda w, g: reported.setdefault(w.path, g))
        return got, reported

    as_tensors, _ = run(False)
    as_raw, reported = run(True)
    assert all(isinstance(g, Tensor) for g in as_tensors)
    assert all(isinstance(g, np.ndarray) for g in as_raw)
    for t, r in zip(as_tensors, as_raw):
        np.testing.assert_allclose(r, t.numpy(), rtol=1e-6)
    weights = model.trainable_weights
    assert sorted(reported) == sorted(w.path for w in weights)
    assert all(reported[w.path] is g for w, g in zip(weights, as_raw))
    # the shared kernel's gradient is the sum over both applications: against finite differences
    kernel = shared.kernel

    def loss():
        (out,) = model._run_forward([ops.sin(ops.convert_to_tensor(x))], training=False, logits=[False])
        return float(ops.sum(ops.multiply(out, out)))

    num = numerical_grad(loss, kernel.value)
    assert rel_error(as_raw[weights.index(kernel)], num) < 1e-4
