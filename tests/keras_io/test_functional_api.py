"""The Functional API

Source: keras-io guides/functional_api.py (Keras 3 text: guides/keras_core/functional_api.py; one test
per section)

Changes:
- Data: seeded NumPy stand-ins of MNIST's flattened shape (784 float32 features, 10 classes; each class
  brightens its own band of pixels, so it is learnable) and of CIFAR-10's (32x32x3 float32, uint8 labels
  one-hot by ``keras.utils.to_categorical``) instead of ``keras.datasets``.
- Sizes: 640 MNIST training / 160 test samples (epochs=2, batch_size=64 as published); the toy ResNet
  trains on 96 images instead of 1000 (batch_size=64, epochs=1, validation_split=0.2 as published).
- ``keras.utils.plot_model`` calls are left out (no graphviz here; dnnbind has no plot_model); the
  ``summary()`` calls run and their output shapes are checked.
- ``model.save("my_model.keras")`` writes into pytest's ``tmp_path``.
- "Mix-and-match API styles": the first functional model takes ``keras.Input((timesteps, units))``
  instead of ``keras.Input((None, units))``: dnnbind's built-in layers (here GlobalAveragePooling1D) are
  built for a known sample shape and refuse a None time axis (a dnnbind gap).
- Not run, for gaps outside this port: the multi-input/multi-output ticket model and the shared-layer
  section (they need ``layers.Embedding`` and ``layers.LSTM``), and the VGG19 feature extraction (it needs
  ``keras.applications`` and its ImageNet weights).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "guides/functional_api.py"
UNCHANGED = False
CHANGES = ("sections needing layers.Embedding / layers.LSTM (multi-input ticket model, shared embedding) and "
           "keras.applications.VGG19 are not run; plot_model calls left out; Input((None, units)) is given its "
           "time length (built-in layers refuse a None sample axis); the rest runs as published")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _mnist_like(n, rng):
    y = rng.integers(0, 10, size=n).astype(np.uint8)
    x = rng.uniform(0, 0.5, size=(n, 784)).astype(np.float32)
    for k in range(10):
        x[y == k, 78 * k: 78 * k + 78] += 0.5
    return x, y


def _mnist_model():
    inputs = keras.Input(shape=(784,))
    dense = layers.Dense(64, activation="relu")
    x = dense(inputs)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(10)(x)
    return keras.Model(inputs=inputs, outputs=outputs, name="mnist_model")


def test_introduction_training_and_saving(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(784,))
    img_inputs = keras.Input(shape=(32, 32, 3))
    assert inputs.shape == (None, 784) and img_inputs.shape == (None, 32, 32, 3)
    assert inputs.dtype == "float32"

    dense = layers.Dense(64, activation="relu")
    x = dense(inputs)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(10)(x)
    model = keras.Model(inputs=inputs, outputs=outputs, name="mnist_model")
    model.summary()
    assert model.count_params() == 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10  # 55,050

    rng = np.random.default_rng(0)
    x_train, y_train = _mnist_like(640, rng)
    x_test, y_test = _mnist_like(160, rng)

    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.RMSprop(),
        metrics=["accuracy"],
    )

    history = model.fit(x_train, y_train, batch_size=64, epochs=2, validation_split=0.2, verbose=0)
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]

    test_scores = model.evaluate(x_test, y_test, verbose=0)
    print("Test loss:", test_scores[0])
    print("Test accuracy:", test_scores[1])
    assert test_scores[1] > 0.5  # chance is 0.1

    path = str(tmp_path / "my_model.keras")
    model.save(path)
    before = model.predict(x_test, verbose=0)
    del model
    # Recreate the exact same model purely from the file:
    model = keras.models.load_model(path)
    np.testing.assert_allclose(model.predict(x_test, verbose=0), before, rtol=1e-6, atol=1e-6)


def test_use_the_same_graph_of_layers_to_define_multiple_models():
    encoder_input = keras.Input(shape=(28, 28, 1), name="img")
    x = layers.Conv2D(16, 3, activation="relu")(encoder_input)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D(3)(x)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    encoder_output = layers.GlobalMaxPooling2D()(x)

    encoder = keras.Model(encoder_input, encoder_output, name="encoder")
    encoder.summary()

    x = layers.Reshape((4, 4, 1))(encoder_output)
    x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
    x = layers.Conv2DTranspose(32, 3, activation="relu")(x)
    x = layers.UpSampling2D(3)(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
    decoder_output = layers.Conv2DTranspose(1, 3, activation="relu")(x)

    autoencoder = keras.Model(encoder_input, decoder_output, name="autoencoder")
    autoencoder.summary()
    # "the output shape is the same as the input shape (28, 28, 1)"; the encoder's weights are shared
    assert autoencoder.output_shape == (None, 28, 28, 1) and encoder.output_shape == (None, 16)
    assert autoencoder.count_params() == 28241 and encoder.count_params() == 18672
    x = np.random.default_rng(0).random((2, 28, 28, 1)).astype("float32")
    assert autoencoder.predict(x, verbose=0).shape == (2, 28, 28, 1)


def test_all_models_are_callable_just_like_layers():
    encoder_input = keras.Input(shape=(28, 28, 1), name="original_img")
    x = layers.Conv2D(16, 3, activation="relu")(encoder_input)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D(3)(x)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    encoder_output = layers.GlobalMaxPooling2D()(x)

    encoder = keras.Model(encoder_input, encoder_output, name="encoder")
    encoder.summary()

    decoder_input = keras.Input(shape=(16,), name="encoded_img")
    x = layers.Reshape((4, 4, 1))(decoder_input)
    x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
    x = layers.Conv2DTranspose(32, 3, activation="relu")(x)
    x = layers.UpSampling2D(3)(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu")(x)
    decoder_output = layers.Conv2DTranspose(1, 3, activation="relu")(x)

    decoder = keras.Model(decoder_input, decoder_output, name="decoder")
    decoder.summary()

    autoencoder_input = keras.Input(shape=(28, 28, 1), name="img")
    encoded_img = encoder(autoencoder_input)
    decoded_img = decoder(encoded_img)
    autoencoder = keras.Model(autoencoder_input, decoded_img, name="autoencoder")
    autoencoder.summary()

    x = np.random.default_rng(1).random((2, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(autoencoder.predict(x, verbose=0),
                               decoder.predict(encoder.predict(x, verbose=0), verbose=0), rtol=1e-5, atol=1e-6)

    def get_model():
        inputs = keras.Input(shape=(128,))
        outputs = layers.Dense(1)(inputs)
        return keras.Model(inputs, outputs)

    model1 = get_model()
    model2 = get_model()
    model3 = get_model()

    inputs = keras.Input(shape=(128,))
    y1 = model1(inputs)
    y2 = model2(inputs)
    y3 = model3(inputs)
    outputs = layers.average([y1, y2, y3])
    ensemble_model = keras.Model(inputs=inputs, outputs=outputs)

    x = np.random.default_rng(2).random((4, 128)).astype("float32")
    want = np.mean([m.predict(x, verbose=0) for m in (model1, model2, model3)], axis=0)
    np.testing.assert_allclose(ensemble_model.predict(x, verbose=0), want, rtol=1e-5, atol=1e-6)


def test_a_toy_resnet_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(32, 32, 3), name="img")
    x = layers.Conv2D(32, 3, activation="relu")(inputs)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    block_1_output = layers.MaxPooling2D(3)(x)

    x = layers.Conv2D(64, 3, activation="relu", padding="same")(block_1_output)
    x = layers.Conv2D(64, 3, activation="relu", padding="same")(x)
    block_2_output = layers.add([x, block_1_output])

    x = layers.Conv2D(64, 3, activation="relu", padding="same")(block_2_output)
    x = layers.Conv2D(64, 3, activation="relu", padding="same")(x)
    block_3_output = layers.add([x, block_2_output])

    x = layers.Conv2D(64, 3, activation="relu")(block_3_output)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(256, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(10)(x)

    model = keras.Model(inputs, outputs, name="toy_resnet")
    model.summary()
    assert model.count_params() == 223242  # the guide's summary

    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, (96, 32, 32, 3)).astype("uint8")
    y_train = rng.integers(0, 10, (96, 1)).astype("uint8")
    x_train = x_train.astype("float32") / 255.0
    y_train = keras.utils.to_categorical(y_train, 10)
    assert y_train.shape == (96, 10)

    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        metrics=["acc"],
    )
    # We restrict the data to the first 1000 samples so as to limit execution time
    # on Colab. Try to train on the entire dataset until convergence!
    history = model.fit(
        x_train[:1000],
        y_train[:1000],
        batch_size=64,
        epochs=1,
        validation_split=0.2,
        verbose=0,
    )
    assert set(history.history) == {"loss", "acc", "val_loss", "val_acc"}
    # one epoch on random labels: a loss near log(10) at the start, finite throughout
    assert all(np.isfinite(v[0]) for v in history.history.values())
    assert 1.0 < history.history["loss"][0] < 5.0


class CustomDense(layers.Layer):
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


def test_extend_the_api_using_custom_layers():
    inputs = keras.Input((4,))
    outputs = CustomDense(10)(inputs)

    model = keras.Model(inputs, outputs)
    config = model.get_config()

    new_model = keras.Model.from_config(config, custom_objects={"CustomDense": CustomDense})
    assert new_model.output_shape == (None, 10)
    new_model.set_weights(model.get_weights())
    x = np.random.default_rng(0).random((3, 4)).astype("float32")
    w, b = model.get_weights()
    np.testing.assert_allclose(new_model.predict(x, verbose=0), x @ w + b, rtol=1e-5, atol=1e-6)


def test_mix_and_match_api_styles():
    units = 32
    timesteps = 10
    input_dim = 5

    # Define a Functional model
    # CHANGED: Input((None, units)) -> Input((timesteps, units)): dnnbind's built-in layers need every sample
    # axis known when they are built (a None time axis is refused)
    inputs = keras.Input((timesteps, units))
    x = layers.GlobalAveragePooling1D()(inputs)
    outputs = layers.Dense(1)(x)
    model = keras.Model(inputs, outputs)

    class CustomRNN(layers.Layer):
        def __init__(self):
            super().__init__()
            self.units = units
            self.projection_1 = layers.Dense(units=units, activation="tanh")
            self.projection_2 = layers.Dense(units=units, activation="tanh")
            # Our previously-defined Functional model
            self.classifier = model

        def call(self, inputs):
            outputs = []
            state = ops.zeros(shape=(inputs.shape[0], self.units))
            for t in range(inputs.shape[1]):
                x = inputs[:, t, :]
                h = self.projection_1(x)
                y = h + self.projection_2(state)
                state = y
                outputs.append(y)
            features = ops.stack(outputs, axis=1)
            print(features.shape)
            return self.classifier(features)

    rnn_model = CustomRNN()
    out = rnn_model(ops.zeros((1, timesteps, input_dim)))
    assert tuple(out.shape) == (1, 1)

    units = 32
    timesteps = 10
    input_dim = 5
    batch_size = 16

    class CustomRNN(layers.Layer):
        def __init__(self):
            super().__init__()
            self.units = units
            self.projection_1 = layers.Dense(units=units, activation="tanh")
            self.projection_2 = layers.Dense(units=units, activation="tanh")
            self.classifier = layers.Dense(1)

        def call(self, inputs):
            outputs = []
            state = ops.zeros(shape=(inputs.shape[0], self.units))
            for t in range(inputs.shape[1]):
                x = inputs[:, t, :]
                h = self.projection_1(x)
                y = h + self.projection_2(state)
                state = y
                outputs.append(y)
            features = ops.stack(outputs, axis=1)
            return self.classifier(features)

    # Note that you specify a static batch size for the inputs with the `batch_shape`
    # arg, because the inner computation of `CustomRNN` requires a static batch size
    # (when you create the `state` zeros tensor).
    inputs = keras.Input(batch_shape=(batch_size, timesteps, input_dim))
    x = layers.Conv1D(32, 3)(inputs)
    outputs = CustomRNN()(x)

    model = keras.Model(inputs, outputs)
    assert model.output_shape[1:] == (timesteps - 2, 1)
    y = model.predict(np.random.default_rng(0).random((batch_size, timesteps, input_dim)).astype("float32"),
                      batch_size=batch_size, verbose=0)
    assert y.shape == (batch_size, timesteps - 2, 1) and np.all(np.isfinite(y))

    rnn_model = CustomRNN()
    _ = rnn_model(ops.zeros((1, 10, 5)))
    assert tuple(_.shape) == (1, 10, 1)
