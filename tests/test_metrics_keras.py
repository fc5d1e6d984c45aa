"""keras.metrics: every class (two weighted updates, then unweighted ones after a reset) and every function
against real Keras 3 (NumPy backend, one subprocess for the module); names; configs; weighted_metrics in
compile against a NumPy reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dnnbind
from dnnbind import metrics

from losses_aux import inputs, run_keras

#: (label, class name, constructor kwargs, data key); "ids": integer labels and predictions
CASES = [
    ("bin_acc", "BinaryAccuracy", {}, "bin"),
    ("bin_acc_t", "BinaryAccuracy", {"threshold": 0.3}, "bin"),
    ("cat_acc", "CategoricalAccuracy", {}, "cat"),
    ("sparse_acc", "SparseCategoricalAccuracy", {}, "sparse"),
    ("topk", "TopKCategoricalAccuracy", {"k": 2}, "cat"),
    ("sparse_topk", "SparseTopKCategoricalAccuracy", {"k": 2}, "sparse"),
    ("acc", "Accuracy", {}, "ids"),
    ("mse", "MeanSquaredError", {}, "signed"),
    ("mae", "MeanAbsoluteError", {}, "signed"),
    ("mape", "MeanAbsolutePercentageError", {}, "reg"),
    ("msle", "MeanSquaredLogarithmicError", {}, "reg"),
    ("rmse", "RootMeanSquaredError", {}, "signed"),
    ("cosine", "CosineSimilarity", {}, "signed"),
    ("logcosh", "LogCoshError", {}, "signed"),
    ("r2", "R2Score", {}, "signed"),
    ("r2_var", "R2Score", {"class_aggregation": "variance_weighted_average"}, "signed"),
    ("r2_none", "R2Score", {"class_aggregation": None}, "signed"),
    ("r2_adj", "R2Score", {"num_regressors": 2}, "signed"),
    ("pearson", "PearsonCorrelation", {}, "signed"),
    ("concordance", "ConcordanceCorrelation", {}, "signed"),
    ("bce", "BinaryCrossentropy", {}, "bin"),
    ("bce_logits", "BinaryCrossentropy", {"from_logits": True, "label_smoothing": 0.1}, "logit"),
    ("cce", "CategoricalCrossentropy", {}, "cat"),
    ("scce", "SparseCategoricalCrossentropy", {}, "sparse"),
    ("scce_logits", "SparseCategoricalCrossentropy", {"from_logits": True}, "sparselogit"),
    ("scce_ignore", "SparseCategoricalCrossentropy", {"from_logits": True, "ignore_class": 2}, "sparselogit"),
    ("poisson", "Poisson", {}, "reg"),
    ("kld", "KLDivergence", {}, "cat"),
    ("hinge", "Hinge", {}, "pm"),
    ("sq_hinge", "SquaredHinge", {}, "pm"),
    ("cat_hinge", "CategoricalHinge", {}, "cat"),
    ("p_at_r", "PrecisionAtRecall", {"recall": 0.5}, "bin"),
    ("r_at_p", "RecallAtPrecision", {"precision": 0.6, "num_thresholds": 11}, "bin"),
    ("sens_at_spec", "SensitivityAtSpecificity", {"specificity": 0.5}, "bin"),
    ("spec_at_sens", "SpecificityAtSensitivity", {"sensitivity": 0.4, "num_thresholds": 7}, "bin"),
    ("p_at_r_class", "PrecisionAtRecall", {"recall": 0.3, "class_id": 2}, "cat"),
    ("f1", "F1Score", {}, "cat"),
    ("f1_macro_t", "F1Score", {"average": "macro", "threshold": 0.3}, "cat"),
    ("fbeta_micro", "FBetaScore", {"average": "micro", "beta": 2.0}, "cat"),
    ("fbeta_weighted", "FBetaScore", {"average": "weighted", "beta": 0.5, "threshold": 0.2}, "cat"),
    ("iou", "IoU", {"num_classes": 5, "target_class_ids": [0, 2, 4]}, "ids"),
    ("iou_ignore", "IoU", {"num_classes": 5, "target_class_ids": [1, 3], "ignore_class": 0}, "ids"),
    ("mean_iou", "MeanIoU", {"num_classes": 5}, "ids"),
    ("mean_iou_f", "MeanIoU", {"num_classes": 5, "dtype": "float32"}, "ids"),
    ("onehot_iou", "OneHotIoU", {"num_classes": 5, "target_class_ids": [1, 3]}, "cat"),
    ("onehot_mean_iou", "OneHotMeanIoU", {"num_classes": 5}, "cat"),
    ("binary_iou", "BinaryIoU", {}, "flat"),
    ("binary_iou_t", "BinaryIoU", {"target_class_ids": [1], "threshold": 0.3}, "flat"),
    ("auc", "AUC", {"num_thresholds": 20}, "bin"),
    ("precision", "Precision", {"thresholds": [0.3, 0.6]}, "bin"),
    ("sum", "Sum", {}, "signed"),
    ("mean", "Mean", {}, "signed"),
]

#: (label, function name, kwargs, data key)
FUNCTIONS = [
    ("binary_accuracy", "binary_accuracy", {"threshold": 0.4}, "bin"),
    ("categorical_accuracy", "categorical_accuracy", {}, "cat"),
    ("sparse_categorical_accuracy", "sparse_categorical_accuracy", {}, "sparse"),
    ("top_k", "top_k_categorical_accuracy", {"k": 2}, "cat"),
    ("sparse_top_k", "sparse_top_k_categorical_accuracy", {"k": 3}, "sparse"),
    ("concordance", "concordance_correlation", {}, "signed"),
    ("pearson", "pearson_correlation", {}, "signed"),
    ("pearson0", "pearson_correlation", {"axis": 0}, "signed"),
    *[(n, n, {}, key) for n, key in [
        ("binary_crossentropy", "bin"), ("binary_focal_crossentropy", "bin"), ("categorical_crossentropy", "cat"),
        ("categorical_focal_crossentropy", "cat"), ("categorical_hinge", "cat"), ("hinge", "pm"),
        ("huber", "signed"), ("log_cosh", "signed"), ("mean_absolute_error", "signed"),
        ("mean_absolute_percentage_error", "reg"), ("mean_squared_error", "signed"),
        ("mean_squared_logarithmic_error", "reg"), ("poisson", "reg"), ("sparse_categorical_crossentropy", "sparse"),
        ("squared_hinge", "pm")]],
]

_SCRIPT = r'''
import json, sys, warnings, numpy as np, keras
warnings.simplefilter("ignore")
work = sys.argv[1]
inp = dict(np.load(work + "/inputs.npz"))
cases, functions = json.load(open(work + "/cases.json"))
out = {}
def data(key):
    return inp[key + "/t"], inp[key + "/p"], inp[key + "/w"]
for label, cls, kw, key in cases:
    yt, yp, w = data(key)
    m = getattr(keras.metrics, cls)(**kw)
    args = (lambda a, b: (b,)) if cls in ("Sum", "Mean") else (lambda a, b: (a, b))
    m.update_state(*args(yt[:3], yp[:3]), sample_weight=w[:3])
    m.update_state(*args(yt[3:], yp[3:]), sample_weight=w[3:])
    out[label + "/weighted"] = np.asarray(m.result())
    m.reset_state()
    m.update_state(*args(yt, yp))
    out[label + "/plain"] = np.asarray(m.result())
    out[label + "/config"] = np.array(json.dumps(m.get_config(), sort_keys=True, default=str))
for label, fn, kw, key in functions:
    yt, yp, w = data(key)
    out["fn/" + label] = np.asarray(getattr(keras.metrics, fn)(yt, yp, **kw))
np.savez(work + "/out.npz", **out)
'''


def _data() -> dict:
    d = inputs()
    rng = np.random.default_rng(7)
    d["ids/t"] = rng.integers(0, 5, size=(6,)).astype(np.float32)
    d["ids/p"] = np.where(rng.uniform(size=6) < 0.5, d["ids/t"], rng.integers(0, 5, size=(6,))).astype(np.float32)
    d["ids/w"] = np.array([1, 2, 1, 3, 1, 2], np.float32)
    d["flat/t"] = rng.integers(0, 2, size=(6,)).astype(np.float32)
    d["flat/p"] = rng.uniform(0.05, 0.95, size=(6,)).astype(np.float32)
    d["flat/w"] = np.array([2, 1, 1, 3, 1, 2], np.float32)
    return d


@pytest.fixture(scope="module")
def ref(monkeypatch_module=None):
    import losses_aux

    original = losses_aux.inputs
    losses_aux.inputs = _data
    try:
        return run_keras(_SCRIPT, [[list(c) for c in CASES], [list(f) for f in FUNCTIONS]], "dnnbind-metrics-")
    finally:
        losses_aux.inputs = original


def _args(cls, a, b):
    return (b,) if cls in ("Sum", "Mean") else (a, b)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_metric_matches_keras(case, ref):
    label, cls, kw, key = case
    d = _data()
    yt, yp, w = d[key + "/t"], d[key + "/p"], d[key + "/w"]
    m = getattr(metrics, cls)(**kw)
    m.update_state(*_args(cls, yt[:3], yp[:3]), sample_weight=w[:3])
    m.update_state(*_args(cls, yt[3:], yp[3:]), sample_weight=w[3:])
    np.testing.assert_allclose(np.asarray(m.result()), ref[label + "/weighted"], rtol=2e-5, atol=2e-6,
                               err_msg=f"{label} weighted")
    m.reset_state()
    m.update_state(*_args(cls, yt, yp))
    np.testing.assert_allclose(np.asarray(m.result()), ref[label + "/plain"], rtol=2e-5, atol=2e-6,
                               err_msg=f"{label} plain")


#: classes whose get_config dnnbind writes as before this change (no dtype key): compared without it
_OLD = {"BinaryAccuracy", "CategoricalAccuracy", "SparseCategoricalAccuracy", "TopKCategoricalAccuracy",
        "SparseTopKCategoricalAccuracy", "Accuracy", "MeanSquaredError", "MeanAbsoluteError", "KLDivergence",
        "AUC", "Precision", "Mean"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_metric_config(case, ref):
    label, cls, kw, _ = case
    m = getattr(metrics, cls)(**kw)
    ours = json.loads(json.dumps(m.get_config(), sort_keys=True, default=str))
    theirs = json.loads(str(ref[label + "/config"]))
    if theirs.get("name", "").startswith(f"{ours.get('name')}_"):  # Keras numbers a repeated default name
        theirs["name"] = ours["name"]
    if cls in _OLD:
        theirs = {k: v for k, v in theirs.items() if k in ours}
        ours = {k: v for k, v in ours.items() if k in theirs}
    assert ours == theirs
    again = metrics.deserialize(metrics.serialize(m))
    assert type(again) is type(m) and again.get_config() == m.get_config()


@pytest.mark.parametrize("case", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_function_matches_keras(case, ref):
    label, fn, kw, key = case
    d = _data()
    got = getattr(metrics, fn)(d[key + "/t"], d[key + "/p"], **kw)
    np.testing.assert_allclose(np.asarray(got), ref["fn/" + label], rtol=2e-5, atol=2e-6, err_msg=label)


def test_names_resolve():
    for name, cls in [("f1_score", metrics.F1Score), ("FBetaScore", metrics.FBetaScore), ("auc", metrics.AUC),
                      ("r2_score", metrics.R2Score), ("root_mean_squared_error", metrics.RootMeanSquaredError),
                      ("poisson", metrics.Poisson), ("hinge", metrics.Hinge), ("logcosh", metrics.LogCoshError),
                      ("log_cosh", metrics.LogCoshError), ("mape", metrics.MeanAbsolutePercentageError),
                      ("msle", metrics.MeanSquaredLogarithmicError), ("F1Score", metrics.F1Score),
                      ("binary_crossentropy", metrics.BinaryCrossentropy), ("sum", metrics.Sum),
                      ("pearson_correlation", metrics.PearsonCorrelation),
                      ("cosine_similarity", metrics.CosineSimilarity)]:
        assert type(metrics.get(name)) is cls, name
    huber = metrics.get("huber")
    assert isinstance(huber, metrics.MeanMetricWrapper) and huber.name == "huber"
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.get("f2_score")
    assert metrics.get("mape").name == "mape" and metrics.get("log_cosh").name == "log_cosh"
    with pytest.raises(ValueError, match="Target class id"):
        metrics.IoU(3, [0, 3])
    with pytest.raises(ValueError, match="beta"):
        metrics.FBetaScore(beta=2)
    with pytest.raises(ValueError, match="recall"):
        metrics.PrecisionAtRecall(1.5)


def test_weighted_count_stays_on_the_device():
    """A weighted update adds its weights to a device array; no host number changes."""
    m = metrics.MeanSquaredError()
    m.update_state(np.ones((4, 2), np.float32), np.zeros((4, 2), np.float32), sample_weight=np.full(4, 0.5, np.float32))
    assert m._host_count == 0.0 and m._weight_count is not None
    m.update_state(np.ones((2, 2), np.float32), np.full((2, 2), 3.0, np.float32))
    assert m._host_count == 2.0
    np.testing.assert_allclose(float(m.result()), (4 * 0.5 * 1 + 2 * 4.0) / (2.0 + 2.0))
    m.reset_state()
    assert float(m.result()) == 0.0
    mean = metrics.Mean()  # per-sample values count their samples; a 0-d value (the trainer's loss) its weight
    mean.update_state(np.ones((2, 3), np.float32))
    mean.update_state(np.zeros((6, 3), np.float32))
    mean.update_state(np.float32(5.0), 2)
    np.testing.assert_allclose(float(mean.result()), (2 + 10) / 10)


def test_compile_weighted_metrics_and_names():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(24, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(24,))
    w = rng.uniform(0.2, 2.0, size=(24,)).astype(np.float32)
    model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy",
                  metrics=["accuracy", "sparse_categorical_crossentropy", "sparse_top_k_categorical_accuracy"],
                  weighted_metrics=["accuracy", "sparse_categorical_crossentropy"])
    logs = model.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)
    p = np.asarray(model.predict(x, verbose=0), np.float64)
    ce = -np.log(p[np.arange(24), y])
    hit = (p.argmax(-1) == y).astype(np.float64)
    np.testing.assert_allclose(logs["sparse_categorical_crossentropy"], ce.mean(), rtol=1e-5)
    np.testing.assert_allclose(logs["weighted_sparse_categorical_crossentropy"], (ce * w).sum() / w.sum(), rtol=1e-5)
    np.testing.assert_allclose(logs["accuracy"], hit.mean(), rtol=1e-6)
    np.testing.assert_allclose(logs["weighted_accuracy"], (hit * w).sum() / w.sum(), rtol=1e-6)
    assert logs["sparse_top_k_categorical_accuracy"] == 1.0  # k=5 of 3 classes
    assert model.get_compile_config()["weighted_metrics"] == ["accuracy", "sparse_categorical_crossentropy"]
    with pytest.raises(TypeError, match="weighted_metrics"):
        model.compile("sgd", "mse", weighted_metrics="mae")


def test_compile_fit_metrics_by_name():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 2))).astype(np.float32)
    model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(2)])
    model.compile("sgd", loss="huber", metrics=["root_mean_squared_error", "r2_score", "log_cosh", "mape",
                                                 "pearson_correlation", "cosine_similarity"])
    hist = model.fit(x, y, epochs=2, batch_size=16, verbose=0).history
    for name in ("root_mean_squared_error", "r2_score", "log_cosh", "mape", "pearson_correlation",
                 "cosine_similarity"):
        assert np.isfinite(hist[name]).all(), name
    pred = np.asarray(model.predict(x, verbose=0), np.float64)
    logs = model.evaluate(x, y, verbose=0, return_dict=True, batch_size=32)
    np.testing.assert_allclose(logs["root_mean_squared_error"], np.sqrt(np.mean((pred - y) ** 2)), rtol=1e-5)


def test_weighted_metrics_survive_a_keras_file(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(16,))
    w = rng.uniform(0.2, 2.0, size=(16,)).astype(np.float32)
    model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(3, activation="softmax")])
    model.compile("sgd", dnnbind.losses.SparseCategoricalCrossentropy(reduction="sum"), metrics=["accuracy"],
                  weighted_metrics=["accuracy", metrics.SparseCategoricalCrossentropy()])
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = dnnbind.models.load_model(path)
    assert loaded.loss.reduction == "sum"
    want = model.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    got = loaded.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    assert sorted(got) == sorted(want) and "weighted_accuracy" in got
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)


def test_a_vector_result_is_logged_as_an_array():
    """``F1Score(average=None)`` gives one score per class: the logs keep the array (Keras 3's pythonify_logs)."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
    model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy", metrics=["f1_score"])
    model.fit(x, y, epochs=1, verbose=0)
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    reference = metrics.F1Score()
    reference.update_state(y, model.predict(x, verbose=0))
    assert np.shape(logs["f1_score"]) == (3,)
    np.testing.assert_allclose(logs["f1_score"], np.asarray(reference.result()), rtol=1e-6)
