"""Regression tests of known bugs, one section per bug; each failed before its fix."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops


def _run_keras(script: str, work, backend: str = "numpy") -> None:
    """Run ``script`` (argv[1]: ``work``) under real Keras 3 in a subprocess; skip when Keras is not installed."""
    if importlib.util.find_spec("keras") is None:
        pytest.skip("real Keras is not installed")
    proc = subprocess.run([sys.executable, "-c", script, str(work)], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": backend}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture
def rng():
    return np.random.default_rng(20261203)


# ------------------------------------------------------- 1. strided (non-contiguous) NumPy inputs
def test_repeat_vector_of_a_strided_numpy_column(rng):
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    col = x[:, 1]  # a view with strides (48, 4): not C-contiguous
    assert not col.flags.c_contiguous
    got = np.asarray(layers.RepeatVector(3)(col))
    np.testing.assert_array_equal(got, np.repeat(col[:, None, :], 3, axis=1))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_ops_repeat_of_strided_views(rng, axis):
    x = rng.normal(size=(3, 6, 2)).astype("float32")
    for view in (x[:, ::2], x.transpose(2, 0, 1), x[::-1, 1:5, :1]):
        got = np.asarray(ops.repeat(view, 2, axis=axis))
        np.testing.assert_array_equal(got, np.repeat(view, 2, axis=axis))


def test_broadcast_to_and_the_gradient_of_a_strided_view(rng):
    x = rng.normal(size=(4, 3)).astype("float64")
    view = x.T[:, 1:2]  # shape (3, 1), strides (8, 24)
    np.testing.assert_array_equal(np.asarray(ops.broadcast_to(view, (2, 3, 5))), np.broadcast_to(view, (2, 3, 5)))
    v = keras.Variable(np.ones((3, 5)))
    with keras.GradientTape() as tape:
        y = ops.sum(ops.broadcast_to(view, (3, 5)) * v)
    np.testing.assert_allclose(np.asarray(tape.gradient(y, v)), np.broadcast_to(view, (3, 5)))
    np.testing.assert_allclose(float(y), float((np.broadcast_to(view, (3, 5))).sum()))


def test_strided_copy_twin_reads_a_strided_numpy_base_in_c_order(rng):
    from dnnbind.kernels import numeric as N
    x = rng.normal(size=(4, 6)).astype("float32")[:, ::2]  # (4, 3), not contiguous
    got = N.strided_copy(x, (3, 4), (1, 3), 0)  # its transpose, in C-order element positions
    np.testing.assert_array_equal(got, x.T)


def test_convert_to_tensor_with_a_dtype_of_a_strided_view(rng):
    x = rng.normal(size=(3, 4)).astype("float32")
    t = ops.convert_to_tensor(x[:, ::2], dtype="float32")
    np.testing.assert_array_equal(np.asarray(ops.repeat(t, 2, axis=0)), np.repeat(x[:, ::2], 2, axis=0))


# ------------------------------------------------- 2. a one-output Functional rebuilt from its config
@pytest.mark.parametrize("listed", [False, True])
def test_a_one_output_model_from_its_config_returns_a_tensor(rng, listed, tmp_path):
    x = rng.normal(size=(3, 4)).astype("float32")
    i = keras.Input((4,))
    o = layers.Dense(2, name="d")(i)
    model = keras.Model(i, [o] if listed else o)
    config = model.get_config()
    # Keras's forms: a bare tensor's ref bare, a list of one as a list
    assert config["output_layers"] == ([["d", 0, 0]] if listed else ["d", 0, 0])
    assert config["input_layers"] == [config["layers"][0]["name"], 0, 0]
    rebuilt = keras.Model.from_config(config)
    rebuilt.set_weights(model.get_weights())
    y = rebuilt(x)
    assert not isinstance(y, (list, tuple, dict)) and tuple(y.shape) == (3, 2)
    assert isinstance(rebuilt.outputs, list) and len(rebuilt.outputs) == 1
    np.testing.assert_allclose(np.asarray(y), np.asarray(model(x)), rtol=1e-6)
    assert rebuilt.get_config()["output_layers"] == config["output_layers"]
    assert not isinstance(model(x), (list, tuple))  # Keras's unpack_singleton, also for outputs=[o]
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    y = loaded(x)
    assert not isinstance(y, (list, tuple)) and len(loaded.outputs) == 1
    np.testing.assert_allclose(np.asarray(y), np.asarray(model(x)), rtol=1e-6)
    assert loaded.get_config()["output_layers"] == config["output_layers"]


# ------------------------------------------ 3. load_model of a Sequential with layers written in ops
@pytest.mark.parametrize("make, shape", [
    (lambda: layers.Conv2DTranspose(4, 3, strides=2, padding="same"), (8, 8, 3)),
    (lambda: layers.Conv1DTranspose(2, 3, strides=2), (7, 3)),
    (lambda: layers.Conv3D(2, 2), (4, 4, 4, 2)),
    (lambda: layers.SeparableConv1D(3, 3, depth_multiplier=2), (6, 2)),
])
def test_load_model_of_a_sequential_with_an_ops_layer(rng, tmp_path, make, shape):
    model = keras.Sequential([keras.Input(shape), make(), layers.Flatten(), layers.Dense(2)])
    x = rng.normal(size=(2, *shape)).astype("float32")
    want = np.asarray(model(x))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert [w.shape for w in loaded.weights] == [w.shape for w in model.weights]
    np.testing.assert_allclose(np.asarray(loaded(x)), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="max_weight_bytes"):  # still sized before anything is allocated
        keras.saving.load_model(tmp_path / "m.keras", max_weight_bytes=8)


_KERAS_CONV_T = r"""
import sys, numpy as np, keras
work = sys.argv[1]
m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same")])
x = np.random.default_rng(3).normal(size=(2, 8, 8, 3)).astype("float32")
m.save(f"{work}/k.keras")
np.savez(f"{work}/k.npz", x=x, y=np.asarray(m(x)))
"""


def test_load_model_of_a_keras_written_conv2d_transpose(tmp_path):
    _run_keras(_KERAS_CONV_T, tmp_path)
    ref = np.load(tmp_path / "k.npz")
    loaded = keras.saving.load_model(tmp_path / "k.keras")
    np.testing.assert_allclose(np.asarray(loaded(ref["x"])), ref["y"], rtol=1e-5, atol=1e-5)
