"""Functional models (``Model(inputs, outputs)``) on the NumPy backend: graph building, gradients of the
whole model loss against finite differences in float64 (residual CNN, two inputs / two outputs, a
shared layer), training with fit, configs, and step-graph bookkeeping through the fake backend.

GPU part (``@pytest.mark.gpu``): a functional residual CNN trained with step graphs matches eager.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind.autodiff import GradientTape
from dnnbind.layers.base import release_pending_state
from dnnbind import layers, mixed_precision
from dnnbind.trainers.step_graphs import StepGraphs
from dnnbind.models import Functional, Model, model_from_config
from testutil import rel_error


@pytest.fixture
def f64(cpu):
    mixed_precision.set_global_policy("float64")
    yield


def init(seed):
    return keras.initializers.GlorotUniform(seed)


# ============================================================================ models under test
def residual_cnn(seed=0, classes=3):
    inputs = keras.Input((6, 6, 2))
    # no bias before BatchNormalization: its gradient is exactly zero (the batch mean absorbs it)
    x = layers.Conv2D(4, 3, padding="same", use_bias=False, kernel_initializer=init(seed))(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    y = layers.Conv2D(4, 3, padding="same", activation="tanh", kernel_initializer=init(seed + 1))(x)
    x = layers.Add()([x, y])  # the residual: x feeds both the Conv2D and the Add
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, activation="softmax", kernel_initializer=init(seed + 2))(x)
    return Model(inputs, outputs, name="rescnn")


def two_in_two_out(seed=0):
    a = keras.Input((5,), name="a")
    b = keras.Input((4,), name="b")
    ha = layers.Dense(6, activation="relu", kernel_initializer=init(seed))(a)
    hb = layers.Dense(6, activation="tanh", kernel_initializer=init(seed + 1))(b)
    s = layers.Add()([ha, hb])
    cls = layers.Dense(3, activation="softmax", name="cls", kernel_initializer=init(seed + 2))(s)
    reg = layers.Dense(2, name="reg", kernel_initializer=init(seed + 3), bias_initializer=init(seed + 4))(hb)
    return Model(inputs=[a, b], outputs=[cls, reg])


def shared_model(seed=0):
    x1 = keras.Input((3,))
    x2 = keras.Input((3,))
    shared = layers.Dense(3, activation="tanh", name="shared", kernel_initializer=init(seed),
                          bias_initializer=init(seed + 5))
    h1 = shared(shared(x1))  # applied in sequence...
    h2 = shared(x2)          # ...and on another input: three applications
    out = layers.Dense(2, activation="softmax", kernel_initializer=init(seed + 1))(layers.Add()([h1, h2]))
    return Model([x1, x2], out), shared


# ============================================================================ gradient checks
def model_loss(model, xs, ys):
    """The compiled (weighted) model loss of one training forward, as a float."""
    fused = model._fused_outputs()
    outs = model._run_forward(xs, training=True, logits=fused)
    total = 0.0
    targets = iter(ys)
    for out, loss, w, f in zip(outs, model._losses, model._loss_weights, fused):
        total += w * float(loss.compute(out.data, next(targets), logits=f)[0])
    release_pending_state()
    return total


def analytic_grads(model, xs, ys):
    with GradientTape() as tape:
        total = model._loss_and_metrics(xs, ys, training=True)
    variables = model.trainable_weights
    found = tape.gradient(total, variables)
    release_pending_state()
    return {w.path: np.array(g, dtype=np.float64) for w, g in zip(variables, found)}


def check_gradients(model, xs, ys, rng, per_weight=8, tol64=1e-7, tol32=2e-5):
    """Every trainable weight's gradient (a random subset of entries) against central differences of
    the model loss; float32 weights (BatchNormalization's) get a float32-sized step and tolerance."""
    grads = analytic_grads(model, xs, ys)
    assert grads, "the model has no trainable weights"
    for layer in model._flat_layers():
        for w in layer.trainable_weights:
            value = w.value
            is64 = value.dtype == np.float64
            eps = 1e-6 if is64 else 2.0**-14  # exact steps in float32 near 0 and 1
            flat = value.reshape(-1)
            idx = rng.choice(flat.size, size=min(per_weight, flat.size), replace=False)
            numeric = []
            for i in idx:
                old = flat[i]
                flat[i] = old + eps
                plus = model_loss(model, xs, ys)
                flat[i] = old - eps
                minus = model_loss(model, xs, ys)
                flat[i] = old
                numeric.append((plus - minus) / (2 * eps))
            # tape.gradient speaks the Keras layout; the perturbed entries are the stored array's
            analytic = grads[w.path] if w._to_internal is None else np.asarray(w._to_internal(grads[w.path]))
            analytic = analytic.reshape(-1)[idx]
            assert np.any(np.asarray(numeric) != 0), f"{w.path}: all sampled gradients are zero"
            err = rel_error(analytic, np.asarray(numeric))
            assert err < (tol64 if is64 else tol32), f"{w.path}: relative error {err:.2e}"
    return grads


def test_residual_cnn_gradients_match_finite_differences(f64, rng):
    model = residual_cnn()
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert model._fused_outputs() == [True]  # the final softmax is fused with the cross-entropy
    x = rng.normal(size=(5, 6, 6, 2))
    y = rng.integers(0, 3, 5).astype(np.int32)
    grads = check_gradients(model, [x], [y], rng)
    # the residual tensor receives gradient from both of its readers: dropping either changes the result
    assert set(grads) == {w.path for w in model.trainable_weights}


def test_two_inputs_two_outputs_gradients_match_finite_differences(f64, rng):
    model = two_in_two_out()
    model.compile("sgd", loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                  loss_weights={"cls": 1.0, "reg": 0.5})
    assert model.output_names == ["cls", "reg"] and model._input_names() == ["a", "b"]
    xa, xb = rng.normal(size=(6, 5)), rng.normal(size=(6, 4))
    y_cls, y_reg = rng.integers(0, 3, 6).astype(np.int32), rng.normal(size=(6, 2))
    check_gradients(model, [xa, xb], [y_cls, y_reg], rng)


def test_shared_layer_gradients_are_summed_over_its_applications(f64, rng):
    model, shared = shared_model()
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert sum(layer is shared for layer in model.layers) == 1 and len(shared._inbound_nodes) == 3
    assert model.count_params() == 3 * 3 + 3 + 3 * 2 + 2
    x1, x2 = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    y = rng.integers(0, 2, 4).astype(np.int32)
    check_gradients(model, [x1, x2], [y], rng, per_weight=12)


# ============================================================================ training
def test_residual_cnn_fit_reduces_the_loss_and_predict_matches_call(cpu, rng):
    model = residual_cnn(seed=1)
    model.compile(keras.optimizers.Adam(0.02), "sparse_categorical_crossentropy", metrics=["accuracy"])
    x = rng.normal(size=(48, 6, 6, 2)).astype(np.float32)
    y = (x[:, :3, :, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + (x[..., 1].mean(axis=(1, 2)) > 0.1)
    h = model.fit(x, y, batch_size=16, epochs=15, verbose=0, seed=0)
    assert h.history["loss"][-1] < 0.8 * h.history["loss"][0]
    p = model.predict(x[:10], verbose=0)
    assert p.shape == (10, 3) and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(model(x[:10]), p, atol=1e-6)
    ev = model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(ev) == {"loss", "accuracy"} and ev["accuracy"] > 0.5


def test_two_output_fit_logs_per_output_losses_and_metrics(cpu, rng):
    model = two_in_two_out(seed=2)
    model.compile(keras.optimizers.Adam(0.02), loss=["sparse_categorical_crossentropy", "mse"],
                  loss_weights=[1.0, 0.5], metrics={"cls": ["accuracy"]})
    xa = rng.normal(size=(64, 5)).astype(np.float32)
    xb = rng.normal(size=(64, 4)).astype(np.float32)
    y_cls = (xa[:, 0] > 0).astype(np.int64) + (xb[:, 0] > 0)
    y_reg = np.stack([xb[:, 1], xb[:, 2] - xb[:, 3]], axis=1).astype(np.float32)
    h = model.fit({"a": xa, "b": xb}, {"cls": y_cls, "reg": y_reg}, batch_size=16, epochs=12, verbose=0, seed=0,
                  validation_data=([xa[:16], xb[:16]], [y_cls[:16], y_reg[:16]]))
    assert model.metrics_names == ["loss", "cls_loss", "reg_loss", "cls_accuracy"]
    hist = h.history
    assert {"loss", "cls_loss", "reg_loss", "cls_accuracy", "val_loss", "val_cls_loss"} <= set(hist)
    assert hist["loss"][-1] < 0.7 * hist["loss"][0] and hist["reg_loss"][-1] < hist["reg_loss"][0]
    # the total is the weighted sum of the per-output losses (each a mean over the same samples)
    ev = model.evaluate([xa, xb], [y_cls, y_reg], verbose=0, return_dict=True)
    assert abs(ev["loss"] - (ev["cls_loss"] + 0.5 * ev["reg_loss"])) < 1e-5 * max(1.0, ev["loss"])
    p_cls, p_reg = model.predict([xa, xb], batch_size=20, verbose=0)
    assert p_cls.shape == (64, 3) and p_reg.shape == (64, 2)
    one = model.predict_on_batch([xa[:8], xb[:8]])
    assert np.allclose(one[1], p_reg[:8], atol=1e-6)
    # the compile arguments round-trip through their JSON form (what a saved model keeps)
    clone = model_from_config({"class_name": "Functional", "config": model.get_config()})
    clone.compile_from_config(json.loads(json.dumps(model.get_compile_config())))
    assert clone.metrics_names == model.metrics_names and clone._loss_weights == [1.0, 0.5]
    assert [type(loss).__name__ for loss in clone._losses] == ["SparseCategoricalCrossentropy", "MeanSquaredError"]
    assert dnnbind.models.load_model is dnnbind.saving.load_model is dnnbind.load_model
    assert dnnbind.models.save_model is dnnbind.saving.save_model


def test_shared_layer_model_trains(cpu, rng):
    model, _ = shared_model(seed=3)
    model.compile(keras.optimizers.Adam(0.03), "sparse_categorical_crossentropy")
    x1 = rng.normal(size=(64, 3)).astype(np.float32)
    x2 = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x1[:, 0] + x2[:, 1] > 0).astype(np.int64)
    h = model.fit([x1, x2], y, batch_size=16, epochs=15, verbose=0, seed=0)
    assert h.history["loss"][-1] < 0.7 * h.history["loss"][0]


def test_output_without_a_loss_and_unfused_outputs(cpu, rng):
    """None as an output's loss: no gradient reaches the layers only it uses (they get zeros)."""
    model = two_in_two_out(seed=4)
    model.compile("sgd", loss={"cls": "sparse_categorical_crossentropy", "reg": None})
    reg = model.get_layer("reg")
    before = reg.get_weights()
    xa = rng.normal(size=(8, 5)).astype(np.float32)
    xb = rng.normal(size=(8, 4)).astype(np.float32)
    model.train_on_batch([xa, xb], {"cls": rng.integers(0, 3, 8), "reg": np.zeros((8, 2))})
    assert all(np.array_equal(a, b) for a, b in zip(before, reg.get_weights()))
    # its forward ran but its backward did not: it keeps no array of the step (graph-capture rule)
    assert reg.__dict__.get("_x2") is None and reg.__dict__.get("_w") is None
    # an output that is also read by another layer keeps its softmax (no fusion)
    inp = keras.Input((4,))
    mid = layers.Dense(4, activation="softmax")(inp)
    out = layers.Dense(2)(mid)
    both = Model(inp, [mid, out])
    both.compile("sgd", ["categorical_crossentropy", "mse"])
    assert both._fused_outputs() == [False, False]


# ============================================================================ structure and errors
def test_graph_structure_summary_and_errors(cpu, capsys):
    model = residual_cnn()
    assert isinstance(model, Functional) and isinstance(model, Model) and dnnbind.Model is Model
    assert [type(layer).__name__ for layer in model.layers] == [
        "InputLayer", "Conv2D", "BatchNormalization", "Activation", "Conv2D", "Add", "GlobalAveragePooling2D",
        "Dense"]
    assert model.input_shape == (None, 6, 6, 2) and model.output_shape == (None, 3)
    model.summary()
    text = capsys.readouterr().out
    assert "Connected to" in text and re.search(r"add(_\d+)? \(Add\)", text)
    assert f"Total params: {model.count_params():,}" in text
    a, b = keras.Input((3,)), keras.Input((3,))
    with pytest.raises(ValueError, match="graph disconnected"):
        Model(a, layers.Add()([a, b]))
    with pytest.raises(TypeError, match="symbolic tensors"):
        Model(a, np.zeros((1, 3)))
    with pytest.raises(TypeError, match="takes a list of inputs"):
        layers.Add()(a)
    with pytest.raises(ValueError, match=r"inputs have incompatible shapes"):
        layers.Add()([a, keras.Input((4,))])
    with pytest.raises(TypeError, match="symbolic and has no value"):
        np.asarray(a)
    m = Model([a, b], layers.Add()([a, b]))
    m.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"model has 2 inputs .*list of 2 arrays or a dict"):
        m.fit(np.ones((4, 3), np.float32), np.ones((4, 3)), verbose=0)
    with pytest.raises(ValueError, match=r"inputs of shapes"):
        m.fit([np.ones((4, 3)), np.ones((4, 2))], np.ones((4, 3)), verbose=0)
    with pytest.raises(ValueError, match=r"loss is a list of 2 but the model has 1 output"):
        m.compile("sgd", ["mse", "mse"])


def test_duplicate_layer_names_are_refused_at_model_as_keras_does(cpu, tmp_path):
    """Such a model used to build and save, then load_model refused its own file ("two layers are named
    'd'"). Keras 3 refuses it at Model(...) (ops/function.py: map_graph), with these words."""
    inputs = keras.Input((4,), name="x")
    hidden = layers.Dense(3, name="d")(inputs)
    with pytest.raises(ValueError, match=r'The name "d" is used 2 times in the model \(Dense, Dense\)\. All operation '
                                         r"names should be unique\. Give each layer its own name="):
        Model(inputs, layers.Dense(2, name="d")(hidden))
    with pytest.raises(ValueError, match='The name "x" is used 2 times'):  # Input layers count, as in Keras
        Model(inputs, layers.Dense(2, name="x")(hidden))
    model = Model(inputs, layers.Dense(2, name="d_2")(hidden))  # distinct names: it round-trips
    model.save(tmp_path / "m.dnnbind")
    assert [layer.name for layer in keras.load_model(tmp_path / "m.dnnbind").layers] == ["x", "d", "d_2"]


def test_config_round_trip_rebuilds_the_graph(cpu, rng):
    for build in (residual_cnn, two_in_two_out, lambda: shared_model()[0]):
        model = build()
        config = model.get_config()
        clone = model_from_config({"class_name": "Functional", "config": config})
        assert [type(layer).__name__ for layer in clone.layers] == [type(layer).__name__ for layer in model.layers]
        clone.set_weights(model.get_weights())
        xs = [rng.normal(size=(3, *s)).astype(np.float32) for s in model._expected_input_shapes()]
        want, got = model.predict(xs, verbose=0), clone.predict(xs, verbose=0)
        for w, g in zip(want if isinstance(want, list) else [want], got if isinstance(got, list) else [got]):
            assert np.allclose(w, g, atol=1e-6)
        assert clone.output_names == model.output_names
    bad = residual_cnn().get_config()
    bad["layers"][1]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = "nowhere"
    with pytest.raises(ValueError, match="unknown layer 'nowhere'"):
        Functional.from_config(bad)
    with pytest.raises(dnnbind.AllocationTooLargeError):
        Functional.from_config(residual_cnn().get_config(), max_weight_bytes=100)


def test_save_weights_and_load_weights_round_trip(cpu, rng, tmp_path):
    model, clone = two_in_two_out(seed=5), two_in_two_out(seed=6)
    model.save_weights(tmp_path / "m.safetensors")
    clone.load_weights(tmp_path / "m.safetensors")
    for a, b in zip(model.get_weights(), clone.get_weights()):
        assert np.array_equal(a, b)


# ============================================================================ step graphs (fake backend)
def test_fake_graph_steps_of_a_functional_model_match_eager_exactly(cpu, rng):
    from test_graph_step import FakeBackend, assert_same

    x = rng.normal(size=(40, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    graphed, eager = residual_cnn(seed=7), residual_cnn(seed=8)
    eager.set_weights(graphed.get_weights())
    for m, jit in ((graphed, "auto"), (eager, False)):
        m.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=jit)
    graphed._step_graphs = StepGraphs(FakeBackend(graphed))
    hg = graphed.fit(x, y, batch_size=8, epochs=3, verbose=0, seed=1, validation_data=(x[:16], y[:16]))
    he = eager.fit(x, y, batch_size=8, epochs=3, verbose=0, seed=1, validation_data=(x[:16], y[:16]))
    assert hg.history == he.history
    assert_same(graphed, eager)
    g = graphed._step_graphs.stats
    assert g["captures"] == 2 and g["replays"] == 13 + 4 and g["failures"] == 0
    assert np.array_equal(graphed.predict(x, batch_size=8, verbose=0), eager.predict(x, batch_size=8, verbose=0))
    # nothing of a step's forward outlives it
    assert all(not isinstance(v, np.ndarray) or k in ("_consts",) for layer in graphed._flat_layers()
               for k, v in vars(layer).items() if k in ("_x", "_x2", "_y", "_saved"))


def test_fake_graph_steps_with_two_inputs_and_two_outputs(cpu, rng):
    from test_graph_step import FakeBackend

    xa = rng.normal(size=(32, 5)).astype(np.float32)
    xb = rng.normal(size=(32, 4)).astype(np.float32)
    yc, yr = rng.integers(0, 3, 32), rng.normal(size=(32, 2)).astype(np.float32)
    graphed, eager = two_in_two_out(seed=9), two_in_two_out(seed=10)
    eager.set_weights(graphed.get_weights())
    for m, jit in ((graphed, "auto"), (eager, False)):
        m.compile(keras.optimizers.Adam(0.01), ["sparse_categorical_crossentropy", "mse"], jit_compile=jit)
    graphed._step_graphs = g = StepGraphs(FakeBackend(graphed))
    hg = graphed.fit([xa, xb], [yc, yr], batch_size=8, epochs=2, verbose=0, seed=2)
    he = eager.fit([xa, xb], [yc, yr], batch_size=8, epochs=2, verbose=0, seed=2)
    assert hg.history == he.history
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        assert np.array_equal(a, b)
    pg, pe = graphed.predict([xa, xb], batch_size=8, verbose=0), eager.predict([xa, xb], batch_size=8, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(pg, pe))
    keys = g.keys()
    assert all(isinstance(k[2], tuple) and isinstance(k[2][0], tuple) for k in keys)  # tuples of shapes
    assert g.stats["replays"] >= 6 + 2


# ============================================================================ GPU
@pytest.fixture
def gpu():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


@pytest.mark.gpu
def test_gpu_functional_residual_cnn_graphs_match_eager(gpu):
    from dnnbind import kernels

    dnnbind.set_default_device("cuda")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = residual_cnn(seed=11), residual_cnn(seed=12)
        eager.set_weights(graphed.get_weights())
        graphed.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                        metrics=["accuracy"])
        eager.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                      metrics=["accuracy"], jit_compile=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no "could not be captured" fallback
            hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=3, validation_data=(x[:32], y[:32]))
            pg = graphed.predict(x, batch_size=16, verbose=0)
        he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=3, validation_data=(x[:32], y[:32]))
        pe = eager.predict(x, batch_size=16, verbose=0)
    g = graphed._step_graphs.stats
    assert g["failures"] == 0 and g["captures"] >= 3 and g["replays"] >= 3 * 4 - 2
    for key in ("loss", "accuracy", "val_loss"):
        assert np.allclose(hg.history[key], he.history[key], rtol=1e-5, atol=1e-6), key
    for a, b in zip(graphed.get_weights(), eager.get_weights()):  # BN moving statistics included
        assert rel_error(a, b) < 1e-5
    assert rel_error(pg, pe) < 1e-5 and not np.array_equal(pg[:16], pg[16:32])


@pytest.mark.gpu
def test_gpu_two_input_two_output_graphs_match_eager(gpu):
    from dnnbind import kernels

    dnnbind.set_default_device("cuda")
    rng = np.random.default_rng(1)
    xa = rng.normal(size=(48, 5)).astype(np.float32)
    xb = rng.normal(size=(48, 4)).astype(np.float32)
    yc, yr = rng.integers(0, 3, 48), rng.normal(size=(48, 2)).astype(np.float32)
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = two_in_two_out(seed=13), two_in_two_out(seed=14)
        eager.set_weights(graphed.get_weights())
        graphed.compile(keras.optimizers.Adam(0.01), ["sparse_categorical_crossentropy", "mse"])
        eager.compile(keras.optimizers.Adam(0.01), ["sparse_categorical_crossentropy", "mse"], jit_compile=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            hg = graphed.fit([xa, xb], [yc, yr], batch_size=16, epochs=3, verbose=0, seed=4)
        he = eager.fit([xa, xb], [yc, yr], batch_size=16, epochs=3, verbose=0, seed=4)
    assert graphed._step_graphs.stats["replays"] >= 6 and graphed._step_graphs.stats["failures"] == 0
    for key in ("loss", "cls_loss", "reg_loss"):
        assert np.allclose(hg.history[key], he.history[key], rtol=1e-5, atol=1e-6), key
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        assert rel_error(a, b) < 1e-5


def test_fit_validation_calls_the_test_hooks(cpu, rng):
    """Keras 3 runs validation through evaluate: on_test_begin/end and the test batch hooks fire."""
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            seen.append("test_begin")

        def on_test_batch_end(self, batch, logs=None):
            seen.append(f"test_batch_{batch}")

        def on_test_end(self, logs=None):
            seen.append(("test_end", round(logs["loss"], 6)))

        def on_epoch_end(self, epoch, logs=None):
            seen.append(("epoch_end", round(logs["val_loss"], 6)))

    model = residual_cnn(seed=13)
    model.compile("sgd", "sparse_categorical_crossentropy")
    x = rng.normal(size=(24, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x[:12], y[:12]), callbacks=[Recorder()])
    assert len(seen) == 10
    for epoch in range(2):
        block = seen[5 * epoch:5 * epoch + 5]
        assert block[:3] == ["test_begin", "test_batch_0", "test_batch_1"]
        # on_test_end gets the validation logs that the epoch reports as val_*
        assert block[3][0] == "test_end" and block[4][0] == "epoch_end" and block[3][1] == block[4][1]


def test_model_input_and_layer_input_make_a_feature_extractor(cpu, rng):
    """Keras 3's ``Model.input`` and ``Layer.input`` (keras.io's "features before a layer" pattern)."""
    inp = keras.Input((4,), name="x")
    hidden = layers.Dense(5, name="hidden")(inp)
    head = layers.Dense(3, name="head")
    model = keras.Model(inp, head(hidden))
    assert model.input is inp and head.input is hidden
    extractor = keras.Model(inputs=model.input, outputs=head.input)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_allclose(extractor.predict(x, verbose=0), model.get_layer("hidden")(x).numpy(), rtol=1e-6)
    a, b = keras.Input((2,), name="a"), keras.Input((2,), name="b")
    two = keras.Model([a, b], layers.Add()([a, b]))
    assert two.input == [a, b] and two.layers[-1].input == [a, b]
    keyed = keras.Model({"a": a, "b": b}, layers.Add()([a, b]))
    assert keyed.input == {"a": a, "b": b}
    with pytest.raises(AttributeError, match=r"Dense 'lonely' has never been called on symbolic inputs"):
        layers.Dense(2, name="lonely").input


class _FunctionalSubclass(keras.Model):
    """Keras 3's "functional subclassing": a Model subclass whose __init__ builds a graph and calls
    super().__init__(inputs=..., outputs=...)."""

    def __init__(self, units=3, **kwargs):
        inputs = keras.Input((4,), name="features")
        hidden = layers.Dense(8, activation="relu", name="hidden")(inputs)
        outputs = layers.Dense(units, activation="softmax", name="head")(hidden)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.units = units

    def describe(self):
        return f"{self.name}: {self.units} classes"


def test_functional_subclassing(cpu, rng):
    first, second = _FunctionalSubclass(name="first"), _FunctionalSubclass(units=2)
    for model, units in ((first, 3), (second, 2)):
        assert isinstance(model, _FunctionalSubclass) and isinstance(model, Functional)
        assert [layer.name for layer in model.layers] == ["features", "hidden", "head"]
        assert model.input.shape == (None, 4)
    assert first.name == "first" and first.describe() == "first: 3 classes"
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    first.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy")
    losses = first.fit(x, y, epochs=5, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    assert second.predict(x, verbose=0).shape == (16, 2)
    # surgery on the subclass's graph
    cut = keras.Model(first.input, first.get_layer("head").input)
    assert cut.predict(x, verbose=0).shape == (16, 8)


class _StepCounting(keras.Model):
    """A subclass used functionally (keras.io's CustomModel(inputs, outputs)) with its own train_step."""

    def train_step(self, data):
        x, y = data
        with GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        self.steps_seen = getattr(self, "steps_seen", 0) + 1
        return {"loss": loss}


class _Pair(keras.Model):
    """A subclass taking two positional arguments of its own (keras.io's VAE(encoder, decoder))."""

    def __init__(self, first, second, **kwargs):
        super().__init__(**kwargs)
        self.first, self.second = first, second

    def call(self, x):
        return self.second(self.first(x))


def test_a_subclass_called_with_inputs_and_outputs_is_functional_with_its_own_methods(cpu, rng):
    # regression: CustomModel(inputs, outputs) raised "unexpected arguments"; Keras 3 builds a functional
    # model whose train_step is the subclass's
    inputs = keras.Input((3,))
    model = _StepCounting(inputs, layers.Dense(1)(inputs), name="counting")
    assert isinstance(model, Functional) and isinstance(model, _StepCounting) and model.name == "counting"
    assert type(model).__name__ == "_StepCounting" and len(model.layers) == 2
    model.compile(optimizer="sgd", loss="mse")
    x, y = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert model.steps_seen == 2
    # the choice is made on the arguments Model.__init__ gets: two positional arguments of the subclass's
    # own __init__ (super().__init__(**kwargs)) keep it a subclassed model
    pair = _Pair(layers.Dense(2), layers.Dense(1))
    assert not isinstance(pair, Functional)
    assert pair(x).shape == (8, 1)


class _Affine(layers.Layer):
    """A user's layer whose get_config leaves out name (keras.io's functional_api CustomDense)."""

    def __init__(self, units=2):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="random_normal")

    def call(self, inputs):
        return keras.ops.matmul(inputs, self.w)

    def get_config(self):
        return {"units": self.units}


def test_model_from_config_rebuilds_a_functional_config_with_custom_objects(cpu, rng):
    # regression: keras.Model.from_config(config, custom_objects=...) called Model(**config) and failed; a
    # layer whose config has no name could not be found in the graph
    inputs = keras.Input((3,))
    model = keras.Model(inputs, layers.Dense(2)(_Affine(4)(inputs)))
    again = keras.Model.from_config(model.get_config(), custom_objects={"_Affine": _Affine})
    assert isinstance(again, Functional) and again.output_shape == (None, 2)
    again.set_weights(model.get_weights())
    x = rng.normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(again.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    with pytest.raises(TypeError, match="custom_objects must be a dict"):
        Functional.from_config(model.get_config(), custom_objects=[_Affine])


def test_a_static_batch_size_input_feeds_built_in_layers(cpu, rng):
    # regression: Input(batch_shape=(4, 6, 3)) made Conv1D see a sample shape (4, 6, 3)
    inputs = keras.Input(batch_shape=(4, 6, 3))
    model = keras.Model(inputs, layers.Dense(1)(layers.Conv1D(2, 3)(inputs)))
    assert model.output_shape[1:] == (4, 1)
    assert model.predict(rng.normal(size=(4, 6, 3)).astype(np.float32), batch_size=4, verbose=0).shape == (4, 4, 1)


def test_data_one_trailing_axis_of_one_apart_is_adjusted_as_keras(cpu):
    """Keras 3's Functional._adjust_input_rank: (N, 4, 4) data feeds Input((4, 4, 1)) (keras-io's MNIST ports
    pass the images without their channel axis); (N, 3, 1) feeds Input((3,)); anything else is refused."""
    inp = keras.Input((4, 4, 1))
    model = Model(inp, layers.Dense(2)(layers.Flatten()(inp)))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(6, 4, 4)).astype("float32")
    model.fit(x, np.zeros((6, 2), "float32"), epochs=1, verbose=0)
    np.testing.assert_allclose(model.predict(x, verbose=0), model.predict(x[..., None], verbose=0), rtol=1e-6)
    flat_in = keras.Input((3,))
    flat = Model(flat_in, layers.Dense(1)(flat_in))
    z = np.ones((2, 3, 1), "float32")
    np.testing.assert_allclose(flat.predict(z, verbose=0), flat.predict(z[..., 0], verbose=0))
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, 4, 4, 1\)"):
        model.predict(np.ones((2, 4, 4, 2), "float32"), verbose=0)
