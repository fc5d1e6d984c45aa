"""Places where dnnbind once computed something other than Keras 3: each checked against real Keras 3
(JAX backend, CPU, one subprocess for the module) or against Keras's documented value.

The Keras side runs ``_KERAS_SCRIPT`` once; it reads the shared inputs from ``inputs.npz`` and writes
its results to ``keras.json`` (plain lists and numbers, no pickle).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras


def _inputs() -> dict:
    rng = np.random.default_rng(20261202)
    return {
        "tob_x": rng.normal(size=(3, 8, 4)).astype(np.float32),
        "tob_y": rng.normal(size=(3, 8, 1)).astype(np.float32),
        "tob_k": rng.normal(size=(4, 1)).astype(np.float32),
        "tob_b": rng.normal(size=(1,)).astype(np.float32),
        "bn_x": rng.normal(1.5, 2.0, size=(6, 3, 3, 4)).astype(np.float32),
        "acc_x": rng.normal(size=(12, 4)).astype(np.float32),
        "acc_y": rng.integers(0, 2, size=(12, 1)).astype(np.float32),
    }


INITIALIZERS = ["RandomNormal", "RandomUniform", "TruncatedNormal", "GlorotUniform", "GlorotNormal", "HeNormal",
                "HeUniform", "LecunNormal", "LecunUniform", "VarianceScaling", "Orthogonal"]
SUMMARY_KWARGS = [{}, {"line_length": 64}, {"show_trainable": True}, {"expand_nested": True},
                  {"positions": [0.5, 0.7, 1.0]}]

_KERAS_SCRIPT = r'''
import json, sys
import numpy as np
import keras
work = sys.argv[1]
inp = dict(np.load(work + "/inputs.npz"))
out = {}

# 1. train_on_batch / test_on_batch: the metrics are reset at each call
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
m.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
m.set_weights([inp["tob_k"], inp["tob_b"]])
out["train_on_batch"] = [m.train_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
out["test_on_batch"] = [m.test_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]

# 2. BatchNormalization: moving_variance takes the biased batch variance
m = keras.Sequential([keras.Input((3, 3, 4)), keras.layers.BatchNormalization(momentum=0.8)])
m.compile(keras.optimizers.SGD(0.1), "mse")
m.train_on_batch(inp["bn_x"], inp["bn_x"] * 0.5)
out["bn_moving"] = [w.tolist() for w in m.layers[0].get_weights()[2:]]

# 3. model.summary(): the box-drawn table
def summary_models():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="d1"),
                          keras.layers.BatchNormalization(name="batch_normalization"),
                          keras.layers.Dense(2, name="d2")], name="seq")
    yield "seq", m
    m.compile("sgd", "mse")  # plain SGD: its variables are the same in dnnbind and Keras (iterations)
    m.train_on_batch(inp["tob_x"][0][:, :3], inp["tob_y"][0].repeat(2, axis=1))
    yield "seq_compiled", m
    a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
    shared = keras.layers.Dense(3, name="shared")
    h = shared(a)
    o = keras.layers.Add(name="add")([shared(h), b])
    yield "functional", keras.Model([a, b], keras.layers.Dense(2, name="head")(o), name="fun")
    i = keras.Input((4,), name="x")
    yield "chain", keras.Model(i, keras.layers.Dense(2, name="o")(keras.layers.Dense(5, name="h")(i)),
                               name="chain")
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="in1")], name="inner")
    yield "nested", keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1, name="top")], name="outer")


SUMMARY_KWARGS = json.load(open(work + "/summary_kwargs.json"))
INITIALIZERS = json.load(open(work + "/initializers.json"))
out["summary"] = {}
for label, model in summary_models():
    for n, kw in enumerate(SUMMARY_KWARGS):
        if "positions" in kw and label in ("functional",):
            continue
        texts = []
        model.summary(print_fn=lambda text, **_: texts.append(text), **kw)
        out["summary"][f"{label}/{n}"] = texts

# 5. inputs are fed in their Input's dtype
SEEN = []  # module level: Keras would wrap a list kept on the layer in a tracked copy


class Spy(keras.layers.Layer):
    def call(self, x):
        SEEN.append(str(x.dtype))
        return keras.ops.cast(x, "float32") * 1.0


out["input_dtypes"] = {}
for in_dtype in ("int32", "float32"):
    for data_dtype in ("int64", "float64"):
        i = keras.Input((3,), dtype=in_dtype)
        m = keras.Model(i, keras.layers.Dense(1)(Spy()(i)))
        m.compile("sgd", "mse")
        data = np.array([[1, 2, 3], [4, 5, 6]], data_dtype)
        del SEEN[:]
        m.fit(data, np.ones((2, 1), "float32"), verbose=0)
        m.predict(data, verbose=0)
        m.evaluate(data, np.ones((2, 1), "float32"), verbose=0)
        out["input_dtypes"][f"{in_dtype}/{data_dtype}"] = sorted(set(SEEN))

# 7. metrics.Accuracy is exact equality; compile's "accuracy" string picks from the shapes
a = keras.metrics.Accuracy()
a.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
a.update_state([[1, 2]], [[1, 0]], sample_weight=[[0.5, 2.0]])
out["accuracy_class"] = float(a.result())
out["accuracy_get"] = type(keras.metrics.get("accuracy")).__name__
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
m.compile("sgd", "binary_crossentropy", metrics=["accuracy", keras.metrics.Accuracy(name="exact"),
                                                 keras.metrics.BinaryAccuracy(name="ba")])
w = m.get_weights()
out["accuracy_weights"] = [v.tolist() for v in w]
out["accuracy_eval"] = m.evaluate(inp["acc_x"], inp["acc_y"], verbose=0, return_dict=True)

# 8. an initializer instance repeats its values (int seed or none); a SeedGenerator seed does not
out["initializers"] = {}
for cls in INITIALIZERS:
    for seed in ("int", "none", "generator"):
        arg = 3 if seed == "int" else None if seed == "none" else keras.random.SeedGenerator(3)
        init = getattr(keras.initializers, cls)(seed=arg)
        out["initializers"][f"{cls}/{seed}"] = bool(np.array_equal(np.asarray(init((4, 3))),
                                                                     np.asarray(init((4, 3)))))
shared = keras.initializers.GlorotUniform()
d1, d2 = keras.layers.Dense(3, kernel_initializer=shared), keras.layers.Dense(3, kernel_initializer=shared)
d1.build((None, 4))
d2.build((None, 4))
out["initializers"]["shared_instance"] = bool(np.array_equal(np.asarray(d1.kernel), np.asarray(d2.kernel)))
d1, d2 = keras.layers.Dense(3), keras.layers.Dense(3)
d1.build((None, 4))
d2.build((None, 4))
out["initializers"]["default_string"] = bool(np.array_equal(np.asarray(d1.kernel), np.asarray(d2.kernel)))

# 10. Sequential.inputs / outputs
def seq_io():
    found = {}
    empty = keras.Sequential([keras.layers.Dense(2)], name="empty")
    for what in ("inputs", "outputs"):
        try:
            getattr(empty, what)
            found[f"unbuilt_{what}"] = "ok"
        except AttributeError as exc:
            found[f"unbuilt_{what}"] = str(exc)
    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="first"), keras.layers.Dense(2, name="last")])
    found["inputs"] = [list(t.shape) for t in m.inputs]
    found["outputs"] = [list(t.shape) for t in m.outputs]
    found["first_output"] = list(m.get_layer("first").output.shape)
    built_later = keras.Sequential([keras.layers.Dense(4)])
    built_later.build((None, 6))
    found["built_later"] = [list(t.shape) for t in built_later.inputs + built_later.outputs]
    return found


out["sequential_io"] = seq_io()

# 11. model.losses: add_loss and activity losses of the last call, then the weights' regularization
class AddLoss(keras.layers.Layer):
    def call(self, x):
        self.add_loss(keras.ops.sum(x) * 0.01)
        return x


def losses_model():
    m = keras.Sequential([keras.Input((3,)),
                          keras.layers.Dense(2, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.1),
                                             activity_regularizer=keras.regularizers.L1(0.01)),
                          AddLoss(), keras.layers.Dense(1, kernel_initializer="ones",
                                                        bias_regularizer=keras.regularizers.L2(0.2))])
    m.compile(keras.optimizers.SGD(0.05), "mse")
    return m


x_l = np.linspace(-1, 1, 12).reshape(4, 3).astype("float32")
y_l = np.linspace(0, 1, 4).reshape(4, 1).astype("float32")
m = losses_model()
found = {"before": [float(v) for v in m.losses]}
found["fit_loss"] = m.fit(x_l, y_l, batch_size=4, epochs=2, verbose=0).history["loss"]
found["after_fit"] = [float(v) for v in m.losses]
found["evaluate"] = m.evaluate(x_l, y_l, verbose=0)
m(x_l)
found["after_call"] = [float(v) for v in m.losses]
out["losses"] = found

with open(work + "/keras.json", "w") as f:
    json.dump(out, f)
'''


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    work = tmp_path_factory.mktemp("keras_semantics")
    np.savez(work / "inputs.npz", **_inputs())
    with open(work / "summary_kwargs.json", "w") as f:
        json.dump(SUMMARY_KWARGS, f)
    with open(work / "initializers.json", "w") as f:
        json.dump(INITIALIZERS, f)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(work / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(work)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"the Keras side failed:\n{proc.stderr[-4000:]}"
    with open(work / "keras.json") as f:
        return json.load(f)


@pytest.fixture
def inp():
    return _inputs()


def test_train_and_test_on_batch_return_this_batchs_values(cpu, ref, inp):
    """Keras 3 resets the metrics at each train_on_batch/test_on_batch: each returns that batch's loss and
    metrics, not the running mean over the earlier calls."""
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    m.set_weights([inp["tob_k"], inp["tob_b"]])
    train = [m.train_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
    test = [m.test_on_batch(inp["tob_x"][i], inp["tob_y"][i]) for i in range(3)]
    np.testing.assert_allclose(train, ref["train_on_batch"], rtol=1e-5)
    np.testing.assert_allclose(test, ref["test_on_batch"], rtol=1e-5)
    # as a dict: this batch's loss, the MSE of the outputs before the update
    x, y = inp["tob_x"][0], inp["tob_y"][0]
    before = float(np.mean((m.predict(x, verbose=0) - y) ** 2))
    d = m.train_on_batch(x, y, return_dict=True)
    assert sorted(d) == ["loss", "mae"] and d["loss"] == pytest.approx(before, rel=1e-5)


def test_batchnorm_moving_variance_takes_the_biased_batch_variance(cpu, ref, inp):
    m = keras.Sequential([keras.Input((3, 3, 4)), keras.layers.BatchNormalization(momentum=0.8)])
    m.compile(keras.optimizers.SGD(0.1), "mse")
    m.train_on_batch(inp["bn_x"], inp["bn_x"] * 0.5)
    moving_mean, moving_var = m.layers[0].get_weights()[2:]
    np.testing.assert_allclose(moving_mean, ref["bn_moving"][0], rtol=1e-5)
    np.testing.assert_allclose(moving_var, ref["bn_moving"][1], rtol=1e-5)
    np.testing.assert_allclose(moving_var, 0.8 + 0.2 * inp["bn_x"].var(axis=(0, 1, 2)), rtol=1e-5)


def _bn_model(kind: str, seed: int):
    """Small channels-last models whose batch norms take each device path: after a bias-free Conv2D (the
    fused convolution + batch norm), followed by a relu (the fused batch norm + relu), and after a Dense."""
    layers = keras.layers
    if kind == "conv_bn_relu":
        body = [keras.Input((6, 6, 8)), layers.Conv2D(8, 3, padding="same", use_bias=False,
                                                      kernel_initializer=keras.initializers.GlorotUniform(seed)),
                layers.BatchNormalization(momentum=0.7), layers.ReLU(), layers.GlobalAveragePooling2D()]
    elif kind == "bn_relu":
        body = [keras.Input((6, 6, 8)), layers.BatchNormalization(momentum=0.7), layers.ReLU(),
                layers.GlobalAveragePooling2D()]
    else:
        body = [keras.Input((5,)), layers.Dense(8, kernel_initializer=keras.initializers.GlorotUniform(seed)),
                layers.BatchNormalization(momentum=0.7)]
    m = keras.Sequential(body)
    m.compile(keras.optimizers.SGD(0.01), "mse")
    return m


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["conv_bn_relu", "bn_relu", "dense_bn"])
def test_gpu_batchnorm_moving_variance_matches_the_numpy_path(kind, dtype):
    """One training step on the GPU leaves the same moving statistics as on NumPy (the biased batch
    variance, as Keras), on every batch-norm path a layer chain takes."""
    from dnnbind import mixed_precision

    rng = np.random.default_rng(7)
    shape = (16, 6, 6, 8) if kind != "dense_bn" else (32, 5)
    x = rng.normal(0.5, 1.5, size=shape).astype(np.float32)
    y = rng.normal(size=(shape[0], 8)).astype(np.float32)
    stats = {}
    try:
        mixed_precision.set_global_policy("mixed_float16" if dtype == "float16" else "float32")
        for device in ("cpu", "cuda"):
            keras.set_default_device(device)
            m = _bn_model(kind, 3)
            m.train_on_batch(x, y)
            bn = next(layer for layer in m.layers if isinstance(layer, keras.layers.BatchNormalization))
            stats[device] = [np.asarray(w, np.float64) for w in bn.get_weights()[2:]]
    finally:
        keras.set_default_device(None)
        mixed_precision.set_global_policy("float32")
    tol = 2e-3 if dtype == "float16" else 1e-3  # float32: the GPU's Dense/conv before the norm run in TF32
    np.testing.assert_allclose(stats["cuda"][0], stats["cpu"][0], rtol=tol, atol=tol)
    np.testing.assert_allclose(stats["cuda"][1], stats["cpu"][1], rtol=tol)
    if kind == "bn_relu":  # the batch norm sees x itself: Keras's value, the biased variance
        np.testing.assert_allclose(stats["cuda"][1], 0.7 + 0.3 * x.astype(np.float64).var(axis=(0, 1, 2)), rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gpu_conv_batchnorm_kernel_running_var_is_biased(dtype):
    """``kernels.conv2d_batchnorm_forward_training`` on CUDA (the genstats graph where chosen, else the two
    ops) updates the running variance with the biased variance of the convolution's output."""
    from dnnbind import kernels
    from dnnbind.cuda import to_device

    rng = np.random.default_rng(11)
    x = rng.normal(0.3, 1.0, size=(8, 6, 6, 16)).astype(dtype)
    w = (rng.normal(size=(16, 3, 3, 16)) * 0.2).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    beta = rng.normal(size=16).astype(np.float32)
    rm, rv = rng.normal(size=16).astype(np.float32), rng.uniform(0.5, 2.0, 16).astype(np.float32)
    drm, drv = to_device(rm), to_device(rv)
    y, _, saved = kernels.conv2d_batchnorm_forward_training(
        to_device(x), to_device(w), to_device(gamma), to_device(beta), drm, drv, momentum=0.9, padding=1,
        layout="NHWC", activation="relu")
    yh = np.asarray(y.to_host(), np.float64)
    var = yh.var(axis=(0, 1, 2))
    tol = 5e-3 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(np.asarray(drv.to_host()), 0.9 * rv + 0.1 * var, rtol=tol,
                               err_msg=f"path {saved.path}")
    np.testing.assert_allclose(np.asarray(drm.to_host()), 0.9 * rm + 0.1 * yh.mean(axis=(0, 1, 2)), rtol=tol,
                               atol=tol, err_msg=f"path {saved.path}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sync_batchnorm_running_var_is_biased(device):
    """The synchronised batch norm's forward (one rank, the all-reduce a no-op) updates the running variance
    with the biased batch variance, on NumPy and on CUDA."""
    from dnnbind.layers.sync_batchnorm import sync_batchnorm_forward

    if device == "cuda":
        from dnnbind.cuda import to_device
    else:
        def to_device(a):
            return a.copy()

    def host(a):
        return np.asarray(a.to_host() if device == "cuda" else a, np.float64)

    rng = np.random.default_rng(12)
    x = rng.normal(1.0, 2.0, size=(8, 4, 4, 6)).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, 6).astype(np.float32), rng.normal(size=6).astype(np.float32)
    rm, rv = rng.normal(size=6).astype(np.float32), rng.uniform(0.5, 2.0, 6).astype(np.float32)
    drm, drv = to_device(rm), to_device(rv)
    sync_batchnorm_forward(to_device(x), to_device(gamma), to_device(beta), drm, drv, momentum=0.9, epsilon=1e-3,
                           layout="NHWC", world_size=1, all_reduce=lambda arrays: None)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(host(drv), 0.9 * rv + 0.1 * x64.var(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(host(drm), 0.9 * rm + 0.1 * x64.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-6)


def _summary_script_part(name: str):
    """A function of ``_KERAS_SCRIPT`` run here with ``keras`` = dnnbind (the same model code)."""
    start = _KERAS_SCRIPT.index(f"def {name}(")
    end = _KERAS_SCRIPT.index("\n\n\n", start)
    scope = {"keras": keras, "np": np}
    return scope, _KERAS_SCRIPT[start:end]


def test_summary_prints_keras_3s_table(cpu, ref, inp, monkeypatch):
    """The table, the parameter lines (with "Optimizer params" once compiled and trained) and the wrapping
    are Keras 3's text, character for character, for Sequential, functional (shared layer, several
    inputs), chain-like functional and nested models, and each summary argument."""
    monkeypatch.setenv("COLUMNS", "200")  # as the Keras side: the default width is min(88 or 108, columns - 4)
    scope, source = _summary_script_part("summary_models")
    scope["inp"] = inp
    exec(source, scope)  # noqa: S102 - this file's own text
    seen = 0
    for label, model in scope["summary_models"]():
        for n, kw in enumerate(SUMMARY_KWARGS):
            key = f"{label}/{n}"
            if key not in ref["summary"]:
                continue
            texts = []
            model.summary(print_fn=texts.append, **kw)
            theirs = ref["summary"][key]
            if label == "seq_compiled":
                # Keras's SGD holds iterations (int32) and learning_rate as variables; dnnbind's
                # optimizer.variables hold iterations (int64) only: the same 8 bytes, one count fewer
                assert "Optimizer params: 2 (8.00 B)" in theirs[0] and " Total params: 44 (176.00 B)" in theirs[0]
                assert len(model.optimizer.variables) == 1
                theirs = [theirs[0].replace("Optimizer params: 2 (", "Optimizer params: 1 (")
                          .replace(" Total params: 44 (", " Total params: 43 (")]
            assert texts == theirs, f"{key} {kw}:\n{texts[0]}\nKeras:\n{theirs[0]}"
            seen += 1
    assert seen == 24
    assert "Non-trainable params: 8 (32.00 B)" in ref["summary"]["seq/0"][0]


def test_summary_without_print_fn_goes_to_stdout(cpu, capsys):
    """Keras 3's text for a narrow table (as it printed it): the header wraps and sits at the bottom."""
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="only")], name="tiny")
    m.summary(line_length=40)
    assert capsys.readouterr().out == """\
Model: "tiny"
┏━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━┓
┃                 ┃ Output     ┃ Param ┃
┃ Layer (type)    ┃ Shape      ┃     # ┃
┡━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━┩
│ only (Dense)    │ (None, 2)  │     8 │
└─────────────────┴────────────┴───────┘
 Total params: 8 (32.00 B)
 Trainable params: 8 (32.00 B)
 Non-trainable params: 0 (0.00 B)
"""
    with pytest.raises(ValueError, match="line_length"):
        m.summary(line_length=0)


class _Spy(keras.layers.Layer):
    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self.seen = seen

    def call(self, x):
        self.seen.append(str(x.dtype))
        return keras.ops.cast(x, "float32") * 1.0


@pytest.mark.parametrize("in_dtype", ["int32", "float32"])
@pytest.mark.parametrize("data_dtype", ["int64", "float64"])
def test_fit_predict_evaluate_feed_inputs_in_their_input_dtype(cpu, ref, in_dtype, data_dtype):
    """Keras 3 converts the data to each Input's dtype: int32 ids stay integers, ints fed to a float32
    Input become float32."""
    seen = []
    i = keras.Input((3,), dtype=in_dtype)
    m = keras.Model(i, keras.layers.Dense(1)(_Spy(seen)(i)))
    m.compile("sgd", "mse")
    data = np.array([[1, 2, 3], [4, 5, 6]], data_dtype)
    del seen[:]
    m.fit(data, np.ones((2, 1), "float32"), verbose=0)
    m.predict(data, verbose=0)
    m.evaluate(data, np.ones((2, 1), "float32"), verbose=0)
    m.train_on_batch(data, np.ones((2, 1), "float32"))
    assert sorted(set(seen)) == ref["input_dtypes"][f"{in_dtype}/{data_dtype}"] == [in_dtype]


def test_sequential_feeds_its_inputs_dtype(cpu):
    seen = []
    m = keras.Sequential([keras.Input((3,), dtype="int32"), _Spy(seen), keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    del seen[:]
    data = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    m.fit(data, np.ones((2, 1), "float32"), verbose=0)
    m.predict(data.astype(np.float64), verbose=0)
    assert set(seen) == {"int32"}


@pytest.mark.gpu
def test_gpu_int32_ids_train_as_on_numpy():
    """An Embedding fed int32 ids (host arrays in fit, DeviceArrays in train_on_batch) on CUDA: the same
    weights after the steps as on NumPy."""
    from dnnbind.cuda import to_device

    rng = np.random.default_rng(5)
    ids = rng.integers(0, 50, size=(16, 4)).astype(np.int64)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    weights = {}
    try:
        for device in ("cpu", "cuda"):
            keras.set_default_device(device)
            m = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(50, 3, embeddings_initializer=keras.initializers.RandomNormal(
                                      seed=1)), keras.layers.Flatten(),
                                  keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))])
            m.compile(keras.optimizers.SGD(0.1), "mse")
            m.fit(ids, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            x = to_device(ids.astype(np.int32)) if device == "cuda" else ids.astype(np.int32)
            m.train_on_batch(x, to_device(y) if device == "cuda" else y)
            weights[device] = m.get_weights()
    finally:
        keras.set_default_device(None)
    for a, b in zip(weights["cuda"], weights["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_accuracy_class_is_exact_equality_and_the_string_picks_from_shapes(cpu, ref, inp):
    a = keras.metrics.Accuracy()
    a.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
    assert float(a.result()) == pytest.approx(0.75)
    a.update_state([[1, 2]], [[1, 0]], sample_weight=[[0.5, 2.0]])
    assert float(a.result()) == pytest.approx(ref["accuracy_class"], rel=1e-6)
    assert type(keras.metrics.get("accuracy")).__name__ == ref["accuracy_get"] == "Accuracy"
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    m.compile("sgd", "binary_crossentropy",
              metrics=["accuracy", keras.metrics.Accuracy(name="exact"), keras.metrics.BinaryAccuracy(name="ba")])
    m.set_weights([np.asarray(v, np.float32) for v in ref["accuracy_weights"]])
    got = m.evaluate(inp["acc_x"], inp["acc_y"], verbose=0, return_dict=True)
    theirs = ref["accuracy_eval"]
    assert sorted(got) == sorted(theirs) == ["accuracy", "ba", "exact", "loss"]
    for k in theirs:
        assert float(got[k]) == pytest.approx(theirs[k], rel=1e-5, abs=1e-6), k
    assert theirs["accuracy"] == theirs["ba"] > 0 and theirs["exact"] == 0.0


def test_an_initializer_instance_repeats_its_values_as_keras(cpu, ref):
    """Keras 3: an initializer with an int seed, or none (a seed drawn at creation), returns the same values at
    every call (two layers sharing the instance get the same kernel); a SeedGenerator seed gives new values
    at every call; two layers given the default string get different kernels."""
    from dnnbind import random as krandom

    theirs = ref["initializers"]
    for cls in INITIALIZERS:
        for seed in ("int", "none", "generator"):
            arg = 3 if seed == "int" else None if seed == "none" else krandom.SeedGenerator(3)
            init = getattr(keras.initializers, cls)(seed=arg)
            a, b = np.asarray(init((4, 3))), np.asarray(init((4, 3)))
            assert not np.all(a == 0)
            assert bool(np.array_equal(a, b)) == theirs[f"{cls}/{seed}"] == (seed != "generator"), (cls, seed)
    shared = keras.initializers.GlorotUniform()
    d1, d2 = keras.layers.Dense(3, kernel_initializer=shared), keras.layers.Dense(3, kernel_initializer=shared)
    d1.build((None, 4))
    d2.build((None, 4))
    assert bool(np.array_equal(d1.get_weights()[0], d2.get_weights()[0])) == theirs["shared_instance"] is True
    d1, d2 = keras.layers.Dense(3), keras.layers.Dense(3)
    d1.build((None, 4))
    d2.build((None, 4))
    assert bool(np.array_equal(d1.get_weights()[0], d2.get_weights()[0])) == theirs["default_string"] is False
    # the same int seed in two instances: the same values; another seed: others
    g = keras.initializers.GlorotUniform
    assert np.array_equal(g(seed=7)((5, 2)), g(seed=7)((5, 2))) and not np.array_equal(g(seed=7)((5, 2)),
                                                                                         g(seed=8)((5, 2)))
    with pytest.raises(ValueError, match="seed must be an int"):
        g(seed=1.5)


def test_sequential_inputs_and_outputs_as_keras(cpu, ref):
    scope, source = _summary_script_part("seq_io")
    exec(source, scope)  # noqa: S102 - this file's own text
    ours = scope["seq_io"]()
    assert ours == ref["sequential_io"]
    assert ours["unbuilt_inputs"] == "Sequential model 'empty' has no defined inputs yet."
    # the graph computes what the model computes
    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="a"), keras.layers.Dense(2, name="b")])
    probe = keras.Model(m.inputs, [m.get_layer("a").output, m.outputs[0]])
    x = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)
    hidden, final = probe.predict(x, verbose=0)
    np.testing.assert_allclose(final, m.predict(x, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(hidden, np.asarray(m.get_layer("a")(x)), rtol=1e-6)


def test_model_losses_as_keras(cpu, ref):
    """model.losses before and after fit (the current weights' penalties), after a call (that call's
    activity and add_loss losses first), and the fit/evaluate losses that include them."""
    scope, source = _summary_script_part("losses_model")
    a = _KERAS_SCRIPT.index("class AddLoss(")
    exec(_KERAS_SCRIPT[a:_KERAS_SCRIPT.index("\n\n\n", a)], scope)  # noqa: S102 - this file's own text
    exec(source, scope)  # noqa: S102
    x_l = np.linspace(-1, 1, 12).reshape(4, 3).astype("float32")
    y_l = np.linspace(0, 1, 4).reshape(4, 1).astype("float32")
    m = scope["losses_model"]()
    theirs = ref["losses"]
    np.testing.assert_allclose([float(v) for v in m.losses], theirs["before"], rtol=1e-6)
    assert len(theirs["before"]) == 2 and len(theirs["after_call"]) == 4
    np.testing.assert_allclose(m.fit(x_l, y_l, batch_size=4, epochs=2, verbose=0).history["loss"],
                               theirs["fit_loss"], rtol=1e-5)
    np.testing.assert_allclose([float(v) for v in m.losses], theirs["after_fit"], rtol=1e-5)
    assert m.evaluate(x_l, y_l, verbose=0) == pytest.approx(theirs["evaluate"], rel=1e-5)
    m(x_l)
    np.testing.assert_allclose([float(v) for v in m.losses], theirs["after_call"], rtol=1e-5)
