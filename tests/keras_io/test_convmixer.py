"""Image classification with ConvMixer

Source: keras-io examples/vision/convmixer.py

Changes:
- Data: seeded NumPy stand-ins of CIFAR-10's layout (32x32x3 uint8 images, labels of shape (n, 1), 10
  classes) instead of ``keras.datasets.cifar10``: each class is a fixed random colour pattern (a coarse
  grid of class colours, upsampled), shifted by up to 2 pixels and noised. 128 training / 32 test images
  instead of 50,000/10,000 (``val_split = 0.1`` as published: 12 validation images).
- ``tf.data`` is replaced by its in-memory stand-in (``tf_data_standin.Dataset``, a
  ``keras.utils.PyDataset`` with ``from_tensor_slices``/``shuffle``/``batch``/``map``/``prefetch``): the
  pipeline lines are the published ones, ``data_augmentation`` runs on every training batch of every epoch.
- ``tfa.optimizers.AdamW`` (TensorFlow Addons) is ``keras.optimizers.AdamW``, as in the Keras 3 version.
- The checkpoint is ``checkpoint.weights.h5`` in pytest's temporary directory instead of
  ``/tmp/checkpoint`` (Keras 3 requires the ``.weights.h5`` suffix with ``save_weights_only=True``).
- Sizes: ``get_conv_mixer_256_8(filters=32, depth=2)`` instead of the defaults 256 and 8 (the NumPy
  backend's convolutions), batch size 32 instead of 128, 3 epochs instead of 10; ``verbose=0``.
- The filter plots (matplotlib) are replaced by checks of the weights they show: the patch embeddings
  (``layers[2]``, after the input and the Rescaling) and a 5x5 depthwise kernel found as the example
  finds it.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from tf_data_standin import AUTOTUNE, Dataset

SOURCE = "examples/vision/convmixer.py"
UNCHANGED = False
CHANGES = ("tf.data replaced by an in-memory stand-in (tf_data_standin.Dataset over keras.utils.PyDataset); "
           "tfa.optimizers.AdamW is keras.optimizers.AdamW; checkpoint as .weights.h5; a smaller ConvMixer "
           "(filters=32, depth=2) through the function's own arguments")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _cifar_like(n, rng, patterns):
    y = rng.integers(0, 10, size=(n, 1))
    x = np.empty((n, 32, 32, 3))
    for i in range(n):
        x[i] = np.roll(patterns[y[i, 0]], tuple(rng.integers(-2, 3, size=2)), axis=(0, 1))
    x = np.clip(x + rng.normal(0, 20, size=x.shape), 0, 255)
    return x.astype(np.uint8), y.astype(np.uint8)


def _patterns(rng):
    coarse = rng.uniform(0, 255, size=(10, 4, 4, 3))
    return np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)


def test_convmixer(tmp_path):
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    patterns = _patterns(rng)

    learning_rate = 0.001
    weight_decay = 0.0001
    batch_size = 32
    num_epochs = 3

    (x_train, y_train), (x_test, y_test) = _cifar_like(128, rng, patterns), _cifar_like(32, rng, patterns)
    val_split = 0.1

    val_indices = int(len(x_train) * val_split)
    new_x_train, new_y_train = x_train[val_indices:], y_train[val_indices:]
    x_val, y_val = x_train[:val_indices], y_train[:val_indices]

    print(f"Training data samples: {len(new_x_train)}")
    print(f"Validation data samples: {len(x_val)}")
    print(f"Test data samples: {len(x_test)}")

    image_size = 32
    auto = AUTOTUNE

    data_augmentation = keras.Sequential(
        [layers.RandomCrop(image_size, image_size), layers.RandomFlip("horizontal"),],
        name="data_augmentation",
    )

    def make_datasets(images, labels, is_train=False):
        dataset = Dataset.from_tensor_slices((images, labels))
        if is_train:
            dataset = dataset.shuffle(batch_size * 10)
        dataset = dataset.batch(batch_size)
        if is_train:
            dataset = dataset.map(
                lambda x, y: (data_augmentation(x), y), num_parallel_calls=auto
            )
        return dataset.prefetch(auto)

    train_dataset = make_datasets(new_x_train, new_y_train, is_train=True)
    val_dataset = make_datasets(x_val, y_val)
    test_dataset = make_datasets(x_test, y_test)

    # the training pipeline augments (RandomCrop at the full size is the identity; flips are whole images)
    images, _ = train_dataset[0]
    raw = new_x_train[train_dataset.order[:batch_size]].astype("float32")
    images = np.asarray(images)
    flipped = np.all(images == raw[:, :, ::-1], axis=(1, 2, 3))
    assert np.all(flipped | np.all(images == raw, axis=(1, 2, 3))) and 0 < flipped.sum() < batch_size

    def activation_block(x):
        x = layers.Activation("gelu")(x)
        return layers.BatchNormalization()(x)

    def conv_stem(x, filters: int, patch_size: int):
        x = layers.Conv2D(filters, kernel_size=patch_size, strides=patch_size)(x)
        return activation_block(x)

    def conv_mixer_block(x, filters: int, kernel_size: int):
        # Depthwise convolution.
        x0 = x
        x = layers.Conv2D(filters, kernel_size=kernel_size, groups=filters, padding="same")(
            x
        )
        x = layers.Add()([activation_block(x), x0])  # Residual.

        # Pointwise convolution.
        x = layers.Conv2D(filters, kernel_size=1)(x)
        x = activation_block(x)

        return x

    def get_conv_mixer_256_8(
        image_size=32, filters=256, depth=8, kernel_size=5, patch_size=2, num_classes=10
    ):
        """ConvMixer-256/8: https://openreview.net/pdf?id=TVHS5Y4dNvM.

        The hyperparameter values are taken from the paper.
        """
        inputs = keras.Input((image_size, image_size, 3))
        x = layers.Rescaling(scale=1.0 / 255)(inputs)

        # Extract patch embeddings.
        x = conv_stem(x, filters, patch_size)

        # ConvMixer blocks.
        for _ in range(depth):
            x = conv_mixer_block(x, filters, kernel_size)

        # Classification block.
        x = layers.GlobalAvgPool2D()(x)
        outputs = layers.Dense(num_classes, activation="softmax")(x)

        return keras.Model(inputs, outputs)

    def run_experiment(model):
        optimizer = keras.optimizers.AdamW(learning_rate=0.001, weight_decay=0.0001)

        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )

        checkpoint_filepath = str(tmp_path / "checkpoint.weights.h5")
        checkpoint_callback = keras.callbacks.ModelCheckpoint(
            checkpoint_filepath,
            monitor="val_accuracy",
            save_best_only=True,
            save_weights_only=True,
        )

        history = model.fit(
            train_dataset,
            validation_data=val_dataset,
            epochs=num_epochs,
            callbacks=[checkpoint_callback],
            verbose=0,
        )

        model.load_weights(checkpoint_filepath)
        _, accuracy = model.evaluate(test_dataset, verbose=0)
        print(f"Test accuracy: {round(accuracy * 100, 2)}%")

        return history, model

    conv_mixer_model = get_conv_mixer_256_8(filters=32, depth=2)
    history, conv_mixer_model = run_experiment(conv_mixer_model)

    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert (tmp_path / "checkpoint.weights.h5").exists()
    # in training mode (batch statistics) the model has learnt the classes; a few steps are too few for the
    # BatchNormalization moving averages (momentum 0.99) that evaluate uses, as in Keras
    assert history.history["accuracy"][-1] > 0.3  # chance is 0.1
    _, accuracy = conv_mixer_model.evaluate(test_dataset, verbose=0)
    assert 0.0 <= accuracy <= 1.0

    patch_embeddings = conv_mixer_model.layers[2].get_weights()[0]
    assert patch_embeddings.shape == (2, 2, 3, 32)
    p_min, p_max = patch_embeddings.min(), patch_embeddings.max()
    weights = (patch_embeddings - p_min) / (p_max - p_min)
    assert weights.min() == 0.0 and weights.max() == 1.0

    depthwise = []
    for i, layer in enumerate(conv_mixer_model.layers):
        if isinstance(layer, layers.Conv2D):
            if tuple(layer.get_config()["kernel_size"]) == (5, 5):
                print(i, layer)
                depthwise.append(i)
    assert len(depthwise) == 2  # one per block
    kernel = conv_mixer_model.layers[depthwise[0]].get_weights()[0]
    assert kernel.shape == (5, 5, 1, 32)  # groups=filters: one input channel per filter

    probs = conv_mixer_model.predict(x_test[:4], verbose=0)
    assert probs.shape == (4, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
