"""Sequential on the NumPy backend: structure, summary, compile/fit/evaluate/predict semantics."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from testutil import rel_error


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def blobs(rng, n=240, d=6, classes=3):
    centers = rng.normal(0, 4, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = (centers[y] + rng.normal(size=(n, d))).astype(np.float32)
    return x, y


def mlp(d=6, classes=3, seed=0):
    return keras.Sequential([
        keras.Input(shape=(d,)),
        layers.Dense(16, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed)),
        layers.Dense(classes, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ])


def test_namespace():
    for name in ["Sequential", "Input", "load_model", "layers", "optimizers", "losses", "metrics", "callbacks",
                 "utils", "mixed_precision"]:
        assert hasattr(keras, name), name


def test_structure_add_pop_count_params():
    model = keras.Sequential(name="m")
    model.add(keras.Input((4,)))
    model.add(layers.Dense(3))
    model.add(layers.Dense(2))
    assert model.built and len(model.layers) == 2
    assert model.count_params() == 4 * 3 + 3 + 3 * 2 + 2
    assert model.output_shape == (None, 2)
    popped = model.pop()
    assert isinstance(popped, layers.Dense) and model.output_shape == (None, 3)
    ws = model.get_weights()
    assert [w.shape for w in ws] == [(4, 3), (3,)]
    model.set_weights([np.ones((4, 3)), np.zeros(3)])
    assert np.allclose(model.predict(np.ones((2, 4)), verbose=0), 4.0)
    # input_shape on the first layer also builds the model
    m2 = keras.Sequential([layers.Dense(2, input_shape=(5,))])
    assert m2.built and m2.count_params() == 12


def test_summary_text():
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu", name="conv2d"),
        layers.MaxPooling2D(pool_size=(2, 2), name="max_pooling2d"),
        layers.BatchNormalization(name="batch_normalization"),
        layers.Flatten(name="flatten"),
        layers.Dense(10, activation="softmax", name="dense"),
    ], name="sequential")
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert 'Model: "sequential"' in text
    assert "Layer (type)" in text and "Output Shape" in text and "Param #" in text
    assert "conv2d (Conv2D)" in text and "(None, 26, 26, 32)" in text and "320" in text
    # Keras 3 wraps a name (type) wider than its column at the space
    assert "│ batch_normalization" in text and "│ (BatchNormalization)" in text and "(None, 13, 13, 32)" in text
    assert "(None, 5408)" in text and "54,090" in text
    total = 320 + 128 + 54090
    assert f"Total params: {total:,}" in text
    assert f"Trainable params: {total - 64:,}" in text
    assert "Non-trainable params: 64" in text


class _Doubler(layers.Layer):
    def call(self, x):
        return x * 2.0


def test_summary_shows_the_shapes_of_layers_that_define_call():
    # regression: a Sequential holding a layer written with call() (a user's layer, Conv2DTranspose) failed
    # in summary(), which read the layer's own output_shape (None for such layers)
    model = keras.Sequential([keras.Input((4, 4, 2)), layers.Conv2DTranspose(3, 2, strides=2, name="up"),
                              _Doubler(name="twice"), layers.Flatten(name="flat")])
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert "up (Conv2DTranspose)" in text and "(None, 8, 8, 3)" in text and "27" in text
    assert "twice (_Doubler)" in text and "(None, 192)" in text


def test_fit_learns_and_accuracy_is_right(rng):
    keras.utils.set_random_seed(0)  # fit's shuffle: not whatever earlier tests left in the generator
    x, y = blobs(rng)
    model = mlp()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    before = model.evaluate(x, y, verbose=0)
    history = model.fit(x, y, batch_size=32, epochs=8, verbose=0)
    assert isinstance(history, keras.callbacks.History)
    assert history.epoch == list(range(8))
    assert set(history.history) == {"loss", "accuracy"}
    loss, acc = model.evaluate(x, y, verbose=0)
    assert loss < 0.5 * before[0] and history.history["loss"][-1] < history.history["loss"][0]
    pred = model.predict(x, verbose=0)
    assert pred.shape == (len(x), 3) and pred.dtype == np.float32
    assert np.allclose(pred.sum(1), 1, atol=1e-5)
    assert abs(acc - np.mean(pred.argmax(1) == y)) < 1e-6
    assert acc > 0.9
    manual = -np.mean(np.log(np.clip(pred[np.arange(len(y)), y], 1e-7, 1)))
    assert abs(loss - manual) < 1e-4
    d = model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(d) == {"loss", "accuracy"} and abs(d["loss"] - loss) < 1e-6


def test_evaluate_without_metrics_returns_a_float(rng):
    x, y = blobs(rng, n=40)
    model = mlp()
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert isinstance(model.evaluate(x, y, verbose=0), float)


def test_validation_split_takes_the_last_samples(rng):
    x, y = blobs(rng, n=100)
    model = mlp()
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    h = model.fit(x, y, epochs=1, batch_size=16, validation_split=0.2, verbose=0)
    val_loss, val_acc = model.evaluate(x[80:], y[80:], verbose=0)
    assert abs(h.history["val_loss"][0] - val_loss) < 1e-6
    assert abs(h.history["val_accuracy"][0] - val_acc) < 1e-6
    h2 = model.fit(x[:80], y[:80], epochs=1, validation_data=(x[80:], y[80:]), verbose=0)
    assert "val_loss" in h2.history


def test_fused_softmax_matches_logits_model(rng):
    """Dense(softmax)+SCCE (fused) trains exactly like Dense(linear)+SCCE(from_logits=True)."""
    x, y = blobs(rng, n=64)
    a = mlp(seed=3)
    b = keras.Sequential([keras.Input((6,)), layers.Dense(16, activation="relu"), layers.Dense(3)])
    b.set_weights(a.get_weights())
    a.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    b.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert a._fused() and not b._fused()
    la = a.fit(x, y, epochs=2, shuffle=False, verbose=0).history["loss"]
    lb = b.fit(x, y, epochs=2, shuffle=False, verbose=0).history["loss"]
    assert np.allclose(la, lb, rtol=1e-5)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        assert rel_error(wa, wb) < 1e-5
    # a separate Softmax layer with categorical labels fuses too
    c = keras.Sequential([keras.Input((6,)), layers.Dense(3), layers.Softmax()])
    c.compile("sgd", "categorical_crossentropy", metrics=["accuracy"])
    assert c._fused()
    c.fit(x, keras.utils.to_categorical(y, 3), epochs=1, verbose=0)


def test_train_test_predict_on_batch(rng):
    x, y = blobs(rng, n=32)
    model = mlp()
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"])
    before = model.test_on_batch(x, y)
    model.reset_metrics()
    out = model.train_on_batch(x, y)
    assert isinstance(out, list) and len(out) == 2
    assert abs(out[0] - before[0]) < 1e-5  # train_on_batch reports the loss before its update
    model.reset_metrics()
    after = model.test_on_batch(x, y, return_dict=True)
    assert after["loss"] < before[0] and set(after) == {"loss", "accuracy"}
    again = model.test_on_batch(x, y, return_dict=True)
    assert abs(again["loss"] - after["loss"]) < 1e-6
    # each call resets the metrics first (Keras 3): it reports its own batch, not a running average
    a = model.test_on_batch(x[:16], y[:16])[0]
    c = model.test_on_batch(x[16:], y[16:])[0]
    assert abs(model.test_on_batch(x[16:], y[16:])[0] - c) < 1e-6 and abs(a - c) > 1e-6
    p = model.predict_on_batch(x[:5])
    assert p.shape == (5, 3) and isinstance(p, np.ndarray)
    assert np.allclose(model(x[:5]), p)


def test_int_inputs_are_cast_like_keras(rng):
    model = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    model.compile("sgd", "mse")
    xi = np.arange(12).reshape(4, 3)
    assert np.allclose(model.predict(xi, verbose=0), model.predict(xi.astype(np.float32), verbose=0))
    model.fit(xi, np.ones(4), verbose=0)


def test_binary_and_mse_models(rng):
    keras.utils.set_random_seed(0)  # the unseeded initial weights and fit's shuffle decide the thresholds below
    x = rng.normal(size=(128, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.float32)
    model = keras.Sequential([keras.Input((2,)), layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    h = model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    loss, acc = model.evaluate(x, y, verbose=0)
    pred = model.predict(x, verbose=0)
    assert abs(acc - np.mean((pred[:, 0] > 0.5) == (y > 0.5))) < 1e-6
    assert acc > 0.9 and h.history["loss"][-1] < h.history["loss"][0]
    reg = keras.Sequential([keras.Input((2,)), layers.Dense(1)])
    reg.compile(keras.optimizers.SGD(0.1), "mse")
    t = x @ np.array([[1.5], [-2.0]], np.float32) + 0.5
    reg.fit(x, t, epochs=20, batch_size=16, verbose=0)
    assert reg.evaluate(x, t, verbose=0) < 1e-3


def test_mnist_convnet_script_runs_with_keras_imports():
    """The Keras mnist_convnet example, with only the imports changed (tiny random data, 1 epoch)."""
    import dnnbind as keras
    from dnnbind import layers

    num_classes = 10
    input_shape = (28, 28, 1)
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, size=(64, 28, 28)).astype("uint8")
    y_train = rng.integers(0, 10, size=64)
    x_train = x_train.astype("float32") / 255
    x_train = np.expand_dims(x_train, -1)
    y_train = keras.utils.to_categorical(y_train, num_classes)
    model = keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ])
    lines = []
    model.summary(print_fn=lines.append)
    assert "Total params: 34,826" in "\n".join(lines)
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=32, epochs=1, validation_split=0.25, verbose=0)
    score = model.evaluate(x_train[:16], y_train[:16], verbose=0)
    assert len(score) == 2 and np.isfinite(score[0]) and 0 <= score[1] <= 1
    assert len(history.history["val_loss"]) == 1


def test_mixed_precision_policy_switches_dtypes(rng):
    from dnnbind import mixed_precision

    mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        assert mixed_precision.global_policy().compute_dtype == "bfloat16"
        dense = layers.Dense(3)
        bn = layers.BatchNormalization()
        assert dense.compute_dtype == "bfloat16" and dense.variable_dtype == "float32"
        model = keras.Sequential([keras.Input((4, 4, 2)), layers.Conv2D(2, 3), bn, layers.Flatten(), dense])
        assert all(w.value.dtype == np.float32 for w in model.weights)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = rng.normal(size=(8, 4, 4, 2)).astype(np.float32)
        h = model.fit(x, rng.integers(0, 3, 8), epochs=2, verbose=0)
        assert np.all(np.isfinite(h.history["loss"]))
        assert model.predict(x, verbose=0).dtype == np.float32
        mixed_precision.set_global_policy("mixed_float16")
        assert layers.Dense(2).compute_dtype == "float16"
        assert layers.Dense(2, dtype="float32").compute_dtype == "float32"
    finally:
        mixed_precision.set_global_policy("float32")
    assert layers.Dense(2).compute_dtype == "float32"
    with pytest.raises(ValueError, match="unknown dtype policy"):
        mixed_precision.set_global_policy("mixed_int4")


def test_dynamic_loss_scaling_rules():
    """mixed_float16's loss scaling (forced on here, on NumPy): x2 after growth_steps finite steps,
    /2 and the update skipped on a non-finite step."""
    from dnnbind import models

    m = keras.Sequential([keras.Input((3,)), layers.Dense(2)])
    m.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    m._loss_scale = models._LossScale(m.device, growth_steps=2)
    x, y = np.ones((4, 3), np.float32), np.array([0, 1, 0, 1])
    w0 = m.get_weights()
    m.train_on_batch(x, y)
    assert float(m._loss_scale.scale) == 2.0**15
    assert not np.array_equal(m.get_weights()[0], w0[0])
    m.train_on_batch(x, y)
    assert float(m._loss_scale.scale) == 2.0**16
    bad = x.copy()
    # finite (NaN/inf in x are refused), but two equal rows with different labels: one of them is
    # misclassified, and its scaled gradient overflows float32
    bad[:2] = 1e35
    w1 = m.get_weights()
    with np.errstate(all="ignore"):
        m.train_on_batch(bad, y)
    assert float(m._loss_scale.scale) == 2.0**15
    assert all(np.array_equal(a, b) for a, b in zip(w1, m.get_weights()))


def test_sequential_refuses_duplicate_layer_names_before_any_change():
    # Keras 3: "All layers added to a Sequential model should have unique names"; the model is unchanged
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="d")])
    with pytest.raises(ValueError, match="unique names.*'d'"):
        model.add(layers.Dense(2, name="d"))
    assert [layer.name for layer in model.layers] == ["d"]
    with pytest.raises(ValueError, match="'d'"):
        keras.Sequential([layers.Dense(3, name="d"), layers.Dense(2, name="d")])
    model.add(layers.Dense(2, name="e"))
    assert model.output_shape == (None, 2)
