"""Reproducibility in Keras Models

Source: keras-io examples/keras_recipes/reproducibility_recipes.py

Changes:
- ``tf.config.experimental.enable_op_determinism()`` is dropped: it is TensorFlow's switch; dnnbind's NumPy
  backend is deterministic (on CUDA, ``dnnbind.kernels.config`` has ``deterministic=True``).
- Data: seeded NumPy stand-ins of MNIST's shapes (28x28 uint8 images, labels 0-9; each class brightens its
  own block: learnable) instead of ``keras.datasets.mnist``; the ``tf.data`` pipeline (shuffle, batch 64,
  ``prepare_dataset``) becomes NumPy arrays: ``prepare_dataset`` casts, scales, expands the channel axis
  and resizes to 32x32 with ``keras.ops.image.resize`` instead of ``tf.image.resize``, and ``fit`` shuffles
  (its default) with ``batch_size=64``.
- ``float(initializer(seed=42)(shape=(1, 1)))`` becomes ``float(...[0, 0])`` (see ``CHANGES``).
- Sizes: 384 training / 128 test images instead of 60000 / 10000 (2 epochs as published). ``verbose=0``.
- "Restart the kernel and train again" becomes a second call of ``train_model`` after the same
  ``keras.utils.set_random_seed(812)``: the test asserts both histories (and test accuracies) are equal, and
  the published JSON round trip of the history is kept (in pytest's temporary directory).
"""

import json

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import initializers
from dnnbind import layers

SOURCE = "examples/keras_recipes/reproducibility_recipes.py"
UNCHANGED = False
CHANGES = ("float(initializer(seed=42)(shape=(1, 1))) reads the value as [0, 0]: dnnbind's initializers return "
           "NumPy arrays (Keras 3's return backend tensors, which float() converts at any shape), and NumPy 2 "
           "refuses float() of a (1, 1) array.")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _mnist_like(n, rng):
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 100, size=(n, 28, 28)).astype(np.uint8)
    for c in range(10):
        r, col = divmod(c, 5)
        images[labels == c, 4 + 10 * r: 12 + 10 * r, 2 + 5 * col: 6 + 5 * col] += 155
    return images, labels


def test_reproducibility_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keras.utils.set_random_seed(812)

    initializers_list = [
        initializers.RandomNormal,
        initializers.RandomUniform,
        initializers.TruncatedNormal,
        initializers.VarianceScaling,
        initializers.GlorotNormal,
        initializers.GlorotUniform,
        initializers.HeNormal,
        initializers.HeUniform,
        initializers.LecunNormal,
        initializers.LecunUniform,
        initializers.Orthogonal,
    ]

    for initializer in initializers_list:
        results = []
        for iteration in range(2):
            # In order to get same results across multiple runs from an initializer,
            # you can specify a seed value.
            result = float(initializer(seed=42)(shape=(1, 1))[0, 0])  # dnnbind: [0, 0] (see CHANGES)
            results.append(result)
        assert results[0] == results[1], initializer

    glorot_normal_1 = keras.initializers.GlorotNormal(seed=42)
    glorot_normal_2 = keras.initializers.GlorotNormal(seed=42)

    input_dim, neurons = 3, 5

    result_1 = glorot_normal_1(shape=(input_dim, neurons))
    result_2 = glorot_normal_2(shape=(input_dim, neurons))

    equal = np.allclose(result_1, result_2)
    assert equal

    glorot_normal_3 = keras.initializers.GlorotNormal()
    glorot_normal_4 = keras.initializers.GlorotNormal()

    result_3 = glorot_normal_3(shape=(input_dim, neurons))
    result_4 = glorot_normal_4(shape=(input_dim, neurons))

    equal = np.allclose(result_3, result_4)
    assert not equal

    def train_model(train_data, test_data):
        model = keras.Sequential(
            [
                layers.Conv2D(32, (3, 3), activation="relu"),
                layers.MaxPooling2D((2, 2)),
                layers.Dropout(0.2),
                layers.Conv2D(32, (3, 3), activation="relu"),
                layers.MaxPooling2D((2, 2)),
                layers.Dropout(0.2),
                layers.Conv2D(32, (3, 3), activation="relu"),
                layers.GlobalAveragePooling2D(),
                layers.Dense(64, activation="relu"),
                layers.Dropout(0.2),
                layers.Dense(10, activation="softmax"),
            ]
        )

        model.compile(
            optimizer="adam",
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=False,
        )
        history = model.fit(*train_data, batch_size=64, epochs=2, validation_data=test_data, verbose=0)

        accuracy = model.evaluate(*test_data, batch_size=64, verbose=0)[1]

        return history.history, accuracy

    rng = np.random.default_rng(812)
    (train_images, train_labels), (test_images, test_labels) = _mnist_like(384, rng), _mnist_like(128, rng)

    def prepare_dataset(image, label):
        # Cast and normalize the image
        image = image.astype("float32") / 255.0

        # Expand the channel dimension
        image = np.expand_dims(image, axis=-1)

        # Resize the image
        image = keras.ops.convert_to_numpy(keras.ops.image.resize(image, (32, 32)))

        return image, label

    train_data = prepare_dataset(train_images, train_labels)
    test_data = prepare_dataset(test_images, test_labels)
    assert train_data[0].shape == (384, 32, 32, 1)

    keras.utils.set_random_seed(812)
    history, accuracy = train_model(train_data, test_data)

    with open("history.json", "w") as fp:
        json.dump(history, fp)

    with open("history.json", "r") as fp:
        history_loaded = json.load(fp)

    for key in history.keys():
        for i in range(len(history[key])):
            assert np.allclose(history[key][i], history_loaded[key][i]), key

    # the "second run of the notebook": the same seed gives the same training, value for value
    keras.utils.set_random_seed(812)
    history_again, accuracy_again = train_model(train_data, test_data)
    assert history_again == history and accuracy_again == accuracy

    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert np.all(np.isfinite(history["loss"])) and history["loss"][1] < history["loss"][0]
    assert accuracy > 0.2  # chance is 0.1

    # another seed trains differently
    keras.utils.set_random_seed(813)
    history_other, _ = train_model(train_data, test_data)
    assert history_other["loss"] != history["loss"]
