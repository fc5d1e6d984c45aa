"""Training & evaluation with the built-in methods

Source: keras-io guides/training_with_built_in_methods.py (Keras 3 text: guides/keras_core/
training_with_built_in_methods.py; one test per section)

Changes:
- Data: seeded NumPy stand-ins of MNIST's flattened shape (784 float32 features, float32 labels 0-9; each
  class brightens its own band of pixels, so it is learnable): 600 training, 100 validation and 100 test
  samples instead of 50,000 / 10,000 / 10,000 from ``keras.datasets.mnist``.
- The ``tf.data.Dataset`` pipelines are replaced by the same NumPy arrays with ``batch_size=64`` (and
  ``steps_per_epoch`` / ``validation_steps`` where the guide uses them: 3 steps and 2 validation steps
  instead of 100 and 10, for the smaller data); a Dataset yielding sample weights becomes
  ``sample_weight=``.
- ``ModelCheckpoint(save_freq=100)`` saves every 10 batches instead (an epoch here is 19 batches of 32), and the
  checkpoints go to pytest's ``tmp_path``.
- Printed progress is off (``verbose=0``) and the values the guide prints are asserted.
- The multi-input model's ``keras.Input(shape=(None, 10))`` is given its length, ``(20, 10)`` (the data's):
  dnnbind's built-in layers refuse a None sample axis (a dnnbind gap).
- Not run: the PyTorch ``DataLoader`` section (no torch here); the metric variants of the multi-output
  ``compile`` (``MeanAbsolutePercentageError`` is not in dnnbind, ``MeanAbsoluteError`` comes with the
  ex-misc branch); ``keras.callbacks.TensorBoard`` (not in dnnbind).
"""

import os

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "guides/training_with_built_in_methods.py"
UNCHANGED = False
CHANGES = ("Input(shape=(None, 10)) is given its length (built-in layers refuse a None sample axis); the torch "
           "DataLoader section, the MeanAbsolutePercentageError/MeanAbsoluteError metric variants and the "
           "TensorBoard callback are not run (not in dnnbind); tf.data pipelines become NumPy arrays")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


@pytest.fixture
def mnist():
    rng = np.random.default_rng(0)
    n = 800
    y = rng.integers(0, 10, n)
    x = rng.uniform(0, 0.5, (n, 784)).astype("float32")
    for k in range(10):
        x[y == k, 78 * k: 78 * k + 78] += 0.5
    y = y.astype("float32")
    x_train, y_train = x[:700], y[:700]
    x_test, y_test = x[700:], y[700:]
    # Reserve samples for validation
    x_val = x_train[-100:]
    y_val = y_train[-100:]
    x_train = x_train[:-100]
    y_train = y_train[:-100]
    return x_train, y_train, x_val, y_val, x_test, y_test


def get_uncompiled_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


def _learns(history, key="loss"):
    values = history.history[key]
    return np.all(np.isfinite(values)) and (len(values) == 1 or values[-1] < values[0])


def test_api_overview_a_first_end_to_end_example(mnist):
    x_train, y_train, x_val, y_val, x_test, y_test = mnist
    model = get_uncompiled_model()
    model.compile(
        optimizer=keras.optimizers.RMSprop(),  # Optimizer
        # Loss function to minimize
        loss=keras.losses.SparseCategoricalCrossentropy(),
        # List of metrics to monitor
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    history = model.fit(
        x_train,
        y_train,
        batch_size=64,
        epochs=2,
        validation_data=(x_val, y_val),
        verbose=0,
    )
    assert set(history.history) == {"loss", "sparse_categorical_accuracy", "val_loss",
                                    "val_sparse_categorical_accuracy"}
    assert _learns(history)

    results = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    print("test loss, test acc:", results)
    assert results[1] > 0.5  # chance is 0.1

    predictions = model.predict(x_test[:3], verbose=0)
    print("predictions shape:", predictions.shape)
    assert predictions.shape == (3, 10)
    np.testing.assert_allclose(predictions.sum(axis=1), 1.0, rtol=1e-5)

    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    assert len(model.evaluate(x_test, y_test, verbose=0)) == 2


def custom_mean_squared_error(y_true, y_pred):
    return ops.mean(ops.square(y_true - y_pred), axis=-1)


class CustomMSE(keras.losses.Loss):
    def __init__(self, regularization_factor=0.1, name="custom_mse"):
        super().__init__(name=name)
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
        reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
        return mse + reg * self.regularization_factor


def test_custom_losses(mnist):
    x_train, y_train = mnist[:2]
    model = get_uncompiled_model()
    model.compile(optimizer=keras.optimizers.Adam(), loss=custom_mean_squared_error)

    # We need to one-hot encode the labels to use MSE
    y_train_one_hot = ops.one_hot(y_train, num_classes=10)
    history = model.fit(x_train, y_train_one_hot, batch_size=64, epochs=1, verbose=0)
    assert _learns(history)

    model = get_uncompiled_model()
    model.compile(optimizer=keras.optimizers.Adam(), loss=CustomMSE())

    y_train_one_hot = ops.one_hot(y_train, num_classes=10)
    history = model.fit(x_train, y_train_one_hot, batch_size=64, epochs=1, verbose=0)
    pred = model.predict(x_train[:64], verbose=0)
    onehot = np.eye(10)[y_train[:64].astype(int)]
    want = np.mean(np.mean((onehot - pred) ** 2, -1) + 0.1 * np.mean((0.5 - pred) ** 2, -1))
    got = float(np.asarray(CustomMSE()(onehot.astype("float32"), pred)))
    np.testing.assert_allclose(got, want, rtol=1e-5)


class CategoricalTruePositives(keras.metrics.Metric):
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(
            shape=(), name="ctp", initializer="zeros"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
        values = ops.cast(y_true, "int32") == ops.cast(y_pred, "int32")
        values = ops.cast(values, "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            values = ops.multiply(values, sample_weight)
        self.true_positives.assign_add(ops.sum(values))

    def result(self):
        return self.true_positives

    def reset_state(self):
        # The state of the metric will be reset at the start of each epoch.
        self.true_positives.assign(0.0)


def test_custom_metrics(mnist):
    x_train, y_train = mnist[:2]
    model = get_uncompiled_model()
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[CategoricalTruePositives()],
    )
    history = model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=0)
    assert _learns(history)
    ctp = history.history["categorical_true_positives"]
    # the labels are (batch,), the predictions' argmax is reshaped to (batch, 1): the comparison
    # broadcasts to (batch, batch) as in Keras, so the count runs up to batch * batch per step
    assert len(ctp) == 3 and all(np.isfinite(ctp)) and ctp[-1] > 0


class ActivityRegularizationLayer(layers.Layer):
    def call(self, inputs):
        self.add_loss(ops.sum(inputs) * 0.1)
        return inputs  # Pass-through layer.


class LogisticEndpoint(keras.layers.Layer):
    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, targets, logits, sample_weights=None):
        # Compute the training-time loss value and add it
        # to the layer using `self.add_loss()`.
        loss = self.loss_fn(targets, logits, sample_weights)
        self.add_loss(loss)

        # Return the inference-time prediction tensor (for `.predict()`).
        return ops.softmax(logits)


def test_losses_that_dont_fit_the_standard_signature(mnist):
    x_train, y_train = mnist[:2]
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)

    # Insert activity regularization as a layer
    x = ActivityRegularizationLayer()(x)

    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, name="predictions")(x)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

    # The displayed loss will be much higher than before
    # due to the regularization component.
    history = model.fit(x_train, y_train, batch_size=64, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and history.history["loss"][0] > np.log(10)

    inputs = keras.Input(shape=(3,), name="inputs")
    targets = keras.Input(shape=(10,), name="targets")
    logits = keras.layers.Dense(10)(inputs)
    predictions = LogisticEndpoint(name="predictions")(targets, logits)

    model = keras.Model(inputs=[inputs, targets], outputs=predictions)
    model.compile(optimizer="adam")  # No loss argument!

    rng = np.random.default_rng(0)
    data = {
        "inputs": rng.random((3, 3)),
        "targets": rng.random((3, 10)),
    }
    history = model.fit(data, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and 0.3 < history.history["loss"][0] < 3.0


def test_automatically_setting_apart_a_validation_holdout_set(mnist):
    x_train, y_train = mnist[:2]
    model = get_compiled_model()
    history = model.fit(x_train, y_train, batch_size=64, validation_split=0.2, epochs=1, verbose=0)
    assert "val_loss" in history.history and np.isfinite(history.history["val_loss"][0])


def test_training_and_evaluation_with_batched_arrays(mnist):
    # the guide's tf.data section, with the arrays batched by fit itself
    x_train, y_train, x_val, y_val, x_test, y_test = mnist
    model = get_compiled_model()
    history = model.fit(x_train, y_train, batch_size=64, shuffle=True, epochs=3, verbose=0)
    assert _learns(history)
    result = model.evaluate(x_test, y_test, batch_size=64, verbose=0)
    named = dict(zip(model.metrics_names, result))
    assert set(named) == {"loss", "sparse_categorical_accuracy"}

    model = get_compiled_model()
    seen = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    # Only use 3 batches per epoch (the guide: 100 of its 781); 3 epochs draw 9 of the 10 batches
    model.fit(x_train, y_train, batch_size=64, epochs=3, steps_per_epoch=3, callbacks=[counter], verbose=0)
    assert len(seen) == 9

    model = get_compiled_model()
    history = model.fit(x_train, y_train, batch_size=64, epochs=1, validation_data=(x_val, y_val),
                        validation_steps=2, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])


class ExamplePyDataset(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x = x
        self.y = y
        self.batch_size = batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / float(self.batch_size)))

    def __getitem__(self, idx):
        batch_x = self.x[idx * self.batch_size : (idx + 1) * self.batch_size]
        batch_y = self.y[idx * self.batch_size : (idx + 1) * self.batch_size]
        return batch_x, batch_y


def test_training_and_evaluation_using_pydataset_instances(mnist):
    x_train, y_train, x_val, y_val = mnist[:4]
    train_py_dataset = ExamplePyDataset(x_train, y_train, batch_size=32)
    val_py_dataset = ExamplePyDataset(x_val, y_val, batch_size=32)

    model = get_compiled_model()
    history = model.fit(train_py_dataset, batch_size=64, validation_data=val_py_dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])
    result = model.evaluate(val_py_dataset, verbose=0)
    assert len(result) == 2 and result[1] > 0.3

    train_py_dataset = ExamplePyDataset(x_train, y_train, batch_size=32, workers=4)
    val_py_dataset = ExamplePyDataset(x_val, y_val, batch_size=32, workers=4)

    model = get_compiled_model()
    history = model.fit(train_py_dataset, batch_size=64, validation_data=val_py_dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])


def test_using_sample_weighting_and_class_weighting(mnist):
    x_train, y_train = mnist[:2]
    class_weight = {
        0: 1.0,
        1: 1.0,
        2: 1.0,
        3: 1.0,
        4: 1.0,
        # Set weight "2" for class "5",
        # making this class 2x more important
        5: 2.0,
        6: 1.0,
        7: 1.0,
        8: 1.0,
        9: 1.0,
    }

    print("Fit with class weight")
    model = get_compiled_model()
    weights = model.get_weights()
    h_class = model.fit(x_train, y_train, class_weight=class_weight, batch_size=64, epochs=1, shuffle=False,
                        verbose=0)

    sample_weight = np.ones(shape=(len(y_train),))
    sample_weight[y_train == 5] = 2.0

    print("Fit with sample weight")
    model = get_compiled_model()
    model.set_weights(weights)
    h_sample = model.fit(x_train, y_train, sample_weight=sample_weight, batch_size=64, epochs=1, shuffle=False,
                         verbose=0)
    # the same weighting two ways: the same training
    np.testing.assert_allclose(h_class.history["loss"], h_sample.history["loss"], rtol=1e-5)


def test_passing_data_to_multi_input_multi_output_models():
    image_input = keras.Input(shape=(32, 32, 3), name="img_input")
    timeseries_input = keras.Input(shape=(20, 10), name="ts_input")  # CHANGED: (None, 10)

    x1 = layers.Conv2D(3, 3)(image_input)
    x1 = layers.GlobalMaxPooling2D()(x1)

    x2 = layers.Conv1D(3, 3)(timeseries_input)
    x2 = layers.GlobalMaxPooling1D()(x2)

    x = layers.concatenate([x1, x2])

    score_output = layers.Dense(1, name="score_output")(x)
    class_output = layers.Dense(5, name="class_output")(x)

    model = keras.Model(
        inputs=[image_input, timeseries_input], outputs=[score_output, class_output]
    )

    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss=[
            keras.losses.MeanSquaredError(),
            keras.losses.CategoricalCrossentropy(),
        ],
    )
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss={
            "score_output": keras.losses.MeanSquaredError(),
            "class_output": keras.losses.CategoricalCrossentropy(),
        },
        loss_weights={"score_output": 2.0, "class_output": 1.0},
    )
    # List loss version
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss=[None, keras.losses.CategoricalCrossentropy()],
    )
    # Or dict loss version
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss={"class_output": keras.losses.CategoricalCrossentropy()},
    )

    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss=[
            keras.losses.MeanSquaredError(),
            keras.losses.CategoricalCrossentropy(),
        ],
    )

    # Generate dummy NumPy data
    rng = np.random.default_rng(0)
    img_data = rng.random(size=(100, 32, 32, 3))
    ts_data = rng.random(size=(100, 20, 10))
    score_targets = rng.random(size=(100, 1))
    class_targets = rng.random(size=(100, 5))

    # Fit on lists
    h1 = model.fit([img_data, ts_data], [score_targets, class_targets], batch_size=32, epochs=1, verbose=0)

    # Alternatively, fit on dicts
    h2 = model.fit(
        {"img_input": img_data, "ts_input": ts_data},
        {"score_output": score_targets, "class_output": class_targets},
        batch_size=32,
        epochs=1,
        verbose=0,
    )
    for h in (h1, h2):
        assert {"loss", "score_output_loss", "class_output_loss"} <= set(h.history)
        assert all(np.isfinite(v[0]) for v in h.history.values())


class LossHistory(keras.callbacks.Callback):
    def on_train_begin(self, logs):
        self.per_batch_losses = []

    def on_batch_end(self, batch, logs):
        self.per_batch_losses.append(logs.get("loss"))


def test_using_callbacks(mnist):
    x_train, y_train = mnist[:2]
    model = get_compiled_model()

    callbacks = [
        keras.callbacks.EarlyStopping(
            # Stop training when `val_loss` is no longer improving
            monitor="val_loss",
            # "no longer improving" being defined as "no better than 1e-2 less"
            min_delta=1e-2,
            # "no longer improving" being further defined as "for at least 2 epochs"
            patience=2,
            verbose=1,
        )
    ]
    history = model.fit(
        x_train,
        y_train,
        epochs=20,
        batch_size=64,
        callbacks=callbacks,
        validation_split=0.2,
        verbose=0,
    )
    val = history.history["val_loss"]
    if len(val) < 20:  # it stopped: the last two epochs were no better than 1e-2 below the best before them
        assert min(val[-2:]) > min(val[:-2]) - 1e-2

    model = get_compiled_model()
    losses = LossHistory()
    model.fit(x_train, y_train, epochs=1, batch_size=64, callbacks=[losses], verbose=0)
    assert len(losses.per_batch_losses) == 10 and all(np.isfinite(losses.per_batch_losses))


def test_checkpointing_models(mnist, tmp_path):
    x_train, y_train = mnist[:2]
    model = get_compiled_model()

    callbacks = [
        keras.callbacks.ModelCheckpoint(
            # Path where to save the model
            # The two parameters below mean that we will overwrite
            # the current checkpoint if and only if
            # the `val_loss` score has improved.
            # The saved model name will include the current epoch.
            filepath=str(tmp_path / "mymodel_{epoch}.keras"),
            save_best_only=True,  # Only save a model if `val_loss` has improved.
            monitor="val_loss",
            verbose=1,
        )
    ]
    model.fit(
        x_train,
        y_train,
        epochs=2,
        batch_size=64,
        callbacks=callbacks,
        validation_split=0.2,
        verbose=0,
    )
    assert (tmp_path / "mymodel_1.keras").exists()

    # Prepare a directory to store all the checkpoints.
    checkpoint_dir = str(tmp_path / "ckpt")
    if not os.path.exists(checkpoint_dir):
        os.makedirs(checkpoint_dir)

    def make_or_restore_model():
        # Either restore the latest model, or create a fresh one
        # if there is no checkpoint available.
        checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
        if checkpoints:
            latest_checkpoint = max(checkpoints, key=os.path.getctime)
            print("Restoring from", latest_checkpoint)
            return keras.models.load_model(latest_checkpoint)
        print("Creating a new model")
        return get_compiled_model()

    model = make_or_restore_model()
    callbacks = [
        # This callback saves the model every 10 batches.
        # We include the training loss in the saved model name.
        keras.callbacks.ModelCheckpoint(
            filepath=checkpoint_dir + "/model-loss={loss:.2f}.keras", save_freq=10
        )
    ]
    model.fit(x_train, y_train, epochs=1, callbacks=callbacks, verbose=0)
    saved = os.listdir(checkpoint_dir)
    assert len(saved) >= 1 and all(name.startswith("model-loss=") for name in saved)
    restored = make_or_restore_model()
    assert restored.count_params() == model.count_params()
    assert len(restored.evaluate(x_train[:64], y_train[:64], verbose=0)) == 2


def test_using_learning_rate_schedules(mnist):
    x_train, y_train = mnist[:2]
    initial_learning_rate = 0.1
    lr_schedule = keras.optimizers.schedules.ExponentialDecay(
        initial_learning_rate, decay_steps=100000, decay_rate=0.96, staircase=True
    )

    optimizer = keras.optimizers.RMSprop(learning_rate=lr_schedule)
    model = get_uncompiled_model()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    history = model.fit(x_train, y_train, batch_size=64, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    np.testing.assert_allclose(float(lr_schedule(100000)), 0.1 * 0.96, rtol=1e-6)
