"""DCGAN to generate face images

Source: keras-io examples/generative/dcgan_overriding_train_step.py

Changes:
- Data: seeded NumPy stand-ins of the CelebA crops' shape (64x64x3 float32 in [0, 1], smooth colour
  gradients), given to ``fit`` as an array with ``batch_size`` instead of an
  ``image_dataset_from_directory`` pipeline over the downloaded CelebA archive.
- Sizes: every layer width divided by 16 (discriminator 4/8/8 filters, generator Dense(8 * 8 * 8) and
  8/16/32 transposed filters; the 64x64 geometry, kernels and strides as published), 8 images, batch
  size 4, 2 epochs: the published widths cost about 2.5 GFLOP per generated image, far over a CI budget
  on two CPU cores.
- ``tf.GradientTape`` is spelled ``keras.GradientTape`` (dnnbind is the backend here) and the label
  noise ``0.05 * tf.random.uniform(tf.shape(labels))`` is drawn by its backend-neutral twin
  ``keras.random.uniform(ops.shape(labels))``: the only TensorFlow ops of the example.
- ``GANMonitor`` keeps the generated images (times 255, as NumPy) instead of writing PNG files with
  ``keras.utils.array_to_img`` (which dnnbind does not have: it has no image I/O).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops

SOURCE = "examples/generative/dcgan_overriding_train_step.py"
UNCHANGED = False
CHANGES = ("tf.random.uniform(tf.shape(labels)) -> keras.random.uniform(ops.shape(labels)) and tf.GradientTape -> "
           "keras.GradientTape (the example's TensorFlow-backend calls); GANMonitor keeps arrays instead of saving "
           "PNGs (dnnbind has no keras.utils.array_to_img)")

WIDTH = 16  # the published widths are divided by this


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        # Sample random points in the latent space
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )

        # Decode them to fake images
        generated_images = self.generator(random_latent_vectors)

        # Combine them with real images
        combined_images = ops.concatenate([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = ops.concatenate(
            [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
        )
        # Add random noise to the labels - important trick!
        labels += 0.05 * keras.random.uniform(ops.shape(labels))

        # Train the discriminator
        with keras.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        # Sample random points in the latent space
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )

        # Assemble labels that say "all real images"
        misleading_labels = ops.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with keras.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        # Update metrics
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {
            "d_loss": self.d_loss_metric.result(),
            "g_loss": self.g_loss_metric.result(),
        }


class GANMonitor(keras.callbacks.Callback):
    def __init__(self, num_img=3, latent_dim=128):
        self.num_img = num_img
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(42)
        self.saved = []

    def on_epoch_end(self, epoch, logs=None):
        random_latent_vectors = keras.random.normal(
            shape=(self.num_img, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.model.generator(random_latent_vectors)
        generated_images *= 255
        generated_images.numpy()
        for i in range(self.num_img):
            self.saved.append((epoch, i, np.asarray(generated_images[i])))  # was array_to_img(...).save(png)


def _faces(n, rng):
    """CelebA-shaped stand-ins: smooth random colour gradients in [0, 1]."""
    yy, xx = np.meshgrid(np.linspace(0, 1, 64), np.linspace(0, 1, 64), indexing="ij")
    a = rng.uniform(0.2, 0.8, (n, 1, 1, 3))
    b = rng.uniform(-0.2, 0.2, (n, 1, 1, 3))
    img = a + b * (yy[None, :, :, None] - xx[None, :, :, None])
    return np.clip(img, 0, 1).astype("float32")


def test_dcgan_overriding_train_step():
    keras.utils.set_random_seed(0)
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(64, 64, 3)),
            layers.Conv2D(64 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dropout(0.2),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )
    discriminator.summary()

    latent_dim = 128

    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            layers.Dense(8 * 8 * (128 // WIDTH)),
            layers.Reshape((8, 8, 128 // WIDTH)),
            layers.Conv2DTranspose(128 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(256 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(512 // WIDTH, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    generator.summary()
    assert generator.output_shape == (None, 64, 64, 3)

    dataset = _faces(8, np.random.default_rng(0))

    epochs = 2  # In practice, use ~100 epochs

    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )

    d_before = [w.numpy().copy() for w in discriminator.trainable_weights]
    g_before = [w.numpy().copy() for w in generator.trainable_weights]
    monitor = GANMonitor(num_img=3, latent_dim=latent_dim)
    history = gan.fit(dataset, batch_size=4, epochs=epochs, callbacks=[monitor], verbose=0)

    for key in ("d_loss", "g_loss"):
        values = history.history[key]
        assert len(values) == epochs and np.all(np.isfinite(values)), (key, values)
    # binary cross-entropy of a near-chance discriminator: about log 2 for both players
    assert 0.3 < history.history["d_loss"][0] < 1.2 and 0.3 < history.history["g_loss"][0] < 1.2
    # both optimizers moved their own player's weights (and only through its own tape)
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(d_before, discriminator.trainable_weights))
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(g_before, generator.trainable_weights))
    assert len(monitor.saved) == 3 * epochs
    for _, _, img in monitor.saved:
        assert img.shape == (64, 64, 3) and 0 <= img.min() and img.max() <= 255
