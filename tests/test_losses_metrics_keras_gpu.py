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


@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_on_device_matches_numpy(case):
    label, cls, ckw, _, _, key = case
    data = inputs()
    yt, yp, w = data[key + "/t"], data[key + "/p"], data[key + "/w"]
    for red in ("sum_over_batch_size", "sum", "none"):
        loss = getattr(losses, cls)(reduction=red, **_kw(ckw))
        want = np.asarray(loss(yt, yp, sample_weight=w), np.float64)
        t = ops.convert_to_tensor(dev(yp))
        with GradientTape() as tape:
            tape.watch(t)
            got = loss(dev(yt), t, sample_weight=dev(w))
            total = ops.sum(got)
        (grad,) = tape.gradient(total, [t])
        assert dnnbind.backend.is_device_array(got.data), label
        np.testing.assert_allclose(host(got.data), want, rtol=1e-4, atol=1e-5, err_msg=f"{label} {red}")
        ref = ops.convert_to_tensor(yp)
        with GradientTape() as tape:
            tape.watch(ref)
            ref_total = ops.sum(loss(yt, ref, sample_weight=w))
        (ref_grad,) = tape.gradient(ref_total, [ref])
        np.testing.assert_allclose(host(grad.data), np.asarray(ref_grad, np.float64), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{label} {red} gradient")


@pytest.mark.parametrize("case", METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_metric_on_device_matches_numpy(case):
    label, cls, kw, key = case
    d = _data()
    yt, yp, w = d[key + "/t"], d[key + "/p"], d[key + "/w"]
    results = []
    for to in (np.asarray, dev):
        m = getattr(metrics, cls)(**kw)
        m.update_state(*_args(cls, to(yt[:3]), to(yp[:3])), sample_weight=to(w[:3]))
        m.update_state(*_args(cls, to(yt[3:]), to(yp[3:])), sample_weight=to(w[3:]))
        r = m.result()
        results.append(host(r.data) if dnnbind.backend.is_device_array(getattr(r, "data", None))
                       else np.asarray(r, np.float64))
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
