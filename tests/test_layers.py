"""Layers on the NumPy backend: forward vs hand-written NumPy references, Keras weight layouts,
shape inference, gradients (finite differences in float64), configs."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import initializers, layers
from testutil import layer_grad_check, numerical_grad, rel_error


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def conv_ref(x, k, b, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """NHWC input, Keras kernel (kh, kw, cin/g, cout): a direct loop reference."""
    x = np.pad(x, ((0, 0), (pad[0], pad[1]), (pad[2], pad[3]), (0, 0)))
    n, h, w, c = x.shape
    kh, kw, cg, cout = k.shape
    oh = (h - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (w - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((n, oh, ow, cout))
    og = cout // groups
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride[0]: i * stride[0] + (kh - 1) * dilation[0] + 1: dilation[0],
                      j * stride[1]: j * stride[1] + (kw - 1) * dilation[1] + 1: dilation[1], :]
            for g in range(groups):
                pg = patch[..., g * cg:(g + 1) * cg]
                out[:, i, j, g * og:(g + 1) * og] = np.tensordot(pg, k[..., g * og:(g + 1) * og],
                                                                 axes=([1, 2, 3], [0, 1, 2]))
    return out + (0 if b is None else b)


def test_auto_names_are_unique_and_keras_like():
    a, b = layers.Dense(2), layers.Dense(2)
    assert a.name.startswith("dense") and b.name.startswith("dense") and a.name != b.name
    assert layers.BatchNormalization().name.startswith("batch_normalization")


def test_dense_forward_and_layout(rng):
    layer = layers.Dense(3, activation="relu")
    x = rng.normal(size=(4, 5)).astype(np.float32)
    y = layer(x)
    kernel, bias = layer.get_weights()
    assert kernel.shape == (5, 3) and bias.shape == (3,)
    assert rel_error(y, np.maximum(x @ kernel + bias, 0)) < 1e-6
    new_k = rng.normal(size=(5, 3)).astype(np.float32)
    new_b = rng.normal(size=(3,)).astype(np.float32)
    layer.set_weights([new_k, new_b])
    assert rel_error(layer(x), np.maximum(x @ new_k + new_b, 0)) < 1e-6
    assert layer.count_params() == 18


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("padding,strides,groups", [("valid", 1, 1), ("same", 2, 1), ("same", 1, 2)])
def test_conv2d_forward_matches_reference(rng, data_format, padding, strides, groups):
    layer = layers.Conv2D(4, (3, 2), strides=strides, padding=padding, groups=groups, data_format=data_format)
    x_nhwc = rng.normal(size=(2, 7, 6, 4)).astype(np.float32)
    x = x_nhwc if data_format == "channels_last" else x_nhwc.transpose(0, 3, 1, 2)
    y = layer(x)
    k, b = layer.get_weights()
    assert k.shape == (3, 2, 4 // groups, 4)
    from dnnbind.kernels._params import resolve_padding

    s = (strides, strides)
    pad = resolve_padding(padding, (7, 6), (3, 2), s)
    ref = conv_ref(x_nhwc.astype(np.float64), k, b, stride=s, pad=pad, groups=groups)
    if data_format == "channels_first":
        ref = ref.transpose(0, 3, 1, 2)
    assert y.shape == ref.shape
    assert rel_error(y, ref) < 1e-5


def test_conv2d_same_stride2_shape_inference():
    layer = layers.Conv2D(5, 3, strides=2, padding="same")
    assert layer.compute_output_shape((None, 7, 7, 3)) == (None, 4, 4, 5)
    assert layer.compute_output_shape((8, 8, 3)) == (4, 4, 5)
    assert layers.Conv2D(5, 3).compute_output_shape((28, 28, 1)) == (26, 26, 5)
    assert layers.MaxPooling2D(3, strides=2, padding="same").compute_output_shape((7, 7, 2)) == (4, 4, 2)
    assert layers.Conv2D(2, 3, data_format="channels_first").compute_output_shape((1, 10, 9)) == (2, 8, 7)


def test_conv2d_dilation(rng):
    layer = layers.Conv2D(2, 3, dilation_rate=2)
    x = rng.normal(size=(1, 9, 9, 3)).astype(np.float32)
    y = layer(x)
    k, b = layer.get_weights()
    assert rel_error(y, conv_ref(x.astype(np.float64), k, b, dilation=(2, 2))) < 1e-5


def pool_ref(x, size, stride, mode):
    n, h, w, c = x.shape
    oh, ow = (h - size) // stride + 1, (w - size) // stride + 1
    out = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            win = x[:, i * stride:i * stride + size, j * stride:j * stride + size, :]
            out[:, i, j] = win.max(axis=(1, 2)) if mode == "max" else win.mean(axis=(1, 2))
    return out


def test_pooling_layers(rng):
    x = rng.normal(size=(2, 6, 6, 3)).astype(np.float32)
    assert rel_error(layers.MaxPooling2D()(x), pool_ref(x, 2, 2, "max")) < 1e-6
    assert rel_error(layers.AvgPool2D(3, strides=1)(x), pool_ref(x, 3, 1, "avg")) < 1e-6
    assert layers.MaxPool2D is layers.MaxPooling2D
    # "same" average pooling excludes the padding from the count (Keras)
    x2 = np.ones((1, 3, 3, 1), np.float32)
    assert np.allclose(layers.AveragePooling2D(2, strides=2, padding="same")(x2), 1.0)
    g = layers.GlobalAveragePooling2D()(x)
    assert g.shape == (2, 3) and rel_error(g, x.mean(axis=(1, 2))) < 1e-6
    gk = layers.GlobalAveragePooling2D(keepdims=True)(x)
    assert gk.shape == (2, 1, 1, 3)


def test_batchnorm_training_inference_and_layout(rng):
    bn = layers.BatchNormalization(momentum=0.9, epsilon=1e-3)
    x = rng.normal(2.0, 3.0, size=(8, 4, 4, 3)).astype(np.float32)
    y = bn(x, training=True)
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    assert rel_error(y, (x - mean) / np.sqrt(var + 1e-3)) < 1e-5
    gamma, beta, mm, mv = bn.get_weights()
    assert [w.name for w in bn.weights] == ["gamma", "beta", "moving_mean", "moving_variance"]
    assert len(bn.trainable_weights) == 2 and len(bn.non_trainable_weights) == 2
    assert rel_error(mm, 0.1 * mean) < 1e-5
    assert rel_error(mv, 0.9 + 0.1 * var) < 1e-5  # the biased batch variance, as Keras 3
    gamma2 = rng.uniform(0.5, 2, 3).astype(np.float32)
    bn.set_weights([gamma2, beta + 1, mm, mv])
    y_inf = bn(x, training=False)
    assert rel_error(y_inf, gamma2 * (x - mm) / np.sqrt(mv + 1e-3) + beta + 1) < 1e-5


def test_batchnorm_2d_and_channels_first(rng):
    x = rng.normal(size=(16, 5)).astype(np.float32)
    y = layers.BatchNormalization()(x, training=True)
    assert rel_error(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-3)) < 1e-5
    xc = rng.normal(size=(4, 3, 5, 5)).astype(np.float32)
    yc = layers.BatchNormalization(axis=1)(xc, training=True)
    ref = (xc - xc.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(xc.var(axis=(0, 2, 3), keepdims=True) + 1e-3)
    assert rel_error(yc, ref) < 1e-5
    with pytest.raises(NotImplementedError, match="axis=2"):
        layers.BatchNormalization(axis=2)(xc)


def test_batchnorm_on_sequences_and_volumes(rng):
    """Conv1D's (batch, steps, channels) and other ranks: the per-channel statistics of Keras (computed as
    4-d); values, moving statistics, inference and the gradients, channels last and first."""
    for shape, axis in [((6, 7, 3), -1), ((6, 3, 7), 1), ((3, 4, 2, 3, 2), -1)]:
        x = rng.normal(1.0, 2.0, size=shape)
        bn = layers.BatchNormalization(axis=axis, momentum=0.5, dtype="float64")
        bn.build(shape[1:])
        gamma, beta = rng.uniform(0.5, 2, shape[axis]), rng.normal(size=shape[axis])
        bn.set_weights([gamma, beta, np.zeros(shape[axis]), np.ones(shape[axis])])
        red = tuple(i for i in range(len(shape)) if i != axis % len(shape))
        keep = [1 if i in red else shape[i] for i in range(len(shape))]
        xhat = (x - x.mean(axis=red, keepdims=True)) / np.sqrt(x.var(axis=red, keepdims=True) + 1e-3)
        y = bn.forward(x, training=True)
        assert y.shape == shape and rel_error(y, gamma.reshape(keep) * xhat + beta.reshape(keep)) < 1e-6
        assert rel_error(bn.get_weights()[2], 0.5 * x.mean(axis=red)) < 1e-6
        r = rng.normal(size=shape)
        dx = bn.backward(r)

        def f():
            xh = (x - x.mean(axis=red, keepdims=True)) / np.sqrt(x.var(axis=red, keepdims=True) + 1e-3)
            return float(((bn.gamma.value.reshape(keep) * xh) * r).sum())

        assert dx.shape == shape and rel_error(dx, numerical_grad(f, x)) < 1e-6
        assert rel_error(np.array(bn.grads["gamma"]), (r * xhat).sum(axis=red)) < 1e-5
        _, _, mm, mv = bn.get_weights()
        y_inf = bn.forward(x, training=False)
        assert rel_error(y_inf, gamma.reshape(keep) * (x - mm.reshape(keep)) / np.sqrt(mv.reshape(keep) + 1e-3)
                         + beta.reshape(keep)) < 1e-6
        assert rel_error(bn.backward(r), r * (gamma / np.sqrt(mv + 1e-3)).reshape(keep)) < 1e-6
    # in a model (Sequential's BN+ReLU fusion schedule passes it by), through the trainer
    import dnnbind as keras

    model = keras.Sequential([keras.Input((8, 2)), layers.Conv1D(4, 3), layers.BatchNormalization(), layers.ReLU(),
                              layers.GlobalAveragePooling1D(), layers.Dense(1)])
    model.compile("adam", "mse")
    xs = rng.normal(size=(16, 8, 2)).astype(np.float32)
    h = model.fit(xs, xs.sum(axis=(1, 2))[:, None], epochs=4, verbose=0)
    assert np.all(np.isfinite(h.history["loss"])) and h.history["loss"][-1] < h.history["loss"][0]


def test_frozen_batchnorm_runs_in_inference_mode(rng):
    bn = layers.BatchNormalization(dtype="float64")
    bn.build((3,))
    bn.set_weights([np.array([1.0, 2.0, 3.0]), np.zeros(3), np.array([1.0, -1.0, 0.5]), np.array([4.0, 1.0, 9.0])])
    bn.trainable = False
    assert bn.trainable_weights == [] and len(bn.non_trainable_weights) == 4
    x = rng.normal(size=(5, 3))
    y = bn.forward(x, training=True)
    scale = np.array([1.0, 2.0, 3.0]) / np.sqrt(np.array([4.0, 1.0, 9.0]) + 1e-3)
    assert rel_error(y, (x - np.array([1.0, -1.0, 0.5])) * scale) < 1e-6
    dy = rng.normal(size=(5, 3))
    assert rel_error(bn.backward(dy), dy * scale) < 1e-6
    assert bn.get_weights()[2].tolist() == [1.0, -1.0, 0.5]  # statistics untouched


def test_flatten_keeps_data_order(rng):
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    assert np.array_equal(layers.Flatten()(x), x.reshape(2, -1))
    assert np.array_equal(layers.Flatten(data_format="channels_first")(x), x.reshape(2, -1))


def test_dropout(rng):
    x = rng.uniform(1, 2, size=(200, 50)).astype(np.float32)
    d = layers.Dropout(0.4, seed=3)
    assert np.array_equal(d(x), x)
    y = d(x, training=True)
    kept = y != 0
    assert 0.5 < kept.mean() < 0.7
    assert np.allclose(y[kept], x[kept] / 0.6, rtol=1e-6)
    dx = d.backward(np.ones_like(x))
    assert np.array_equal(dx != 0, kept)


@pytest.mark.parametrize("name,ref", [
    ("relu", lambda x: np.maximum(x, 0)),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", np.tanh),
    ("softplus", lambda x: np.log1p(np.exp(x))),
    ("swish", lambda x: x / (1 + np.exp(-x))),
    ("silu", lambda x: x / (1 + np.exp(-x))),
    ("elu", lambda x: np.where(x > 0, x, np.expm1(x))),
    ("leaky_relu", lambda x: np.where(x > 0, x, 0.2 * x)),
    ("linear", lambda x: x),
    ("softmax", lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
])
def test_activations(rng, name, ref):
    x = rng.normal(size=(3, 6)).astype(np.float32)
    assert rel_error(layers.Activation(name)(x), ref(x.astype(np.float64))) < 1e-5


def test_activation_layers(rng):
    x = rng.normal(size=(3, 6)).astype(np.float32) * 5
    assert rel_error(layers.ReLU()(x), np.maximum(x, 0)) < 1e-6
    assert rel_error(layers.ReLU(max_value=6.0)(x), np.clip(x, 0, 6)) < 1e-6
    assert rel_error(layers.LeakyReLU()(x), np.where(x > 0, x, 0.3 * x)) < 1e-6
    sm = layers.Softmax()(x)
    assert np.allclose(sm.sum(-1), 1, atol=1e-6)
    with pytest.raises(ValueError, match="unknown activation 'nope'"):
        layers.Dense(2, activation="nope")


def test_gradients_dense_conv_pool(rng):
    x = rng.normal(size=(3, 4)).astype(np.float64)
    d = layers.Dense(3, activation="tanh", dtype="float64")
    d(x)
    layer_grad_check(d, x)
    xc = rng.normal(size=(2, 5, 5, 2))
    c = layers.Conv2D(3, 3, strides=2, padding="same", activation="sigmoid", dtype="float64")
    c(xc)
    layer_grad_check(c, xc)
    p = layers.AveragePooling2D(2, dtype="float64")
    p(xc)
    layer_grad_check(p, xc)


def test_gradient_batchnorm(rng):
    x = rng.normal(size=(6, 3, 3, 2))
    bn = layers.BatchNormalization(dtype="float64")
    bn.build((3, 3, 2))
    bn.set_weights([rng.uniform(0.5, 2, 2), rng.normal(size=2), np.zeros(2), np.ones(2)])
    y = bn.forward(x, training=True)
    r = rng.normal(size=y.shape)
    dx = bn.backward(r)
    dgamma = np.array(bn.grads["gamma"])

    def f():
        xm = x - x.mean(axis=(0, 1, 2))
        g = bn.gamma.value
        return float(((g * xm / np.sqrt(x.var(axis=(0, 1, 2)) + 1e-3) + bn.beta.value) * r).sum())

    assert rel_error(dx, numerical_grad(f, x)) < 1e-6
    # gamma is float32 (BN parameters always are): compare with the closed form instead
    xhat = (x - x.mean(axis=(0, 1, 2))) / np.sqrt(x.var(axis=(0, 1, 2)) + 1e-3)
    assert rel_error(dgamma, (r * xhat).sum(axis=(0, 1, 2))) < 1e-5
    assert rel_error(np.array(bn.grads["beta"]), r.sum(axis=(0, 1, 2))) < 1e-5


def test_set_weights_errors_name_the_layer(rng):
    layer = layers.Conv2D(4, 3, name="myconv")
    layer.build((8, 8, 2))
    with pytest.raises(ValueError, match="myconv.*kernel.*expects shape \\(3, 3, 2, 4\\)"):
        layer.set_weights([np.zeros((4, 2, 3, 3)), np.zeros(4)])
    with pytest.raises(ValueError, match="myconv.*expects 2 weight arrays"):
        layer.set_weights([np.zeros((3, 3, 2, 4))])


def test_input_shape_mismatch_on_a_built_layer(rng):
    layer = layers.Dense(2, name="d_in")
    layer(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="d_in.*\\(batch, 3\\).*\\(batch, 4\\)"):
        layer(np.zeros((1, 4), np.float32))


def test_config_round_trip():
    for layer in [layers.Conv2D(8, 3, strides=2, padding="same", activation="relu", kernel_initializer="he_normal"),
                  layers.Dense(4, use_bias=False), layers.BatchNormalization(momentum=0.9, center=False),
                  layers.MaxPooling2D(3, strides=1), layers.Dropout(0.3, seed=1), layers.Activation("gelu"),
                  layers.GlobalAveragePooling2D(keepdims=True)]:
        config = layer.get_config()
        clone = type(layer).from_config(config)
        assert clone.get_config() == config
        import json

        json.dumps(config)


def test_initializers_match_keras_fans():
    k = initializers.GlorotUniform(seed=1)((3, 3, 16, 32))
    limit = np.sqrt(6 / (9 * 16 + 9 * 32))
    assert np.abs(k).max() <= limit and np.abs(k).max() > 0.9 * limit
    he = initializers.HeNormal(seed=2)((3, 3, 64, 64))
    assert abs(he.std() - np.sqrt(2 / (9 * 64))) < 0.05 * np.sqrt(2 / (9 * 64))
    assert np.abs(he).max() <= 2 * np.sqrt(2 / (9 * 64)) / 0.8796 + 1e-6
    assert np.array_equal(initializers.HeUniform(seed=5)((4, 4)), initializers.HeUniform(seed=5)((4, 4)))
    for name in ["glorot_normal", "lecun_normal", "lecun_uniform", "zeros", "ones", "random_normal",
                 "random_uniform", "truncated_normal", "he_uniform"]:
        assert initializers.get(name)((2, 3)).shape == (2, 3)
    assert np.all(initializers.Constant(0.5)((2,)) == 0.5)
    with pytest.raises(ValueError, match="unknown initializer"):
        initializers.get("nope")


def test_initializer_short_aliases_of_keras():
    """Keras 3's "uniform"/"normal"/"one"/"zero" (Embedding's default is "uniform"); serialized by full name."""
    for alias, cls in [("uniform", initializers.RandomUniform), ("normal", initializers.RandomNormal),
                       ("one", initializers.Ones), ("zero", initializers.Zeros)]:
        assert type(initializers.get(alias)) is cls
    assert initializers.serialize(initializers.get("uniform"))["class_name"] == "RandomUniform"


def test_orthogonal_initializer():
    """Keras 3's Orthogonal: orthonormal columns (or rows, for wide shapes) times gain; seeded; by name."""
    for shape in [(6, 4), (4, 6), (3, 3, 2, 5)]:
        w = initializers.Orthogonal(gain=2.0, seed=3)(shape)
        assert w.shape == shape and w.dtype == np.float32
        flat = w.astype(np.float64).reshape(-1, shape[-1])
        gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
        np.testing.assert_allclose(gram, 4.0 * np.eye(len(gram)), atol=1e-5)
    assert np.array_equal(initializers.Orthogonal(seed=1)((3, 3)), initializers.OrthogonalInitializer(seed=1)((3, 3)))
    for name in ("orthogonal", "Orthogonal", "OrthogonalInitializer"):
        assert type(initializers.get(name)) is initializers.OrthogonalInitializer
    cfg = initializers.serialize(initializers.Orthogonal(gain=0.5))
    assert cfg == {"class_name": "OrthogonalInitializer", "config": {"gain": 0.5, "seed": None}}
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        initializers.Orthogonal()((4,))


def test_a_bfloat16_layer_takes_its_own_weights_back():
    import dnnbind as keras
    from dnnbind._validate import BFLOAT16

    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, dtype="bfloat16")])
    weights = model.get_weights()
    assert weights[0].dtype == BFLOAT16
    model.set_weights([w + np.ones_like(w) for w in weights])
    assert all(np.array_equal(a, b + np.ones_like(b)) for a, b in zip(model.get_weights(), weights))


def test_build_with_a_keras_batch_shape_then_call(rng):
    """Keras's ``layer.build(x.shape)`` includes the batch axis: a hand-built layer then takes batches of any
    size (it used to take (64, 10) as the sample shape and refuse (5, 10)); a later wrong shape still fails."""
    import dnnbind as keras

    dense = layers.Dense(3)
    dense.build((64, 10))
    x = rng.normal(size=(5, 10)).astype(np.float32)
    y = dense(x)
    assert y.shape == (5, 3)
    kernel, bias = dense.get_weights()
    assert rel_error(keras.ops.convert_to_numpy(y), x @ kernel + bias) < 1e-6
    with pytest.raises(ValueError, match=r"expects inputs of shape \(batch, 10\), got \(batch, 64, 10\)"):
        dense(np.zeros((2, 64, 10), np.float32))
    called = layers.Dense(3)
    called(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"expects inputs of shape \(batch, 4\), got \(batch, 3, 4\)"):
        called(np.zeros((2, 3, 4), np.float32))


def test_constant_initializer_takes_an_array():
    """Keras 3 multiplies the value into ones(shape): keras-io's PointNet sets a bias to np.eye(k).flatten()."""
    init = initializers.Constant(np.eye(3).flatten())
    np.testing.assert_array_equal(init((9,)), np.eye(3).flatten().astype(np.float32))
    np.testing.assert_array_equal(initializers.Constant([1.0, 2.0])((3, 2)), [[1, 2]] * 3)
    assert initializers.Constant([1.0, 2.0]).get_config() == {"value": [1.0, 2.0]}
    assert initializers.Constant(2).get_config() == {"value": 2.0}
    dense = layers.Dense(9, kernel_initializer="zeros", bias_initializer=init)
    dense.build((None, 4))
    np.testing.assert_array_equal(dense.get_weights()[1], np.eye(3).flatten())
    with pytest.raises(ValueError, match=r"a value of shape \(9,\) cannot fill a weight of shape \(4,\)"):
        init((4,))
    with pytest.raises(TypeError, match="numeric"):
        initializers.Constant("one")


def test_layer_output_is_its_first_symbolic_output():
    import dnnbind as keras

    a = keras.Input((4,))
    dense = layers.Dense(3)
    out = dense(a)
    assert dense.output is out and dense.input is a
    with pytest.raises(AttributeError, match="never been called on symbolic inputs"):
        _ = layers.Dense(2).output


def test_user_layer_built_inside_a_symbolic_call_sees_a_none_batch_axis():
    """Keras 3 gives a nested user layer's build (None, ...) during symbolic tracing (keras-io's PixelCNN builds
    its Conv2D from that shape)."""
    import dnnbind as keras

    seen = []

    class Inner(layers.Layer):
        def build(self, input_shape):
            seen.append(input_shape)
            self.conv = layers.Conv2D(2, 3, padding="same")
            self.conv.build(input_shape)

        def call(self, x):
            return self.conv(x)

    class Outer(layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def call(self, x):
            return self.inner(x)

    out = Outer()(keras.Input((5, 5, 1)))
    assert out.shape == (None, 5, 5, 2)
    assert seen == [(None, 5, 5, 1)]
