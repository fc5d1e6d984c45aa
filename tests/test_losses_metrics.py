"""Losses and metrics vs NumPy references; name lookup; Keras's choice of accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import losses, metrics, utils

_AUC_CASES = [{}, {"curve": "PR"}, {"summation_method": "minoring"}, {"curve": "PR", "summation_method": "majoring"},
              {"num_thresholds": 7}, {"thresholds": [0.3, 0.1, 0.8]}, {"from_logits": True}]

_AUC_SCRIPT = r"""
import json, sys
import numpy as np
import keras
d = dict(np.load(sys.argv[1] + "/in.npz"))
cases = json.loads(sys.argv[2])
out = []
for kw in cases:
    m = keras.metrics.AUC(**kw)
    m.update_state(d["y1"], d["p1"] if not kw.get("from_logits") else d["z1"], sample_weight=d["w1"])
    m.update_state(d["y2"], d["p2"] if not kw.get("from_logits") else d["z2"])
    out.append(float(m.result()))
json.dump(out, open(sys.argv[1] + "/out.json", "w"))
"""


def softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_crossentropies(rng):
    z = rng.normal(size=(6, 4)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    oh = utils.to_categorical(y, 4)
    p = softmax(z.astype(np.float64))
    ref = -np.mean(np.log(p[np.arange(6), y]))
    assert float(losses.SparseCategoricalCrossentropy(from_logits=True)(y, z)) == pytest.approx(ref, rel=1e-5)
    assert float(losses.SparseCategoricalCrossentropy()(y, p.astype(np.float32))) == pytest.approx(ref, rel=1e-5)
    assert float(losses.CategoricalCrossentropy(from_logits=True)(oh, z)) == pytest.approx(ref, rel=1e-5)
    # the functional forms return per-sample losses (Keras 3)
    assert float(np.mean(losses.categorical_crossentropy(oh, p.astype(np.float32)))) == pytest.approx(ref, rel=1e-5)
    ls = 0.1
    smooth = oh * (1 - ls) + ls / 4
    ref_ls = -np.mean((smooth * np.log(p)).sum(1))
    got = losses.CategoricalCrossentropy(from_logits=True, label_smoothing=ls)(oh, z)
    assert float(got) == pytest.approx(ref_ls, rel=1e-5)
    # the gradient is (softmax - y) / N
    _, grad = losses.SparseCategoricalCrossentropy(from_logits=True).compute(z, y.astype(np.int32))
    assert np.allclose(grad, (p - oh) / 6, atol=1e-6)


def test_binary_crossentropy_and_mse(rng):
    p = rng.uniform(0.05, 0.95, size=(8, 1)).astype(np.float32)
    t = rng.integers(0, 2, size=(8, 1)).astype(np.float32)
    ref = -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))
    assert float(losses.BinaryCrossentropy()(t, p)) == pytest.approx(ref, rel=1e-5)
    logits = np.log(p / (1 - p))
    assert float(losses.BinaryCrossentropy(from_logits=True)(t, logits)) == pytest.approx(ref, rel=1e-4)
    a, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(losses.mse(a, b)), np.mean((a - b) ** 2, axis=-1), rtol=1e-5)
    assert float(losses.MeanSquaredError()(a, b)) == pytest.approx(np.mean((a - b) ** 2), rel=1e-5)


def test_loss_lookup():
    assert isinstance(losses.get("mse"), losses.MeanSquaredError)
    assert isinstance(losses.get("sparse_categorical_crossentropy"), losses.SparseCategoricalCrossentropy)
    assert isinstance(losses.get("CategoricalCrossentropy"), losses.CategoricalCrossentropy)
    assert isinstance(losses.get(losses.binary_crossentropy), losses.BinaryCrossentropy)
    with pytest.raises(ValueError, match="unknown loss 'hingee'.*sparse_categorical_crossentropy"):
        losses.get("hingee")
    cfg = losses.serialize(losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2))
    clone = losses.get(cfg)
    assert clone.from_logits and clone.label_smoothing == 0.2


def test_label_checks():
    scce = losses.SparseCategoricalCrossentropy()
    assert scce.prepare_labels(np.array([[1], [2]]), (3,)).shape == (2,)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[0, 5\]"):
        scce.prepare_labels(np.array([0, 5]), (3,))
    with pytest.raises(ValueError, match="categorical_crossentropy"):
        scce.prepare_labels(np.eye(3), (3,))
    with pytest.raises(ValueError, match="one-hot of shape \\(batch, 3\\)"):
        losses.CategoricalCrossentropy().prepare_labels(np.array([0, 1]), (3,))
    # regression: noisy labels past 1 (keras-io's DCGAN adds 0.05 * U(0, 1) to its ones) were refused; Keras
    # takes them and so does dnnbind, with Keras's formula
    bce = losses.BinaryCrossentropy()
    noisy = np.array([[1.04], [0.02], [1.0], [0.0]], np.float32)
    np.testing.assert_array_equal(bce.prepare_labels(noisy, (1,)), noisy)
    p = np.array([[0.9], [0.2], [0.6], [0.3]], np.float32)
    want = np.mean(-noisy * np.log(p) - (1 - noisy) * np.log(1 - p))
    np.testing.assert_allclose(float(np.asarray(bce(noisy, p))), want, rtol=1e-5)


def test_accuracy_metrics(rng):
    scores = rng.normal(size=(10, 5)).astype(np.float32)
    y = rng.integers(0, 5, 10)
    y[:4] = scores[:4].argmax(1)
    want = np.mean(scores.argmax(1) == y)
    m = metrics.SparseCategoricalAccuracy()
    m.update_state(y[:6].astype(np.int32), scores[:6])
    m.update_state(y[6:].astype(np.int32), scores[6:])
    assert m.result() == pytest.approx(want)
    c = metrics.CategoricalAccuracy()
    c.update_state(utils.to_categorical(y, 5), scores)
    assert c.result() == pytest.approx(want)
    c.reset_state()
    assert c.result() == 0.0
    top = metrics.SparseTopKCategoricalAccuracy(k=2)
    top.update_state(y.astype(np.int32), scores)
    ranks = (scores > scores[np.arange(10), y][:, None]).sum(1)
    assert top.result() == pytest.approx(np.mean(ranks < 2))
    topc = metrics.TopKCategoricalAccuracy(k=3)
    topc.update_state(utils.to_categorical(y, 5), scores)
    assert topc.result() == pytest.approx(np.mean(ranks < 3))
    b = metrics.BinaryAccuracy()
    pb = np.array([[0.2], [0.7], [0.5], [0.9]], np.float32)
    tb = np.array([[0.0], [1.0], [1.0], [0.0]], np.float32)
    b.update_state(tb, pb)
    assert b.result() == pytest.approx(0.5)  # 0.5 is not > 0.5


@pytest.mark.parametrize("thresholds", [None, 0.3, [0.0, 0.25, 0.5, 0.9]])
def test_confusion_matrix_metrics(rng, thresholds, cpu):
    """TP/FP/TN/FN, Precision, Recall: Keras 3's counts (pred > threshold, label != 0), weighted, over
    several updates; a float threshold gives a scalar, a list one value per threshold."""
    ts = [0.5] if thresholds is None else (thresholds if isinstance(thresholds, list) else [thresholds])
    batches = [(rng.integers(0, 2, size=(7, 1)), rng.uniform(size=(7, 1)).astype(np.float32), rng.uniform(size=7))
               for _ in range(3)]
    want = {k: np.zeros(len(ts)) for k in ("tp", "fp", "tn", "fn")}
    for y, p, w in batches:
        for i, t in enumerate(ts):
            pos, lab = p[:, 0] > t, y[:, 0] != 0
            want["tp"][i] += (w * (pos & lab)).sum()
            want["fp"][i] += (w * (pos & ~lab)).sum()
            want["tn"][i] += (w * (~pos & ~lab)).sum()
            want["fn"][i] += (w * (~pos & lab)).sum()
    made = {"tp": metrics.TruePositives(thresholds), "fp": metrics.FalsePositives(thresholds),
            "tn": metrics.TrueNegatives(thresholds), "fn": metrics.FalseNegatives(thresholds),
            "precision": metrics.Precision(thresholds), "recall": metrics.Recall(thresholds)}
    for m in made.values():
        for y, p, w in batches:
            m.update_state(y, p, sample_weight=w)
    want["precision"] = want["tp"] / (want["tp"] + want["fp"])
    want["recall"] = want["tp"] / (want["tp"] + want["fn"])
    for k, m in made.items():
        got = np.asarray(m.result().data)
        assert got.shape == (() if not isinstance(thresholds, list) else (len(ts),)), k
        np.testing.assert_allclose(got.reshape(-1), want[k], rtol=1e-5, err_msg=k)
    assert made["precision"].name == "precision" and made["fn"].name == "false_negatives"
    made["tp"].reset_state()
    assert not np.asarray(made["tp"].result().data).any()
    assert type(metrics.get("recall")) is metrics.Recall
    assert metrics.Precision.__name__ in [metrics.serialize(made["precision"])["class_name"]]
    # no positive prediction yet: precision is 0, not NaN (divide_no_nan, as Keras)
    assert float(metrics.Precision().result().data) == 0.0
    with pytest.raises(ValueError, match="Precision 'precision': thresholds must be"):
        metrics.Precision(thresholds=1.5)
    with pytest.raises(NotImplementedError, match="top_k and class_id"):
        metrics.Recall(top_k=2)


def test_regression_functions_and_metrics(rng, cpu):
    """mean_squared_error / mean_absolute_error squeeze (N,) labels against (N, 1) outputs, as Keras 3 (they
    used to broadcast to (N, N)); the MeanSquaredError/MeanAbsoluteError metrics ("mse"/"mae") average them."""
    y = rng.normal(size=6).astype(np.float32)
    p = rng.normal(size=(6, 1)).astype(np.float32)
    d = y - p[:, 0]
    np.testing.assert_allclose(np.asarray(losses.mean_squared_error(y, p).data), d ** 2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.mae(y, p).data), np.abs(d), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.mean_absolute_error(p, p[:, 0]).data), np.zeros(6), atol=0)
    w = rng.uniform(size=6)
    for name, want, cls in [("mse", d ** 2, metrics.MeanSquaredError), ("mae", np.abs(d), metrics.MeanAbsoluteError)]:
        m = metrics.get(name)
        assert type(m) is cls and m.name == name
        m.update_state(y[:3], p[:3])
        m.update_state(y[3:], p[3:])
        assert float(m.result().data) == pytest.approx(want.mean(), rel=1e-5)
        weighted = cls()
        weighted.update_state(y, p, sample_weight=w)
        assert float(weighted.result().data) == pytest.approx((want * w).sum() / w.sum(), rel=1e-5)
    assert metrics.MeanSquaredError().name == "mean_squared_error"


def test_auc_matches_real_keras(rng, cpu, tmp_path):
    """keras.metrics.AUC (ROC/PR, the three summations, given thresholds, from_logits, sample weights, two
    updates) against Keras 3 on JAX."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    d = {"y1": rng.integers(0, 2, size=(40, 1)), "p1": rng.uniform(size=(40, 1)).astype(np.float32),
         "w1": rng.uniform(size=40).astype(np.float32), "y2": rng.integers(0, 2, size=(25, 1)),
         "p2": rng.uniform(size=(25, 1)).astype(np.float32)}
    d["p1"][:20] = np.where(d["y1"][:20] == 1, 0.7, 0.2)  # some signal and ties
    d["z1"], d["z2"] = np.log(d["p1"] / (1 - d["p1"])), np.log(d["p2"] / (1 - d["p2"]))
    np.savez(tmp_path / "in.npz", **d)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _AUC_SCRIPT, str(tmp_path), json.dumps(_AUC_CASES)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = json.load(open(tmp_path / "out.json"))
    for kw, ref in zip(_AUC_CASES, want):
        m = metrics.AUC(**kw)
        m.update_state(d["y1"], d["p1"] if not kw.get("from_logits") else d["z1"], sample_weight=d["w1"])
        m.update_state(d["y2"], d["p2"] if not kw.get("from_logits") else d["z2"])
        assert float(m.result().data) == pytest.approx(ref, rel=1e-5, abs=1e-6), kw
    auc = metrics.get("auc")
    assert type(auc) is metrics.AUC and auc.name == "auc" and len(auc.thresholds) == 200
    cfg = metrics.AUC(thresholds=[0.3, 0.1]).get_config()
    assert cfg["thresholds"] == [0.1, 0.3] and cfg["num_thresholds"] == 4
    with pytest.raises(NotImplementedError, match="multi_label"):
        metrics.AUC(multi_label=True)
    with pytest.raises(ValueError, match="curve must be"):
        metrics.AUC(curve="PRGAIN")


def test_accuracy_resolution_as_keras():
    """compile's "accuracy" string picks the accuracy from the shapes (Keras 3's compile_utils); metrics.get
    gives the exact-equality Accuracy (tests/test_keras_semantics.py compares both with Keras)."""
    acc = metrics.compile_metric("accuracy")
    assert isinstance(acc.resolve((), (10,)), metrics.SparseCategoricalAccuracy)
    assert isinstance(acc.resolve((1,), (10,)), metrics.SparseCategoricalAccuracy)
    assert isinstance(acc.resolve((10,), (10,)), metrics.CategoricalAccuracy)
    assert isinstance(acc.resolve((1,), (1,)), metrics.BinaryAccuracy)
    assert metrics.compile_metric("acc").name == "acc" and metrics.get("acc").name == "acc"
    assert type(metrics.get("accuracy")) is metrics.Accuracy
    with pytest.raises(ValueError, match="unknown metric 'f1'.*accuracy"):
        metrics.get("f1")


def test_to_categorical():
    out = utils.to_categorical([0, 2, 1], 3)
    assert out.dtype == np.float32 and np.array_equal(out, np.eye(3)[[0, 2, 1]])
    assert utils.to_categorical(np.array([[1], [0]])).shape == (2, 2)
    with pytest.raises(ValueError, match="out of range"):
        utils.to_categorical([3], 3)


_KLD_SCRIPT = r"""
import json, sys
import numpy as np
import keras
d = dict(np.load(sys.argv[1] + "/in.npz"))
out = {"per": np.asarray(keras.losses.kl_divergence(d["t"], d["p"])).tolist(),
       "mean": float(keras.losses.KLDivergence()(d["t"], d["p"])),
       "sum": float(keras.losses.KLDivergence(reduction="sum")(d["t"], d["p"])),
       "weighted": float(keras.losses.KLDivergence()(d["t"], d["p"], sample_weight=d["w"])),
       "config": keras.losses.KLDivergence(name="kd").get_config()}
m = keras.metrics.MeanMetricWrapper(keras.losses.kl_divergence)
m.update_state(d["t"][:3], d["p"][:3])
m.update_state(d["t"][3:], d["p"][3:])
out["wrapper"] = float(m.result())
out["wrapper_name"] = m.name
json.dump(out, open(sys.argv[1] + "/out.json", "w"))
"""


def _kld_data(rng):
    t = rng.uniform(size=(5, 4)).astype(np.float32)
    t /= t.sum(1, keepdims=True)
    t[0, 1] = 0.0  # a zero target: the clip to [epsilon, 1] keeps the loss finite
    p = rng.uniform(size=(5, 4)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    p[2, 3] = 0.0
    return {"t": t, "p": p, "w": rng.uniform(size=5).astype(np.float32)}


def test_kl_divergence_numpy_reference_and_gradient(rng, cpu):
    from dnnbind import ops
    from dnnbind.autodiff import GradientTape
    from testutil import numerical_grad, rel_error

    d = _kld_data(rng)
    tc, pc = np.clip(d["t"], 1e-7, 1), np.clip(d["p"], 1e-7, 1)
    per = np.sum(tc * np.log(tc / pc), axis=-1)
    np.testing.assert_allclose(np.asarray(losses.kl_divergence(d["t"], d["p"])), per, rtol=1e-5)
    np.testing.assert_allclose(float(np.asarray(losses.KLDivergence()(d["t"], d["p"]))), per.mean(), rtol=1e-5)
    assert losses.get("kld").name == "kl_divergence" and type(losses.get("KLDivergence")) is losses.KLDivergence
    assert losses.get(losses.kl_divergence).__class__ is losses.KLDivergence
    again = losses.deserialize(losses.serialize(losses.KLDivergence(reduction="sum", name="kd")))
    assert again.get_config() == {"name": "kd", "reduction": "sum"}
    # float64 gradient w.r.t. y_pred against finite differences (away from the clip)
    t = rng.uniform(0.1, 1, size=(3, 4))
    p = rng.uniform(0.1, 1, size=(3, 4))
    t /= t.sum(1, keepdims=True)
    p /= p.sum(1, keepdims=True)
    loss = losses.KLDivergence(dtype="float64")
    x = ops.convert_to_tensor(p)
    with GradientTape() as tape:
        tape.watch(x)
        value = loss(t, x)
    grad = np.asarray(tape.gradient(value, x))
    numeric = numerical_grad(lambda: float(np.asarray(loss(t, p))), p)
    assert rel_error(grad, numeric) < 1e-7
    with pytest.raises(ValueError, match="cannot be broadcast"):
        losses.kl_divergence(np.ones((2, 3)), np.ones((2, 4)))


def test_kl_divergence_and_mean_metric_wrapper_match_real_keras(rng, cpu, tmp_path):
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("keras") is None:
        pytest.skip("real Keras 3 is not installed (test extra)")
    d = _kld_data(rng)
    np.savez(tmp_path / "in.npz", **d)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KLD_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = json.load(open(tmp_path / "out.json"))
    np.testing.assert_allclose(np.asarray(losses.kl_divergence(d["t"], d["p"])), want["per"], rtol=1e-5)
    assert float(np.asarray(losses.KLDivergence()(d["t"], d["p"]))) == pytest.approx(want["mean"], rel=1e-5)
    assert float(np.asarray(losses.KLDivergence(reduction="sum")(d["t"], d["p"]))) == pytest.approx(want["sum"],
                                                                                                  rel=1e-5)
    got = float(np.asarray(losses.KLDivergence()(d["t"], d["p"], sample_weight=d["w"])))
    assert got == pytest.approx(want["weighted"], rel=1e-5)
    assert losses.KLDivergence(name="kd").get_config() == want["config"]
    m = metrics.MeanMetricWrapper(losses.kl_divergence)
    m.update_state(d["t"][:3], d["p"][:3])
    m.update_state(d["t"][3:], d["p"][3:])
    assert float(np.asarray(m.result())) == pytest.approx(want["wrapper"], rel=1e-5)
    assert m.name == want["wrapper_name"] == "mean_metric_wrapper"


def test_mean_metric_wrapper(cpu):
    from dnnbind import ops

    def hits(y_true, y_pred):  # one number per batch, as keras-io's siamese `accuracy`
        return ops.mean(ops.equal(ops.cast(y_true, "float32"), ops.cast(y_pred > 0.5, "float32")))

    m = metrics.MeanMetricWrapper(hits, name="hits")
    m.update_state(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.9, 0.2, 0.1, 0.7]))  # 3/4
    m.update_state(np.array([0.0, 1.0]), np.array([0.9, 0.2]))  # 0/2
    assert float(np.asarray(m.result())) == pytest.approx(0.375)  # the mean of the two batch values
    m.reset_state()
    w = metrics.MeanMetricWrapper(lambda a, b, scale: ops.abs(a - b) * scale, scale=2.0)
    w.update_state(np.array([[1.0, 2.0]]), np.array([[0.0, 0.0]]), sample_weight=np.array([0.5]))
    assert float(np.asarray(w.result())) == pytest.approx(3.0)  # (2*1*0.5 + 2*2*0.5) / (0.5 + 0.5)
    assert metrics.KLDivergence().name == "kl_divergence" and type(metrics.get("kld")) is metrics.KLDivergence
    assert metrics.MeanSquaredError().name == "mean_squared_error" and metrics.MeanSquaredError("m").name == "m"
    with pytest.raises(TypeError, match="fn must be a function"):
        metrics.MeanMetricWrapper("accuracy")


def test_compile_wraps_a_metric_function(cpu):
    import dnnbind as keras
    from dnnbind import layers, ops

    def within(y_true, y_pred):
        return ops.cast(ops.abs(y_true - y_pred) < 0.5, "float32")

    model = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=[within])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    logs = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    p = model.predict(x, verbose=0)
    assert set(logs) == {"loss", "within"}
    assert logs["within"] == pytest.approx(float(np.mean(np.abs(y - p) < 0.5)))


def test_labels_one_trailing_axis_of_one_apart(cpu):
    bce = losses.BinaryCrossentropy()
    y = np.array([[[0.0, 1.0], [1.0, 0.0]]], np.float32)  # (1, 2, 2) labels of a (1, 2, 2, 1) output
    assert bce.prepare_labels(y, (2, 2, 1)).shape == (1, 2, 2, 1)
    assert bce.prepare_labels(y[..., None], (2, 2)).shape == (1, 2, 2)
    with pytest.raises(ValueError, match=r"labels must have shape \(batch, 2, 2, 1\)"):
        bce.prepare_labels(np.ones((1, 2, 3)), (2, 2, 1))
