"""Trainer pattern

Source: keras-io examples/keras_recipes/trainer_pattern.py

Changes:
- Imports: ``tf.GradientTape`` is ``keras.GradientTape`` (dnnbind's tape; the example needs no other
  TensorFlow op), and ``os.environ["KERAS_BACKEND"] = "tensorflow"`` is dropped.
- Data: seeded NumPy stand-ins of MNIST's shapes (28x28 uint8 images scaled by 255.0 as published, labels
  0-9), made learnable (each class brightens its own rows), instead of ``keras.datasets.mnist``.
- Sizes: 512 training / 128 test samples, 3 epochs instead of 5 (batch size 64 as published).
- The test asserts each trainer's accuracy rises above chance (SGD's slowly, Adam's quickly), that the
  custom ``test_step`` logs ``val_`` metrics, and runs ``predict`` through the wrapped model.
"""

import numpy as np
import pytest

import dnnbind as keras

SOURCE = "examples/keras_recipes/trainer_pattern.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class MyTrainer(keras.Model):
    def __init__(self, model):
        super().__init__()
        self.model = model
        # Create loss and metrics here.
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy()
        self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy()

    @property
    def metrics(self):
        # List metrics here.
        return [self.accuracy_metric]

    def train_step(self, data):
        x, y = data
        with keras.GradientTape() as tape:
            y_pred = self.model(x, training=True)  # Forward pass
            # Compute loss value
            loss = self.loss_fn(y, y_pred)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))

        # Update metrics
        for metric in self.metrics:
            metric.update_state(y, y_pred)

        # Return a dict mapping metric names to current value.
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data

        # Inference step
        y_pred = self.model(x, training=False)

        # Update metrics
        for metric in self.metrics:
            metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def call(self, x):
        # Equivalent to `call()` of the wrapped keras.Model
        x = self.model(x)
        return x


def _mnist_like(n, rng):
    y = rng.integers(0, 10, size=n).astype(np.uint8)
    x = rng.integers(0, 128, size=(n, 28, 28)).astype(np.uint8)
    for c in range(10):
        x[y == c, 2 * c + 4: 2 * c + 6, :] += 127
    return x, y


def test_trainer_pattern():
    rng = np.random.default_rng(1)
    keras.utils.set_random_seed(1)
    (x_train, y_train), (x_test, y_test) = _mnist_like(512, rng), _mnist_like(128, rng)
    x_train, x_test = x_train / 255.0, x_test / 255.0

    # A model defined using Sequential API
    model_a = keras.models.Sequential(
        [
            keras.layers.Flatten(input_shape=(28, 28)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )

    # A model defined using Functional API
    func_input = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Flatten(input_shape=(28, 28))(func_input)
    x = keras.layers.Dense(512, activation="relu")(x)
    x = keras.layers.Dropout(0.4)(x)
    func_output = keras.layers.Dense(10, activation="softmax")(x)

    model_b = keras.Model(func_input, func_output)

    trainer_1 = MyTrainer(model_a)
    trainer_2 = MyTrainer(model_b)

    trainer_1.compile(optimizer=keras.optimizers.SGD())
    h1 = trainer_1.fit(
        x_train, y_train, epochs=3, batch_size=64, validation_data=(x_test, y_test), verbose=0
    )

    trainer_2.compile(optimizer=keras.optimizers.Adam())
    h2 = trainer_2.fit(
        x_train, y_train, epochs=3, batch_size=64, validation_data=(x_test, y_test), verbose=0
    )

    for h in (h1, h2):
        acc = h.history["sparse_categorical_accuracy"]
        assert np.all(np.isfinite(acc)) and acc[-1] > acc[0]
        assert "val_sparse_categorical_accuracy" in h.history
    assert h1.history["val_sparse_categorical_accuracy"][-1] > 0.2  # chance is 0.1
    assert h2.history["val_sparse_categorical_accuracy"][-1] > 0.8
    probs = trainer_2.predict(x_test[:16], verbose=0)
    assert probs.shape == (16, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(probs, keras.ops.convert_to_numpy(model_b(x_test[:16])), rtol=1e-5, atol=1e-7)
