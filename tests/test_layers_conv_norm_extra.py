"""DepthwiseConv2D, SeparableConv2D, Conv1D, LayerNormalization, GlobalMaxPooling2D/1D,
GlobalAveragePooling1D and SpatialDropout2D on the NumPy backend: forward vs hand-written
references, Keras weight layouts, shapes, gradients (finite differences in float64), configs,
argument checks, and training inside a Sequential model."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dnnbind
from dnnbind import layers
from dnnbind.kernels._params import resolve_padding
from testutil import layer_grad_check, random, rel_error


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def depthwise_ref(x, k, b, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1)):
    """NHWC x, Keras depthwise kernel (kh, kw, C, dm): out channel c*dm+m = sum over the window of x[..c] k[.., c, m]."""
    x = np.pad(x, ((0, 0), (pad[0], pad[1]), (pad[2], pad[3]), (0, 0)))
    n, h, w, c = x.shape
    kh, kw, _, dm = k.shape
    oh = (h - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (w - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((n, oh, ow, c, dm))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i * dilation[0]:i * dilation[0] + (oh - 1) * stride[0] + 1:stride[0],
                      j * dilation[1]:j * dilation[1] + (ow - 1) * stride[1] + 1:stride[1], :]
            out += patch[..., None] * k[i, j]
    out = out.reshape(n, oh, ow, c * dm)
    return out + (0 if b is None else b)


def conv1d_ref(x, k, b, stride=1, pad=(0, 0), dilation=1):
    """(N, steps, C) x, Keras kernel (k, C, F)."""
    x = np.pad(x, ((0, 0), pad, (0, 0)))
    n, steps, _ = x.shape
    ks = k.shape[0]
    out_steps = (steps - (ks - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, out_steps, k.shape[2]))
    for t in range(out_steps):
        for i in range(ks):
            out[:, t] += x[:, t * stride + i * dilation] @ k[i]
    return out + (0 if b is None else b)


def nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


# ------------------------------------------------------------------------------ DepthwiseConv2D

@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("dm, strides, padding, dilation", [(1, 1, "valid", 1), (2, 2, "same", 1), (3, 1, "same", 2)])
def test_depthwise_forward_matches_reference_and_keras_layout(rng, data_format, dm, strides, padding, dilation):
    x_nhwc = random(rng, (2, 7, 6, 3)).astype(np.float32)
    layer = layers.DepthwiseConv2D((3, 2), strides=strides, padding=padding, depth_multiplier=dm,
                                   dilation_rate=dilation, data_format=data_format, bias_initializer="ones")
    x = x_nhwc if data_format == "channels_last" else nchw(x_nhwc)
    y = layer(x)
    k, b = layer.get_weights()
    assert k.shape == (3, 2, 3, dm) and b.shape == (3 * dm,)
    k = random(rng, k.shape)
    b = random(rng, b.shape)
    layer.set_weights([k, b])
    assert np.allclose(layer.get_weights()[0], k.astype(np.float32))
    pad = resolve_padding(padding, (7, 6), (3, 2), (strides, strides), (dilation, dilation))
    ref = depthwise_ref(x_nhwc.astype(np.float64), k, b, (strides, strides), pad, (dilation, dilation))
    y = layer(x)
    if data_format == "channels_first":
        ref = nchw(ref)
    assert y.shape == ref.shape == (2, *layer.compute_output_shape(x.shape[1:]))
    assert rel_error(y, ref) < 1e-5


def test_depthwise_gradients_and_config(rng):
    x = random(rng, (2, 5, 5, 2))
    layer = layers.DepthwiseConv2D(3, depth_multiplier=2, strides=2, padding="same", activation="tanh",
                                   dtype="float64")
    layer(x)
    layer_grad_check(layer, x)
    x = random(rng, (2, 2, 5, 4))
    layer = layers.DepthwiseConv2D(2, data_format="channels_first", use_bias=False, dtype="float64")
    layer(x)
    layer_grad_check(layer, x)
    config = layer.get_config()
    clone = layers.DepthwiseConv2D.from_config(config)
    assert clone.get_config() == config and json.dumps(config)
    assert config["depth_multiplier"] == 1 and "depthwise_initializer" in config and "filters" not in config


# ------------------------------------------------------------------------------ SeparableConv2D

@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_separable_forward_is_pointwise_of_depthwise(rng, data_format):
    x_nhwc = random(rng, (2, 6, 7, 3)).astype(np.float32)
    layer = layers.SeparableConv2D(4, 3, strides=(1, 2), padding="same", depth_multiplier=2, activation="relu",
                                   data_format=data_format)
    x = x_nhwc if data_format == "channels_last" else nchw(x_nhwc)
    layer(x)
    dk, pk, b = (random(rng, w.shape) for w in layer.weights)
    assert dk.shape == (3, 3, 3, 2) and pk.shape == (1, 1, 6, 4) and b.shape == (4,)
    assert [w.name for w in layer.weights] == ["depthwise_kernel", "pointwise_kernel", "bias"]
    layer.set_weights([dk, pk, b])
    pad = resolve_padding("same", (6, 7), (3, 3), (1, 2))
    mid = depthwise_ref(x_nhwc.astype(np.float64), dk, None, (1, 2), pad)
    ref = np.maximum(mid @ pk[0, 0] + b, 0)
    if data_format == "channels_first":
        ref = nchw(ref)
    y = layer(x)
    assert y.shape == ref.shape == (2, *layer.compute_output_shape(x.shape[1:]))
    assert rel_error(y, ref) < 1e-5


def test_separable_gradients_and_config(rng):
    x = random(rng, (2, 5, 4, 2))
    layer = layers.SeparableConv2D(3, (2, 3), depth_multiplier=2, padding="same", activation="sigmoid",
                                   dtype="float64")
    layer(x)
    layer_grad_check(layer, x)
    config = layer.get_config()
    assert config["filters"] == 3 and config["depth_multiplier"] == 2 and "groups" not in config
    assert "pointwise_initializer" in config and "kernel_initializer" not in config
    clone = layers.SeparableConv2D.from_config(config)
    assert clone.get_config() == config and json.dumps(config)
    frozen = layers.SeparableConv2D(3, 2, trainable=False, dtype="float64")
    frozen(x)
    frozen.forward(x, training=True)
    assert frozen.backward(np.ones((2, 4, 3, 3)), need_dx=False) is None and frozen.grads == {}


# ------------------------------------------------------------------------------ Conv1D

@pytest.mark.parametrize("padding, strides, dilation", [("valid", 1, 1), ("same", 2, 1), ("causal", 1, 2),
                                                        ("same", 1, 3)])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_conv1d_forward_matches_reference(rng, padding, strides, dilation, data_format):
    x_nwc = random(rng, (2, 11, 3)).astype(np.float32)
    layer = layers.Conv1D(4, 3, strides=strides, padding=padding, dilation_rate=dilation, data_format=data_format)
    x = x_nwc if data_format == "channels_last" else np.ascontiguousarray(x_nwc.transpose(0, 2, 1))
    layer(x)
    k, b = (random(rng, w.shape) for w in layer.weights)
    assert k.shape == (3, 3, 4)
    layer.set_weights([k, b])
    assert np.allclose(layer.get_weights()[0], k.astype(np.float32))
    if padding == "causal":
        pad = (dilation * 2, 0)
    else:
        pad = resolve_padding(padding, (11, 1), (3, 1), (strides, 1), (dilation, 1))[:2]
    ref = conv1d_ref(x_nwc.astype(np.float64), k, b, strides, pad, dilation)
    if data_format == "channels_first":
        ref = ref.transpose(0, 2, 1)
    y = layer(x)
    assert y.shape == ref.shape == (2, *layer.compute_output_shape(x.shape[1:]))
    assert rel_error(y, ref) < 1e-5


def test_conv1d_causal_output_does_not_see_the_future(rng):
    layer = layers.Conv1D(2, 4, padding="causal", dtype="float64")
    x = random(rng, (1, 9, 2))
    y = layer(x)
    x2 = x.copy()
    x2[:, 5:] += 1.0
    assert np.array_equal(layer(x2)[:, :5], y[:, :5]) and not np.allclose(layer(x2)[:, 5:], y[:, 5:])


def test_conv1d_gradients_groups_and_config(rng):
    x = random(rng, (2, 7, 4))
    layer = layers.Conv1D(6, 3, strides=2, padding="same", groups=2, activation="tanh", dtype="float64")
    layer(x)
    assert layer.get_weights()[0].shape == (3, 2, 6)
    layer_grad_check(layer, x)
    layer = layers.Conv1D(2, 2, padding="causal", dilation_rate=2, data_format="channels_first", dtype="float64")
    x = random(rng, (2, 3, 6))
    layer(x)
    layer_grad_check(layer, x)
    config = layer.get_config()
    assert config["kernel_size"] == [2] and config["dilation_rate"] == [2] and config["padding"] == "causal"
    clone = layers.Conv1D.from_config(config)
    assert clone.get_config() == config and json.dumps(config)


# ------------------------------------------------------------------------------ LayerNormalization

def layernorm_ref(x, gamma, beta, axes, eps=1e-3):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("axis", [-1, [1, 2, 3], [-2, -1]])
def test_layernorm_forward_matches_keras_formula(rng, axis):
    x = random(rng, (3, 4, 5, 6), low=-2, high=3).astype(np.float32)
    layer = layers.LayerNormalization(axis=axis)
    layer(x)
    rank_axes = tuple(a % 4 for a in ([axis] if isinstance(axis, int) else axis))
    pshape = tuple(x.shape[a] for a in sorted(rank_axes))
    gamma, beta = random(rng, pshape, low=0.5, high=1.5), random(rng, pshape)
    assert [w.shape for w in layer.weights] == [pshape, pshape] and layer.weights[0].name == "gamma"
    layer.set_weights([gamma, beta])
    y = layer(x)
    assert rel_error(y, layernorm_ref(x.astype(np.float64), gamma, beta, rank_axes)) < 1e-5
    assert layer.compute_output_shape((None, 4, 5, 6)) == (None, 4, 5, 6)


def test_layernorm_gradients_center_scale_and_config(rng):
    x = random(rng, (4, 3, 5))
    for kwargs in ({}, {"center": False}, {"scale": False}, {"axis": [-2, -1], "epsilon": 1e-2}):
        layer = layers.LayerNormalization(dtype="float64", **kwargs)
        layer.build(x.shape[1:])
        if layer.weights:
            layer.set_weights([random(rng, w.shape, low=0.5, high=1.5) for w in layer.weights])
        layer_grad_check(layer, x)
    layer = layers.LayerNormalization(center=False, scale=False)
    assert layer(x.astype(np.float32)).shape == x.shape and layer.weights == []
    config = layers.LayerNormalization(axis=[1, 2], epsilon=1e-5, center=False).get_config()
    assert config["axis"] == [1, 2] and config["epsilon"] == 1e-5 and config["rms_scaling"] is False
    assert layers.LayerNormalization.from_config(config).get_config() == config and json.dumps(config)


def test_layernorm_weights_stay_float32_under_mixed_precision(rng):
    layer = layers.LayerNormalization(dtype="mixed_bfloat16")
    y = layer(random(rng, (2, 8)).astype(np.float32), training=True)
    assert layer.gamma.value.dtype == np.float32 and y.dtype == np.float32  # NumPy computes bf16 in float32
    layer.backward(np.ones_like(y))
    assert layer.grads["gamma"].dtype == np.float32


def test_layernorm_refuses_what_it_cannot_do():
    with pytest.raises(NotImplementedError, match="only the trailing axes"):
        layers.LayerNormalization(axis=1).build((4, 5))
    with pytest.raises(NotImplementedError, match="never the batch axis"):
        layers.LayerNormalization(axis=[0, 1]).build((4,))
    with pytest.raises(ValueError, match="axis 3 is out of range for inputs of rank 2"):
        layers.LayerNormalization(axis=3).build((4,))
    with pytest.raises(NotImplementedError, match="rms_scaling=True is not supported"):
        layers.LayerNormalization(rms_scaling=True)
    ln = layers.LayerNormalization(gamma_regularizer="l2")  # supported now: the penalty joins the losses
    ln(np.ones((2, 3), np.float32))
    assert len(ln.losses) == 1 and ln.get_config()["gamma_regularizer"]["class_name"] == "L2"
    with pytest.raises(ValueError, match="LayerNormalization 'ln_bad': epsilon must be > 0"):
        layers.LayerNormalization(epsilon=0, name="ln_bad")
    with pytest.raises(TypeError, match="axis must be an int"):
        layers.LayerNormalization(axis=1.5)
    layer = layers.LayerNormalization(axis=1)
    with pytest.raises(NotImplementedError):
        layer(np.ones((2, 3, 4), np.float32))
    assert not layer.built and layer.weights == []


# ------------------------------------------------------------------------------ global pooling

@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_max_pooling_2d(rng, data_format, keepdims):
    x_nhwc = random(rng, (3, 5, 4, 6))
    x = x_nhwc if data_format == "channels_last" else nchw(x_nhwc)
    layer = layers.GlobalMaxPooling2D(data_format=data_format, keepdims=keepdims, dtype="float64")
    y = layer(x)
    ref = x_nhwc.max(axis=(1, 2))
    want = (3, 6) if not keepdims else ((3, 1, 1, 6) if data_format == "channels_last" else (3, 6, 1, 1))
    assert y.shape == want == (3, *layer.compute_output_shape(x.shape[1:]))
    assert np.array_equal(y.reshape(3, 6), ref)
    layer_grad_check(layer, x)


@pytest.mark.parametrize("cls, reduce", [(layers.GlobalMaxPooling1D, np.max), (layers.GlobalAveragePooling1D, np.mean)])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pooling_1d(rng, cls, reduce, data_format, keepdims):
    x_nwc = random(rng, (3, 7, 5))
    x = x_nwc if data_format == "channels_last" else np.ascontiguousarray(x_nwc.transpose(0, 2, 1))
    layer = cls(data_format=data_format, keepdims=keepdims, dtype="float64")
    y = layer(x)
    want = (3, 5) if not keepdims else ((3, 1, 5) if data_format == "channels_last" else (3, 5, 1))
    assert y.shape == want == (3, *layer.compute_output_shape(x.shape[1:]))
    assert rel_error(y.reshape(3, 5), reduce(x_nwc, axis=1)) < 1e-12
    layer_grad_check(layer, x)
    assert cls.from_config(layer.get_config()).get_config() == layer.get_config()


def test_global_max_pooling_gradient_goes_to_the_first_maximum():
    x = np.zeros((1, 3, 2), np.float64)
    x[0, 0, 1] = x[0, 2, 1] = 5.0  # a tie in channel 1
    x[0, 1, 0] = 1.0
    layer = layers.GlobalMaxPooling1D(dtype="float64")
    layer.forward(x, training=True)
    dx = layer.backward(np.array([[2.0, 3.0]]))
    assert np.array_equal(dx[0], [[0, 3], [2, 0], [0, 0]])


def test_global_pooling_shape_errors():
    with pytest.raises(ValueError, match="GlobalMaxPooling1D 'gm1' expects 3-d inputs"):
        layers.GlobalMaxPooling1D(name="gm1")(np.ones((2, 3, 4, 5), np.float32))
    with pytest.raises(ValueError, match="expects 4-d inputs"):
        layers.GlobalMaxPooling2D()(np.ones((2, 3, 4), np.float32))


# ------------------------------------------------------------------------------ SpatialDropout2D

@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_spatial_dropout_drops_whole_channels(rng, data_format):
    x = random(rng, (8, 4, 4, 16), low=0.5, high=1.5).astype(np.float32)
    if data_format == "channels_first":
        x = nchw(x)
    layer = layers.SpatialDropout2D(0.5, data_format=data_format, seed=7)
    assert np.array_equal(layer(x), x)  # inference: identity
    y = layer(x, training=True)
    ratio = y / x
    per_map = ratio.reshape(8, 16, 16) if data_format == "channels_first" else \
        ratio.transpose(0, 3, 1, 2).reshape(8, 16, 16)
    assert np.allclose(per_map, per_map[:, :, :1])  # one factor per (sample, channel)
    assert set(np.unique(np.round(per_map, 5))) <= {0.0, 2.0} and 0.3 < np.mean(per_map == 0) < 0.7
    dx = layer.backward(np.ones_like(y))
    assert np.allclose(dx, ratio)
    assert layer.compute_output_shape((None, *x.shape[1:])) == (None, *x.shape[1:])


def test_spatial_dropout_seeding_and_config():
    dnnbind.utils.set_random_seed(3)
    a = layers.SpatialDropout2D(0.3)
    dnnbind.utils.set_random_seed(3)
    b = layers.SpatialDropout2D(0.3)
    x = np.ones((4, 2, 2, 8), np.float32)
    assert np.array_equal(a(x, training=True), b(x, training=True))
    config = a.get_config()
    assert config["seed"] is None and config["rate"] == 0.3
    assert layers.SpatialDropout2D.from_config(config).get_config() == config
    with pytest.raises(ValueError, match="SpatialDropout2D 'sd': rate must be in \\[0, 1\\)"):
        layers.SpatialDropout2D(1.0, name="sd")
    with pytest.raises(ValueError, match="expects 4-d inputs"):
        layers.SpatialDropout2D(0.1)(np.ones((2, 3, 4), np.float32))


# ------------------------------------------------------------------------------ argument checks

def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="DepthwiseConv2D 'dw': depth_multiplier must be a positive int"):
        layers.DepthwiseConv2D(3, depth_multiplier=0, name="dw")
    with pytest.raises(ValueError, match="DepthwiseConv2D 'dw2': padding must be 'valid' or 'same'"):
        layers.DepthwiseConv2D(3, padding="full", name="dw2")
    dw = layers.DepthwiseConv2D(3, depthwise_regularizer="l2", depthwise_constraint="non_neg")
    dw(np.ones((1, 5, 5, 2), np.float32))
    assert dw.kernel.regularizer is not None and dw.kernel.constraint is not None
    with pytest.raises(TypeError, match="SeparableConv2D 'sep': filters must be an int"):
        layers.SeparableConv2D(2.5, 3, name="sep")
    with pytest.raises(ValueError, match="Conv1D 'c1': kernel_size must be an int or a tuple of one int"):
        layers.Conv1D(2, (3, 3), name="c1")
    with pytest.raises(ValueError, match="Conv1D: padding must be 'valid', 'same' or 'causal'"):
        layers.Conv1D(2, 3, padding="full")
    with pytest.raises(ValueError, match="Conv1D 'c2' expects 3-d inputs"):
        layers.Conv1D(2, 3, name="c2")(np.ones((2, 5, 5, 1), np.float32))
    with pytest.raises(ValueError, match="too small for kernel"):
        layers.Conv1D(2, 6)(np.ones((2, 5, 1), np.float32))


# ------------------------------------------------------------------------------ in a model

def test_sequential_model_with_the_new_layers_trains_and_round_trips(rng, tmp_path):
    dnnbind.utils.set_random_seed(0)
    x = rng.normal(size=(64, 8, 8, 3)).astype(np.float32)
    y = (x[:, :4].mean(axis=(1, 2, 3)) > x[:, 4:].mean(axis=(1, 2, 3))).astype(np.int64)

    def build():
        return dnnbind.Sequential([
            layers.SeparableConv2D(8, 3, padding="same", activation="relu", input_shape=(8, 8, 3)),
            layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
            layers.LayerNormalization(),
            layers.SpatialDropout2D(0.1, seed=1),
            layers.GlobalMaxPooling2D(),
            layers.Dense(2, activation="softmax"),
        ])

    model = build()
    model.compile(dnnbind.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    seq = rng.normal(size=(32, 12, 4)).astype(np.float32)
    model1d = dnnbind.Sequential([layers.Conv1D(6, 3, padding="causal", activation="relu", input_shape=(12, 4)),
                                  layers.LayerNormalization(), layers.GlobalAveragePooling1D(), layers.Dense(1)])
    model1d.compile("sgd", "mse")
    h1 = model1d.fit(seq, seq[:, :, 0].mean(axis=1, keepdims=True), batch_size=8, epochs=3, verbose=0)
    assert np.all(np.isfinite(h1.history["loss"]))
    path = tmp_path / "model.dnnbind"
    model.save(path)
    loaded = dnnbind.saving.load_model(path)
    assert rel_error(loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0)) < 1e-6
