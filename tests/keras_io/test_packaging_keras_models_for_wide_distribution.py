"""Packaging Keras models for wide distribution using Functional Subclassing

Source: keras-io examples/keras_recipes/packaging_keras_models_for_wide_distribution.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's arrays (28x28 uint8 images, uint8 labels 0-9; each class
  brightens its own rows: learnable) instead of ``tf.keras.datasets.mnist``. The ``tf.data`` streams
  (expand_dims, batch 256, cache, shuffle, repeat) become NumPy arrays with the channel axis added and
  ``fit(..., batch_size=256, steps_per_epoch=STEPS_PER_EPOCH)`` (fit shuffles arrays itself); the binary
  labels' ``tf.cast(tf.math.equal(y, 0), tf.uint8)`` map is the same NumPy expression on the arrays, and the
  dict stream is a dict of arrays.
- Model code: the two ``Input(shape=(None, None, 1))`` become ``(28, 28, 1)`` (see ``CHANGES``).
- Sizes: 64 training / 32 test images instead of 60000 / 10000; EPOCHS = 2 instead of 5, BATCH_SIZE = 8
  instead of 256 (STEPS_PER_EPOCH = len(train_labels) // BATCH_SIZE as published). The stand-in images are
  digits 0-2 only, which differ in brightness (what the model's global average pooling keeps). ``verbose=0``; ``summary()`` and the
  prints are left out (``walk_layers`` collects the names instead of printing them).
"""

import numpy as np
import pytest

import dnnbind as keras

SOURCE = "examples/keras_recipes/packaging_keras_models_for_wide_distribution.py"
UNCHANGED = False
CHANGES = ("Input(shape=(None, None, 1)) becomes Input(shape=(28, 28, 1)) in both models: dnnbind's built-in "
           "layers (Rescaling, Conv2D...) need every sample dimension known when they are called on symbolic "
           "inputs, so the example's 'unconstrained inputs' (any image size, same weights) does not work; the rest "
           "(functional subclassing, introspection, surgery on model.input / layer.input, dict inputs) runs as "
           "published.")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class MnistModel(keras.Model):
    def __init__(self, **kwargs):
        # Keras Functional model definition. This could have used Sequential as
        # well. Sequential is just syntactic sugar for simple functional models.

        # 1-channel monochrome input
        inputs = keras.layers.Input(shape=(28, 28, 1), dtype="uint8")  # dnnbind: (None, None, 1), see CHANGES
        # pixel format conversion from uint8 to float32
        y = keras.layers.Rescaling(1 / 255.0)(inputs)

        # 3 convolutional layers
        y = keras.layers.Conv2D(
            filters=16, kernel_size=3, padding="same", activation="relu"
        )(y)
        y = keras.layers.Conv2D(
            filters=32, kernel_size=6, padding="same", activation="relu", strides=2
        )(y)
        y = keras.layers.Conv2D(
            filters=48, kernel_size=6, padding="same", activation="relu", strides=2
        )(y)

        # 2 dense layers
        y = keras.layers.GlobalAveragePooling2D()(y)
        y = keras.layers.Dense(48, activation="relu")(y)
        y = keras.layers.Dropout(0.4)(y)
        outputs = keras.layers.Dense(
            10, activation="softmax", name="classification_head"  # 10 classes
        )(y)

        # A Keras Functional model is created by calling keras.Model(inputs, outputs)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)


class MnistDictModel(keras.Model):
    def __init__(self, **kwargs):
        #
        # The input is a dictionary
        #
        inputs = {
            "image": keras.layers.Input(
                shape=(28, 28, 1),  # 1-channel monochrome; dnnbind: (None, None, 1), see CHANGES
                dtype="uint8",
                name="image",
            )
        }

        # pixel format conversion from uint8 to float32
        y = keras.layers.Rescaling(1 / 255.0)(inputs["image"])

        # 3 conv layers
        y = keras.layers.Conv2D(
            filters=16, kernel_size=3, padding="same", activation="relu"
        )(y)
        y = keras.layers.Conv2D(
            filters=32, kernel_size=6, padding="same", activation="relu", strides=2
        )(y)
        y = keras.layers.Conv2D(
            filters=48, kernel_size=6, padding="same", activation="relu", strides=2
        )(y)

        # 2 dense layers
        y = keras.layers.GlobalAveragePooling2D()(y)
        y = keras.layers.Dense(48, activation="relu")(y)
        y = keras.layers.Dropout(0.4)(y)
        outputs = keras.layers.Dense(
            10, activation="softmax", name="classification_head"  # 10 classes
        )(y)

        # A Keras Functional model is created by calling keras.Model(inputs, outputs)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)


def _mnist_like(n, rng):
    """Digits 0-2 only, each with its own brightness (what survives the model's global average pooling)."""
    y = rng.integers(0, 3, size=n).astype(np.uint8)
    x = rng.integers(0, 40, size=(n, 28, 28)) + 100 * y[:, None, None]
    return x.astype(np.uint8), y


def test_packaging_keras_models_for_wide_distribution():
    rng = np.random.default_rng(6)
    keras.utils.set_random_seed(6)
    BATCH_SIZE = 8

    (x_train, train_labels), (x_test, test_labels) = _mnist_like(64, rng), _mnist_like(32, rng)
    train_data = (np.expand_dims(x_train, axis=-1), train_labels)  # 1-channel monochrome
    test_data = (np.expand_dims(x_test, axis=-1), test_labels)

    STEPS_PER_EPOCH = len(train_labels) // BATCH_SIZE
    EPOCHS = 2

    model = MnistModel()

    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )

    history = model.fit(
        *train_data,
        batch_size=BATCH_SIZE,
        steps_per_epoch=STEPS_PER_EPOCH,
        epochs=EPOCHS,
        validation_data=test_data,
        verbose=0,
    )
    h = history.history
    assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < h["loss"][0]
    assert isinstance(model, MnistModel) and isinstance(model, keras.Model)
    assert model.predict(np.zeros((2, 28, 28, 1), np.uint8), verbose=0).shape == (2, 10)

    model = MnistModel()

    names = []

    # Recursively walking the layer graph works as well
    def walk_layers(layer):
        if hasattr(layer, "layers"):
            for layer in layer.layers:
                walk_layers(layer)
        else:
            names.append(layer.name)

    walk_layers(model)
    assert len(names) == 9 and names[-1] == "classification_head"

    model = MnistModel()

    input = model.input
    # cut before the classification head
    y = model.get_layer("classification_head").input

    # add a new classification head
    output = keras.layers.Dense(
        1,  # single class for binary classification
        activation="sigmoid",
        name="binary_classification_head",
    )(y)

    # create a new functional model
    binary_model = keras.Model(input, output)

    # new dataset with 0 / 1 labels (1 = digit '0', 0 = all other digits)
    bin_train_data = (train_data[0], np.equal(train_data[1], np.zeros_like(train_data[1])).astype(np.uint8))
    bin_test_data = (test_data[0], np.equal(test_data[1], np.zeros_like(test_data[1])).astype(np.uint8))

    # appropriate loss and metric for binary classification
    binary_model.compile(
        optimizer="adam", loss="binary_crossentropy", metrics=["binary_accuracy"]
    )

    history = binary_model.fit(
        *bin_train_data,
        batch_size=BATCH_SIZE,
        steps_per_epoch=STEPS_PER_EPOCH,
        epochs=EPOCHS,
        validation_data=bin_test_data,
        verbose=0,
    )
    h = history.history
    assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < h["loss"][0]
    assert binary_model.predict(bin_test_data[0][:4], verbose=0).shape == (4, 1)
    # the surgery kept the trunk: the new model shares the original model's layers up to the head
    assert not any(layer.name == "classification_head" for layer in binary_model.layers)
    assert any(layer is model.layers[2] for layer in binary_model.layers)

    model = MnistDictModel()

    # reformat the dataset as a dictionary
    dict_train_data = ({"image": train_data[0]}, train_data[1])
    dict_test_data = ({"image": test_data[0]}, test_data[1])

    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )

    history = model.fit(
        *dict_train_data,
        batch_size=BATCH_SIZE,
        steps_per_epoch=STEPS_PER_EPOCH,
        epochs=EPOCHS,
        validation_data=dict_test_data,
        verbose=0,
    )
    h = history.history
    assert np.all(np.isfinite(h["loss"])) and h["loss"][-1] < h["loss"][0]
    assert h["sparse_categorical_accuracy"][-1] > h["sparse_categorical_accuracy"][0]
