"""RandomPosterization, RandomElasticTransform, AugMix, RandAugment and STFTSpectrogram on CUDA
(tests/test_layers_more_augmentation.py holds their Keras comparisons): the same results as the NumPy backend for a
given transformation, the same draws for a given seed (Philox on both backends), STFTSpectrogram's forward and
input gradient, and a captured training step that draws new augmentations at each replay."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import kernels, layers, ops
from dnnbind.autodiff import GradientTape

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)


def _host(t):
    return ops.convert_to_numpy(t).astype(np.float64)


def _images(shape, seed=0, high=255.0):
    return np.random.default_rng(seed).uniform(0, high, size=shape).astype(np.float32)


def _on(device, fn):
    dnnbind.set_default_device(device)
    return fn()


def _tensors(t):
    if isinstance(t, dict):
        return {k: _tensors(v) for k, v in t.items()}
    if isinstance(t, list):
        return [_tensors(v) for v in t]
    return ops.convert_to_tensor(t)


N, H, W = 2, 9, 8
GIVEN = [
    ("posterize", lambda: layers.RandomPosterization(6), {"shift_factor": np.array([5, 2], np.uint8)}),
    ("elastic", lambda: layers.RandomElasticTransform(scale=(0.7, 0.7)),
     {"apply_transform": np.array([True, False]), "distortion_factor": np.float32(0.7),
      "dx": np.random.default_rng(1).normal(size=(N, H, W)).astype(np.float32),
      "dy": np.random.default_rng(2).normal(size=(N, H, W)).astype(np.float32)}),
    ("elastic_constant_nearest", lambda: layers.RandomElasticTransform(scale=(1.0, 1.0), fill_mode="constant",
                                                                       interpolation="nearest"),
     {"apply_transform": np.array([True, True]), "distortion_factor": np.float32(1.0),
      "dx": np.random.default_rng(3).normal(size=(N, H, W)).astype(np.float32),
      "dy": np.random.default_rng(4).normal(size=(N, H, W)).astype(np.float32)}),
]


@pytest.mark.parametrize("name, make, transformation", GIVEN, ids=[c[0] for c in GIVEN])
def test_given_transformation_on_cuda_matches_numpy(name, make, transformation):
    x = _images((N, H, W, 3))

    def run():
        return _host(make().transform_images(ops.convert_to_tensor(x), _tensors(transformation), training=True))

    want, got = _on("cpu", run), _on("cuda", run)
    assert not np.allclose(want, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-3, err_msg=name)


SEEDED = [
    ("posterize", lambda: layers.RandomPosterization((2, 7), seed=1)),
    ("elastic", lambda: layers.RandomElasticTransform(factor=(1.0, 1.0), seed=2)),
    ("augmix", lambda: layers.AugMix(seed=3)),
    ("randaugment", lambda: layers.RandAugment(num_ops=3, seed=4)),
]


@pytest.mark.parametrize("name, make", SEEDED, ids=[c[0] for c in SEEDED])
def test_seeded_draws_match_numpy_and_stay_on_the_device(name, make):
    x = _images((4, H, W, 3), seed=5)

    def run():
        layer = make()
        a, b = layer(ops.convert_to_tensor(x)), layer(ops.convert_to_tensor(x))
        return _host(a), _host(b), layer.generator.device

    (ca, cb, _), (ga, gb, device) = _on("cpu", run), _on("cuda", run)
    assert device.is_cuda and not np.allclose(ga, gb)
    np.testing.assert_allclose(ga, ca, rtol=1e-5, atol=2e-2, err_msg=name)
    np.testing.assert_allclose(gb, cb, rtol=1e-5, atol=2e-2, err_msg=name)


@pytest.mark.parametrize("mode", ["log", "psd", "stft", "angle"])
def test_stft_spectrogram_on_cuda_matches_numpy_with_gradient(mode):
    x = np.random.default_rng(6).normal(size=(3, 96, 2)).astype(np.float32)

    def run():
        layer = layers.STFTSpectrogram(mode=mode, frame_length=16, frame_step=6)
        t = ops.convert_to_tensor(x)
        with GradientTape() as tape:
            tape.watch(t)
            y = layer(t)
            loss = ops.sum(ops.multiply(y, y))
        return _host(y), _host(tape.gradient(loss, t))

    cy, cg = _on("cpu", run)
    with kernels.config.override(allow_tf32=False):
        (gy, gg) = _on("cuda", run)
    np.testing.assert_allclose(gy, cy, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gg, cg, rtol=1e-3, atol=1e-3 * float(np.abs(cg).max()))


def test_captured_training_step_draws_new_augmentations_at_each_replay():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=64)
    x = rng.uniform(0, 80, size=(64, 10, 10, 3)).astype(np.float32)
    x[y == 1, 3:7, 3:7] += 150.0

    def fresh():
        return [layers.RandomPosterization(6, seed=1), layers.RandomElasticTransform(factor=0.5, seed=2),
                layers.RandAugment(num_ops=2, factor=0.3, seed=3)]

    # the counter advance of one call (the same shapes), on the NumPy backend
    dnnbind.set_default_device("cpu")
    per_call = []
    for layer in fresh():
        layer(ops.convert_to_tensor(x[:16]))
        per_call.append(int(np.asarray(ops.convert_to_numpy(layer.generator.counter))))
    dnnbind.set_default_device("cuda")
    augment = fresh()
    model = dnnbind.Sequential([dnnbind.Input((10, 10, 3)), *augment, layers.Rescaling(1 / 255.0),
                                layers.Conv2D(4, 3, activation="relu"), layers.Flatten(),
                                layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=dnnbind.optimizers.Adam(0.02), loss="binary_crossentropy")
    with kernels.config.override(allow_tf32=False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "could not be captured" fallback
        hist = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    stats = model._step_graphs.stats
    assert stats["failures"] == 0 and stats["replays"] >= 3 * 4 - 2, stats
    assert np.all(np.isfinite(hist.history["loss"]))
    for layer, advance in zip(augment, per_call):
        counter = int(np.asarray(layer.generator.counter.to_host()))
        assert advance > 0 and counter == 3 * 4 * advance, (layer.name, counter, advance)
    p1, p2 = model.predict(x, verbose=0), model.predict(x, verbose=0)
    np.testing.assert_array_equal(p1, p2)  # inference: no augmentation
