"""NumPy optimizer updates against hand-computed Keras 3 formulas (two steps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnbind import ops


def _setup():
    p = np.array([1.0, -2.0, 0.5])
    g1 = np.array([0.1, -0.3, 0.2])
    g2 = np.array([-0.2, 0.1, 0.4])
    return p, g1, g2


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_two_steps(nesterov):
    p, g1, g2 = _setup()
    lr, mom, wd = 0.1, 0.9, 0.01
    params, vel = [p.copy()], [np.zeros(3)]
    ref_p, ref_v = p.copy(), np.zeros(3)
    for g in (g1, g2):
        ops.sgd_update(params, [g], vel, lr=np.asarray(lr), momentum=mom, nesterov=nesterov, weight_decay=wd)
        ref_p = ref_p - lr * wd * ref_p
        ref_v = mom * ref_v - lr * g
        ref_p = ref_p + (mom * ref_v - lr * g if nesterov else ref_v)
    np.testing.assert_allclose(params[0], ref_p, rtol=1e-14)
    np.testing.assert_allclose(vel[0], ref_v, rtol=1e-14)


def test_sgd_plain_and_grad_scale_and_skip():
    p, g1, _ = _setup()
    params = [p.copy()]
    ops.sgd_update(params, [g1 * 8], None, lr=0.5, grad_scale=8.0)
    np.testing.assert_allclose(params[0], p - 0.5 * g1, rtol=1e-14)
    before = params[0].copy()
    ops.sgd_update(params, [g1], None, lr=0.5, skip=np.asarray(1, np.int32))
    assert np.array_equal(params[0], before)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_two_steps(amsgrad):
    p, g1, g2 = _setup()
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-7, 0.004
    params, m, v = [p.copy()], [np.zeros(3)], [np.zeros(3)]
    vhat = [np.zeros(3)] if amsgrad else None
    rp, rm, rv, rvh = p.copy(), np.zeros(3), np.zeros(3), np.zeros(3)
    for t, g in enumerate((g1, g2), start=1):
        ops.adam_update(params, [g], m, v, lr=lr, step=np.asarray(t), beta1=b1, beta2=b2, epsilon=eps,
                        weight_decay=wd, amsgrad=amsgrad, vhat=vhat)
        rp = rp - lr * wd * rp
        rm = rm + (g - rm) * (1 - b1)
        rv = rv + (g * g - rv) * (1 - b2)
        rvh = np.maximum(rvh, rv)
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        rp = rp - lr_t * rm / (np.sqrt(rvh if amsgrad else rv) + eps)
    np.testing.assert_allclose(params[0], rp, rtol=1e-14)
    np.testing.assert_allclose(m[0], rm, rtol=1e-14)
    np.testing.assert_allclose(v[0], rv, rtol=1e-14)


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_rmsprop_two_steps(centered, momentum):
    p, g1, g2 = _setup()
    lr, rho, eps = 0.01, 0.9, 1e-7
    params, sq = [p.copy()], [np.zeros(3)]
    mom, avg = [np.zeros(3)], [np.zeros(3)]
    rp, rs, rmom, ravg = p.copy(), np.zeros(3), np.zeros(3), np.zeros(3)
    for g in (g1, g2):
        ops.rmsprop_update(params, [g], sq, lr=lr, rho=rho, momentum=momentum, epsilon=eps, centered=centered,
                           mom=mom, avg=avg)
        rs = rho * rs + (1 - rho) * g * g
        denom = rs
        if centered:
            ravg = rho * ravg + (1 - rho) * g
            denom = rs - ravg * ravg
        inc = lr * g / np.sqrt(denom + eps)
        if momentum:
            rmom = momentum * rmom + inc
            rp = rp - rmom
        else:
            rp = rp - inc
    np.testing.assert_allclose(params[0], rp, rtol=1e-13)
    np.testing.assert_allclose(sq[0], rs, rtol=1e-14)


def test_float16_grads_update_float32_params():
    params = [np.ones(4, np.float32)]
    ops.sgd_update(params, [np.full(4, 0.5, np.float16)], None, lr=0.1)
    np.testing.assert_allclose(params[0], 0.95, rtol=1e-7)
    assert params[0].dtype == np.float32


def test_validation():
    p = [np.ones(3, np.float32)]
    with pytest.raises(ValueError, match=r"adam_update: m\[0\] has shape \(2,\) but params\[0\] has \(3,\)"):
        ops.adam_update(p, [np.ones(3, np.float32)], [np.zeros(2, np.float32)], [np.zeros(3, np.float32)], lr=0.1,
                        step=1)
    with pytest.raises(ValueError, match="sgd_update: grads has 2 entries but params has 1"):
        ops.sgd_update(p, [np.ones(3, np.float32)] * 2, None, lr=0.1)
    with pytest.raises(ValueError, match="sgd_update: momentum=0.9 needs velocities"):
        ops.sgd_update(p, [np.ones(3, np.float32)], None, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="adam_update: step must be >= 1"):
        ops.adam_update(p, [np.ones(3, np.float32)], [np.zeros(3, np.float32)], [np.zeros(3, np.float32)], lr=0.1,
                        step=0)
