"""Convolutional autoencoder for image denoising

Source: keras-io examples/vision/autoencoder.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's shape (uint8 28x28 images, preprocessed by the example's own
  ``preprocess``): ten fixed stroke templates plus a little jitter, instead of ``keras.datasets.mnist``.
  ``noise`` draws from a seeded generator instead of the global ``np.random``.
- Sizes: 32 training / 16 test images; 2 epochs (plain) and 2 epochs (denoising) instead of 50 and 100
  (batch size 128 becomes 16).
- ``display`` (matplotlib) is left out; the predictions it would show are checked instead.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind.models import Model

SOURCE = "examples/vision/autoencoder.py"
UNCHANGED = True

_rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def preprocess(array):
    """Normalizes the supplied array and reshapes it."""
    array = array.astype("float32") / 255.0
    array = np.reshape(array, (len(array), 28, 28, 1))
    return array


def noise(array):
    """Adds random noise to each image in the supplied array."""
    noise_factor = 0.4
    noisy_array = array + noise_factor * _rng.normal(
        loc=0.0, scale=1.0, size=array.shape
    )
    return np.clip(noisy_array, 0.0, 1.0)


def _mnist_like(n, rng):
    templates = np.zeros((10, 28, 28), np.float32)
    for k in range(10):
        templates[k, 4 + 2 * k: 7 + 2 * k, 5:23] = 255
        templates[k, 5:23, 4 + 2 * k: 7 + 2 * k] = 255
    labels = rng.integers(0, 10, n)
    return (templates[labels] * rng.uniform(0.8, 1.0, (n, 1, 1))).astype(np.uint8)


def test_autoencoder():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    train_data, test_data = _mnist_like(32, rng), _mnist_like(16, rng)

    # Normalize and reshape the data
    train_data = preprocess(train_data)
    test_data = preprocess(test_data)

    # Create a copy of the data with added noise
    noisy_train_data = noise(train_data)
    noisy_test_data = noise(test_data)

    input = layers.Input(shape=(28, 28, 1))

    # Encoder
    x = layers.Conv2D(32, (3, 3), activation="relu", padding="same")(input)
    x = layers.MaxPooling2D((2, 2), padding="same")(x)
    x = layers.Conv2D(32, (3, 3), activation="relu", padding="same")(x)
    x = layers.MaxPooling2D((2, 2), padding="same")(x)

    # Decoder
    x = layers.Conv2DTranspose(32, (3, 3), strides=2, activation="relu", padding="same")(x)
    x = layers.Conv2DTranspose(32, (3, 3), strides=2, activation="relu", padding="same")(x)
    x = layers.Conv2D(1, (3, 3), activation="sigmoid", padding="same")(x)

    # Autoencoder
    autoencoder = Model(input, x)
    autoencoder.compile(optimizer="adam", loss="binary_crossentropy")
    autoencoder.summary()
    assert autoencoder.count_params() == 28353  # the example's summary

    history = autoencoder.fit(
        x=train_data,
        y=train_data,
        epochs=2,
        batch_size=16,
        shuffle=True,
        validation_data=(test_data, test_data),
        verbose=0,
    )
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss
    assert np.all(np.isfinite(history.history["val_loss"]))

    predictions = autoencoder.predict(test_data, verbose=0)
    assert predictions.shape == (16, 28, 28, 1)

    history = autoencoder.fit(
        x=noisy_train_data,
        y=train_data,
        epochs=2,
        batch_size=16,
        shuffle=True,
        validation_data=(noisy_test_data, test_data),
        verbose=0,
    )
    val = history.history["val_loss"]
    assert np.all(np.isfinite(val)) and val[-1] < val[0], val

    predictions = autoencoder.predict(noisy_test_data, verbose=0)
    assert predictions.shape == (16, 28, 28, 1)
    assert np.all((predictions >= 0) & (predictions <= 1))
