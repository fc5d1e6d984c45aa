"""Conditional GAN

Source: keras-io examples/generative/conditional_gan.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's shape (28x28x1 float32 in [0, 1], one fixed stroke template
  per class plus noise; labels one-hot by ``keras.utils.to_categorical``), given to ``fit`` as arrays with
  ``batch_size`` and ``shuffle`` instead of a ``tf.data`` pipeline over ``keras.datasets.mnist``.
- Sizes: 8 images, batch size 4, 1 epoch instead of 70,000 digits, batch size 64, 20 epochs.
- ``tf.GradientTape`` is spelled ``keras.GradientTape`` (the example runs its ``train_step`` on the
  TensorFlow backend; dnnbind is the backend here).
- The interpolation's frames are checked instead of written to ``animation.gif`` with imageio
  (``embed.embed_file`` from tensorflow_docs is left out).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops

SOURCE = "examples/generative/conditional_gan.py"
UNCHANGED = True

batch_size = 4
num_channels = 1
num_classes = 10
image_size = 28
latent_dim = 128


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class ConditionalGAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.gen_loss_tracker = keras.metrics.Mean(name="generator_loss")
        self.disc_loss_tracker = keras.metrics.Mean(name="discriminator_loss")

    @property
    def metrics(self):
        return [self.gen_loss_tracker, self.disc_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, data):
        # Unpack the data.
        real_images, one_hot_labels = data

        # Add dummy dimensions to the labels so that they can be concatenated with
        # the images. This is for the discriminator.
        image_one_hot_labels = one_hot_labels[:, :, None, None]
        image_one_hot_labels = ops.repeat(
            image_one_hot_labels, repeats=[image_size * image_size]
        )
        image_one_hot_labels = ops.reshape(
            image_one_hot_labels, (-1, image_size, image_size, num_classes)
        )

        # Sample random points in the latent space and concatenate the labels.
        # This is for the generator.
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        random_vector_labels = ops.concatenate(
            [random_latent_vectors, one_hot_labels], axis=1
        )

        # Decode the noise (guided by labels) to fake images.
        generated_images = self.generator(random_vector_labels)

        # Combine them with real images. Note that we are concatenating the labels
        # with these images here.
        fake_image_and_labels = ops.concatenate(
            [generated_images, image_one_hot_labels], -1
        )
        real_image_and_labels = ops.concatenate([real_images, image_one_hot_labels], -1)
        combined_images = ops.concatenate(
            [fake_image_and_labels, real_image_and_labels], axis=0
        )

        # Assemble labels discriminating real from fake images.
        labels = ops.concatenate(
            [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
        )

        # Train the discriminator.
        with keras.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        # Sample random points in the latent space.
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        random_vector_labels = ops.concatenate(
            [random_latent_vectors, one_hot_labels], axis=1
        )

        # Assemble labels that say "all real images".
        misleading_labels = ops.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with keras.GradientTape() as tape:
            fake_images = self.generator(random_vector_labels)
            fake_image_and_labels = ops.concatenate(
                [fake_images, image_one_hot_labels], -1
            )
            predictions = self.discriminator(fake_image_and_labels)
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        # Monitor loss.
        self.gen_loss_tracker.update_state(g_loss)
        self.disc_loss_tracker.update_state(d_loss)
        return {
            "g_loss": self.gen_loss_tracker.result(),
            "d_loss": self.disc_loss_tracker.result(),
        }


def _mnist_like(n, rng):
    templates = np.zeros((10, 28, 28), np.float32)
    for k in range(10):
        templates[k, 4 + 2 * k: 7 + 2 * k, 5:23] = 255
        templates[k, 5:23, 4 + 2 * k: 7 + 2 * k] = 255
    labels = rng.integers(0, 10, n)
    return (templates[labels] * rng.uniform(0.7, 1.0, (n, 1, 1))).astype(np.uint8), labels.astype(np.uint8)


def test_conditional_gan():
    keras.utils.set_random_seed(0)
    all_digits, all_labels = _mnist_like(8, np.random.default_rng(0))

    # Scale the pixel values to [0, 1] range, add a channel dimension to
    # the images, and one-hot encode the labels.
    all_digits = all_digits.astype("float32") / 255.0
    all_digits = np.reshape(all_digits, (-1, 28, 28, 1))
    all_labels = keras.utils.to_categorical(all_labels, 10)
    print(f"Shape of training images: {all_digits.shape}")
    print(f"Shape of training labels: {all_labels.shape}")

    generator_in_channels = latent_dim + num_classes
    discriminator_in_channels = num_channels + num_classes
    print(generator_in_channels, discriminator_in_channels)

    # Create the discriminator.
    discriminator = keras.Sequential(
        [
            keras.layers.InputLayer((28, 28, discriminator_in_channels)),
            layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.GlobalMaxPooling2D(),
            layers.Dense(1),
        ],
        name="discriminator",
    )

    # Create the generator.
    generator = keras.Sequential(
        [
            keras.layers.InputLayer((generator_in_channels,)),
            # We want to generate 128 + num_classes coefficients to reshape into a
            # 7x7x(128 + num_classes) map.
            layers.Dense(7 * 7 * generator_in_channels),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Reshape((7, 7, generator_in_channels)),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    assert generator.output_shape == (None, 28, 28, 1)

    cond_gan = ConditionalGAN(
        discriminator=discriminator, generator=generator, latent_dim=latent_dim
    )
    cond_gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )

    g_before = [w.numpy().copy() for w in generator.trainable_weights]
    history = cond_gan.fit(all_digits, all_labels, batch_size=batch_size, shuffle=True, epochs=1, verbose=0)
    for key in ("g_loss", "d_loss"):
        value = history.history[key][0]
        assert np.isfinite(value) and 0.2 < value < 1.5, (key, value)  # about log 2 at the start
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(g_before, generator.trainable_weights))

    # We first extract the trained generator from our Conditional GAN.
    trained_gen = cond_gan.generator

    # Choose the number of intermediate images that would be generated in
    # between the interpolation + 2 (start and last images).
    num_interpolation = 9  # @param {type:"integer"}

    # Sample noise for the interpolation.
    interpolation_noise = keras.random.normal(shape=(1, latent_dim))
    interpolation_noise = ops.repeat(interpolation_noise, repeats=num_interpolation)
    interpolation_noise = ops.reshape(interpolation_noise, (num_interpolation, latent_dim))

    def interpolate_class(first_number, second_number):
        # Convert the start and end labels to one-hot encoded vectors.
        first_label = keras.utils.to_categorical([first_number], num_classes)
        second_label = keras.utils.to_categorical([second_number], num_classes)
        first_label = ops.cast(first_label, "float32")
        second_label = ops.cast(second_label, "float32")

        # Calculate the interpolation vector between the two labels.
        percent_second_label = ops.linspace(0, 1, num_interpolation)[:, None]
        percent_second_label = ops.cast(percent_second_label, "float32")
        interpolation_labels = (
            first_label * (1 - percent_second_label) + second_label * percent_second_label
        )

        # Combine the noise and the labels and run inference with the generator.
        noise_and_labels = ops.concatenate([interpolation_noise, interpolation_labels], 1)
        fake = trained_gen.predict(noise_and_labels)
        return fake

    start_class = 2  # @param {type:"slider", min:0, max:9, step:1}
    end_class = 6  # @param {type:"slider", min:0, max:9, step:1}

    fake_images = interpolate_class(start_class, end_class)

    fake_images *= 255.0
    converted_images = fake_images.astype(np.uint8)
    converted_images = ops.image.resize(converted_images, (96, 96)).numpy().astype(np.uint8)
    assert converted_images.shape == (9, 96, 96, 1)
    # the noise is shared by every frame: only the label moves, so the frames differ
    assert not np.array_equal(fake_images[0], fake_images[-1])
