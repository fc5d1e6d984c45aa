"""Optimizers vs hand-computed Keras 3 updates, schedules, lookup by name, state export."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnbind import optimizers
from testutil import rel_error


def run(opt, p0, grads):
    p = p0.copy()
    for g in grads:
        opt.apply([p], [g.copy()])
    return p


@pytest.fixture
def data(rng):
    p0 = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(3)]
    return p0, grads


def test_sgd_momentum_nesterov_and_decay(data):
    p0, grads = data
    for momentum, nesterov, wd in [(0.0, False, None), (0.9, False, None), (0.9, True, 0.01)]:
        p, v = p0.astype(np.float64), np.zeros_like(p0, dtype=np.float64)
        lr = 0.1
        for g in grads:
            if wd:
                p = p - lr * wd * p
            if momentum:
                v = momentum * v - lr * g
                p = p + (momentum * v - lr * g if nesterov else v)
            else:
                p = p - lr * g
        got = run(optimizers.SGD(lr, momentum=momentum, nesterov=nesterov, weight_decay=wd), p0, grads)
        assert rel_error(got, p) < 1e-6, (momentum, nesterov, wd)


def adam_ref(p0, grads, lr, b1=0.9, b2=0.999, eps=1e-7, wd=0.0, amsgrad=False):
    p, m, v, vh = p0.astype(np.float64), 0.0, 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        p = p - lr * wd * p
        m = m + (g - m) * (1 - b1)
        v = v + (g * g - v) * (1 - b2)
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        vh = np.maximum(vh, v) if amsgrad else v
        p = p - lr_t * m / (np.sqrt(vh) + eps)
    return p


def test_adam_adamw(data):
    p0, grads = data
    assert rel_error(run(optimizers.Adam(0.01), p0, grads), adam_ref(p0, grads, 0.01)) < 1e-6
    assert rel_error(run(optimizers.AdamW(0.01), p0, grads), adam_ref(p0, grads, 0.01, wd=0.004)) < 1e-6
    assert optimizers.AdamW().weight_decay == 0.004
    assert rel_error(run(optimizers.Adam(0.01, amsgrad=True), p0, grads),
                     adam_ref(p0, grads, 0.01, amsgrad=True)) < 1e-6


@pytest.mark.parametrize("centered,momentum", [(False, 0.0), (True, 0.0), (False, 0.5), (True, 0.5)])
def test_rmsprop(data, centered, momentum):
    p0, grads = data
    lr, rho, eps = 0.01, 0.9, 1e-7
    p, v, a, mom = p0.astype(np.float64), 0.0, 0.0, 0.0
    for g in grads:
        v = rho * v + (1 - rho) * g * g
        denom = v
        if centered:
            a = rho * a + (1 - rho) * g
            denom = v - a * a
        inc = lr * g / np.sqrt(denom + eps)
        if momentum:
            mom = momentum * mom + inc
            p = p - mom
        else:
            p = p - inc
    got = run(optimizers.RMSprop(lr, rho=rho, momentum=momentum, centered=centered), p0, grads)
    assert rel_error(got, p) < 1e-5


def test_defaults_and_get():
    assert optimizers.SGD().learning_rate == pytest.approx(0.01)
    a = optimizers.Adam()
    assert (a.learning_rate, a.beta_1, a.beta_2, a.epsilon) == (pytest.approx(0.001), 0.9, 0.999, 1e-7)
    r = optimizers.RMSprop()
    assert (r.rho, r.momentum, r.epsilon, r.centered) == (0.9, 0.0, 1e-7, False)
    assert isinstance(optimizers.get("adam"), optimizers.Adam)
    assert isinstance(optimizers.get("AdamW"), optimizers.AdamW)
    with pytest.raises(ValueError, match="unknown optimizer 'adamax'.*adam, adamw, rmsprop, sgd"):
        optimizers.get("adamax")
    cfg = optimizers.serialize(optimizers.SGD(0.3, momentum=0.5))
    clone = optimizers.get(cfg)
    assert isinstance(clone, optimizers.SGD) and clone.momentum == 0.5 and clone.learning_rate == pytest.approx(0.3)


def test_schedules():
    s = optimizers.schedules
    e = s.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    assert e(0) == pytest.approx(0.1) and e(10) == pytest.approx(0.05) and e(5) == pytest.approx(0.1 * 0.5 ** 0.5)
    assert s.ExponentialDecay(0.1, 10, 0.5, staircase=True)(15) == pytest.approx(0.05)
    c = s.CosineDecay(1.0, decay_steps=100, alpha=0.1)
    assert c(0) == pytest.approx(1.0) and c(100) == pytest.approx(0.1) and c(50) == pytest.approx(0.55)
    assert c(1000) == pytest.approx(0.1)
    w = s.CosineDecay(0.0, 10, warmup_target=1.0, warmup_steps=5)
    assert w(0) == 0.0 and w(5) == pytest.approx(1.0) and w(15) == pytest.approx(0.0, abs=1e-12)
    pc = s.PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    assert [pc(0), pc(10), pc(11), pc(20), pc(21)] == [1.0, 1.0, 0.5, 0.5, 0.1]
    with pytest.raises(ValueError, match="len\\(values\\) == len\\(boundaries\\) \\+ 1"):
        s.PiecewiseConstantDecay([1], [1.0])


def test_schedule_drives_the_update(rng):
    """With a schedule, step t uses schedule(t) (Keras: the step count before the update)."""
    p0 = rng.normal(size=(4,)).astype(np.float32)
    g = np.ones(4, np.float32)
    sched = optimizers.schedules.PiecewiseConstantDecay([0], [1.0, 0.1])
    opt = optimizers.SGD(sched)
    p = run(opt, p0, [g, g, g])
    assert rel_error(p, p0 - (1.0 + 0.1 + 0.1)) < 1e-6
    assert opt.iterations == 3 and opt.learning_rate == pytest.approx(0.1)


def test_learning_rate_setter_and_state_round_trip(data):
    p0, grads = data
    opt = optimizers.Adam(0.01)
    p = run(opt, p0, grads[:2])
    opt.learning_rate = 0.02
    state = opt.get_state()
    assert state["iterations"] == 2 and set(state) == {"iterations", "0/m", "0/v"}
    clone = optimizers.Adam(0.02)
    clone.set_state(state, [p.copy()])
    a, b = p.copy(), p.copy()
    opt.apply([a], [grads[2]])
    clone.apply([b], [grads[2]])
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="learning_rate must be a finite number"):
        optimizers.SGD(float("nan"))
