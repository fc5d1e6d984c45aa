"""Making new layers and models via subclassing

Source: keras-io guides/making_new_layers_and_models_via_subclassing.py (Keras 3 text:
guides/keras_core/making_new_layers_and_models_via_subclassing.py; one test per section)

Changes:
- Data: the guide's ``np.random.random`` arrays drawn from a seeded generator; for the end-to-end VAE,
  seeded MNIST-shaped stand-ins (784 float32 features in [0, 1], ten fixed patterns plus noise) instead of
  ``keras.datasets.mnist``.
- Sizes: the VAE trains on 512 samples instead of 60,000 (epochs=2 and batch_size=64 as published).
- The ``print`` calls stay; the values they show are asserted too. The ``ResNet`` sketch and the
  backend-specific ``Linear`` variants are code blocks in the guide's text, not run there, and not run
  here.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "guides/making_new_layers_and_models_via_subclassing.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class LinearInit(keras.layers.Layer):  # the guide's first ``Linear``
    def __init__(self, units=32, input_dim=32):
        super().__init__()
        self.w = self.add_weight(
            shape=(input_dim, units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(shape=(units,), initializer="zeros", trainable=True)

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b


def test_the_layer_class():
    x = ops.ones((2, 2))
    linear_layer = LinearInit(4, 2)
    y = linear_layer(x)
    print(y)
    assert linear_layer.weights == [linear_layer.w, linear_layer.b]
    np.testing.assert_allclose(np.asarray(y), np.ones((2, 2)) @ linear_layer.w.numpy(), rtol=1e-6)


class ComputeSum(keras.layers.Layer):
    def __init__(self, input_dim):
        super().__init__()
        self.total = self.add_weight(
            initializer="zeros", shape=(input_dim,), trainable=False
        )

    def call(self, inputs):
        self.total.assign_add(ops.sum(inputs, axis=0))
        return self.total


def test_layers_can_have_non_trainable_weights():
    x = ops.ones((2, 2))
    my_sum = ComputeSum(2)
    y = my_sum(x)
    print(y.numpy())
    np.testing.assert_array_equal(y.numpy(), [2.0, 2.0])
    y = my_sum(x)
    print(y.numpy())
    np.testing.assert_array_equal(y.numpy(), [4.0, 4.0])

    print("weights:", len(my_sum.weights))
    print("non-trainable weights:", len(my_sum.non_trainable_weights))
    # It's not included in the trainable weights:
    print("trainable_weights:", my_sum.trainable_weights)
    assert len(my_sum.weights) == 1 and len(my_sum.non_trainable_weights) == 1 and my_sum.trainable_weights == []


class Linear(keras.layers.Layer):  # deferred weight creation
    def __init__(self, units=32):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(
            shape=(self.units,), initializer="random_normal", trainable=True
        )

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b


class MLPBlock(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.linear_1 = Linear(32)
        self.linear_2 = Linear(32)
        self.linear_3 = Linear(1)

    def call(self, inputs):
        x = self.linear_1(inputs)
        x = keras.activations.relu(x)
        x = self.linear_2(x)
        x = keras.activations.relu(x)
        return self.linear_3(x)


def test_deferred_weights_and_recursive_composition():
    x = ops.ones((2, 2))
    # At instantiation, we don't know on what inputs this is going to get called
    linear_layer = Linear(32)
    assert linear_layer.weights == []
    # The layer's weights are created dynamically the first time the layer is called
    y = linear_layer(x)
    assert tuple(y.shape) == (2, 32) and tuple(linear_layer.w.shape) == (2, 32)

    mlp = MLPBlock()
    y = mlp(ops.ones(shape=(3, 64)))  # The first call to the `mlp` will create the weights
    print("weights:", len(mlp.weights))
    print("trainable weights:", len(mlp.trainable_weights))
    assert len(mlp.weights) == 6 and len(mlp.trainable_weights) == 6 and tuple(y.shape) == (3, 1)


# A layer that creates an activity regularization loss
class ActivityRegularizationLayer(keras.layers.Layer):
    def __init__(self, rate=1e-2):
        super().__init__()
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * ops.mean(inputs))
        return inputs


class OuterLayer(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.activity_reg = ActivityRegularizationLayer(1e-2)

    def call(self, inputs):
        return self.activity_reg(inputs)


class OuterLayerWithKernelRegularizer(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(
            32, kernel_regularizer=keras.regularizers.l2(1e-3)
        )

    def call(self, inputs):
        return self.dense(inputs)


def test_the_add_loss_method():
    layer = OuterLayer()
    assert len(layer.losses) == 0  # No losses yet since the layer has never been called

    _ = layer(ops.zeros((1, 1)))
    assert len(layer.losses) == 1  # We created one loss value

    # `layer.losses` gets reset at the start of each __call__
    _ = layer(ops.zeros((1, 1)))
    assert len(layer.losses) == 1  # This is the loss created during the call above

    layer = OuterLayerWithKernelRegularizer()
    _ = layer(ops.zeros((1, 1)))

    # This is `1e-3 * sum(layer.dense.kernel ** 2)`,
    # created by the `kernel_regularizer` above.
    print(layer.losses)
    assert len(layer.losses) == 1
    np.testing.assert_allclose(float(np.asarray(layer.losses[0])), 1e-3 * np.sum(layer.dense.kernel.numpy() ** 2),
                               rtol=1e-5)

    rng = np.random.default_rng(0)
    inputs = keras.Input(shape=(3,))
    outputs = ActivityRegularizationLayer()(inputs)
    model = keras.Model(inputs, outputs)

    # If there is a loss passed in `compile`, the regularization
    # losses get added to it
    model.compile(optimizer="adam", loss="mse")
    x, y = rng.random((2, 3)), rng.random((2, 3))
    history = model.fit(x, y, verbose=0)
    want = np.mean((x - y) ** 2) + 1e-2 * np.mean(x)
    np.testing.assert_allclose(history.history["loss"][0], want, rtol=1e-5)

    # It's also possible not to pass any loss in `compile`,
    # since the model already has a loss to minimize, via the `add_loss`
    # call during the forward pass!
    model.compile(optimizer="adam")
    x, y = rng.random((2, 3)), rng.random((2, 3))
    history = model.fit(x, y, verbose=0)
    np.testing.assert_allclose(history.history["loss"][0], 1e-2 * np.mean(x), rtol=1e-5)


class LinearConfig(keras.layers.Layer):
    def __init__(self, units=32):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(
            shape=(self.units,), initializer="random_normal", trainable=True
        )

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b

    def get_config(self):
        return {"units": self.units}


class LinearKwargs(keras.layers.Layer):
    def __init__(self, units=32, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(
            shape=(input_shape[-1], self.units),
            initializer="random_normal",
            trainable=True,
        )
        self.b = self.add_weight(
            shape=(self.units,), initializer="random_normal", trainable=True
        )

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units})
        return config


def test_you_can_optionally_enable_serialization_on_your_layers():
    # Now you can recreate the layer from its config:
    layer = LinearConfig(64)
    config = layer.get_config()
    print(config)
    new_layer = LinearConfig.from_config(config)
    assert new_layer.units == 64

    layer = LinearKwargs(64, name="my_linear")
    config = layer.get_config()
    print(config)
    new_layer = LinearKwargs.from_config(config)
    assert config["units"] == 64 and config["name"] == "my_linear"
    assert new_layer.units == 64 and new_layer.name == "my_linear"


class CustomDropout(keras.layers.Layer):
    def __init__(self, rate, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, inputs, training=None):
        if training:
            return keras.random.dropout(inputs, rate=self.rate)
        return inputs


def test_privileged_training_argument():
    keras.utils.set_random_seed(0)
    layer = CustomDropout(0.5)
    x = ops.ones((64, 32))
    np.testing.assert_array_equal(np.asarray(layer(x)), 1.0)
    dropped = np.asarray(layer(x, training=True))
    assert set(np.unique(dropped)) <= {0.0, 2.0} and 0.3 < np.mean(dropped == 0) < 0.7
    # predict calls it with training=False: no dropout, the same output twice
    inputs = keras.Input((32,))
    model = keras.Model(inputs, layers.Dense(1)(CustomDropout(0.5)(inputs)))
    np.testing.assert_allclose(model.predict(np.ones((4, 32), np.float32), verbose=0),
                               model.predict(np.ones((4, 32), np.float32), verbose=0))


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim))
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class Encoder(layers.Layer):
    """Maps MNIST digits to a triplet (z_mean, z_log_var, z)."""

    def __init__(self, latent_dim=32, intermediate_dim=64, name="encoder", **kwargs):
        super().__init__(name=name, **kwargs)
        self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
        self.dense_mean = layers.Dense(latent_dim)
        self.dense_log_var = layers.Dense(latent_dim)
        self.sampling = Sampling()

    def call(self, inputs):
        x = self.dense_proj(inputs)
        z_mean = self.dense_mean(x)
        z_log_var = self.dense_log_var(x)
        z = self.sampling((z_mean, z_log_var))
        return z_mean, z_log_var, z


class Decoder(layers.Layer):
    """Converts z, the encoded digit vector, back into a readable digit."""

    def __init__(self, original_dim, intermediate_dim=64, name="decoder", **kwargs):
        super().__init__(name=name, **kwargs)
        self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
        self.dense_output = layers.Dense(original_dim, activation="sigmoid")

    def call(self, inputs):
        x = self.dense_proj(inputs)
        return self.dense_output(x)


class VariationalAutoEncoder(keras.Model):
    """Combines the encoder and decoder into an end-to-end model for training."""

    def __init__(
        self,
        original_dim,
        intermediate_dim=64,
        latent_dim=32,
        name="autoencoder",
        **kwargs
    ):
        super().__init__(name=name, **kwargs)
        self.original_dim = original_dim
        self.encoder = Encoder(latent_dim=latent_dim, intermediate_dim=intermediate_dim)
        self.decoder = Decoder(original_dim, intermediate_dim=intermediate_dim)

    def call(self, inputs):
        z_mean, z_log_var, z = self.encoder(inputs)
        reconstructed = self.decoder(z)
        # Add KL divergence regularization loss.
        kl_loss = -0.5 * ops.mean(
            z_log_var - ops.square(z_mean) - ops.exp(z_log_var) + 1
        )
        self.add_loss(kl_loss)
        return reconstructed


def test_putting_it_all_together_an_end_to_end_example():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    patterns = (rng.random((10, 784)) > 0.7).astype("float32")
    x_train = np.clip(patterns[rng.integers(0, 10, 512)] + rng.uniform(0, 0.2, (512, 784)), 0, 1)
    x_train = x_train.astype("float32")

    original_dim = 784
    vae = VariationalAutoEncoder(784, 64, 32)

    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    vae.compile(optimizer, loss=keras.losses.MeanSquaredError())

    history = vae.fit(x_train, x_train, epochs=2, batch_size=64, verbose=0)
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss
    assert vae.predict(x_train[:5], verbose=0).shape == (5, original_dim)
    _ = vae(x_train[:5])
    assert vae.name == "autoencoder" and len(vae.losses) == 1  # the KL term of the last call
