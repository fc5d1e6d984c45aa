"""DepthwiseConv2D, SeparableConv2D, Conv1D, LayerNormalization, GlobalMaxPooling2D/1D,
GlobalAveragePooling1D and SpatialDropout2D on CUDA: each layer's forward and gradients vs the
float64 NumPy layer per dtype policy, and Sequential models of them trained with CUDA-graph
replayed steps (no capture fallback) matching the NumPy backend."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import layers, mixed_precision
from dnnbind.kernels import config
from gpu_errlog import BF16, check, dev, host, quantize
from testutil import random, rel_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


POLICIES = [
    pytest.param("float32", "float32", np.dtype(np.float32), id="fp32"),
    pytest.param("float16", "mixed_float16", np.dtype(np.float16), id="fp16"),
    pytest.param("bfloat16", "mixed_bfloat16", BF16, id="bf16"),
]

# name, factory(dtype policy), input shape (batch first). Smooth activations only: a relu flipped
# by a low-precision rounding near 0 would move the gradient by more than the tolerance.
LAYERS = [
    ("depthwise_nhwc", lambda dt: layers.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2,
                                                         activation="tanh", dtype=dt), (2, 9, 8, 3)),
    ("depthwise_nchw", lambda dt: layers.DepthwiseConv2D((3, 2), dilation_rate=2, data_format="channels_first",
                                                         dtype=dt), (2, 4, 9, 7)),
    ("separable_nhwc", lambda dt: layers.SeparableConv2D(5, 3, padding="same", depth_multiplier=2, dtype=dt),
     (2, 8, 8, 3)),
    ("separable_nchw", lambda dt: layers.SeparableConv2D(4, (2, 3), strides=2, padding="same",
                                                         data_format="channels_first", activation="sigmoid",
                                                         dtype=dt), (2, 3, 9, 9)),
    ("conv1d_causal", lambda dt: layers.Conv1D(6, 3, padding="causal", dilation_rate=2, dtype=dt), (3, 12, 4)),
    ("conv1d_nchw", lambda dt: layers.Conv1D(4, 3, strides=2, padding="same", groups=2,
                                             data_format="channels_first", dtype=dt), (3, 4, 11)),
    ("layernorm", lambda dt: layers.LayerNormalization(dtype=dt), (4, 5, 48)),
    ("layernorm_image", lambda dt: layers.LayerNormalization(axis=[1, 2, 3], center=False, dtype=dt), (3, 4, 4, 8)),
    ("global_max_2d", lambda dt: layers.GlobalMaxPooling2D(dtype=dt), (3, 5, 4, 6)),
    ("global_max_2d_nchw", lambda dt: layers.GlobalMaxPooling2D(data_format="channels_first", keepdims=True,
                                                                dtype=dt), (3, 6, 5, 4)),
    ("global_max_1d", lambda dt: layers.GlobalMaxPooling1D(dtype=dt), (3, 7, 5)),
    ("global_avg_1d", lambda dt: layers.GlobalAveragePooling1D(data_format="channels_first", dtype=dt), (3, 5, 7)),
]


def _input(rng, name, shape, dtype):
    if name.startswith("global_max"):
        # distinct values in every pooled window, exact in float16 and bfloat16: no ties to break
        n, rest = shape[0], shape[1:]
        channel_axis = 1 if "nchw" in name else len(shape) - 1
        c = shape[channel_axis]
        window = int(np.prod(rest)) // c
        ranks = np.argsort(rng.random((n, c, window)), axis=-1).astype(np.float64)
        vals = (ranks - window / 2 + 0.5) / 8.0
        spatial = tuple(d for i, d in enumerate(shape) if i not in (0, channel_axis))
        vals = vals.reshape(n, c, *spatial)
        return vals if channel_axis == 1 else np.moveaxis(vals, 1, -1).copy()
    return quantize(random(rng, shape, low=-2, high=2), dtype)


@pytest.mark.parametrize("label, policy, cdt", POLICIES)
@pytest.mark.parametrize("name, make, shape", LAYERS, ids=[c[0] for c in LAYERS])
def test_layer_on_cuda_matches_numpy(rng, label, policy, cdt, name, make, shape):
    dnnbind.set_default_device("cpu")
    ref = make("float64")
    ref.build(shape[1:])
    weights = [quantize(random(rng, w.shape, low=0.5, high=1.5) if w.name == "gamma" else random(rng, w.shape), cdt)
               for w in ref.weights]
    ref.set_weights(weights)
    x = _input(rng, name, shape, cdt)
    y_ref = ref.forward(x, training=True)
    dy = quantize(random(rng, y_ref.shape), cdt)
    dx_ref = ref.backward(dy)
    grads_ref = {k: np.asarray(v) for k, v in ref.grads.items()}

    dnnbind.set_default_device("cuda")
    layer = make(policy)
    layer.build(shape[1:])
    layer.set_weights(weights)
    with config.override(allow_tf32=False):
        y = layer.forward(dev(x, cdt), training=True)
        assert y.dtype == cdt and tuple(y.shape) == y_ref.shape
        dx = layer.backward(dev(dy, cdt))
    check(f"layer.{name}.forward", label, y, y_ref, name)
    check(f"layer.{name}.dx", label, dx, dx_ref, name)
    assert set(layer.grads) == set(grads_ref)
    for key, g in grads_ref.items():
        assert layer.grads[key].dtype == np.float32  # the variable dtype
        check(f"layer.{name}.d{key}", label, layer.grads[key], g, name)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_spatial_dropout_layer_on_cuda(rng, data_format):
    dnnbind.set_default_device("cuda")
    shape = (16, 4, 4, 32) if data_format == "channels_last" else (16, 32, 4, 4)
    x = random(rng, shape, low=0.5, high=1.5).astype(np.float32)
    layer = layers.SpatialDropout2D(0.5, data_format=data_format, seed=3)
    xd = dev(x)
    assert layer(xd).data is xd  # inference: identity (the same memory, as a tensor)
    y = np.asarray(layer(xd, training=True))
    ratio = y / x
    per_map = ratio if data_format == "channels_first" else ratio.transpose(0, 3, 1, 2)
    per_map = per_map.reshape(16, 32, 16)
    assert np.allclose(per_map, per_map[:, :, :1]) and 0.35 < np.mean(per_map[:, :, 0] == 0) < 0.65
    dx = host(layer.backward(dev(np.ones_like(x))))
    assert np.allclose(dx, ratio)


def _image_model(device, seed=0, dropout=False):
    dnnbind.set_default_device(device)
    init = dnnbind.initializers.GlorotUniform
    return dnnbind.Sequential([
        layers.SeparableConv2D(8, 3, padding="same", activation="relu", depthwise_initializer=init(seed),
                               pointwise_initializer=init(seed + 1), input_shape=(8, 8, 3)),
        layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", depthwise_initializer=init(seed + 2)),
        layers.LayerNormalization(),
        *([layers.SpatialDropout2D(0.2, seed=1)] if dropout else []),
        layers.GlobalMaxPooling2D(),
        layers.Dense(5, activation="softmax", kernel_initializer=init(seed + 3)),
    ])


def _sequence_model(device, seed=0):
    dnnbind.set_default_device(device)
    init = dnnbind.initializers.GlorotUniform
    return dnnbind.Sequential([
        layers.Conv1D(8, 3, padding="causal", activation="tanh", kernel_initializer=init(seed), input_shape=(12, 4)),
        layers.LayerNormalization(),
        layers.GlobalMaxPooling1D(),
        layers.Dense(5, activation="softmax", kernel_initializer=init(seed + 1)),
    ])


def _fit_without_capture_fallback(model, x, y, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, **kwargs)
    fallbacks = [str(w.message) for w in caught if "captur" in str(w.message).lower()]
    assert not fallbacks, fallbacks
    return history


@pytest.mark.parametrize("make, x_shape", [(_image_model, (64, 8, 8, 3)), (_sequence_model, (64, 12, 4))])
def test_graph_replayed_training_matches_numpy(make, x_shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=x_shape).astype(np.float32)
    y = rng.integers(0, 5, x_shape[0])
    cpu = make("cpu")
    gpu = make("cuda")
    gpu.set_weights(cpu.get_weights())
    with config.override(allow_tf32=False):
        for m in (cpu, gpu):
            m.compile(dnnbind.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
        hc = cpu.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        hg = _fit_without_capture_fallback(gpu, x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert np.allclose(hc.history["loss"], hg.history["loss"], rtol=1e-3)
    for a, b in zip(cpu.get_weights(), gpu.get_weights()):
        assert rel_error(b, a) < 1e-3
    assert rel_error(gpu.predict(x, verbose=0), cpu.predict(x, verbose=0)) < 1e-3


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_graph_replayed_training_with_spatial_dropout(policy):
    mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(128, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, 128)
    model = _image_model("cuda", dropout=True)
    model.compile(dnnbind.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    history = _fit_without_capture_fallback(model, x, y, batch_size=32, epochs=5, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < history.history["loss"][0]
