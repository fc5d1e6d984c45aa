"""keras.losses and keras.metrics on DeviceArrays vs the same on NumPy: every loss class (values and the
gradient through the tape) and the metrics with device state (weighted means, confusion counts, IoU,
F-scores, R2), plus weighted_metrics in a CUDA-graph fit."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import losses, metrics, ops
from dnnbind.autodiff import GradientTape
from gpu_errlog import dev, host

from losses_aux import inputs
from test_losses_keras import CASES as LOSS_CASES
from test_losses_keras import _kw
from test_metrics_keras import CASES as METRIC_CASES
from test_metrics_keras import _args, _data

pytestmark = pytest.mark.gpu


def _loss_and_grad(loss, yt, yp, w, to):
    t = ops.convert_to_tensor(to(yp))
    with GradientTape() as tape:
        tape.watch(t)
        value = loss(to(yt), t, sample_weight=to(w))
        total = ops.sum(value)
    (grad,) = tape.gradient(total, [t])
    return value, grad


@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_on_device_matches_numpy(case):
    label, cls, ckw, _, _, key = case
    data = inputs()
    yt, yp, w = data[key + "/t"], data[key + "/p"], data[key + "/w"]
    for red in ("sum_over_batch_size", "sum", "none"):
        loss = getattr(losses, cls)(reduction=red, **_kw(ckw))
        dnnbind.backend.set_default_device("cpu")  # the NumPy reference: constants (eye, full) on the host too
        try:
            want, want_grad = _loss_and_grad(loss, yt, yp, w, np.asarray)
        finally:
            dnnbind.backend.set_default_device(None)
        got, grad = _loss_and_grad(loss, yt, yp, w, dev)
        assert dnnbind.backend.is_device_array(got.data) and dnnbind.backend.is_device_array(grad.data), label
        np.testing.assert_allclose(host(got.data), np.asarray(want, np.float64), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{label} {red}")
        np.testing.assert_allclose(host(grad.data), np.asarray(want_grad, np.float64), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{label} {red} gradient")


@pytest.mark.parametrize("case", METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_metric_on_device_matches_numpy(case):
    label, cls, kw, key = case
    d = _data()
    yt, yp, w = d[key + "/t"], d[key + "/p"], d[key + "/w"]
    results = []
    for device, to in (("cpu", np.asarray), ("cuda:0", dev)):
        # the metric's variables live on the default device: the NumPy reference runs with the CPU as default
        dnnbind.backend.set_default_device(device)
        try:
            m = getattr(metrics, cls)(**kw)
            m.update_state(*_args(cls, to(yt[:3]), to(yp[:3])), sample_weight=to(w[:3]))
            m.update_state(*_args(cls, to(yt[3:]), to(yp[3:])), sample_weight=to(w[3:]))
            r = m.result()
            on_device = dnnbind.backend.is_device_array(getattr(r, "data", None))
            assert on_device == (device != "cpu"), label
            results.append(host(r.data) if on_device else np.asarray(r, np.float64))
        finally:
            dnnbind.backend.set_default_device(None)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6, err_msg=label)


def test_weighted_metrics_in_a_graph_fit_match_eager():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = rng.integers(0, 4, size=(64,))
    w = rng.uniform(0.2, 2.0, size=(64,)).astype(np.float32)
    logs = []
    for jit in (False, True):
        dnnbind.utils.set_random_seed(3)
        model = dnnbind.Sequential([dnnbind.Input((8,)), dnnbind.layers.Dense(4, activation="softmax")])
        model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"],
                      weighted_metrics=["accuracy", "sparse_categorical_crossentropy"],
                      jit_compile=jit)
        logs.append(model.fit(x, y, sample_weight=w, batch_size=16, epochs=2, verbose=0).history)
    for key in logs[0]:
        np.testing.assert_allclose(logs[1][key], logs[0][key], rtol=1e-5, err_msg=key)
