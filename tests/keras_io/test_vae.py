"""Variational AutoEncoder

Source: keras-io examples/generative/vae.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's shape (28x28x1 float32 in [0, 1]): ten fixed stroke templates
  plus noise, instead of ``keras.datasets.mnist`` (70,000 digits).
- Sizes: 64 samples, 5 epochs and batch size 32 instead of 70,000 digits, 30 epochs and batch size 128.
- ``tf.GradientTape`` is spelled ``keras.GradientTape``: the example selects the TensorFlow backend for its
  ``train_step``; dnnbind is the backend here, and its tape has the same interface.
- The plots (``plot_latent_space``, ``plot_label_clusters``) are replaced by the predictions they make:
  ``vae.decoder.predict`` over a small latent grid and ``vae.encoder.predict`` on the data.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops

SOURCE = "examples/generative/vae.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(
            name="reconstruction_loss"
        )
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [
            self.total_loss_tracker,
            self.reconstruction_loss_tracker,
            self.kl_loss_tracker,
        ]

    def train_step(self, data):
        with keras.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(
                ops.sum(
                    keras.losses.binary_crossentropy(data, reconstruction),
                    axis=(1, 2),
                )
            )
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }


def _digits(n, rng):
    """MNIST-shaped stand-ins: one of ten fixed stroke templates per sample, plus noise, in [0, 1]."""
    templates = np.zeros((10, 28, 28), np.float32)
    for k in range(10):
        templates[k, 4 + 2 * k: 8 + 2 * k, 4:24] = 1.0  # a horizontal bar at a class-specific height
        templates[k, 4:24, 4 + 2 * k: 7 + 2 * k] = 1.0  # and a vertical one
    labels = rng.integers(0, 10, n)
    x = templates[labels] * rng.uniform(0.7, 1.0, (n, 1, 1)) + rng.uniform(0, 0.15, (n, 28, 28))
    return np.expand_dims(np.clip(x, 0, 1), -1).astype("float32"), labels


def test_vae():
    keras.utils.set_random_seed(0)
    latent_dim = 2

    encoder_inputs = keras.Input(shape=(28, 28, 1))
    x = layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
    encoder.summary()

    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
    x = layers.Reshape((7, 7, 64))(x)
    x = layers.Conv2DTranspose(64, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Conv2DTranspose(32, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
    decoder.summary()
    assert decoder.count_params() == 65089  # the example's summary: 9,408 + 36,928 + 18,464 + 289
    assert encoder.count_params() == 69076

    mnist_digits, labels = _digits(64, np.random.default_rng(0))

    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam())
    history = vae.fit(mnist_digits, epochs=5, batch_size=32, verbose=0)

    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)), loss
    assert loss[-1] < loss[0], loss
    assert set(history.history) == {"loss", "reconstruction_loss", "kl_loss"}

    # plot_latent_space: decode a grid of latent points
    grid = np.array([[xi, yi] for yi in np.linspace(1, -1, 3) for xi in np.linspace(-1, 1, 3)])
    x_decoded = vae.decoder.predict(grid, verbose=0)
    assert x_decoded.shape == (9, 28, 28, 1)
    assert np.all((x_decoded >= 0) & (x_decoded <= 1))
    digit = x_decoded[0].reshape(28, 28)
    assert digit.shape == (28, 28)

    # plot_label_clusters: encode the data
    z_mean, _, _ = vae.encoder.predict(mnist_digits, verbose=0)
    assert z_mean.shape == (64, 2) and np.all(np.isfinite(z_mean))
