"""Image classification from scratch

Source: keras-io examples/vision/image_classification_from_scratch.py

Changes:
- Data: instead of the Kaggle Cats vs Dogs JPEGs (download, the JFIF filter and
  ``image_dataset_from_directory``), seeded in-memory float32 images of the same layout (RGB in [0, 255],
  labels 0 "cat" / 1 "dog") scaled down from 180x180 to 32x32 (the NumPy backend trains the
  2.8M-parameter model at about 0.07 s per 32x32 image-step): each image is noise plus a bright blob,
  warm-coloured for dogs and cool for cats. 40 images split 0.8/0.2 (``validation_split=0.2``,
  ``subset="both"``, ``seed=1337`` as published) instead of ~23,000.
- ``tf.data`` is replaced by its in-memory stand-in (``tf_data_standin.Dataset``, a
  ``keras.utils.PyDataset`` with the ``map``, ``prefetch`` and ``take`` the example calls):
  ``train_ds.map(...)`` applies ``data_augmentation`` to every batch of every epoch, as the published
  pipeline does (``tf.data.AUTOTUNE`` is the stand-in's ``AUTOTUNE``).
- Sizes: batch size 16 instead of 128, 2 epochs instead of 25; ``verbose=0``. The checkpoints
  (``save_at_{epoch}.keras``) are written in pytest's temporary directory.
- The plots (matplotlib) and ``keras.utils.plot_model`` are left out; the augmentation preview still runs
  ``data_augmentation`` on the first batch, and the test checks what it did.
- "Run inference on new data": ``load_img``/``img_to_array`` of a JPEG is replaced by one generated dog
  image; ``tf.expand_dims`` is ``keras.ops.expand_dims``.
- ``compile(..., jit_compile=True)`` is kept: on the NumPy backend steps run eagerly (with a warning).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from tf_data_standin import AUTOTUNE, Dataset

SOURCE = "examples/vision/image_classification_from_scratch.py"
UNCHANGED = False
CHANGES = ("the Cats vs Dogs JPEGs and image_dataset_from_directory are replaced by in-memory 32x32 images "
           "and a tf.data stand-in (tf_data_standin.Dataset over keras.utils.PyDataset); plots left out")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _cats_and_dogs(n, image_size, rng):
    labels = rng.integers(0, 2, size=n)
    h, w = image_size
    rows, cols = np.mgrid[0:h, 0:w]
    images = rng.uniform(0, 90, size=(n, h, w, 3))
    for i, label in enumerate(labels):
        cy, cx, r = rng.uniform(0.3 * h, 0.7 * h), rng.uniform(0.3 * w, 0.7 * w), rng.uniform(0.15, 0.3) * h
        blob = ((rows - cy) ** 2 + (cols - cx) ** 2 < r * r)[..., None]
        colour = np.array([230.0, 150.0, 60.0]) if label == 1 else np.array([60.0, 150.0, 230.0])
        images[i] = np.where(blob, colour + rng.uniform(-20, 20, size=3), images[i])
    return images.astype("float32"), labels.astype("int32")


def image_dataset_from_directory(n, validation_split, seed, image_size, batch_size):
    """The example's two datasets (``subset="both"``), from generated images."""
    images, labels = _cats_and_dogs(n, image_size, np.random.default_rng(seed))
    split = int(n * (1 - validation_split))
    return (Dataset.from_tensor_slices((images[:split], labels[:split])).shuffle(1000, seed=seed).batch(batch_size),
            Dataset.from_tensor_slices((images[split:], labels[split:])).batch(batch_size))


@pytest.mark.filterwarnings("ignore:.*jit_compile.*:UserWarning")
@pytest.mark.filterwarnings("ignore:save. the .keras file:UserWarning")
def test_image_classification_from_scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keras.utils.set_random_seed(1337)

    image_size = (32, 32)
    batch_size = 16

    train_ds, val_ds = image_dataset_from_directory(
        40,
        validation_split=0.2,
        seed=1337,
        image_size=image_size,
        batch_size=batch_size,
    )

    data_augmentation = keras.Sequential(
        [
            layers.RandomFlip("horizontal"),
            layers.RandomRotation(0.1),
        ]
    )

    for images, _ in train_ds.take(1):
        for i in range(9):
            augmented_images = data_augmentation(images)
            preview = np.asarray(augmented_images[0]).astype("uint8")
            assert preview.shape == (32, 32, 3)
    # called alone, the augmentation is active (Keras 3): flipped and rotated, not the batch as it was
    assert np.abs(np.asarray(augmented_images) - images).mean() > 5.0
    np.testing.assert_array_equal(np.asarray(data_augmentation(images, training=False)), images)

    train_ds = train_ds.prefetch(buffer_size=32)
    val_ds = val_ds.prefetch(buffer_size=32)

    def make_model(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)

        # Entry block
        x = layers.Rescaling(1.0 / 255)(inputs)
        x = layers.Conv2D(32, 3, strides=2, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)

        x = layers.Conv2D(64, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)

        previous_block_activation = x  # Set aside residual

        for size in [128, 256, 512, 728]:
            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization()(x)

            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization()(x)

            x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

            # Project residual
            residual = layers.Conv2D(size, 1, strides=2, padding="same")(
                previous_block_activation
            )
            x = layers.add([x, residual])  # Add back residual
            previous_block_activation = x  # Set aside next residual

        x = layers.SeparableConv2D(1024, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)

        x = layers.GlobalAveragePooling2D()(x)
        if num_classes == 2:
            activation = "sigmoid"
            units = 1
        else:
            activation = "softmax"
            units = num_classes

        x = layers.Dropout(0.5)(x)
        outputs = layers.Dense(units, activation=activation)(x)
        return keras.Model(inputs, outputs)

    model = make_model(input_shape=image_size + (3,), num_classes=2)
    assert model.output_shape == (None, 1)
    assert model.count_params() == 2_782_649  # Keras's count for this model at any image size

    # Apply `data_augmentation` to the training images.
    train_ds = train_ds.map(
        lambda img, label: (data_augmentation(img), label),
        num_parallel_calls=AUTOTUNE,
    )
    # Prefetching samples in GPU memory helps maximize GPU utilization.
    train_ds = train_ds.prefetch(AUTOTUNE)

    epochs = 2

    callbacks = [
        keras.callbacks.ModelCheckpoint("save_at_{epoch}.keras"),
    ]
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=["accuracy"],
        jit_compile=True,  # Enable XLA compilation for faster execution
    )
    history = model.fit(
        train_ds,
        epochs=epochs,
        callbacks=callbacks,
        validation_data=val_ds,
        verbose=0,
    )

    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert np.isfinite(history.history["val_loss"]).all() and "val_accuracy" in history.history
    assert (tmp_path / "save_at_1.keras").exists() and (tmp_path / "save_at_2.keras").exists()

    dogs, _ = _cats_and_dogs(4, image_size, np.random.default_rng(7))
    img_array = dogs[0]
    img_array = keras.ops.expand_dims(img_array, 0)  # Create batch axis

    predictions = model.predict(img_array, verbose=0)
    score = float(predictions[0][0])
    print(f"This image is {100 * (1 - score):.2f}% cat and {100 * score:.2f}% dog.")
    assert predictions.shape == (1, 1) and 0.0 <= score <= 1.0
    # inference is deterministic: augmentation and dropout are inactive in predict
    np.testing.assert_array_equal(model.predict(img_array, verbose=0), predictions)
