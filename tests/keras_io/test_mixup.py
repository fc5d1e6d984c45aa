"""MixUp augmentation for image classification

Source: keras-io examples/vision/mixup.py

Changes:
- Data: seeded NumPy stand-ins of FashionMNIST's layout (28x28 uint8 images, 10 classes) instead of
  ``tf.keras.datasets.fashion_mnist``: each class is a fixed random silhouette (a union of as many rectangles as
  its label plus one),
  shifted by up to 2 pixels and noised. 704 training / 128 test images instead of 60,000/10,000, and
  ``val_samples = 64`` instead of 2000.
- ``tf.data`` is replaced by its in-memory stand-in (``tf_data_standin.Dataset``, a
  ``keras.utils.PyDataset`` with ``from_tensor_slices``/``shuffle``/``batch``/``zip``/``map``): the pipeline
  lines are the published ones, and ``mix_up`` runs on every pair of batches of every epoch. The mixup
  itself is the published code in ``keras.ops`` / ``keras.random``: ``tf.random.gamma`` is
  ``keras.random.gamma``, ``tf.shape``/``tf.reshape`` are ``keras.ops.shape``/``keras.ops.reshape``,
  ``tf.one_hot`` is ``keras.ops.one_hot``; ``tf.keras`` is ``keras``.
- The initial weights go to ``initial_weights.weights.h5`` (Keras 3 requires the ``.weights.h5`` suffix),
  in pytest's temporary directory.
- Sizes: 4 epochs instead of 10 for both trainings (batch size 64 as published); ``verbose=0``.
- The preview plot is replaced by checks of the first mixed batch (labels are convex combinations).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from tf_data_standin import AUTOTUNE, Dataset

SOURCE = "examples/vision/mixup.py"
UNCHANGED = False
CHANGES = ("tf.data replaced by an in-memory stand-in (tf_data_standin.Dataset over keras.utils.PyDataset); tf ops spelled "
           "keras.ops/keras.random; initial weights saved as .weights.h5 (Keras 3)")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _fashion_like(n, rng, templates):
    y = rng.integers(0, 10, size=n)
    x = np.empty((n, 28, 28))
    for i in range(n):
        x[i] = np.roll(templates[y[i]], tuple(rng.integers(-2, 3, size=2)), axis=(0, 1))
    x = np.clip(x + rng.uniform(0, 0.1, size=x.shape), 0, 1)
    return (x * 255).astype(np.uint8), y


def _templates(rng):
    t = np.zeros((10, 28, 28))
    for c in range(10):  # a silhouette of c + 1 rectangles: the classes differ in size and shape
        for _ in range(c + 1):
            top, left = rng.integers(2, 20, size=2)
            h, w = rng.integers(3, 7, size=2)
            t[c, top:top + h, left:left + w] = 1.0
    return t


def test_mixup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    templates = _templates(rng)
    (x_train, y_train), (x_test, y_test) = _fashion_like(704, rng, templates), _fashion_like(128, rng, templates)

    x_train = x_train.astype("float32") / 255.0
    x_train = np.reshape(x_train, (-1, 28, 28, 1))
    y_train = keras.ops.one_hot(y_train, 10)

    x_test = x_test.astype("float32") / 255.0
    x_test = np.reshape(x_test, (-1, 28, 28, 1))
    y_test = keras.ops.one_hot(y_test, 10)
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)

    AUTO = AUTOTUNE
    BATCH_SIZE = 64
    EPOCHS = 4

    # Put aside a few samples to create our validation set
    val_samples = 64
    x_val, y_val = x_train[:val_samples], y_train[:val_samples]
    new_x_train, new_y_train = x_train[val_samples:], y_train[val_samples:]

    train_ds_one = (
        Dataset.from_tensor_slices((new_x_train, new_y_train))
        .shuffle(BATCH_SIZE * 100)
        .batch(BATCH_SIZE)
    )
    train_ds_two = (
        Dataset.from_tensor_slices((new_x_train, new_y_train))
        .shuffle(BATCH_SIZE * 100)
        .batch(BATCH_SIZE)
    )
    # Because we will be mixing up the images and their corresponding labels, we will be
    # combining two shuffled datasets from the same training data.
    train_ds = Dataset.zip((train_ds_one, train_ds_two))

    val_ds = Dataset.from_tensor_slices((x_val, y_val)).batch(BATCH_SIZE)

    test_ds = Dataset.from_tensor_slices((x_test, y_test)).batch(BATCH_SIZE)

    def sample_beta_distribution(size, concentration_0=0.2, concentration_1=0.2):
        gamma_1_sample = keras.random.gamma(shape=[size], alpha=concentration_1)
        gamma_2_sample = keras.random.gamma(shape=[size], alpha=concentration_0)
        return gamma_1_sample / (gamma_1_sample + gamma_2_sample)

    def mix_up(ds_one, ds_two, alpha=0.2):
        # Unpack two datasets
        images_one, labels_one = ds_one
        images_two, labels_two = ds_two
        batch_size = keras.ops.shape(images_one)[0]

        # Sample lambda and reshape it to do the mixup
        l = sample_beta_distribution(batch_size, alpha, alpha)
        x_l = keras.ops.reshape(l, (batch_size, 1, 1, 1))
        y_l = keras.ops.reshape(l, (batch_size, 1))

        # Perform mixup on both images and labels by combining a pair of images/labels
        # (one from each dataset) into one image/label
        images = images_one * x_l + images_two * (1 - x_l)
        labels = labels_one * y_l + labels_two * (1 - y_l)
        return (images, labels)

    # First create the new dataset using our `mix_up` utility
    train_ds_mu = train_ds.map(
        lambda ds_one, ds_two: mix_up(ds_one, ds_two, alpha=0.2), num_parallel_calls=AUTO
    )

    # Let's preview 9 samples from the dataset
    sample_images, sample_labels = next(iter(train_ds_mu))
    sample_images, sample_labels = np.asarray(sample_images), np.asarray(sample_labels)
    assert sample_images.shape == (64, 28, 28, 1) and sample_labels.shape == (64, 10)
    np.testing.assert_allclose(sample_labels.sum(axis=1), 1.0, rtol=1e-5)
    lam = sample_labels.max(axis=1)  # the larger of lambda and 1 - lambda (two different classes), or 1
    assert np.all((lam >= 0.5 - 1e-6) & (lam <= 1.0 + 1e-6))
    assert np.sum(lam < 0.95) > 5  # Beta(0.2, 0.2) puts most mass near 0 and 1, some in between
    assert 0.0 <= sample_images.min() and sample_images.max() <= 1.0

    def get_training_model():
        model = keras.Sequential(
            [
                layers.Conv2D(16, (5, 5), activation="relu", input_shape=(28, 28, 1)),
                layers.MaxPooling2D(pool_size=(2, 2)),
                layers.Conv2D(32, (5, 5), activation="relu"),
                layers.MaxPooling2D(pool_size=(2, 2)),
                layers.Dropout(0.2),
                layers.GlobalAvgPool2D(),
                layers.Dense(128, activation="relu"),
                layers.Dense(10, activation="softmax"),
            ]
        )
        return model

    initial_model = get_training_model()
    initial_model.save_weights("initial_weights.weights.h5")

    ## 1. Train the model with the mixed up dataset
    model = get_training_model()
    model.load_weights("initial_weights.weights.h5")
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    hist_mu = model.fit(train_ds_mu, validation_data=val_ds, epochs=EPOCHS, verbose=0)
    _, test_acc_mu = model.evaluate(test_ds, verbose=0)
    print("Test accuracy: {:.2f}%".format(test_acc_mu * 100))

    ## 2. Train the model *without* the mixed up dataset
    model = get_training_model()
    model.load_weights("initial_weights.weights.h5")
    for mine, initial in zip(model.get_weights(), initial_model.get_weights()):
        np.testing.assert_array_equal(mine, initial)  # both trainings start from the saved weights
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    # Notice that we are NOT using the mixed up dataset here
    hist = model.fit(train_ds_one, validation_data=val_ds, epochs=EPOCHS, verbose=0)
    _, test_acc = model.evaluate(test_ds, verbose=0)
    print("Test accuracy: {:.2f}%".format(test_acc * 100))

    for h in (hist_mu, hist):
        losses = h.history["loss"]
        assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
        assert "val_accuracy" in h.history
    assert test_acc_mu > 0.35 and test_acc > 0.35  # chance is 0.1
    probs = model.predict(x_test[:8], verbose=0)
    assert probs.shape == (8, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
