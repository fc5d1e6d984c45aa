"""The layers written in keras.ops for issue 24 (PReLU, Conv3D, DepthwiseConv1D, SeparableConv1D, GroupNormalization,
UnitNormalization, the 1-d/3-d/adaptive poolings, the 1-d/3-d reshaping layers, RepeatVector and the noise layers)
against real Keras 3 (JAX backend, one subprocess for every case): forward outputs and the gradients of the input
and of every trainable weight on the same weights, output shapes, weight names and shapes; configs round trip;
.weights.h5 files move both ways; the noise layers' statistics; errors naming the layer."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from dnnbind.autodiff import GradientTape


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


# (label, class name, constructor kwargs, input shape)
CASES = [
    ("prelu", "PReLU", {"alpha_initializer": "ones"}, (2, 4, 3)),
    ("prelu_shared", "PReLU", {"shared_axes": [1, 2]}, (2, 3, 4, 5)),
    ("conv3d", "Conv3D", {"filters": 3, "kernel_size": 2}, (2, 3, 4, 4, 2)),
    ("conv3d_same_s2", "Conv3D", {"filters": 2, "kernel_size": (3, 2, 3), "strides": 2, "padding": "same",
                                  "activation": "tanh"}, (1, 4, 5, 5, 3)),
    ("conv3d_groups_cf", "Conv3D", {"filters": 4, "kernel_size": 2, "groups": 2, "data_format": "channels_first"},
     (2, 4, 3, 3, 3)),
    ("conv3d_dilated", "Conv3D", {"filters": 2, "kernel_size": 2, "dilation_rate": 2, "use_bias": False},
     (1, 5, 5, 5, 2)),
    ("depthwise1d", "DepthwiseConv1D", {"kernel_size": 3, "depth_multiplier": 2}, (2, 7, 3)),
    ("depthwise1d_same_s2", "DepthwiseConv1D", {"kernel_size": 3, "strides": 2, "padding": "same",
                                                "activation": "relu"}, (2, 8, 4)),
    ("depthwise1d_cf", "DepthwiseConv1D", {"kernel_size": 2, "data_format": "channels_first", "dilation_rate": 2},
     (2, 3, 7)),
    ("separable1d", "SeparableConv1D", {"filters": 4, "kernel_size": 3, "depth_multiplier": 2}, (2, 7, 3)),
    ("separable1d_same", "SeparableConv1D", {"filters": 2, "kernel_size": 3, "padding": "same", "strides": 2},
     (2, 8, 3)),
    ("groupnorm", "GroupNormalization", {"groups": 2}, (2, 3, 4, 6)),
    ("groupnorm_axis1", "GroupNormalization", {"groups": 3, "axis": 1, "epsilon": 0.1}, (3, 6, 5)),
    ("groupnorm_instance", "GroupNormalization", {"groups": -1, "center": False}, (2, 5, 4)),
    ("unitnorm", "UnitNormalization", {}, (3, 4, 5)),
    ("unitnorm_axes", "UnitNormalization", {"axis": [1, 2]}, (3, 4, 5)),
    ("maxpool1d", "MaxPooling1D", {}, (2, 7, 3)),
    ("maxpool1d_same", "MaxPooling1D", {"pool_size": 3, "strides": 2, "padding": "same"}, (2, 8, 3)),
    ("avgpool1d_cf", "AveragePooling1D", {"pool_size": 2, "padding": "same", "data_format": "channels_first"},
     (2, 3, 7)),
    ("maxpool3d", "MaxPooling3D", {}, (2, 4, 5, 4, 2)),
    ("avgpool3d_same", "AveragePooling3D", {"pool_size": (2, 3, 2), "strides": (1, 2, 2), "padding": "same"},
     (1, 3, 5, 4, 2)),
    ("avgpool3d_cf", "AveragePooling3D", {"pool_size": 2, "data_format": "channels_first"}, (2, 2, 4, 4, 4)),
    ("gmp3d", "GlobalMaxPooling3D", {}, (2, 3, 4, 2, 3)),
    ("gap3d_keep_cf", "GlobalAveragePooling3D", {"keepdims": True, "data_format": "channels_first"},
     (2, 3, 3, 4, 2)),
    ("amp1d", "AdaptiveMaxPooling1D", {"output_size": 3}, (2, 7, 2)),
    ("aap1d", "AdaptiveAveragePooling1D", {"output_size": 4}, (2, 9, 2)),
    ("amp2d", "AdaptiveMaxPooling2D", {"output_size": (2, 3)}, (2, 5, 7, 2)),
    ("aap2d_cf", "AdaptiveAveragePooling2D", {"output_size": 3, "data_format": "channels_first"}, (2, 2, 7, 5)),
    ("amp3d", "AdaptiveMaxPooling3D", {"output_size": 2}, (1, 5, 4, 3, 2)),
    ("aap3d", "AdaptiveAveragePooling3D", {"output_size": (2, 3, 2)}, (1, 4, 5, 3, 2)),
    ("zeropad1d", "ZeroPadding1D", {"padding": (1, 2)}, (2, 4, 3)),
    ("zeropad3d", "ZeroPadding3D", {"padding": ((1, 0), (0, 2), (1, 1))}, (1, 2, 3, 2, 2)),
    ("zeropad3d_cf", "ZeroPadding3D", {"padding": 1, "data_format": "channels_first"}, (1, 2, 2, 3, 2)),
    ("crop1d", "Cropping1D", {"cropping": (2, 1)}, (2, 6, 3)),
    ("crop3d", "Cropping3D", {"cropping": ((1, 0), (1, 2), 1)}, (1, 3, 5, 4, 2)),
    ("crop3d_cf", "Cropping3D", {"cropping": 1, "data_format": "channels_first"}, (1, 2, 4, 3, 4)),
    ("upsample1d", "UpSampling1D", {"size": 3}, (2, 4, 3)),
    ("upsample3d", "UpSampling3D", {"size": (2, 1, 3)}, (1, 2, 3, 2, 2)),
    ("upsample3d_cf", "UpSampling3D", {"data_format": "channels_first"}, (1, 2, 2, 2, 3)),
    ("repeat", "RepeatVector", {"n": 3}, (2, 4)),
    ("activity_reg", "ActivityRegularization", {"l1": 0.01, "l2": 0.1}, (2, 5)),
    # the noise layers outside training: the identity in both libraries
    ("alpha_dropout", "AlphaDropout", {"rate": 0.3}, (2, 5)),
    ("gaussian_dropout", "GaussianDropout", {"rate": 0.3}, (2, 5)),
    ("gaussian_noise", "GaussianNoise", {"stddev": 0.3}, (2, 5)),
    ("spatial_dropout1d", "SpatialDropout1D", {"rate": 0.3}, (2, 4, 3)),
    ("spatial_dropout3d", "SpatialDropout3D", {"rate": 0.3}, (1, 2, 2, 2, 3)),
    ("convlstm2d_seq", "ConvLSTM2D", {"filters": 2, "kernel_size": 3, "padding": "same", "return_sequences": True},
     (2, 3, 4, 4, 2)),
    ("convlstm2d_cf", "ConvLSTM2D", {"filters": 3, "kernel_size": 2, "data_format": "channels_first",
                                     "activation": "relu", "unit_forget_bias": False}, (2, 3, 2, 4, 5)),
    ("convlstm1d_back_s2", "ConvLSTM1D", {"filters": 3, "kernel_size": 2, "strides": 2, "go_backwards": True},
     (2, 4, 7, 2)),
    ("convlstm3d", "ConvLSTM3D", {"filters": 2, "kernel_size": 2, "use_bias": False}, (1, 2, 3, 3, 3, 2)),
]


def _inputs(label: str, cls: str, kwargs: dict, shape: tuple) -> dict:
    """Seeded input, weights (Keras layouts) and output cotangent of one case."""
    rng = np.random.default_rng(zlib.crc32(label.encode()))
    layer = getattr(layers, cls)(**kwargs)
    layer.build(shape)
    out_shape = layer.compute_output_shape(shape)
    data = {"x": rng.normal(size=shape).astype(np.float32), "g": rng.normal(size=out_shape).astype(np.float32)}
    for i, w in enumerate(layer.weights):
        data[f"w{i}"] = (rng.normal(size=w.shape) * 0.5).astype(np.float32)
    return data


_SCRIPT = r"""
import json, sys
import numpy as np
import jax, jax.numpy as jnp
import keras
work = sys.argv[1]
cases = json.load(open(f"{work}/cases.json"))
data = dict(np.load(f"{work}/in.npz"))
out = {}
for label, cls, kwargs, shape in cases:
    layer = getattr(keras.layers, cls)(**kwargs)
    layer.build(tuple(shape))
    n = len(layer.weights)
    layer.set_weights([data[f"{label}/w{i}"] for i in range(n)])
    out[f"{label}/shape"] = np.array(layer.compute_output_shape(tuple(shape)), dtype=float)
    out[f"{label}/names"] = np.array(json.dumps([[w.name, list(w.shape)] for w in layer.weights]))
    tv = [v.value for v in layer.trainable_variables]
    ntv = [v.value for v in layer.non_trainable_variables]
    def f(x, tv):
        y, _ = layer.stateless_call(tv, ntv, x)
        return jnp.sum(y * data[f"{label}/g"]), y
    (_, y), (dx, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(data[f"{label}/x"], tv)
    out[f"{label}/y"] = np.asarray(y)
    out[f"{label}/dx"] = np.asarray(dx)
    for i, g in enumerate(dw):
        out[f"{label}/dw{i}"] = np.asarray(g)
    if cls == "ActivityRegularization":
        layer(data[f"{label}/x"])
    out[f"{label}/losses"] = np.array([float(l) for l in layer.losses])
np.savez(f"{work}/out.npz", **out)
"""


def _keras_env(work: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=os.path.join(work, "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    return env


def _no_keras() -> "str | None":
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        return "real Keras 3 with JAX is not installed (test extra)"
    return None


@functools.lru_cache(maxsize=1)
def _keras_results() -> "dict | str":
    missing = _no_keras()
    if missing:
        return missing
    work = tempfile.mkdtemp(prefix="dnnbind_breadth_")
    arrays = {f"{label}/{k}": v for label, cls, kw, shape in CASES for k, v in _inputs(label, cls, kw, shape).items()}
    np.savez(os.path.join(work, "in.npz"), **arrays)
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump([[label, cls, kw, list(shape)] for label, cls, kw, shape in CASES], f)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=_keras_env(work),
                          timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    return {**dict(np.load(os.path.join(work, "out.npz"))), **{f"in:{k}": v for k, v in arrays.items()}}


@pytest.mark.parametrize("label,cls,kwargs,shape", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_keras(label, cls, kwargs, shape):
    theirs = _keras_results()
    if isinstance(theirs, str):
        pytest.skip(theirs)
    layer = getattr(layers, cls)(**kwargs)
    layer.build(shape)
    n = len(layer.weights)
    assert [[w.name, list(w.shape)] for w in layer.weights] == json.loads(str(theirs[f"{label}/names"]))
    layer.set_weights([theirs[f"in:{label}/w{i}"] for i in range(n)])
    assert tuple(layer.compute_output_shape(shape)) == tuple(int(s) for s in theirs[f"{label}/shape"])
    x = ops.convert_to_tensor(theirs[f"in:{label}/x"])
    with GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        total = ops.sum(ops.multiply(y, theirs[f"in:{label}/g"]))
    np.testing.assert_allclose(np.asarray(y), theirs[f"{label}/y"], rtol=1e-4, atol=1e-5)
    grads = tape.gradient(total, [x] + list(layer.trainable_weights))
    np.testing.assert_allclose(np.asarray(grads[0]), theirs[f"{label}/dx"], rtol=1e-4, atol=1e-4,
                               err_msg=f"{label}: gradient of the input")
    for i, g in enumerate(grads[1:]):
        np.testing.assert_allclose(np.asarray(g), theirs[f"{label}/dw{i}"], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{label}: gradient of {layer.trainable_weights[i].name}")
    np.testing.assert_allclose([float(np.asarray(v)) for v in layer.losses], theirs[f"{label}/losses"], rtol=1e-5)


@pytest.mark.parametrize("label,cls,kwargs,shape", CASES, ids=[c[0] for c in CASES])
def test_config_round_trips(label, cls, kwargs, shape):
    layer = getattr(layers, cls)(**kwargs, name=f"the_{label}")
    config = layer.get_config()
    json.dumps(config)
    again = getattr(layers, cls).from_config(config)
    assert again.get_config() == config
    restored = layers.deserialize({"class_name": cls, "config": config})
    assert type(restored) is type(layer) and restored.name == f"the_{label}"


# ----- .weights.h5 files both ways ----------------------------------------------------------------------
_MODEL = r"""
def model(keras, layers):
    inputs = keras.Input((6, 5, 4, 2))
    x = layers.Conv3D(4, 2, padding="same", name="c3")(inputs)
    x = layers.GroupNormalization(2, name="gn")(x)
    x = layers.PReLU(shared_axes=[1, 2, 3], name="pr")(x)
    x = layers.MaxPooling3D(2, name="mp")(x)
    x = layers.Reshape((3 * 2 * 2, 4))(x)
    x = layers.DepthwiseConv1D(3, depth_multiplier=2, name="dw")(x)
    x = layers.SeparableConv1D(3, 3, name="sep")(x)
    x = layers.UnitNormalization()(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.SpectralNormalization(layers.Dense(3), name="sn")(x)
    return keras.Model(inputs, x)


def sequence_model(keras, layers):
    inputs = keras.Input((3, 5, 4, 2))
    x = layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True, name="cl")(inputs)
    x = layers.ConvLSTM2D(2, 2, name="cl2")(x)
    return keras.Model(inputs, layers.GlobalMaxPooling2D()(x))


def embedding_model(keras, layers):
    inputs = keras.Input((4,), dtype="int32")
    x = layers.ReversibleEmbedding(10, 6, tie_weights=False, name="rev")(inputs)
    return keras.Model(inputs, layers.Dense(2, name="d")(x))
"""

_FILES_SCRIPT = _MODEL + r"""
import sys
import numpy as np
import keras
from keras import layers
work = sys.argv[1]
m = model(keras, layers)
x = np.load(f"{work}/x.npy")
m.load_weights(f"{work}/dnnbind.weights.h5")
np.save(f"{work}/keras_pred_of_dnnbind.npy", np.asarray(m.predict(x, verbose=0)))
rng = np.random.default_rng(5)
m.set_weights([rng.normal(size=w.shape).astype("float32") * 0.4 + (1.0 if "gamma" in w.path else 0.0)
               for w in m.weights])
m.save_weights(f"{work}/keras.weights.h5")
np.save(f"{work}/keras_pred.npy", np.asarray(m.predict(x, verbose=0)))
q = sequence_model(keras, layers)
q.load_weights(f"{work}/dnnbind_seq.weights.h5")
np.save(f"{work}/keras_seq_of_dnnbind.npy", np.asarray(q.predict(np.load(f"{work}/seq.npy"), verbose=0)))
e = embedding_model(keras, layers)
ids = np.load(f"{work}/ids.npy")
e.load_weights(f"{work}/dnnbind_emb.weights.h5")
np.save(f"{work}/keras_emb_of_dnnbind.npy", np.asarray(e.predict(ids, verbose=0)))
rev = e.get_layer("rev")
np.save(f"{work}/keras_reverse.npy", np.asarray(rev(np.load(f"{work}/vectors.npy"), reverse=True)))
"""


def test_weights_files_move_both_ways_with_keras(tmp_path):
    missing = _no_keras()
    if missing:
        pytest.skip(missing)
    namespace: dict = {}
    exec(_MODEL, namespace)
    m = namespace["model"](keras, layers)
    rng = np.random.default_rng(3)
    m.set_weights([rng.normal(size=w.shape).astype("float32") * 0.4 for w in m.weights])
    x = rng.normal(size=(3, 6, 5, 4, 2)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    m.save_weights(str(tmp_path / "dnnbind.weights.h5"))
    q = namespace["sequence_model"](keras, layers)
    q.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 for w in q.weights])
    seq = rng.normal(size=(2, 3, 5, 4, 2)).astype("float32")
    np.save(tmp_path / "seq.npy", seq)
    q.save_weights(str(tmp_path / "dnnbind_seq.weights.h5"))
    e = namespace["embedding_model"](keras, layers)
    e.set_weights([rng.normal(size=w.shape).astype("float32") for w in e.weights])
    ids = rng.integers(0, 10, size=(3, 4)).astype("int32")
    vectors = rng.normal(size=(2, 3, 6)).astype("float32")
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "vectors.npy", vectors)
    e.save_weights(str(tmp_path / "dnnbind_emb.weights.h5"))
    proc = subprocess.run([sys.executable, "-c", _FILES_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=_keras_env(str(tmp_path)), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    np.testing.assert_allclose(np.load(tmp_path / "keras_pred_of_dnnbind.npy"), np.asarray(m.predict(x, verbose=0)),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "keras_seq_of_dnnbind.npy"), np.asarray(q.predict(seq, verbose=0)),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "keras_emb_of_dnnbind.npy"), np.asarray(e.predict(ids, verbose=0)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "keras_reverse.npy"),
                               np.asarray(e.get_layer("rev")(vectors, reverse=True)), rtol=1e-5, atol=1e-6)
    m.load_weights(str(tmp_path / "keras.weights.h5"))
    np.testing.assert_allclose(np.asarray(m.predict(x, verbose=0)), np.load(tmp_path / "keras_pred.npy"),
                               rtol=1e-4, atol=1e-5)


def test_reversible_embedding_tied_and_soft_capped():
    layer = layers.ReversibleEmbedding(5, 3, logit_soft_cap=2.0)
    ids = np.array([[0, 4], [2, 1]])
    y = np.asarray(layer(ids))
    table = layer.get_weights()[0]
    np.testing.assert_allclose(y, table[ids])
    v = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32) * 20
    np.testing.assert_allclose(np.asarray(layer(v, reverse=True)), np.tanh(v @ table.T / 2.0) * 2.0, rtol=1e-5)
    assert layer.compute_output_shape((None, 7, 3), reverse=True) == (None, 7, 5)
    assert [w.name for w in layer.weights] == ["embeddings"]


def test_spectral_normalization_matches_the_power_method():
    layer = layers.SpectralNormalization(layers.Dense(4, use_bias=False), power_iterations=2)
    x = np.random.default_rng(1).normal(size=(3, 5)).astype(np.float32)
    y0 = np.asarray(layer(x))  # not training: the kernel as it is
    w = layer.layer.kernel.numpy().astype(np.float64)
    np.testing.assert_allclose(y0, x @ w, rtol=1e-5)
    u = layer.vector_u.numpy().astype(np.float64)
    for _ in range(2):
        v = u @ w.T
        v /= np.linalg.norm(v)
        u = v @ w
        u /= np.linalg.norm(u)
    sigma = (v @ w @ u.T).item()
    y = np.asarray(layer(x, training=True))
    np.testing.assert_allclose(layer.layer.kernel.numpy(), w / sigma, rtol=1e-5)
    np.testing.assert_allclose(layer.vector_u.numpy(), u, rtol=1e-5)
    np.testing.assert_allclose(y, x @ (w / sigma), rtol=1e-5)
    for _ in range(30):
        layer(x, training=True)
    assert abs(np.linalg.svd(layer.layer.kernel.numpy())[1][0] - 1.0) < 1e-3
    again = layers.deserialize(layers.serialize(layer))
    assert type(again.layer) is layers.Dense and again.power_iterations == 2


def test_input_spec_checks_like_keras():
    spec = layers.InputSpec(ndim=3, axes={-1: 4})
    from dnnbind.layers.input_spec import assert_input_compatibility

    assert_input_compatibility(spec, np.zeros((2, 5, 4)), "l")
    with pytest.raises(ValueError, match=r"Input 0 of layer 'l' is incompatible with the layer: expected ndim=3"):
        assert_input_compatibility(spec, np.zeros((2, 4)), "l")
    with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 4"):
        assert_input_compatibility(spec, np.zeros((2, 5, 3)), "l")
    assert layers.InputSpec.from_config(spec.get_config()).get_config() == spec.get_config()
    assert layers.InputSpec(shape=(None, 3)).ndim == 2


def test_wrapper_builds_and_serializes_its_layer():
    w = layers.Wrapper(layers.Dense(3, name="inner"), name="wrap")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(np.asarray(w(x)), np.asarray(w.layer(x)))
    config = layers.serialize(w)
    assert config["class_name"] == "Wrapper" and config["config"]["layer"]["class_name"] == "Dense"
    assert [v.name for v in w.weights] == ["kernel", "bias"]


def test_conv_lstm_states_and_errors():
    layer = layers.ConvLSTM1D(2, 3, padding="same", return_state=True, return_sequences=True, name="c")
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 3)).astype(np.float32)
    seq, h, c = layer(x)
    assert seq.shape == (2, 4, 5, 2) and h.shape == c.shape == (2, 5, 2)
    np.testing.assert_allclose(np.asarray(seq)[:, -1], np.asarray(h), rtol=1e-6)
    assert layer.compute_output_shape((None, 4, 5, 3)) == [(None, 4, 5, 2), (None, 5, 2), (None, 5, 2)]
    # a given initial state is where the recurrence starts
    again = layer(x, initial_state=[h, c])
    assert not np.allclose(np.asarray(again[0]), np.asarray(seq))
    with pytest.raises(ValueError, match=r"ConvLSTM1D 'c' expects 4-d inputs"):
        layer(x[0])
    with pytest.raises(NotImplementedError, match=r"dropout > 0"):
        layers.ConvLSTM2D(2, 3, dropout=0.2)


# ----- the noise layers in training ---------------------------------------------------------------------
def test_gaussian_noise_and_dropout_statistics():
    x = np.full((400, 50), 2.0, np.float32)
    y = np.asarray(layers.GaussianNoise(0.5, seed=1)(x, training=True))
    assert abs(y.mean() - 2.0) < 0.02 and abs(y.std() - 0.5) < 0.02
    y = np.asarray(layers.GaussianDropout(0.2, seed=2)(x, training=True))
    assert abs(y.mean() - 2.0) < 0.02 and abs(y.std() - 2.0 * np.sqrt(0.2 / 0.8)) < 0.03


def test_alpha_dropout_keeps_selu_statistics():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 80)).astype(np.float32)
    layer = layers.AlphaDropout(0.2, seed=3)
    y = np.asarray(layer(x, training=True))
    alpha_p = -1.6732632423543772848170429916717 * 1.0507009873554804934193349852946
    a = ((1 - 0.2) * (1 + 0.2 * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * 0.2
    dropped = np.isclose(y, a * alpha_p + b)
    assert abs(dropped.mean() - 0.2) < 0.01
    np.testing.assert_allclose(y[~dropped], a * x[~dropped] + b, rtol=1e-5)
    assert abs(y.mean()) < 0.02 and abs(y.std() - 1.0) < 0.03
    second = np.asarray(layer(x, training=True))
    assert not np.array_equal(second, y)  # the generator advances


@pytest.mark.parametrize("cls,shape,kw", [("SpatialDropout1D", (64, 5, 40), {}),
                                          ("SpatialDropout3D", (32, 2, 3, 2, 40), {}),
                                          ("SpatialDropout3D", (32, 40, 2, 3, 2), {"data_format": "channels_first"})])
def test_spatial_dropouts_drop_whole_channels(cls, shape, kw):
    x = np.random.default_rng(1).uniform(1, 2, size=shape).astype(np.float32)
    y = np.asarray(getattr(layers, cls)(0.4, seed=4, **kw)(x, training=True))
    channel_axis = len(shape) - 1 if kw.get("data_format", "channels_last") == "channels_last" else 1
    spatial = tuple(a for a in range(1, len(shape)) if a != channel_axis)
    zero = (y == 0).all(axis=spatial)
    assert ((y == 0).any(axis=spatial) == zero).all()  # a channel is dropped whole or not at all
    assert abs(zero.mean() - 0.4) < 0.06
    kept = np.broadcast_to(np.expand_dims(~zero, spatial), shape)
    np.testing.assert_allclose(y[kept], x[kept] / 0.6, rtol=1e-6)


def test_noise_layers_train_inside_a_model():
    model = keras.Sequential([keras.Input((6,)), layers.Dense(8), layers.GaussianNoise(0.1, seed=1),
                              layers.AlphaDropout(0.1, seed=2), layers.PReLU(), layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    assert model.evaluate(x, y, verbose=0) < 0.5 * first


# ----- errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,x,match", [
    (lambda: layers.Conv3D(2, 2, name="c"), np.ones((1, 4, 4, 3), np.float32), r"Conv3D 'c' expects 5-d inputs"),
    (lambda: layers.MaxPooling3D(name="p"), np.ones((1, 4, 4, 3), np.float32), r"MaxPooling3D 'p' expects 5-d"),
    (lambda: layers.MaxPooling1D(4, name="p"), np.ones((1, 3, 2), np.float32), r"MaxPooling1D 'p': the pooling window"),
    (lambda: layers.GroupNormalization(4, name="g"), np.ones((1, 3, 6), np.float32),
     r"GroupNormalization 'g': groups \(4\) cannot be more than the number of channels \(6\)|multiple of groups"),
    (lambda: layers.GroupNormalization(4, name="g"), np.ones((1, 3, 2), np.float32),
     r"GroupNormalization 'g': groups \(4\) cannot be more"),
    (lambda: layers.Cropping1D((2, 2), name="c"), np.ones((1, 4, 2), np.float32), r"Cropping1D 'c': cropping"),
    (lambda: layers.RepeatVector(2, name="r"), np.ones((1, 4, 2), np.float32), r"RepeatVector 'r' expects 2-d"),
    (lambda: layers.PReLU(shared_axes=[3], name="p"), np.ones((1, 4, 2), np.float32), r"PReLU 'p': shared_axes"),
])
def test_bad_inputs_name_the_layer(make, x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)


@pytest.mark.parametrize("make,match", [
    (lambda: layers.Conv3D(2, (2, 2)), r"kernel_size must have 3 values"),
    (lambda: layers.Conv3D(3, 2, groups=2), r"filters \(3\) must be a multiple of groups \(2\)"),
    (lambda: layers.AlphaDropout(1.0), r"rate"),
    (lambda: layers.GaussianNoise(-1.0), r"stddev"),
    (lambda: layers.ZeroPadding3D(((1, 1), (1, 1))), r"ZeroPadding3D .*padding must be"),
    (lambda: layers.AveragePooling1D(2, padding="full"), r"padding must be 'valid' or 'same'"),
    (lambda: layers.UpSampling3D(data_format="nhwc"), r"data_format"),
    (lambda: layers.GroupNormalization(0), r"groups must be a positive int or -1"),
])
def test_bad_arguments_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_a_layers_own_input_spec_is_checked_at_call():
    class Twice(layers.Layer):
        def __init__(self):
            super().__init__(name="twice")
            self.input_spec = layers.InputSpec(ndim=2, axes={-1: 3})

        def call(self, x):
            return ops.multiply(x, 2.0)

    layer = Twice()
    np.testing.assert_allclose(np.asarray(layer(np.ones((2, 3), np.float32))), 2.0)
    with pytest.raises(ValueError, match=r"Input 0 of layer 'twice' is incompatible with the layer: expected axis -1"):
        layer(np.ones((2, 4), np.float32))
