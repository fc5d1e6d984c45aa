"""Standalone Mixture-of-Experts (MoE) Layers

Source: keras-io examples/keras_recipes/mixture_of_experts.py

Changes:
- Data: seeded NumPy stand-ins of CIFAR-10's shapes (32x32x3 float images in [0, 1], uint8 labels of shape
  (N, 1); each class tints its own colour channel and image quadrant: learnable) instead of
  ``keras.datasets.cifar10``.
- Sizes: 40 training / 16 test images instead of a 10000-image subset / 10000; 2 epochs instead of 10,
  batch size 16 instead of 128 (validation_split=0.2 as published): the MoE convolutions (128 and 256
  output channels before the expert sum) cost about 60 MFLOP per image on the NumPy backend. ``verbose=0``; ``summary()`` and the prints are
  left out.
- The test asserts both models learn (loss falls, accuracy above chance), that the MoE model has more
  parameters than the baseline, and runs the published gating-weights analysis (the feature extractor
  built from ``moe_model.input`` / ``dense_moe_layer.input``).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops, activations, optimizers

SOURCE = "examples/keras_recipes/mixture_of_experts.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class DenseMoE(layers.Layer):
    """
    Mixture-of-Experts Dense layer.

    A drop-in replacement for keras.layers.Dense that uses multiple expert
    networks combined via a learned gating mechanism.
    """

    def __init__(
        self,
        units,
        n_experts,
        expert_activation=None,
        gating_activation=None,
        use_expert_bias=True,
        use_gating_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = units
        self.n_experts = n_experts
        self.expert_activation = activations.get(expert_activation)
        self.gating_activation = activations.get(gating_activation)
        self.use_expert_bias = use_expert_bias
        self.use_gating_bias = use_gating_bias

    def build(self, input_shape):
        input_dim = input_shape[-1]

        # Expert kernels: (input_dim, units, n_experts)
        self.expert_kernel = self.add_weight(
            name="expert_kernel",
            shape=(input_dim, self.units, self.n_experts),
            initializer="glorot_uniform",
            trainable=True,
        )

        # Expert biases: (units, n_experts)
        if self.use_expert_bias:
            self.expert_bias = self.add_weight(
                name="expert_bias",
                shape=(self.units, self.n_experts),
                initializer="zeros",
                trainable=True,
            )

        # Gating kernel: (input_dim, n_experts)
        self.gating_kernel = self.add_weight(
            name="gating_kernel",
            shape=(input_dim, self.n_experts),
            initializer="glorot_uniform",
            trainable=True,
        )

        # Gating bias: (n_experts,)
        if self.use_gating_bias:
            self.gating_bias = self.add_weight(
                name="gating_bias",
                shape=(self.n_experts,),
                initializer="zeros",
                trainable=True,
            )

        super().build(input_shape)

    def call(self, inputs):
        # Compute expert outputs
        # Shape: (batch_size, units, n_experts)
        expert_outputs = ops.tensordot(inputs, self.expert_kernel, axes=1)

        if self.use_expert_bias:
            expert_outputs = expert_outputs + self.expert_bias

        expert_outputs = self.expert_activation(expert_outputs)

        # Compute gating weights
        # Shape: (batch_size, n_experts)
        gating_outputs = ops.tensordot(inputs, self.gating_kernel, axes=1)

        if self.use_gating_bias:
            gating_outputs = gating_outputs + self.gating_bias

        gating_outputs = self.gating_activation(gating_outputs)

        # Expand gating weights to broadcast with expert outputs
        # Shape: (batch_size, 1, n_experts)
        gating_outputs = ops.expand_dims(gating_outputs, axis=1)

        # Weighted combination of expert outputs
        # Shape: (batch_size, units)
        output = ops.sum(expert_outputs * gating_outputs, axis=-1)

        return output

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "n_experts": self.n_experts,
                "expert_activation": activations.serialize(self.expert_activation),
                "gating_activation": activations.serialize(self.gating_activation),
                "use_expert_bias": self.use_expert_bias,
                "use_gating_bias": self.use_gating_bias,
            }
        )
        return config


class Conv2DMoE(layers.Layer):
    """
    Mixture-of-Experts Conv2D layer.

    A drop-in replacement for keras.layers.Conv2D that uses multiple expert
    convolutional models combined via a learned gating mechanism.
    """

    def __init__(
        self,
        filters,
        kernel_size,
        n_experts,
        strides=1,
        padding="valid",
        expert_activation=None,
        gating_activation=None,
        use_expert_bias=True,
        use_gating_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = filters
        self.kernel_size = (
            kernel_size
            if isinstance(kernel_size, tuple)
            else (kernel_size, kernel_size)
        )
        self.n_experts = n_experts
        self.strides = strides if isinstance(strides, tuple) else (strides, strides)
        self.padding = padding
        self.expert_activation = activations.get(expert_activation)
        self.gating_activation = activations.get(gating_activation)
        self.use_expert_bias = use_expert_bias
        self.use_gating_bias = use_gating_bias

    def build(self, input_shape):
        input_channels = input_shape[-1]

        # Expert kernels: (kernel_h, kernel_w, input_channels, filters, n_experts)
        self.expert_kernel = self.add_weight(
            name="expert_kernel",
            shape=(
                self.kernel_size[0],
                self.kernel_size[1],
                input_channels,
                self.filters,
                self.n_experts,
            ),
            initializer="glorot_uniform",
            trainable=True,
        )

        # Expert biases: (filters, n_experts)
        if self.use_expert_bias:
            self.expert_bias = self.add_weight(
                name="expert_bias",
                shape=(self.filters, self.n_experts),
                initializer="zeros",
                trainable=True,
            )

        # Gating kernel: (1, 1, input_channels, n_experts)
        # Uses 1x1 convolution for efficient per-position gating
        self.gating_kernel = self.add_weight(
            name="gating_kernel",
            shape=(1, 1, input_channels, self.n_experts),
            initializer="glorot_uniform",
            trainable=True,
        )

        # Gating bias: (n_experts,)
        if self.use_gating_bias:
            self.gating_bias = self.add_weight(
                name="gating_bias",
                shape=(self.n_experts,),
                initializer="zeros",
                trainable=True,
            )

        super().build(input_shape)

    def call(self, inputs):
        # Process each expert and collect outputs
        expert_kernel = ops.reshape(
            self.expert_kernel,
            (
                self.kernel_size[0],
                self.kernel_size[1],
                ops.shape(inputs)[-1],
                self.filters * self.n_experts,
            ),
        )

        expert_outputs = ops.conv(
            inputs,
            expert_kernel,
            strides=self.strides,
            padding=self.padding,
        )

        # Reshape output to split the experts dimension.
        output_shape = ops.shape(expert_outputs)
        expert_outputs = ops.reshape(
            expert_outputs,
            (
                output_shape[0],
                output_shape[1],
                output_shape[2],
                self.filters,
                self.n_experts,
            ),
        )

        if self.use_expert_bias:
            expert_outputs = expert_outputs + self.expert_bias

        expert_outputs = self.expert_activation(expert_outputs)

        # Compute gating weights using 1x1 convolution
        # Shape: (batch, height, width, n_experts)
        gating_outputs = ops.conv(
            inputs,
            self.gating_kernel,
            strides=self.strides,
            padding=self.padding,
        )

        if self.use_gating_bias:
            gating_outputs = gating_outputs + self.gating_bias

        gating_outputs = self.gating_activation(gating_outputs)

        # Expand gating to broadcast with expert outputs
        # Shape: (batch, height, width, 1, n_experts)
        gating_outputs = ops.expand_dims(gating_outputs, axis=-2)

        # Weighted combination of expert outputs
        # Shape: (batch, height, width, filters)
        output = ops.sum(expert_outputs * gating_outputs, axis=-1)

        return output

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "n_experts": self.n_experts,
                "strides": self.strides,
                "padding": self.padding,
                "expert_activation": activations.serialize(self.expert_activation),
                "gating_activation": activations.serialize(self.gating_activation),
                "use_expert_bias": self.use_expert_bias,
                "use_gating_bias": self.use_gating_bias,
            }
        )
        return config


def _cifar_like(n, rng):
    y = rng.integers(0, 10, size=(n, 1)).astype(np.uint8)
    x = rng.uniform(0, 0.6, size=(n, 32, 32, 3)).astype(np.float32)
    for c in range(10):
        rows = y[:, 0] == c
        q0, q1 = (c // 2) % 2 * 16, c % 2 * 16
        x[rows, q0:q0 + 16, q1:q1 + 16, c % 3] += 0.4
        if c >= 5:
            x[rows, :, :, (c + 1) % 3] *= 0.3
    return x, y


def create_baseline_model():
    inputs = keras.Input(shape=(32, 32, 3))

    # Convolutional feature extraction
    x = layers.Conv2D(32, 3, activation="relu", padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D(2)(x)

    x = layers.Conv2D(64, 3, activation="relu", padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D(2)(x)

    # Dense classification head
    x = layers.Flatten()(x)
    x = layers.Dense(128, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(10, activation="softmax")(x)

    model = keras.Model(inputs, outputs, name="baseline_model")
    return model


def create_moe_model():
    inputs = keras.Input(shape=(32, 32, 3))

    # MoE convolutional feature extraction
    x = Conv2DMoE(
        32,
        3,
        n_experts=4,
        padding="same",
        expert_activation="relu",
        gating_activation="softmax",
    )(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D(2)(x)

    x = Conv2DMoE(
        64,
        3,
        n_experts=4,
        padding="same",
        expert_activation="relu",
        gating_activation="softmax",
    )(x)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D(2)(x)

    # MoE dense classification head
    x = layers.Flatten()(x)
    x = DenseMoE(
        128,
        n_experts=8,
        expert_activation="relu",
        gating_activation="softmax",
    )(x)
    x = layers.Dropout(0.5)(x)
    x = DenseMoE(
        64,
        n_experts=4,
        expert_activation="relu",
        gating_activation="softmax",
    )(x)
    outputs = layers.Dense(10, activation="softmax")(x)

    model = keras.Model(inputs, outputs, name="moe_model")
    return model


def test_mixture_of_experts():
    rng = np.random.default_rng(5)
    keras.utils.set_random_seed(5)
    (x_train, y_train), (x_test, y_test) = _cifar_like(40, rng), _cifar_like(16, rng)

    # Training parameters
    epochs = 2
    batch_size = 16

    baseline_model = create_baseline_model()
    baseline_model.compile(
        optimizer=optimizers.Adam(learning_rate=0.001),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    baseline_history = baseline_model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.2,
        verbose=0,
    )
    baseline_test_loss, baseline_test_acc = baseline_model.evaluate(
        x_test, y_test, verbose=0
    )

    moe_model = create_moe_model()
    moe_model.compile(
        optimizer=optimizers.Adam(learning_rate=0.001),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    moe_history = moe_model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.2,
        verbose=0,
    )
    moe_test_loss, moe_test_acc = moe_model.evaluate(x_test, y_test, verbose=0)

    for h in (baseline_history.history, moe_history.history):
        assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < h["loss"][0]
        assert h["accuracy"][-1] > 0.2  # chance is 0.1
    assert np.isfinite(baseline_test_loss) and np.isfinite(moe_test_loss)
    assert moe_model.count_params() > baseline_model.count_params()

    # Get the first DenseMoE layer from the MoE model
    dense_moe_layer = None
    for layer in moe_model.layers:
        if isinstance(layer, DenseMoE):
            dense_moe_layer = layer
            break

    assert dense_moe_layer is not None
    if dense_moe_layer:
        # Create a model to extract features before the MoE layer
        feature_extractor = keras.Model(
            inputs=moe_model.input,
            outputs=dense_moe_layer.input,  # Input to the first DenseMoE layer
        )

        # Get features for a sample of test data
        test_features = feature_extractor.predict(x_test[:100], verbose=0)

        # Compute gating weights for these samples
        gating_layer = layers.Dense(
            units=dense_moe_layer.n_experts,
            activation=dense_moe_layer.gating_activation,
            use_bias=dense_moe_layer.use_gating_bias,
        )
        gating_layer.build(test_features.shape)
        weights = [dense_moe_layer.gating_kernel]
        if dense_moe_layer.use_gating_bias:
            weights.append(dense_moe_layer.gating_bias)
        gating_layer.set_weights(weights)
        gating_weights = gating_layer(test_features)

        # Convert to numpy for analysis
        gating_weights_np = ops.convert_to_numpy(gating_weights)

    assert test_features.shape == (16, 8 * 8 * 64)
    assert gating_weights_np.shape == (16, 8)
    np.testing.assert_allclose(gating_weights_np.sum(axis=1), 1.0, rtol=1e-5)  # softmax gates
    # the gating Dense reproduces the layer's own gates
    logits = test_features @ ops.convert_to_numpy(dense_moe_layer.gating_kernel) + ops.convert_to_numpy(
        dense_moe_layer.gating_bias)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(gating_weights_np, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    config = dense_moe_layer.get_config()
    assert config["n_experts"] == 8 and config["gating_activation"] == "softmax"
