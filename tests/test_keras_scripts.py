"""Keras 3 scripts as Keras users write them, with only the imports changed, run on the CPU in CI.

Each script trains on a small synthetic task that is learnable (so accuracy far above chance and a
falling loss prove that learning happened, not only that the code ran):

* a functional residual CNN (Input, Conv2D, BatchNormalization, Activation, Add,
  GlobalAveragePooling2D, Dense) fit with validation_split;
* a subclassed keras.Model (layers made in __init__, composed in call);
* a keras.utils.PyDataset feeding fit and predict;
* a .keras save / keras.models.load_model round trip with identical predictions.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers


def stripes(n, seed=0, size=8):
    """Images with one bright horizontal (class 0) or vertical (class 1) stripe, plus noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.3, size=(n, size, size, 1)).astype("float32")
    y = rng.integers(0, 2, size=n)
    pos = rng.integers(1, size - 1, size=n)
    for i in range(n):
        if y[i] == 0:
            x[i, pos[i], :, 0] += 1.5
        else:
            x[i, :, pos[i], 0] += 1.5
    return x, y


def blobs(n, seed=0):
    """Three Gaussian clusters in 10 dimensions."""
    centers = np.random.default_rng(1234).normal(0, 2.0, size=(3, 10))  # the same task for every split
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = (centers[y] + rng.normal(0, 1.0, size=(n, 10))).astype("float32")
    return x, y


def test_functional_residual_cnn_learns_with_validation_split():
    keras.utils.set_random_seed(0)
    x_train, y_train = stripes(320)

    inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Conv2D(8, 3, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    residual = x
    x = layers.Conv2D(8, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.Add()([x, residual])
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs, outputs, name="resnet_mini")

    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=32, epochs=6, validation_split=0.2, verbose=0)

    loss = history.history["loss"]
    assert len(loss) == 6 and loss[-1] < 0.6 * loss[0]
    assert history.history["accuracy"][-1] > 0.85
    assert history.history["val_accuracy"][-1] > 0.8   # 64 held-out samples; chance is 0.5
    x_test, y_test = stripes(96, seed=1)
    test_loss, test_acc = model.evaluate(x_test, y_test, verbose=0)
    assert test_acc > 0.8


def test_subclassed_model_learns():
    keras.utils.set_random_seed(1)

    class MLP(keras.Model):
        def __init__(self, num_classes=3):
            super().__init__()
            self.hidden = layers.Dense(32, activation="relu")
            self.dropout = layers.Dropout(0.1)
            self.classifier = layers.Dense(num_classes, activation="softmax")

        def call(self, inputs, training=False):
            x = self.hidden(inputs)
            x = self.dropout(x, training=training)
            return self.classifier(x)

    x_train, y_train = blobs(300)
    model = MLP()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=32, epochs=8, verbose=0)

    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    x_test, y_test = blobs(150, seed=2)
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    assert acc > 0.9   # chance is 1/3
    preds = model.predict(x_test, verbose=0)
    assert preds.shape == (150, 3) and np.allclose(preds.sum(axis=1), 1.0, atol=1e-5)


def test_py_dataset_feeds_fit_and_predict():
    keras.utils.set_random_seed(2)

    class BlobDataset(keras.utils.PyDataset):
        def __init__(self, x, y, batch_size, **kwargs):
            super().__init__(**kwargs)
            self.x, self.y = x, y
            self.batch_size = batch_size
            self.epochs_seen = 0

        def __len__(self):
            return int(np.ceil(len(self.x) / self.batch_size))

        def __getitem__(self, idx):
            low = idx * self.batch_size
            high = min(low + self.batch_size, len(self.x))
            return self.x[low:high], self.y[low:high]

        def on_epoch_end(self):
            self.epochs_seen += 1

    x_train, y_train = blobs(250, seed=3)
    x_val, y_val = blobs(60, seed=4)
    train_ds = BlobDataset(x_train, y_train, batch_size=32, workers=2, use_multiprocessing=False)
    val_ds = BlobDataset(x_val, y_val, batch_size=32)

    model = keras.Sequential([
        keras.Input(shape=(10,)),
        layers.Dense(16, activation="relu"),
        layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(train_ds, epochs=5, validation_data=val_ds, verbose=0)

    assert train_ds.epochs_seen == 5
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.9
    probs = model.predict(BlobDataset(x_val, y_val, batch_size=32), verbose=0)
    assert probs.shape == (60, 3)
    assert np.mean(np.argmax(probs, axis=1) == y_val) > 0.9
    np.testing.assert_allclose(probs, model.predict(x_val, verbose=0), rtol=1e-6, atol=1e-7)


def test_keras_file_round_trip_gives_identical_predictions(tmp_path):
    pytest.importorskip("h5py", reason="the .keras format needs h5py: pip install 'dnnbind[keras]'")
    keras.utils.set_random_seed(3)
    x_train, y_train = stripes(160, seed=5)

    model = keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        layers.Conv2D(4, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(2, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=16, epochs=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["accuracy"][-1] > 0.8

    path = tmp_path / "stripes.keras"
    with pytest.warns(UserWarning, match="holds no optimizer state"):  # Keras's own optimizer variables
        model.save(path)
    restored = keras.models.load_model(path)

    x_test, y_test = stripes(40, seed=6)
    np.testing.assert_array_equal(restored.predict(x_test, verbose=0), model.predict(x_test, verbose=0))
    assert restored.evaluate(x_test, y_test, verbose=0) == pytest.approx(model.evaluate(x_test, y_test, verbose=0))


def test_multi_output_model_with_list_losses_reloads_compiled(tmp_path):
    pytest.importorskip("h5py", reason="the .keras format needs h5py: pip install 'dnnbind[keras]'")
    keras.utils.set_random_seed(4)
    x, y = blobs(120, seed=7)
    inputs = keras.Input(shape=(10,), name="features")
    h = layers.Dense(12, activation="relu")(inputs)
    cls = layers.Dense(3, activation="softmax", name="cls")(h)
    reg = layers.Dense(1, name="reg")(h)
    model = keras.Model(inputs, [cls, reg])
    model.compile(optimizer="adam", loss=["sparse_categorical_crossentropy", "mse"], loss_weights=[1.0, 0.5],
                  metrics={"cls": ["accuracy"]})
    model.fit(x, [y, x[:, :1]], batch_size=30, epochs=2, verbose=0)
    for name in ("multi.keras", "multi.dnnbind"):
        if name.endswith(".keras"):
            with pytest.warns(UserWarning, match="holds no optimizer state"):
                model.save(tmp_path / name)
        else:
            model.save(tmp_path / name)
        restored = keras.models.load_model(tmp_path / name)
        assert restored.compiled and restored.metrics_names == model.metrics_names
        assert restored.evaluate(x, [y, x[:, :1]], verbose=0) == pytest.approx(
            model.evaluate(x, [y, x[:, :1]], verbose=0), rel=1e-6)
