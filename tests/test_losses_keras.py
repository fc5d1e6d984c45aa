"""keras.losses: every class (each reduction, with sample weights) and every function against real Keras 3
(NumPy backend, one subprocess for the module); gradients against finite differences in float64; names,
configs and compile by string."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dnnbind
from dnnbind import losses, ops
from dnnbind.autodiff import GradientTape

from losses_aux import inputs, run_keras

#: (label, class name, class kwargs, function name or None, function kwargs, data key)
CASES = [
    ("mse", "MeanSquaredError", {}, "mean_squared_error", {}, "signed"),
    ("mse_col", "MeanSquaredError", {}, "mean_squared_error", {}, "col"),
    ("mae", "MeanAbsoluteError", {}, "mean_absolute_error", {}, "signed"),
    ("mape", "MeanAbsolutePercentageError", {}, "mean_absolute_percentage_error", {}, "reg"),
    ("msle", "MeanSquaredLogarithmicError", {}, "mean_squared_logarithmic_error", {}, "reg"),
    ("cosine", "CosineSimilarity", {}, "cosine_similarity", {}, "signed"),
    ("huber", "Huber", {}, "huber", {}, "signed"),
    ("huber_d", "Huber", {"delta": 0.3}, "huber", {"delta": 0.3}, "signed"),
    ("log_cosh", "LogCosh", {}, "log_cosh", {}, "signed"),
    ("poisson", "Poisson", {}, "poisson", {}, "reg"),
    ("kld", "KLDivergence", {}, "kl_divergence", {}, "cat"),
    ("hinge01", "Hinge", {}, "hinge", {}, "bin"),
    ("hinge_pm", "Hinge", {}, "hinge", {}, "pm"),
    ("hinge_real", "Hinge", {}, "hinge", {}, "signed"),
    ("sq_hinge", "SquaredHinge", {}, "squared_hinge", {}, "pm"),
    ("cat_hinge", "CategoricalHinge", {}, "categorical_hinge", {}, "cat"),
    ("bce", "BinaryCrossentropy", {}, "binary_crossentropy", {}, "bin"),
    ("bce_logits_ls", "BinaryCrossentropy", {"from_logits": True, "label_smoothing": 0.1}, "binary_crossentropy",
     {"from_logits": True, "label_smoothing": 0.1}, "logit"),
    ("cce", "CategoricalCrossentropy", {}, "categorical_crossentropy", {}, "cat"),
    ("cce_logits_ls", "CategoricalCrossentropy", {"from_logits": True, "label_smoothing": 0.2},
     "categorical_crossentropy", {"from_logits": True, "label_smoothing": 0.2}, "catlogit"),
    ("cce_axis1", "CategoricalCrossentropy", {"from_logits": True, "label_smoothing": 0.1, "axis": 1},
     "categorical_crossentropy", {"from_logits": True, "label_smoothing": 0.1, "axis": 1}, "axis1"),
    ("cce_axis1_probs", "CategoricalCrossentropy", {"axis": 1}, "categorical_crossentropy", {"axis": 1}, "axis1"),
    ("bce_axis1", "BinaryCrossentropy", {"axis": 1}, "binary_crossentropy", {"axis": 1}, "axis1"),
    ("scce", "SparseCategoricalCrossentropy", {}, "sparse_categorical_crossentropy", {}, "sparse"),
    ("scce_logits", "SparseCategoricalCrossentropy", {"from_logits": True}, "sparse_categorical_crossentropy",
     {"from_logits": True}, "sparselogit"),
    ("scce_ignore", "SparseCategoricalCrossentropy", {"from_logits": True, "ignore_class": 2},
     "sparse_categorical_crossentropy", {"from_logits": True, "ignore_class": 2}, "sparselogit"),
    ("bfce", "BinaryFocalCrossentropy", {}, "binary_focal_crossentropy", {}, "bin"),
    ("bfce_all", "BinaryFocalCrossentropy",
     {"apply_class_balancing": True, "alpha": 0.4, "gamma": 1.5, "from_logits": True, "label_smoothing": 0.1},
     "binary_focal_crossentropy",
     {"apply_class_balancing": True, "alpha": 0.4, "gamma": 1.5, "from_logits": True, "label_smoothing": 0.1},
     "logit"),
    ("cfce", "CategoricalFocalCrossentropy", {}, "categorical_focal_crossentropy", {}, "cat"),
    ("cfce_all", "CategoricalFocalCrossentropy",
     {"alpha": 0.3, "gamma": 1.0, "from_logits": True, "label_smoothing": 0.1}, "categorical_focal_crossentropy",
     {"alpha": 0.3, "gamma": 1.0, "from_logits": True, "label_smoothing": 0.1}, "catlogit"),
    ("cgce", "CategoricalGeneralizedCrossEntropy", {"q": 0.3}, "categorical_generalized_cross_entropy",
     {"q": 0.3}, "sparse"),
    ("dice", "Dice", {}, "dice", {}, "seg"),
    ("dice_axis", "Dice", {"axis": [1, 2, 3]}, "dice", {"axis": [1, 2, 3]}, "seg"),
    ("tversky", "Tversky", {"alpha": 0.3, "beta": 0.7}, "tversky", {"alpha": 0.3, "beta": 0.7}, "seg"),
    ("tversky_axis", "Tversky", {"axis": [1, 2, 3]}, "tversky", {"axis": [1, 2, 3]}, "seg"),
    ("circle", "Circle", {"gamma": 2.0}, "circle", {"gamma": 2.0}, "emb"),
    ("circle_keep", "Circle", {"gamma": 3.0, "margin": 0.2, "remove_diagonal": False}, "circle",
     {"gamma": 3.0, "margin": 0.2, "remove_diagonal": False}, "emb"),
    ("ctc", "CTC", {}, "ctc", {}, "ctc"),
]
REDUCTIONS = ["sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none"]

_SCRIPT = r'''
import json, sys, numpy as np, keras
work = sys.argv[1]
inp = dict(np.load(work + "/inputs.npz"))
cases = json.load(open(work + "/cases.json"))
out = {}
for label, cls, ckw, fn, fkw, key in cases:
    yt, yp, w = inp[key + "/t"], inp[key + "/p"], inp[key + "/w"]
    ckw = {k: tuple(v) if isinstance(v, list) else v for k, v in ckw.items()}
    fkw = {k: tuple(v) if isinstance(v, list) else v for k, v in fkw.items()}
    for red in %r:
        loss = getattr(keras.losses, cls)(reduction=red, **ckw)
        out[label + "/" + red] = np.asarray(loss(yt, yp, sample_weight=w))
    out[label + "/plain"] = np.asarray(getattr(keras.losses, cls)(**ckw)(yt, yp))
    cfg = getattr(keras.losses, cls)(**ckw).get_config()
    out[label + "/config"] = np.array(json.dumps(cfg, sort_keys=True, default=str))
    if fn:
        out[label + "/fn"] = np.asarray(getattr(keras.losses, fn)(yt, yp, **fkw))
out["census/losses"] = np.array(json.dumps(sorted(n for n in dir(keras.losses) if not n.startswith("_"))))
out["census/metrics"] = np.array(json.dumps(sorted(n for n in dir(keras.metrics) if not n.startswith("_"))))
np.savez(work + "/out.npz", **out)
''' % (REDUCTIONS,)


@pytest.fixture(scope="module")
def ref():
    return run_keras(_SCRIPT, [list(c) for c in CASES], "dnnbind-losses-")


def _kw(kwargs):
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_matches_keras(case, ref):
    label, cls, ckw, fn, fkw, key = case
    data = inputs()
    yt, yp, w = data[key + "/t"], data[key + "/p"], data[key + "/w"]
    tol = dict(rtol=2e-5, atol=2e-6)
    for red in REDUCTIONS:
        got = getattr(losses, cls)(reduction=red, **_kw(ckw))(yt, yp, sample_weight=w)
        np.testing.assert_allclose(np.asarray(got), ref[f"{label}/{red}"], err_msg=f"{label} {red}", **tol)
    got = getattr(losses, cls)(**_kw(ckw))(yt, yp)
    np.testing.assert_allclose(np.asarray(got), ref[f"{label}/plain"], err_msg=label, **tol)
    if fn:
        values = getattr(losses, fn)(yt, yp, **_kw(fkw))
        np.testing.assert_allclose(np.asarray(values), ref[f"{label}/fn"], err_msg=label, **tol)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_config_matches_keras(case, ref):
    label, cls, ckw = case[:3]
    loss = getattr(losses, cls)(**_kw(ckw))
    ours = json.loads(json.dumps(loss.get_config(), sort_keys=True, default=str))
    theirs = json.loads(str(ref[f"{label}/config"]))
    ours = {k: list(v) if isinstance(v, tuple) else v for k, v in ours.items()}
    theirs = {k: v for k, v in theirs.items() if k != "dtype"}
    assert ours == theirs
    again = losses.deserialize(losses.serialize(loss))
    assert type(again) is type(loss) and again.get_config() == loss.get_config()


def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f(x)
        flat[i] = old - eps
        down = f(x)
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


#: every case: the random inputs stay far (>> the 1e-6 step) from the hinges' and absolute values' kinks
GRAD_CASES = CASES


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_matches_finite_differences(case):
    label, cls, ckw, _, _, key = case
    data = inputs()
    yt = data[key + "/t"].astype(np.float64)
    yp = data[key + "/p"].astype(np.float64)
    w = data[key + "/w"].astype(np.float64)
    loss = getattr(losses, cls)(dtype="float64", **_kw(ckw))
    t = ops.convert_to_tensor(yp)
    with GradientTape() as tape:
        tape.watch(t)
        value = loss(yt, t, sample_weight=w)
    (grad,) = tape.gradient(value, [t])
    numeric = _numeric_grad(lambda x: float(np.asarray(loss(yt, x.copy(), sample_weight=w))), yp.copy())
    assert np.any(numeric != 0), label
    np.testing.assert_allclose(np.asarray(grad, np.float64), numeric, rtol=1e-5, atol=1e-7, err_msg=label)


def test_every_keras_name_exists(ref):
    """The name census: every public name of keras.losses and keras.metrics exists in dnnbind's."""
    from dnnbind import metrics

    for module, key in ((losses, "census/losses"), (metrics, "census/metrics")):
        missing = [n for n in json.loads(str(ref[key])) if not hasattr(module, n)]
        assert missing == [], f"{module.__name__} lacks {missing}"


def test_names_resolve():
    for name, cls in [("huber", losses.Huber), ("poisson", losses.Poisson), ("log_cosh", losses.LogCosh),
                      ("logcosh", losses.LogCosh), ("mape", losses.MeanAbsolutePercentageError),
                      ("msle", losses.MeanSquaredLogarithmicError), ("mae", losses.MeanAbsoluteError),
                      ("hinge", losses.Hinge), ("squared_hinge", losses.SquaredHinge),
                      ("categorical_hinge", losses.CategoricalHinge), ("dice", losses.Dice),
                      ("tversky", losses.Tversky), ("ctc", losses.CTC), ("circle", losses.Circle),
                      ("cosine_similarity", losses.CosineSimilarity),
                      ("binary_focal_crossentropy", losses.BinaryFocalCrossentropy),
                      ("categorical_focal_crossentropy", losses.CategoricalFocalCrossentropy),
                      ("categorical_generalized_cross_entropy", losses.CategoricalGeneralizedCrossEntropy),
                      ("Huber", losses.Huber), (losses.huber, losses.Huber), (losses.dice, losses.Dice)]:
        assert type(losses.get(name)) is cls, name
    with pytest.raises(ValueError, match="unknown loss"):
        losses.get("hubber")
    with pytest.raises(ValueError, match="q must be in the interval"):
        losses.CategoricalGeneralizedCrossEntropy(q=1.5)
    with pytest.raises(ValueError, match="reduction"):
        losses.Huber(reduction="avg")
    with pytest.raises(ValueError, match="y_true"):
        losses.ctc(np.ones((2, 3, 1)), np.ones((2, 4, 5)))


def test_compile_fit_by_name():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 2))).astype(np.float32)
    for name in ("huber", "log_cosh", "mae", "cosine_similarity"):
        model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(2)])
        model.compile("sgd", loss=name, metrics=["mae"])
        hist = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
        assert np.isfinite(hist.history["loss"]).all() and hist.history["loss"][-1] < hist.history["loss"][0] + 1e-3
    model = dnnbind.Sequential([dnnbind.Input((4,)), dnnbind.layers.Dense(2, activation="softplus")])
    model.compile("sgd", loss="poisson")
    assert np.isfinite(model.fit(x, np.abs(y), epochs=1, verbose=0).history["loss"]).all()


def test_every_package_is_installed():
    """pyproject's explicit package list names every package (dnnbind.losses and dnnbind.metrics are folders
    now): a normal ``pip install`` copies only those."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "dnnbind").rglob("__init__.py")
             if "layers" not in p.relative_to(root).parts}
    found |= {"dnnbind." + ".".join(p.parent.relative_to(root).parts) for p in (root / "layers").rglob("__init__.py")}
    assert found - listed == set()
