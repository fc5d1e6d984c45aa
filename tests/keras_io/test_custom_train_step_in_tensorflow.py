"""Customizing what happens in `fit()` with TensorFlow

Source: keras-io guides/custom_train_step_in_tensorflow.py (the Keras 3 successor of
guides/customizing_what_happens_in_fit.py; one test per section of the guide)

Changes:
- ``tf.GradientTape`` is spelled ``keras.GradientTape`` in every ``train_step`` (the guide runs on the
  TensorFlow backend; dnnbind is the backend here and its tape has the same interface).
- Data: the guide's own ``np.random.random`` arrays, drawn from a seeded generator; for the GAN, seeded
  MNIST-shaped stand-ins (28x28x1 float32 in [0, 1]) as an array with ``batch_size`` instead of a
  ``tf.data`` pipeline over ``keras.datasets.mnist``.
- Sizes: the GAN trains on 2 batches of 8 instead of 100 batches of 64; the other sections keep the
  guide's 1000 samples and epochs.
- The GAN's ``train_step`` uses ``tf.shape`` / ``tf.concat`` / ``tf.ones`` / ``tf.zeros``: spelled
  ``ops.shape`` / ``ops.concatenate`` / ``ops.ones`` / ``ops.zeros`` (the backend-neutral twins).
- Printed progress (``verbose``) is off; the tests check the returned logs instead.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops

SOURCE = "guides/custom_train_step_in_tensorflow.py"
UNCHANGED = False
CHANGES = ("tf.GradientTape -> keras.GradientTape, and the GAN section's tf.shape/tf.concat/tf.ones/tf.zeros -> "
           "keras.ops twins: the guide is written for the TensorFlow backend; no dnnbind gap")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


# "mae" / keras.metrics.MeanAbsoluteError come with the ex-misc branch's regression metrics; until that
# merges, the sections that compile with them cannot run here
needs_mae = pytest.mark.skipif(not hasattr(keras.metrics, "MeanAbsoluteError"),
                               reason="needs keras.metrics.MeanAbsoluteError ('mae'), added on the ex-misc branch")


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.random((1000, 32)), rng.random((1000, 1)), rng.random((1000, 1))


def _falls(values):
    return np.all(np.isfinite(values)) and values[-1] < values[0]


# ------------------------------------------------------------------------- a first simple example
class CustomModelSimple(keras.Model):
    def train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        x, y = data

        with keras.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value
            # (the loss function is configured in `compile()`)
            loss = self.compute_loss(y=y, y_pred=y_pred)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply(gradients, trainable_vars)

        # Update metrics (includes the metric that tracks the loss)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)

        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}


@needs_mae
def test_a_first_simple_example(data):
    x, y, _ = data
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModelSimple(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    history = model.fit(x, y, epochs=3, verbose=0)
    assert _falls(history.history["loss"]) and _falls(history.history["mae"]), history.history


# ------------------------------------------------------------------------------ going lower-level
class CustomModelLowLevel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data

        with keras.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute our own loss
            loss = self.loss_fn(y, y_pred)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply(gradients, trainable_vars)

        # Compute our own metrics
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {
            "loss": self.loss_tracker.result(),
            "mae": self.mae_metric.result(),
        }

    @property
    def metrics(self):
        # We list our `Metric` objects here so that `reset_states()` can be
        # called automatically at the start of each epoch
        # or at the start of `evaluate()`.
        return [self.loss_tracker, self.mae_metric]


@needs_mae
def test_going_lower_level(data):
    x, y, _ = data
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModelLowLevel(inputs, outputs)

    # We don't pass a loss or metrics here.
    model.compile(optimizer="adam")

    # Just use `fit` as usual -- you can use callbacks, etc.
    history = model.fit(x, y, epochs=5, verbose=0)
    assert _falls(history.history["loss"]) and _falls(history.history["mae"]), history.history
    # the metrics are reset each epoch: the last epoch's loss is that epoch's mean, not the running one
    pred = model.predict(x, verbose=0)
    assert history.history["loss"][-1] < 2 * float(np.mean((pred - y) ** 2)) + 0.05


# ---------------------------------------------------------------- sample_weight and class_weight
class CustomModelWeighted(keras.Model):
    def train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        if len(data) == 3:
            x, y, sample_weight = data
        else:
            sample_weight = None
            x, y = data

        with keras.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value.
            # The loss function is configured in `compile()`.
            loss = self.compute_loss(
                y=y,
                y_pred=y_pred,
                sample_weight=sample_weight,
            )

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply(gradients, trainable_vars)

        # Update the metrics.
        # Metrics are configured in `compile()`.
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)

        # Return a dict mapping metric names to current value.
        # Note that it will include the loss (tracked in self.metrics).
        return {m.name: m.result() for m in self.metrics}


@needs_mae
def test_supporting_sample_weight(data):
    x, y, sw = data
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModelWeighted(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # You can now use sample_weight argument
    history = model.fit(x, y, sample_weight=sw, epochs=3, verbose=0)
    assert _falls(history.history["loss"]), history.history


# ----------------------------------------------------------------- providing your own evaluation step
class CustomModelEval(keras.Model):
    def test_step(self, data):
        # Unpack the data
        x, y = data
        # Compute predictions
        y_pred = self(x, training=False)
        # Updates the metrics tracking the loss
        loss = self.compute_loss(y=y, y_pred=y_pred)
        # Update the metrics.
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        # Return a dict mapping metric names to current value.
        # Note that it will include the loss (tracked in self.metrics).
        return {m.name: m.result() for m in self.metrics}


@needs_mae
def test_providing_your_own_evaluation_step(data):
    x, y, _ = data
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModelEval(inputs, outputs)
    model.compile(loss="mse", metrics=["mae"])

    # Evaluate with our custom test_step
    result = model.evaluate(x, y, verbose=0)
    pred = model.predict(x, verbose=0)
    loss, mae = result
    # the loss tracker is a Mean of the per-batch losses (batches of 32, the last one of 8), MAE per sample
    batch_losses = [np.mean((pred[i:i + 32] - y[i:i + 32]) ** 2) for i in range(0, 1000, 32)]
    np.testing.assert_allclose(loss, np.mean(batch_losses), rtol=1e-4)
    np.testing.assert_allclose(mae, np.mean(np.abs(pred - y)), rtol=1e-4)


# ------------------------------------------------------------------ wrapping up: an end-to-end GAN
class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
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
        labels += 0.05 * keras.random.uniform(
            ops.shape(labels), seed=self.seed_generator
        )

        # Train the discriminator
        with keras.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)

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
        self.g_optimizer.apply(grads, self.generator.trainable_weights)

        # Update metrics and return their value.
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {
            "d_loss": self.d_loss_tracker.result(),
            "g_loss": self.g_loss_tracker.result(),
        }


def test_an_end_to_end_gan():
    keras.utils.set_random_seed(0)
    # Create the discriminator
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.GlobalMaxPooling2D(),
            layers.Dense(1),
        ],
        name="discriminator",
    )

    # Create the generator
    latent_dim = 128
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            # We want to generate 128 coefficients to reshape into a 7x7x128 map
            layers.Dense(7 * 7 * 128),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Reshape((7, 7, 128)),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    assert generator.output_shape == (None, 28, 28, 1)

    rng = np.random.default_rng(0)
    all_digits = np.clip(rng.normal(0.2, 0.3, (16, 28, 28, 1)), 0, 1).astype("float32")

    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    g_before = [w.numpy().copy() for w in generator.trainable_weights]
    d_before = [w.numpy().copy() for w in discriminator.trainable_weights]
    history = gan.fit(all_digits, batch_size=8, epochs=1, verbose=0)
    for key in ("d_loss", "g_loss"):
        value = history.history[key][0]
        assert np.isfinite(value) and 0.2 < value < 1.5, (key, value)  # about log 2 at the start
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(g_before, generator.trainable_weights))
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(d_before, discriminator.trainable_weights))
    images = generator.predict(rng.normal(size=(3, latent_dim)), verbose=0)
    assert images.shape == (3, 28, 28, 1) and np.all((images >= 0) & (images <= 1))
