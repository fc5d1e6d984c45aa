"""The image augmentation layers on a GPU: the same results as the NumPy backend for given
transformations, bitwise-equal random draws, and a training step holding them captured as a CUDA
graph whose replays draw new transformations (the seed generators' counters advance on the device)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import kernels, layers, ops
from dnnbind import random as R
from dnnbind.layers.image_preprocessing import rotation_matrix

pytestmark = pytest.mark.gpu


@pytest.fixture
def on():
    def run(device, fn):
        keras.set_default_device(device)
        try:
            return fn()
        finally:
            keras.set_default_device(None)
    return run


def _images(shape=(4, 7, 6, 3), seed=0):
    return np.random.default_rng(seed).uniform(0, 255, size=shape).astype(np.float32)


def _host(t):
    return np.asarray(t)


def test_fixed_transformations_match_the_cpu(on):
    x = _images()

    def apply():
        out = {}
        rot = layers.RandomRotation(0.1, fill_mode="reflect")
        out["rot"] = rot.transform_images(x, {"rotation_matrix": rotation_matrix(np.array([-20.0, 5.0, 33.0, 90.0],
                                                                                           np.float32), 7, 6)})
        zoom = layers.RandomZoom(0.2, fill_mode="wrap", interpolation="nearest")
        out["zoom"] = zoom.transform_images(x, {"height_zoom": np.array([[0.8], [1.2], [1.0], [0.7]], np.float32),
                                                "width_zoom": np.array([[1.1], [0.9], [1.3], [1.0]], np.float32)})
        crop = layers.RandomCrop(4, 3)
        top = ops.cast(ops.convert_to_tensor(np.float32(2.0)), "int32")
        out["crop"] = crop.transform_images(x, (top, ops.add(top, 1)))
        out["contrast"] = layers.RandomContrast(0.5).transform_images(
            x, {"contrast_factor": np.array([0.5, 1.2, 1.0, 1.4], np.float32).reshape(4, 1, 1, 1)})
        out["resize"] = layers.Resizing(5, 9, interpolation="bicubic")(x)
        out["center"] = layers.CenterCrop(9, 4)(x)
        return {k: _host(v) for k, v in out.items()}

    cpu, gpu = on("cpu", apply), on("cuda", apply)
    for key in cpu:
        np.testing.assert_allclose(gpu[key], cpu[key], rtol=1e-5, atol=2e-3, err_msg=key)


def test_random_draws_are_the_same_bits_on_both_backends(on):
    x = _images((16, 10, 9, 2))

    def draw():
        return [_host(layers.RandomFlip(seed=3)(x)), _host(layers.RandomCrop(6, 5, seed=4)(x)),
                _host(layers.RandomTranslation(0.2, 0.2, seed=5, interpolation="nearest")(x))]

    for a, b in zip(on("cpu", draw), on("cuda", draw)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-3)


def test_a_captured_training_step_draws_new_transformations_at_each_replay(on):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=64)
    x = rng.uniform(0, 0.3, size=(64, 10, 10, 1)).astype(np.float32)
    x[y == 1, 3:7, 3:7] += 0.7
    keras.set_default_device("cuda")
    try:
        keras.utils.set_random_seed(1)
        flip, shift, crop = layers.RandomFlip("horizontal"), layers.RandomTranslation(0.1, 0.1), layers.RandomCrop(8, 8)
        model = keras.Sequential([keras.Input((10, 10, 1)), flip, shift, crop,
                                  layers.Conv2D(4, 3, activation="relu"), layers.Flatten(),
                                  layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy")
        with kernels.config.override(allow_tf32=False), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no "could not be captured" fallback
            hist = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
        stats = model._step_graphs.stats
        assert stats["failures"] == 0 and stats["replays"] >= 3 * 4 - 2, stats
        assert np.all(np.isfinite(hist.history["loss"]))
        steps = 3 * 4
        # one draw per step for the flip, two (height, width) for the shift and the crop: every replay advanced them
        for layer, draws in ((flip, 1), (shift, 2), (crop, 2)):
            counter = int(np.asarray(layer.generator.counter.to_host()))
            assert counter == steps * draws * R.BLOCKS_PER_CALL, (layer.name, counter)
        p1, p2 = model.predict(x, verbose=0), model.predict(x, verbose=0)
        np.testing.assert_array_equal(p1, p2)
    finally:
        keras.set_default_device(None)
