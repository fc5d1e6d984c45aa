"""PixelCNN

Source: keras-io examples/generative/pixelcnn.py (the Keras 3 version: ``ops.shape(self.conv.kernel)``,
``ops.ceil(probs - keras.random.uniform(...))``)

Changes:
- Data: seeded NumPy stand-ins of MNIST's digits as uint8 images (a bar of random position and
  orientation, plus noise), binarised exactly as published (``np.where(data < 0.33 * 256, 0, 1)``),
  instead of ``keras.datasets.mnist``.
- Sizes: ``input_shape`` (8, 8, 1) instead of MNIST's (28, 28, 1) (the generation loop calls ``predict``
  once per pixel: 64 calls instead of 784), 64 images and 3 epochs instead of 70,000 and 50
  (``batch_size=128``, ``validation_split=0.1``, 5 residual blocks of 128 filters as published).
- The generated images are kept as arrays (times 255, as ``deprocess_image`` makes them) instead of
  written with ``keras.utils.save_img`` and shown with IPython (dnnbind has no image I/O); ``tqdm``'s
  progress bar over the rows is left out.
- The test also checks what the masks are for: an output pixel does not depend on the input pixels
  after it (nor on itself), and that the kernels stay masked through training.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "examples/generative/pixelcnn.py"
UNCHANGED = False
CHANGES = ("keras.utils.save_img and IPython's display of the generated images are left out (the arrays are "
           "checked instead): dnnbind has no image I/O")


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


# The first layer is the PixelCNN layer. This layer simply
# builds on the 2D convolutional layer, but includes masking.
class PixelConvLayer(layers.Layer):
    def __init__(self, mask_type, **kwargs):
        super().__init__()
        self.mask_type = mask_type
        self.conv = layers.Conv2D(**kwargs)

    def build(self, input_shape):
        # Build the conv2d layer to initialize kernel variables
        self.conv.build(input_shape)
        # Use the initialized kernel to create the mask
        kernel_shape = ops.shape(self.conv.kernel)
        self.mask = np.zeros(shape=kernel_shape)
        self.mask[: kernel_shape[0] // 2, ...] = 1.0
        self.mask[kernel_shape[0] // 2, : kernel_shape[1] // 2, ...] = 1.0
        if self.mask_type == "B":
            self.mask[kernel_shape[0] // 2, kernel_shape[1] // 2, ...] = 1.0

    def call(self, inputs):
        self.conv.kernel.assign(self.conv.kernel * self.mask)
        return self.conv(inputs)


# Next, we build our residual block layer.
# This is just a normal residual block, but based on the PixelConvLayer.
class ResidualBlock(keras.layers.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = keras.layers.Conv2D(
            filters=filters, kernel_size=1, activation="relu"
        )
        self.pixel_conv = PixelConvLayer(
            mask_type="B",
            filters=filters // 2,
            kernel_size=3,
            activation="relu",
            padding="same",
        )
        self.conv2 = keras.layers.Conv2D(
            filters=filters, kernel_size=1, activation="relu"
        )

    def call(self, inputs):
        x = self.conv1(inputs)
        x = self.pixel_conv(x)
        x = self.conv2(x)
        return keras.layers.add([inputs, x])


def deprocess_image(x):
    # Stack the single channeled black and white image to rgb values.
    x = np.stack((x, x, x), 2)
    # Undo preprocessing
    x *= 255.0
    # Convert to uint8 and clip to the valid range [0, 255]
    x = np.clip(x, 0, 255).astype("uint8")
    return x


def _strokes(n, size, rng):
    """Digit-like uint8 images: one bright bar (row or column, random position) on a dim noisy ground."""
    x = rng.uniform(0, 60, (n, size, size))
    for i in range(n):
        k = rng.integers(1, size - 1)
        if rng.random() < 0.5:
            x[i, k, 1:-1] = rng.uniform(150, 255)
        else:
            x[i, 1:-1, k] = rng.uniform(150, 255)
    return x.astype(np.uint8)


def test_pixelcnn():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)

    # Model / data parameters
    num_classes = 10
    input_shape = (8, 8, 1)
    n_residual_blocks = 5
    # The data, split between train and test sets
    x, y = _strokes(48, 8, rng), _strokes(16, 8, rng)
    # Concatenate all the images together
    data = np.concatenate((x, y), axis=0)
    # Round all pixel values less than 33% of the max 256 value to 0
    # anything above this value gets rounded up to 1 so that all values are either
    # 0 or 1
    data = np.where(data < (0.33 * 256), 0, 1)
    data = data.astype(np.float32)
    assert num_classes == 10 and set(np.unique(data)) == {0.0, 1.0}

    inputs = keras.Input(shape=input_shape)
    x = PixelConvLayer(
        mask_type="A", filters=128, kernel_size=7, activation="relu", padding="same"
    )(inputs)

    for _ in range(n_residual_blocks):
        x = ResidualBlock(filters=128)(x)

    for _ in range(2):
        x = PixelConvLayer(
            mask_type="B",
            filters=128,
            kernel_size=1,
            strides=1,
            activation="relu",
            padding="valid",
        )(x)

    out = keras.layers.Conv2D(
        filters=1, kernel_size=1, strides=1, activation="sigmoid", padding="valid"
    )(x)

    pixel_cnn = keras.Model(inputs, out)
    adam = keras.optimizers.Adam(learning_rate=0.0005)
    pixel_cnn.compile(optimizer=adam, loss="binary_crossentropy")

    pixel_cnn.summary()
    # the published summary (28x28 MNIST; the image size does not change the weights): 532,673 parameters
    assert pixel_cnn.count_params() == 532673
    first = pixel_cnn.layers[1]
    assert isinstance(first, PixelConvLayer) and first.mask.shape == (7, 7, 1, 128)
    # mask "A": the rows above the centre, and the centre row left of the centre; "B" adds the centre
    assert first.mask[:3].all() and first.mask[3, :3].all() and not first.mask[3, 3:].any() and not first.mask[4:].any()

    history = pixel_cnn.fit(
        x=data, y=data, batch_size=128, epochs=3, validation_split=0.1, verbose=0
    )
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss
    assert "val_loss" in history.history
    # the kernels stay masked: each call assigns kernel * mask before convolving
    np.testing.assert_array_equal(first.conv.kernel.numpy()[first.mask == 0], 0.0)

    # causality: an output pixel reads only the input pixels before it (raster order), not itself
    probe = data[:1, ..., None].copy()
    base = pixel_cnn.predict(probe, verbose=0)
    r, c = 4, 5
    probe[0, r, c, 0] = 1.0 - probe[0, r, c, 0]
    moved = np.abs(pixel_cnn.predict(probe, verbose=0) - base)[0, :, :, 0]
    before = np.zeros((8, 8), bool)
    before[:r] = True
    before[r, : c + 1] = True
    assert np.all(moved[before] < 1e-6) and moved[~before].max() > 0

    # Create an empty array of pixels.
    batch = 4
    pixels = np.zeros(shape=(batch,) + (pixel_cnn.input_shape)[1:])
    batch, rows, cols, channels = pixels.shape

    # Iterate over the pixels because generation has to be done sequentially pixel by pixel.
    for row in range(rows):
        for col in range(cols):
            for channel in range(channels):
                # Feed the whole array and retrieving the pixel value probabilities for the next
                # pixel.
                probs = pixel_cnn.predict(pixels, verbose=0)[:, row, col, channel]
                # Use the probabilities to pick pixel values and append the values to the image
                # frame.
                pixels[:, row, col, channel] = ops.ceil(
                    probs - keras.random.uniform(probs.shape)
                )

    assert set(np.unique(pixels)) <= {0.0, 1.0}
    images = [deprocess_image(np.squeeze(pic, -1)) for pic in pixels]
    assert all(img.shape == (8, 8, 3) and img.dtype == np.uint8 for img in images)
    assert set(np.unique(images)) <= {0, 255}
