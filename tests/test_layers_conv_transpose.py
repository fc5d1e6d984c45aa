"""Conv1DTranspose / Conv2DTranspose / Conv3DTranspose against real Keras 3 (JAX backend, in a subprocess):
output shapes, forward values and the gradients of the input, kernel and bias; plus the layer contract
(config round trip, bad arguments, regularizers, training in a model)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
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
    ("2d_same_s2", "Conv2DTranspose", {"filters": 4, "kernel_size": 3, "strides": 2, "padding": "same"}, (2, 5, 6, 3)),
    ("2d_valid_s2", "Conv2DTranspose", {"filters": 3, "kernel_size": 3, "strides": 2}, (2, 4, 5, 2)),
    ("2d_valid_s1", "Conv2DTranspose", {"filters": 2, "kernel_size": (2, 3)}, (1, 4, 4, 3)),
    ("2d_k4_s2_same", "Conv2DTranspose", {"filters": 5, "kernel_size": 4, "strides": 2, "padding": "same"},
     (2, 3, 3, 4)),
    ("2d_outpad", "Conv2DTranspose", {"filters": 3, "kernel_size": 3, "strides": 2, "padding": "same",
                                     "output_padding": 1}, (2, 4, 4, 2)),
    ("2d_valid_outpad", "Conv2DTranspose", {"filters": 2, "kernel_size": 3, "strides": (2, 3),
                                           "output_padding": (1, 0)}, (1, 3, 4, 2)),
    ("2d_dilated", "Conv2DTranspose", {"filters": 2, "kernel_size": 3, "dilation_rate": 2, "padding": "same"},
     (1, 5, 5, 2)),
    ("2d_channels_first", "Conv2DTranspose", {"filters": 3, "kernel_size": 3, "strides": 2, "padding": "same",
                                             "data_format": "channels_first", "activation": "relu"}, (2, 2, 4, 5)),
    ("2d_no_bias_sigmoid", "Conv2DTranspose", {"filters": 2, "kernel_size": 2, "strides": 2, "use_bias": False,
                                              "activation": "sigmoid"}, (2, 3, 3, 3)),
    ("1d_same_s2", "Conv1DTranspose", {"filters": 3, "kernel_size": 3, "strides": 2, "padding": "same"}, (2, 7, 4)),
    ("1d_valid", "Conv1DTranspose", {"filters": 2, "kernel_size": 4, "strides": 3}, (2, 5, 3)),
    ("1d_channels_first", "Conv1DTranspose", {"filters": 2, "kernel_size": 3, "strides": 2,
                                             "data_format": "channels_first"}, (2, 3, 6)),
    ("3d_same_s2", "Conv3DTranspose", {"filters": 2, "kernel_size": 3, "strides": 2, "padding": "same"},
     (1, 3, 4, 3, 2)),
    ("3d_valid", "Conv3DTranspose", {"filters": 3, "kernel_size": (2, 3, 2), "strides": (1, 2, 2)}, (2, 2, 3, 3, 2)),
]


def _inputs(label: str, cls: str, kwargs: dict, shape: tuple) -> dict:
    """Seeded input, kernel, bias and output cotangent for one case."""
    rng = np.random.default_rng(zlib.crc32(label.encode()))
    layer = getattr(layers, cls)(**kwargs)
    out_shape = layer.compute_output_shape(shape)
    rank = len(shape) - 2
    channels = shape[-1] if kwargs.get("data_format", "channels_last") == "channels_last" else shape[1]
    k = kwargs["kernel_size"]
    k = (k,) * rank if isinstance(k, int) else tuple(k)
    return {"x": rng.normal(size=shape).astype(np.float32),
            "kernel": rng.normal(size=k + (kwargs["filters"], channels)).astype(np.float32) * 0.5,
            "bias": rng.normal(size=(kwargs["filters"],)).astype(np.float32),
            "g": rng.normal(size=out_shape).astype(np.float32)}


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
    weights = [data[f"{label}/kernel"]] + ([data[f"{label}/bias"]] if kwargs.get("use_bias", True) else [])
    layer.set_weights(weights)
    out[f"{label}/shape"] = np.array(layer.compute_output_shape(tuple(shape)))
    def f(x, kernel, bias):
        vals = [kernel] + ([bias] if kwargs.get("use_bias", True) else [])
        y, _ = layer.stateless_call(vals, [], x)
        return jnp.sum(y * data[f"{label}/g"]), y
    (_, y), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(
        data[f"{label}/x"], data[f"{label}/kernel"], data[f"{label}/bias"])
    out[f"{label}/y"] = np.asarray(y)
    for name, g in zip(("x", "kernel", "bias"), grads):
        out[f"{label}/d{name}"] = np.asarray(g)
np.savez(f"{work}/out.npz", **out)
"""


@functools.lru_cache(maxsize=1)
def _keras_results() -> "dict | str":
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        return "real Keras 3 with JAX is not installed (test extra)"
    work = tempfile.mkdtemp(prefix="dnnbind_convT_")
    arrays = {f"{label}/{k}": v for label, cls, kw, shape in CASES for k, v in _inputs(label, cls, kw, shape).items()}
    np.savez(os.path.join(work, "in.npz"), **arrays)
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump([[label, cls, kw, list(shape)] for label, cls, kw, shape in CASES], f)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=os.path.join(work, "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    return {**dict(np.load(os.path.join(work, "out.npz"))), **{f"in:{k}": v for k, v in arrays.items()}}


@pytest.mark.parametrize("label,cls,kwargs,shape", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_keras(label, cls, kwargs, shape):
    theirs = _keras_results()
    if isinstance(theirs, str):
        pytest.skip(theirs)
    data = {k: theirs[f"in:{label}/{k}"] for k in ("x", "kernel", "bias", "g")}
    layer = getattr(layers, cls)(**kwargs)
    layer.build(shape)
    layer.set_weights([data["kernel"]] + ([data["bias"]] if kwargs.get("use_bias", True) else []))
    assert tuple(layer.compute_output_shape((None,) + shape[1:]))[1:] == tuple(theirs[f"{label}/shape"])[1:]
    x = ops.convert_to_tensor(data["x"])
    with GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        total = ops.sum(ops.multiply(y, data["g"]))
    np.testing.assert_allclose(np.asarray(y), theirs[f"{label}/y"], rtol=1e-4, atol=1e-5)
    targets = [x, layer.kernel] + ([layer.bias] if layer.bias is not None else [])
    grads = tape.gradient(total, targets)
    for name, g in zip(("x", "kernel", "bias"), grads):
        np.testing.assert_allclose(np.asarray(g), theirs[f"{label}/d{name}"], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{label}: gradient of {name}")


def test_config_round_trip_and_keras_names():
    layer = layers.Conv2DTranspose(8, (3, 2), strides=2, padding="same", output_padding=1, activation="relu",
                                   kernel_regularizer=keras.regularizers.L2(0.01), name="up")
    config = layer.get_config()
    assert config["kernel_size"] == [3, 2] and config["strides"] == [2, 2] and config["output_padding"] == [1, 1]
    assert config["activation"] == "relu" and config["kernel_regularizer"]["class_name"] == "L2"
    again = layers.Conv2DTranspose.from_config(config)
    assert again.get_config() == config
    assert layers.Convolution2DTranspose is layers.Conv2DTranspose
    assert layers.deserialize({"class_name": "Conv1DTranspose", "config": {"filters": 2, "kernel_size": 3}}).rank == 1


def test_regularizer_loss_and_constraint():
    layer = layers.Conv2DTranspose(2, 2, kernel_regularizer=keras.regularizers.L2(0.5),
                                   kernel_constraint=keras.constraints.NonNeg())
    layer(np.ones((1, 3, 3, 2), np.float32))
    want = 0.5 * float(np.sum(layer.kernel.numpy() ** 2))
    assert len(layer.losses) == 1
    np.testing.assert_allclose(float(np.asarray(layer.losses[0])), want, rtol=1e-5)
    assert isinstance(layer.kernel.constraint, keras.constraints.NonNeg)


def test_trains_in_a_sequential_model(rng):
    x = rng.normal(size=(16, 4, 4, 2)).astype(np.float32)
    target = np.repeat(np.repeat(x[..., :1], 2, axis=1), 2, axis=2)  # nearest upsampling: learnable
    model = keras.Sequential([keras.Input((4, 4, 2)), layers.Conv2DTranspose(1, 2, strides=2)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    history = model.fit(x, target, epochs=30, batch_size=8, verbose=0)
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < 0.05 * loss[0]
    assert model.predict(x, verbose=0).shape == (16, 8, 8, 1)


@pytest.mark.parametrize("kwargs,match", [
    ({"filters": 0, "kernel_size": 3}, "filters"),
    ({"filters": 2, "kernel_size": (3, 3, 3)}, "kernel_size"),
    ({"filters": 2, "kernel_size": 3, "padding": "causal"}, "padding"),
    ({"filters": 2, "kernel_size": 3, "strides": 0}, "strides"),
    ({"filters": 2, "kernel_size": 3, "output_padding": -1}, "output_padding"),
    ({"filters": 2, "kernel_size": 3, "data_format": "nhwc"}, "data_format"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        layers.Conv2DTranspose(**kwargs)


def test_wrong_rank_input_names_the_layer():
    layer = layers.Conv2DTranspose(2, 3, name="up")
    with pytest.raises(ValueError, match=r"Conv2DTranspose 'up' expects 4-d inputs.*\(2, 5, 3\)"):
        layer(np.zeros((2, 5, 3), np.float32))


@pytest.mark.parametrize("suffix", [".keras", ".dnnbind"])
def test_a_model_with_transposed_convolutions_saves_and_loads(rng, tmp_path, suffix):
    inputs = keras.Input((4, 4, 2))
    x = layers.Conv2DTranspose(3, 3, strides=2, padding="same", activation="relu")(inputs)
    outputs = layers.Conv1DTranspose(2, 2, strides=2)(layers.Reshape((64, 3))(x))
    model = keras.Model(inputs, outputs)
    path = tmp_path / f"m{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # .keras files keep no optimizer state (not compiled here)
        model.save(path)
    loaded = keras.models.load_model(path)
    x = rng.normal(size=(2, 4, 4, 2)).astype(np.float32)
    assert loaded.output_shape == (None, 128, 2)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
