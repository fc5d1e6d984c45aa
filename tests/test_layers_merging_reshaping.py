"""Merge, reshaping and preprocessing layers on the NumPy backend: forward vs NumPy references,
backward vs finite differences (float64), shapes, configs, Keras's documented values, argument
checks, and use inside a Sequential model (fit, save/load)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision
from testutil import numerical_grad, random, rel_error

FD_TOL = 1e-7


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def f64(layer):
    """A float64 layer (the finite-difference checks need float64 end to end)."""
    layer.dtype_policy = mixed_precision.Policy("float64")
    return layer


def fd_layer(layer, inputs, rng, tol=FD_TOL):
    """Every input's backward gradient against finite differences of sum(forward * w)."""
    multi = getattr(layer, "multi_input", False)
    arrays = list(inputs) if multi else [inputs]
    y = layer.forward(arrays if multi else arrays[0], training=True)
    w = random(rng, y.shape)
    grads = layer.backward(w)
    grads = grads if multi else [grads]
    assert len(grads) == len(arrays)
    for i, (x, g) in enumerate(zip(arrays, grads)):
        def loss():
            return float(np.sum(layer.forward(arrays if multi else arrays[0], training=False) * w))

        numeric = numerical_grad(loss, x)
        err = rel_error(g, numeric)
        assert err < tol, f"{layer.name} input {i}: backward vs finite differences {err:.2e}"


# ---------------------------------------------------------------------------------- merging

MERGES = [
    (layers.Add, lambda xs: sum(xs)),
    (layers.Multiply, lambda xs: np.prod(np.stack(xs), axis=0)),
    (layers.Average, lambda xs: sum(xs) / len(xs)),
    (layers.Maximum, lambda xs: np.max(np.stack(xs), axis=0)),
    (layers.Minimum, lambda xs: np.min(np.stack(xs), axis=0)),
]


@pytest.mark.parametrize("cls, ref", MERGES, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("n", [1, 2, 3])
def test_elementwise_merge_forward_and_backward(rng, cls, ref, n):
    xs = [random(rng, (2, 3, 4)) for _ in range(n)]
    layer = f64(cls())
    assert layer.multi_input
    y = layer(xs)
    assert layer.input_shape == [(3, 4)] * n and layer.output_shape == (3, 4)
    assert rel_error(y, ref(xs)) < 1e-12
    fd_layer(layer, xs, rng)
    # every gradient is its own array: a caller may accumulate into one in place
    layer.forward(xs, training=True)
    grads = layer.backward(random(rng, y.shape))
    assert len({id(g) for g in grads}) == n
    layer.forward(xs, training=True)
    assert layer.backward(random(rng, y.shape), need_dx=False) == [None] * n


def test_subtract(rng):
    a, b = random(rng, (3, 5)), random(rng, (3, 5))
    layer = f64(layers.Subtract())
    np.testing.assert_allclose(layer([a, b]), a - b)
    fd_layer(layer, [a, b], rng)
    with pytest.raises(ValueError, match="Subtract '.*' takes exactly 2 inputs, got 3"):
        layers.Subtract()([a, b, a])


def test_maximum_ties_go_to_the_first_input():
    a = np.array([[1.0, 2.0, 3.0]])
    b = np.array([[1.0, 5.0, 3.0]])
    layer = f64(layers.Maximum())
    layer.forward([a, b], training=True)
    da, db = layer.backward(np.array([[7.0, 8.0, 9.0]]))
    np.testing.assert_array_equal(da, [[7, 0, 9]])
    np.testing.assert_array_equal(db, [[0, 8, 0]])


@pytest.mark.parametrize("axis", [-1, 1, 2, -2])
def test_concatenate(rng, axis):
    rank = 3
    ax = axis % rank
    shapes = []
    for size in (2, 1, 3):
        s = [4, 3, 5]
        s[ax] = size
        shapes.append(tuple(s))
    xs = [random(rng, s) for s in shapes]
    layer = f64(layers.Concatenate(axis=axis))
    y = layer(xs)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=ax))
    assert layer.compute_output_shape([(None, *s[1:]) for s in shapes]) == (None, *y.shape[1:])
    fd_layer(layer, xs, rng)


def test_merge_shape_errors_name_the_layer(rng):
    a, b = random(rng, (2, 3)), random(rng, (2, 4))
    with pytest.raises(ValueError, match=r"Add 'sum': inputs have incompatible shapes: input 0 is \(batch, 3\) and "
                                         r"input 1 \(batch, 4\)"):
        layers.Add(name="sum")([a, b])
    with pytest.raises(ValueError, match="inputs must match on every axis but axis 1"):
        layers.Concatenate(axis=1)([random(rng, (2, 3, 4)), random(rng, (2, 2, 5))])
    with pytest.raises(ValueError, match="axis must name a non-batch axis"):
        layers.Concatenate(axis=0)([a, a])
    with pytest.raises(TypeError, match="axis must be an int"):
        layers.Concatenate(axis=1.5)
    built = layers.Add()
    built([a, a])
    with pytest.raises(ValueError, match="was built for inputs"):
        built([b, b])


def test_merge_casts_inputs_to_the_compute_dtype(rng):
    a = random(rng, (2, 3)).astype(np.float32)
    y = layers.Add()([a, np.ones((2, 3), dtype=np.int32)])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, a + 1)


# -------------------------------------------------------------------------------- reshaping

def test_reshape(rng):
    x = random(rng, (2, 3, 4))
    layer = layers.Reshape((-1, 2))
    y = layer(x)
    assert y.shape == (2, 6, 2) and np.array_equal(y, x.reshape(2, 6, 2))
    assert layer.compute_output_shape((None, 3, 4)) == (None, 6, 2)
    dy = random(rng, y.shape)
    np.testing.assert_array_equal(layer.backward(dy), dy.reshape(2, 3, 4))
    with pytest.raises(ValueError, match=r"Reshape '.*': cannot reshape \(batch, 3, 4\) \(12 values per sample\)"):
        layers.Reshape((5,)).compute_output_shape((3, 4))
    with pytest.raises(ValueError, match="one -1"):
        layers.Reshape((-1, -1))


def test_permute(rng):
    x = random(rng, (2, 3, 4, 5))
    layer = f64(layers.Permute((3, 1, 2)))
    y = layer(x)
    np.testing.assert_array_equal(y, x.transpose(0, 3, 1, 2))
    assert layer.output_shape == (5, 3, 4)
    fd_layer(layer, x, rng)
    with pytest.raises(ValueError, match="permutation of 1..2"):
        layers.Permute((0, 1))
    with pytest.raises(ValueError, match="permute 2 axes but the inputs"):
        layers.Permute((2, 1))(x)


def test_identity(rng):
    x = random(rng, (2, 3))
    layer = layers.Identity()
    assert layer(x).data is x and layer.backward(x) is x


def _nchw(x, data_format):
    return x if data_format == "channels_first" else x.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("padding, amounts", [(1, (1, 1, 1, 1)), ((2, 0), (2, 2, 0, 0)), (((0, 1), (2, 3)), (0, 1, 2, 3))])
def test_zero_padding_and_cropping(rng, data_format, padding, amounts):
    shape = (2, 4, 5, 3) if data_format == "channels_last" else (2, 3, 4, 5)
    x = random(rng, shape, np.float32)
    t, b, l, r = amounts
    pad = layers.ZeroPadding2D(padding, data_format=data_format)
    y = np.asarray(pad(x))
    want = np.pad(_nchw(x, data_format), ((0, 0), (0, 0), (t, b), (l, r)))
    np.testing.assert_array_equal(_nchw(y, data_format), want)
    assert pad.output_shape == y.shape[1:]
    fd_layer(f64(layers.ZeroPadding2D(padding, data_format=data_format)), x.astype(np.float64), rng)
    crop = layers.Cropping2D(padding, data_format=data_format)
    z = crop(y)
    np.testing.assert_array_equal(z, x)
    assert crop.output_shape == x.shape[1:]
    fd_layer(f64(layers.Cropping2D(padding, data_format=data_format)), y.astype(np.float64), rng)


def test_padding_and_cropping_errors():
    with pytest.raises(ValueError, match="ZeroPadding2D '.*': padding must not be negative"):
        layers.ZeroPadding2D(-1)
    with pytest.raises(ValueError, match="pair of pairs"):
        layers.ZeroPadding2D(((1, 2, 3), (1, 1)))
    with pytest.raises(ValueError, match="must leave at least one row and column of the 4x5 inputs"):
        layers.Cropping2D(((2, 2), (0, 0))).compute_output_shape((4, 5, 3))
    with pytest.raises(ValueError, match="expects 4-d inputs"):
        layers.Cropping2D(1).compute_output_shape((4, 5))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_upsampling(rng, data_format, interpolation):
    shape = (2, 3, 4, 2) if data_format == "channels_last" else (2, 2, 3, 4)
    x = random(rng, shape)
    layer = f64(layers.UpSampling2D((2, 3), data_format=data_format, interpolation=interpolation))
    y = layer(x)
    yn = _nchw(y, data_format)
    assert yn.shape == (2, 2, 6, 12) and layer.output_shape == y.shape[1:]
    xn = _nchw(x, data_format)
    if interpolation == "nearest":
        np.testing.assert_array_equal(yn, xn.repeat(2, axis=2).repeat(3, axis=3))
    else:  # interior outputs: the average of their two nearest inputs' weighted mix; corners are copies
        np.testing.assert_allclose(yn[:, :, 0, 0], xn[:, :, 0, 0])
        np.testing.assert_allclose(yn[:, :, 1, 0], 0.75 * xn[:, :, 0, 0] + 0.25 * xn[:, :, 1, 0])
    fd_layer(layer, x, rng)


def test_upsampling_interpolation_errors():
    with pytest.raises(NotImplementedError, match="'bicubic' is not supported"):
        layers.UpSampling2D(interpolation="bicubic")
    with pytest.raises(ValueError, match="interpolation must be one of 'nearest', 'bilinear'"):
        layers.UpSampling2D(interpolation="cubic")


# ---------------------------------------------------------------------------- preprocessing

def test_rescaling(rng):
    x = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    layer = layers.Rescaling(1 / 255.0, offset=-0.5)
    y = layer(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x / 255.0 - 0.5, rtol=1e-6)
    per_channel = f64(layers.Rescaling([1.0, 2.0, 3.0], offset=[0.0, 1.0, -1.0]))
    xf = random(rng, (2, 2, 3))
    np.testing.assert_allclose(per_channel(xf), xf * [1, 2, 3] + [0, 1, -1])
    fd_layer(per_channel, xf, rng)
    with pytest.raises(ValueError, match="one per channel of the last axis"):
        layers.Rescaling([1.0, 2.0])(xf)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        layers.Rescaling(float("nan"))


def test_normalization_keras_documented_values():
    # the examples of keras.layers.Normalization's docstring
    layer = layers.Normalization(axis=None)
    layer.adapt(np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype="float32"))
    np.testing.assert_allclose(layer(np.array([1.0, 2.0, 3.0], dtype="float32")), [-1.4142135, -0.70710677, 0.0],
                               rtol=1e-6)
    data = np.array([[0.0, 7.0, 4.0], [2.0, 9.0, 6.0], [0.0, 7.0, 4.0], [2.0, 9.0, 6.0]], dtype="float32")
    layer = layers.Normalization(axis=-1)
    layer.adapt(data)
    np.testing.assert_allclose(layer(np.array([[0.0, 7.0, 4.0]], dtype="float32")), [[-1.0, -1.0, -1.0]])
    layer = layers.Normalization(mean=3.0, variance=2.0)
    np.testing.assert_allclose(layer(np.array([[1.0], [2.0], [3.0]], dtype="float32")).reshape(-1),
                               [-1.4142135, -0.70710677, 0.0], rtol=1e-6)
    layer = layers.Normalization(axis=-1, invert=True)
    layer.adapt(data)
    np.testing.assert_allclose(layer(np.array([[1.0, 2.0, 3.0]], dtype="float32")), [[2.0, 10.0, 8.0]])


@pytest.mark.parametrize("axis", [-1, (1, 2), 2, None])
def test_normalization_adapt_weights_and_gradient(rng, axis):
    data = random(rng, (20, 4, 5, 3), low=-2.0, high=5.0)
    layer = f64(layers.Normalization(axis=axis))
    # batches of different sizes combine into the whole data's statistics
    layer.adapt([data[:7], (data[7:8], None), data[8:]])
    keep = {-1: (3,), (1, 2): (1, 2), 2: (2,), None: ()}[axis]
    reduce = tuple(d for d in range(4) if d not in keep)
    mean, var, count = layer.get_weights()
    kept_shape = tuple(data.shape[d] for d in keep)
    assert [w.name for w in layer.weights] == ["mean", "variance", "count"] and not layer.trainable_weights
    assert mean.shape == kept_shape and var.shape == kept_shape and count.shape == () and count == 0
    np.testing.assert_allclose(mean, data.mean(axis=reduce).reshape(kept_shape), rtol=1e-12)
    np.testing.assert_allclose(var, data.var(axis=reduce).reshape(kept_shape), rtol=1e-12)
    bshape = [data.shape[d] if d in keep else 1 for d in range(4)]
    x = random(rng, (2, 4, 5, 3))
    want = (x - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape))
    np.testing.assert_allclose(layer(x), want, rtol=1e-12)
    fd_layer(layer, x, rng)
    inverse = f64(layers.Normalization(axis=axis, invert=True))
    inverse.build((4, 5, 3))
    inverse.set_weights(layer.get_weights())
    np.testing.assert_allclose(inverse(layer(x)), x, rtol=1e-10)
    fd_layer(inverse, x, rng)


def test_normalization_checks_and_failed_adapt_changes_nothing(rng):
    with pytest.raises(ValueError, match="mean and variance must be given together"):
        layers.Normalization(mean=1.0)
    with pytest.raises(ValueError, match="keeps the batch axis"):
        layers.Normalization(axis=0).build((3,))
    with pytest.raises(NotImplementedError, match="must be neighbours"):
        layers.Normalization(axis=(1, 3)).build((4, 5, 3))
    layer = layers.Normalization()
    with pytest.raises(ValueError, match="adapt\\(\\) batch 1 has shape"):
        layer.adapt([random(rng, (4, 3)), random(rng, (4, 2))])
    assert not layer.built and not layer.weights
    layer.adapt(random(rng, (6, 3)))
    before = layer.get_weights()
    with pytest.raises(ValueError, match="was built for inputs"):
        layer.adapt(random(rng, (6, 4)))
    assert all(np.array_equal(a, b) for a, b in zip(before, layer.get_weights()))
    fixed = layers.Normalization(mean=[1.0, 2.0], variance=[4.0, 9.0])
    with pytest.raises(ValueError, match="adapt\\(\\) has no weights"):
        fixed.adapt(random(rng, (6, 2)))
    np.testing.assert_allclose(fixed(np.array([[3.0, 8.0]])), [[1.0, 2.0]])
    assert fixed.weights == []


# ------------------------------------------------------------------------------- configs

CONFIG_LAYERS = [
    lambda: layers.Add(name="add_c"), lambda: layers.Subtract(), lambda: layers.Multiply(), lambda: layers.Average(),
    lambda: layers.Maximum(), lambda: layers.Minimum(), lambda: layers.Concatenate(axis=1),
    lambda: layers.Reshape((2, -1)), lambda: layers.Permute((2, 1)), lambda: layers.Identity(),
    lambda: layers.ZeroPadding2D(((1, 2), (3, 4)), data_format="channels_first"),
    lambda: layers.Cropping2D((1, 2)), lambda: layers.UpSampling2D(3, interpolation="bilinear"),
    lambda: layers.Rescaling([1.0, 2.0], offset=0.5), lambda: layers.Normalization(axis=(1, 2), invert=True),
    lambda: layers.Normalization(mean=[1.0, 2.0], variance=[3.0, 4.0]),
]


@pytest.mark.parametrize("make", CONFIG_LAYERS)
def test_config_round_trip_through_the_registry(make):
    import json

    layer = make()
    config = {"class_name": type(layer).__name__, "config": layer.get_config()}
    again = layers.deserialize(json.loads(json.dumps(config)))
    assert type(again) is type(layer)
    assert again.get_config() == layer.get_config()


# ------------------------------------------------------------------------- in a Sequential

def test_sequential_model_with_reshaping_and_preprocessing_layers_trains_and_saves(rng, tmp_path):
    dnnbind.utils.set_random_seed(0)
    x = rng.integers(0, 256, size=(32, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, size=32)
    norm = layers.Normalization()
    norm.adapt(x / 255.0)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        layers.Rescaling(1 / 255.0),
        norm,
        layers.ZeroPadding2D(1),
        layers.Conv2D(4, 3, activation="relu"),
        layers.UpSampling2D(2, interpolation="bilinear"),
        layers.Cropping2D(((1, 1), (2, 2))),
        layers.Permute((2, 1, 3)),
        layers.Reshape((-1,)),
        layers.Identity(),
        layers.Dense(3, activation="softmax"),
    ])
    assert model.output_shape == (None, 3)
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < before
    path = tmp_path / "m.dnnbind"
    model.save(path)
    loaded = keras.load_model(path)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def merge_model() -> "keras.Model":
    """Two inputs, two Dense branches, every merge layer (also used by the GPU tests)."""
    init = keras.initializers.GlorotUniform
    a, b = keras.Input((5,)), keras.Input((5,))
    ha = layers.Dense(6, activation="tanh", kernel_initializer=init(1))(a)
    hb = layers.Dense(6, activation="tanh", kernel_initializer=init(2))(b)
    merged = layers.Concatenate()([
        layers.Maximum()([ha, hb]), layers.Minimum()([ha, hb]), layers.Multiply()([ha, hb]),
        layers.Subtract()([ha, hb]), layers.Average()([ha, hb, layers.Add()([ha, hb])]),
    ])
    return keras.Model([a, b], layers.Dense(3, activation="softmax", kernel_initializer=init(3))(merged))


def test_functional_model_with_every_merge_layer_trains_and_saves(rng, tmp_path):
    model = merge_model()
    assert model.output_shape == (None, 3)
    xa, xb = rng.normal(size=(48, 5)).astype(np.float32), rng.normal(size=(48, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=48)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    before = model.evaluate([xa, xb], y, verbose=0)
    model.fit([xa, xb], y, batch_size=16, epochs=5, verbose=0)
    assert model.evaluate([xa, xb], y, verbose=0) < before
    model.save(tmp_path / "f.dnnbind")
    loaded = keras.load_model(tmp_path / "f.dnnbind")
    np.testing.assert_allclose(loaded.predict([xa, xb], verbose=0), model.predict([xa, xb], verbose=0), rtol=1e-6)
