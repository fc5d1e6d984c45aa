"""Regression tests of known bugs, one section per bug; each failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops


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
