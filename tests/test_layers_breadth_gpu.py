"""The layers of issue 24 written in keras.ops (tests/test_layers_breadth.py) on CUDA: each layer's forward and the
gradients of its input and weights vs the float64 NumPy layer (float32 and bfloat16 policies); the noise layers'
training draws on the device (fresh noise each call); models of them trained with CUDA-graph replayed steps (no
capture fallback) matching the NumPy backend."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import layers, mixed_precision, ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import config
from gpu_errlog import BF16, check, quantize
from testutil import random, rel_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


POLICIES = [
    pytest.param("float32", "float32", np.dtype(np.float32), id="fp32"),
    pytest.param("bfloat16", "mixed_bfloat16", BF16, id="bf16"),
]
# convolution chains and normalisations: a few single-op tolerances in bfloat16
TOL = {"float32": 5e-5, "bfloat16": 5e-2}

# name, factory(dtype policy), input shape. Smooth activations only (a relu flipped by a rounding near 0 would
# move the gradient by more than the tolerance); no max pooling in bfloat16-sensitive ties (random inputs).
CASES = [
    ("conv3d", lambda dt: layers.Conv3D(4, 3, padding="same", dtype=dt), (2, 4, 5, 6, 3)),
    ("conv3d_cf_s2", lambda dt: layers.Conv3D(3, 2, strides=2, groups=1, data_format="channels_first",
                                               activation="tanh", dtype=dt), (2, 2, 5, 4, 6)),
    ("depthwise1d", lambda dt: layers.DepthwiseConv1D(3, depth_multiplier=2, padding="same", dtype=dt), (3, 9, 4)),
    ("separable1d", lambda dt: layers.SeparableConv1D(5, 3, strides=2, dtype=dt), (3, 11, 4)),
    ("prelu", lambda dt: layers.PReLU(alpha_initializer="ones", shared_axes=[1], dtype=dt), (3, 5, 6)),
    ("groupnorm", lambda dt: layers.GroupNormalization(4, dtype=dt), (3, 5, 4, 8)),
    ("unitnorm", lambda dt: layers.UnitNormalization(dtype=dt), (4, 7, 9)),
    ("avgpool1d", lambda dt: layers.AveragePooling1D(3, strides=2, padding="same", dtype=dt), (3, 10, 4)),
    ("avgpool3d", lambda dt: layers.AveragePooling3D(2, padding="same", dtype=dt), (2, 5, 4, 5, 3)),
    ("maxpool3d", lambda dt: layers.MaxPooling3D((2, 2, 1), dtype=dt), (2, 4, 4, 3, 3)),
    ("gap3d", lambda dt: layers.GlobalAveragePooling3D(dtype=dt), (2, 3, 4, 5, 6)),
    ("adaptive_avg2d", lambda dt: layers.AdaptiveAveragePooling2D((3, 2), dtype=dt), (2, 7, 5, 3)),
    ("zeropad3d", lambda dt: layers.ZeroPadding3D(((1, 0), 2, (0, 1)), dtype=dt), (2, 3, 2, 3, 2)),
    ("crop3d", lambda dt: layers.Cropping3D(1, dtype=dt), (2, 4, 5, 4, 2)),
    ("upsample3d", lambda dt: layers.UpSampling3D((1, 2, 3), dtype=dt), (2, 2, 3, 2, 2)),
    ("repeat", lambda dt: layers.RepeatVector(3, dtype=dt), (4, 6)),
    ("convlstm2d", lambda dt: layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True, dtype=dt),
     (2, 3, 5, 5, 2)),
    ("convlstm1d", lambda dt: layers.ConvLSTM1D(4, 2, strides=2, dtype=dt), (2, 4, 9, 3)),
]


def _as(t):
    return ops.convert_to_numpy(t).astype(np.float64)


def _run(make, policy, device, weights, x, r):
    dnnbind.set_default_device(device)
    layer = make(policy)
    xt = ops.convert_to_tensor(x.astype(np.float32))
    layer(xt)
    layer.set_weights(weights)
    with GradientTape() as tape:
        tape.watch(xt)
        loss = ops.sum(ops.multiply(ops.cast(layer(xt), "float32"), r.astype(np.float32)))
    grads = tape.gradient(loss, [xt] + list(layer.trainable_weights))
    return _as(layer(xt)), [_as(g) for g in grads]


@pytest.mark.parametrize("label, policy, cdt", POLICIES)
@pytest.mark.parametrize("name, make, shape", CASES, ids=[c[0] for c in CASES])
def test_layer_on_cuda_matches_float64_numpy(rng, label, policy, cdt, name, make, shape):
    x = quantize(random(rng, shape, low=-2, high=2), cdt)
    dnnbind.set_default_device("cpu")
    probe = make("float64")
    y = probe(x)
    weights = [quantize(random(rng, w.shape, low=0.5, high=1.5) if w.name == "gamma" else
                        random(rng, w.shape, low=-0.5, high=0.5), cdt) for w in probe.weights]
    r = quantize(random(rng, tuple(y.shape)), cdt)
    want_y, want_grads = _run(make, "float64", "cpu", weights, x, r)
    with config.override(allow_tf32=False):
        got_y, got_grads = _run(make, policy, "cuda", weights, x, r)
    tol = TOL[label]
    check(f"layer.{name}.forward", label, got_y, want_y, name, tol=tol)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        check(f"layer.{name}.grad{i}", label, g, w, name, tol=tol)


@pytest.mark.parametrize("make", [lambda: layers.GaussianNoise(0.5, seed=1), lambda: layers.GaussianDropout(0.3, seed=2),
                                  lambda: layers.AlphaDropout(0.2, seed=3), lambda: layers.SpatialDropout3D(0.4, seed=4)])
def test_noise_layers_draw_on_the_device(make):
    dnnbind.set_default_device("cuda")
    layer = make()
    x = ops.convert_to_tensor(np.random.default_rng(0).uniform(1, 2, size=(64, 4, 4, 4, 16)).astype(np.float32))
    assert np.array_equal(_as(layer(x)), _as(x))  # not training: the identity
    a, b = _as(layer(x, training=True)), _as(layer(x, training=True))
    assert a.shape == x.shape and np.isfinite(a).all() and not np.array_equal(a, b)
    assert layer.seed_generator.device.is_cuda  # the counter lives where the draws happen


def _volume_model(device, noise=False):
    dnnbind.set_default_device(device)
    init = dnnbind.initializers.GlorotUniform
    return dnnbind.Sequential([
        dnnbind.Input((4, 6, 6, 2)),
        layers.Conv3D(6, 3, padding="same", kernel_initializer=init(0)),
        layers.GroupNormalization(3),
        layers.PReLU(alpha_initializer="ones"),
        *([layers.GaussianNoise(0.05, seed=1), layers.SpatialDropout3D(0.1, seed=2)] if noise else []),
        layers.AveragePooling3D(2),
        layers.Reshape((2 * 3 * 3, 6)),
        layers.SeparableConv1D(8, 3, padding="same", depthwise_initializer=init(1), pointwise_initializer=init(2)),
        layers.UnitNormalization(),
        layers.GlobalAveragePooling1D(),
        layers.Dense(5, activation="softmax", kernel_initializer=init(3)),
    ])


def _fit_without_capture_fallback(model, x, y, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, **kwargs)
    fallbacks = [str(w.message) for w in caught if "captur" in str(w.message).lower()]
    assert not fallbacks, fallbacks
    return history


def test_graph_replayed_training_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 5, 64)
    cpu = _volume_model("cpu")
    gpu = _volume_model("cuda")
    gpu.set_weights(cpu.get_weights())
    with config.override(allow_tf32=False):
        for m in (cpu, gpu):
            m.compile(dnnbind.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
        hc = cpu.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        hg = _fit_without_capture_fallback(gpu, x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert np.allclose(hc.history["loss"], hg.history["loss"], rtol=1e-3)
    for a, b in zip(cpu.get_weights(), gpu.get_weights()):
        assert rel_error(b, a) < 1e-3


def test_graph_replayed_training_with_noise_layers():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(128, 4, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 5, 128)
    model = _volume_model("cuda", noise=True)
    model.compile(dnnbind.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    history = _fit_without_capture_fallback(model, x, y, batch_size=32, epochs=5, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_spectral_normalization_trains_on_cuda():
    dnnbind.set_default_device("cuda")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = x @ rng.normal(size=(6, 1)).astype(np.float32) * 0.3
    model = dnnbind.Sequential([dnnbind.Input((6,)), layers.SpectralNormalization(layers.Dense(8)),
                                layers.Activation("tanh"), layers.Dense(1)])
    model.compile(dnnbind.optimizers.Adam(1e-2), "mse")
    _fit_without_capture_fallback(model, x, y, batch_size=16, epochs=5, verbose=0)
    kernel = model.layers[0].layer.kernel.numpy()
    assert abs(np.linalg.svd(kernel)[1][0] - 1.0) < 0.05  # the kernel kept at unit spectral norm


AUGMENT = [
    ("autocontrast", lambda: layers.AutoContrast(), None),
    ("equalize", lambda: layers.Equalization(), None),
    ("erasing", lambda: layers.RandomErasing(fill_value=3.0),
     {"apply_erasing": np.array([True, False]), "batch_masks": np.random.default_rng(1).random((2, 6, 7, 3)) < 0.5,
      "fill_value": np.full((2, 6, 7, 3), 3.0, np.float32)}),
    ("solarize", lambda: layers.Solarization(0.5, 0.5),
     {"additions": np.array([10.0, 60.0], np.float32).reshape(2, 1, 1, 1),
      "thresholds": np.array([128.0, 40.0], np.float32).reshape(2, 1, 1, 1)}),
    ("invert", lambda: layers.RandomInvert(), {"apply_inversion": np.array([True, False])}),
    ("grayscale", lambda: layers.RandomGrayscale(), np.array([True, False]).reshape(2, 1, 1, 1)),
    ("degenerate", lambda: layers.RandomColorDegeneration(0.5),
     {"factor": np.array([0.3, -0.4], np.float32).reshape(2, 1, 1, 1)}),
    ("saturation", lambda: layers.RandomSaturation(0.5), {"factor": np.array([0.5, 2.0], np.float32)}),
    ("sharpness", lambda: layers.RandomSharpness(0.5), {"factor": np.array([0.1, 0.9], np.float32)}),
    ("hue", lambda: layers.RandomHue(0.5), {"factor": np.array([0.2, -0.3], np.float32)}),
    ("blur", lambda: layers.RandomGaussianBlur(kernel_size=5),
     {"should_apply_blur": np.array([True, False]), "blur_factor": np.array([0.7, 1.2], np.float32)}),
    ("shear", lambda: layers.RandomShear(0.3, 0.3), {"shear_factor": np.array([[0.2, -0.1], [-0.3, 0.15]], np.float32)}),
    ("perspective", lambda: layers.RandomPerspective(scale=0.5),
     {"apply_perspective": np.array([True, True]),
      "start_points": np.tile(np.array([[[0, 0], [6, 0], [0, 5], [6, 5]]], np.float32), (2, 1, 1)),
      "end_points": np.tile(np.array([[[0.5, 0], [6, 0.4], [0, 5], [5.5, 5]]], np.float32), (2, 1, 1))}),
]


@pytest.mark.parametrize("name, make, transformation", AUGMENT, ids=[c[0] for c in AUGMENT])
def test_augmentation_on_cuda_matches_numpy(name, make, transformation):
    x = np.random.default_rng(3).uniform(0, 255, size=(2, 6, 7, 3)).astype(np.float32)

    def run(device):
        dnnbind.set_default_device(device)
        t = transformation
        if isinstance(t, dict):
            t = {k: ops.convert_to_tensor(v) for k, v in t.items()}
        elif t is not None:
            t = ops.convert_to_tensor(t)
        return _as(make().transform_images(ops.convert_to_tensor(x), t, training=True))

    want = run("cpu")
    got = run("cuda")
    assert rel_error(got, want) < 1e-5, name
