"""Simple custom layer example: Antirectifier

Source: keras-io examples/keras_recipes/antirectifier.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's flattened shape (784 float32 features in [0, 1], 10 classes),
  made learnable (each class brightens its own band of pixels), instead of ``keras.datasets.mnist``.
- Sizes: 600 training / 200 test samples, 3 epochs instead of 20 (batch size 128 and validation_split=0.15
  as published).
- The test asserts the loss falls and test accuracy is above chance, and runs ``predict``.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "examples/keras_recipes/antirectifier.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class Antirectifier(layers.Layer):
    def __init__(self, initializer="he_normal", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        output_dim = input_shape[-1]
        self.kernel = self.add_weight(
            shape=(output_dim * 2, output_dim),
            initializer=self.initializer,
            name="kernel",
            trainable=True,
        )

    def call(self, inputs):
        inputs -= ops.mean(inputs, axis=-1, keepdims=True)
        pos = ops.relu(inputs)
        neg = ops.relu(-inputs)
        concatenated = ops.concatenate([pos, neg], axis=-1)
        mixed = ops.matmul(concatenated, self.kernel)
        return mixed

    def get_config(self):
        # Implement get_config to enable serialization. This is optional.
        base_config = super().get_config()
        config = {"initializer": keras.initializers.serialize(self.initializer)}
        return dict(list(base_config.items()) + list(config.items()))


def _mnist_like(n, rng):
    y = rng.integers(0, 10, size=n).astype(np.uint8)
    x = rng.uniform(0, 0.5, size=(n, 784)).astype(np.float32)
    for c in range(10):
        x[y == c, c * 78:(c + 1) * 78] += 0.5
    return x, y


def test_antirectifier():
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    (x_train, y_train), (x_test, y_test) = _mnist_like(600, rng), _mnist_like(200, rng)

    # Training parameters
    batch_size = 128
    num_classes = 10
    epochs = 3

    # Build the model
    model = keras.Sequential(
        [
            keras.Input(shape=(784,)),
            layers.Dense(256),
            Antirectifier(),
            layers.Dense(256),
            Antirectifier(),
            layers.Dropout(0.5),
            layers.Dense(10),
        ]
    )

    # Compile the model
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.RMSprop(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )

    # Train the model
    history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.15, verbose=0)

    # Test the model
    loss, acc = model.evaluate(x_test, y_test, verbose=0)

    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert "val_sparse_categorical_accuracy" in history.history
    assert acc > 0.5  # chance is 0.1
    logits = model.predict(x_test[:8], verbose=0)
    assert logits.shape == (8, num_classes)
    assert (logits.argmax(axis=1) == y_test[:8]).mean() >= 0.75
    # the layer's config round-trips through get_config, as the example says
    again = Antirectifier.from_config(model.layers[1].get_config())
    assert type(again.initializer).__name__ == "HeNormal"
