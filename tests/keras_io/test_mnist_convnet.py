"""Simple MNIST convnet

Source: keras-io examples/vision/mnist_convnet.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's layout (28x28 uint8 images, labels 0-9) instead of
  ``keras.datasets.mnist``: each class is a fixed random template of bright strokes, shifted by up to
  2 pixels and noised, so a convnet can learn it. 1024 training / 128 test images instead of 60,000/10,000.
- Sizes: 5 epochs instead of 15 (batch size 128 and validation_split=0.1 as published). ``verbose=0``.
- The prints are kept; the test asserts that the loss falls, that the test accuracy beats chance by far,
  and that ``predict`` gives probabilities.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers

SOURCE = "examples/vision/mnist_convnet.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _mnist_like(n, rng, templates):
    y = rng.integers(0, 10, size=n).astype(np.uint8)
    x = np.empty((n, 28, 28), np.float64)
    for i in range(n):
        dy, dx = rng.integers(-2, 3, size=2)
        x[i] = np.roll(templates[y[i]], (dy, dx), axis=(0, 1))
    x = np.clip(x * rng.uniform(0.7, 1.0, size=(n, 1, 1)) + rng.uniform(0, 0.25, size=x.shape), 0, 1)
    return (x * 255).astype(np.uint8), y


def _templates(rng):
    t = np.zeros((10, 28, 28))
    for c in range(10):
        for _ in range(3):  # three strokes per class: a row, a column or a diagonal segment
            kind, a, b = rng.integers(0, 3), rng.integers(6, 22), rng.integers(6, 14)
            for k in range(b, b + 10):
                r, col = (a, k) if kind == 0 else (k, a) if kind == 1 else (k, k + a - 14)
                if 0 <= col < 28:
                    t[c, r, col] = 1.0
    return t


def test_mnist_convnet(capsys):
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    templates = _templates(rng)

    # Model / data parameters
    num_classes = 10
    input_shape = (28, 28, 1)

    # Load the data and split it between train and test sets
    (x_train, y_train), (x_test, y_test) = _mnist_like(1024, rng, templates), _mnist_like(128, rng, templates)

    # Scale images to the [0, 1] range
    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255
    # Make sure images have shape (28, 28, 1)
    x_train = np.expand_dims(x_train, -1)
    x_test = np.expand_dims(x_test, -1)
    print("x_train shape:", x_train.shape)
    print(x_train.shape[0], "train samples")
    print(x_test.shape[0], "test samples")

    # convert class vectors to binary class matrices
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )

    model.summary()

    batch_size = 128
    epochs = 5

    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

    history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1, verbose=0)

    score = model.evaluate(x_test, y_test, verbose=0)
    print("Test loss:", score[0])
    print("Test accuracy:", score[1])

    out = capsys.readouterr().out
    assert "x_train shape: (1024, 28, 28, 1)" in out and "Total params: 34,826" in out
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert "val_accuracy" in history.history
    assert score[1] > 0.5  # chance is 0.1
    probs = model.predict(x_test[:16], verbose=0)
    assert probs.shape == (16, num_classes)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
