"""``layers.Embedding`` on the NumPy backend: values and gradients against NumPy and against real Keras 3
(JAX backend, in a subprocess), masks, regularizer and constraint, config, and the errors for bad ids."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from dnnbind.autodiff import GradientTape


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def test_values_are_the_rows_of_the_table_for_ids_of_any_rank(rng):
    emb = layers.Embedding(7, 3)
    for shape in [(5,), (2, 4), (2, 3, 2)]:
        ids = rng.integers(0, 7, size=shape).astype(np.int64)
        out = emb(ids)
        table = emb.get_weights()[0]
        assert tuple(out.shape) == (*shape, 3) and str(out.dtype) == "float32"
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(out), table[ids])
    assert emb.compute_output_shape((None, 4)) == (None, 4, 3)
    assert [w.name for w in emb.weights] == ["embeddings"] and emb.weights[0].shape == (7, 3)


def test_default_initializer_is_keras_uniform():
    emb = layers.Embedding(200, 50)
    emb.build()
    w = emb.get_weights()[0]
    assert w.min() >= -0.05 and w.max() <= 0.05 and w.std() > 0.02  # RandomUniform(-0.05, 0.05)
    assert emb.get_config()["embeddings_initializer"]["class_name"] == "RandomUniform"


def test_gradient_adds_into_repeated_rows(rng):
    emb = layers.Embedding(5, 2)
    ids = np.array([[0, 3, 3], [1, 3, 0]], np.int32)
    g_out = rng.normal(size=(2, 3, 2)).astype(np.float32)
    emb(ids)
    with GradientTape() as tape:
        loss = ops.sum(emb(ids) * g_out)
    (grad,) = tape.gradient(loss, emb.trainable_weights)
    want = np.zeros((5, 2), np.float32)
    np.add.at(want, ids.reshape(-1), g_out.reshape(-1, 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(grad), want, rtol=1e-6)
    assert not want[2].any() and want[3].any()  # an id never taken gets no gradient


def test_mask_zero():
    emb = layers.Embedding(4, 2, mask_zero=True)
    ids = np.array([[1, 0, 3], [0, 0, 2]])
    out = emb(ids)
    want = ids != 0
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(emb.compute_mask(ids)), want)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out._keras_mask), want)
    assert layers.Embedding(4, 2).compute_mask(ids) is None and emb.supports_masking


def test_regularizer_and_constraint_reach_the_table():
    emb = layers.Embedding(6, 3, embeddings_initializer="ones", embeddings_regularizer=keras.regularizers.l2(0.5),
                           embeddings_constraint=keras.constraints.NonNeg())
    emb(np.array([1, 2]))
    assert len(emb.losses) == 1
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(emb.losses[0])), 0.5 * 18, rtol=1e-6)
    assert emb.embeddings.constraint is not None
    cfg = emb.get_config()
    assert cfg["embeddings_regularizer"]["class_name"] == "L2" and cfg["embeddings_constraint"]["class_name"] == "NonNeg"
    again = layers.Embedding.from_config(cfg)
    assert (again.input_dim, again.output_dim, again.mask_zero) == (6, 3, False)


def test_weights_argument_and_config_round_trip(rng):
    table = rng.normal(size=(4, 2)).astype(np.float32)
    emb = layers.Embedding(4, 2, weights=table, mask_zero=True, name="emb")
    assert emb.built
    np.testing.assert_array_equal(emb.get_weights()[0], table)
    cfg = emb.get_config()
    assert {k: cfg[k] for k in ("input_dim", "output_dim", "mask_zero", "name")} == {
        "input_dim": 4, "output_dim": 2, "mask_zero": True, "name": "emb"}
    with pytest.warns(UserWarning, match="input_length"):
        layers.Embedding(4, 2, input_length=3)


def test_bfloat16_policy_outputs_in_the_compute_dtype_and_keeps_a_float32_table():
    emb = layers.Embedding(4, 2, dtype="mixed_float16")
    out = emb(np.array([0, 1]))
    assert emb.weights[0].dtype == "float32"
    # on NumPy, mixed_float16 computes in float32 (see Layer._effective_compute_dtype); the policy is kept
    assert emb.compute_dtype == "float16" and str(out.dtype) in ("float16", "float32")


def test_whole_floats_are_cast_as_in_keras_and_fractions_refused():
    emb = layers.Embedding(5, 2)
    out = emb(np.array([[1.0, 4.0]], np.float32))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out), emb.get_weights()[0][[[1, 4]]])
    with pytest.raises(ValueError, match=r"Embedding 'embedding.*': inputs must be integer ids, got dtype float32 "
                                         r"holding 1.5 at flat position 1"):
        emb(np.array([[1.0, 1.5]], np.float32))
    with pytest.raises(TypeError, match=r"Embedding '.*': inputs must be integer ids, got dtype bool"):
        emb(np.array([True, False]))


def test_out_of_range_ids_name_the_layer():
    emb = layers.Embedding(5, 2, name="tokens")
    with pytest.raises(ValueError, match=r"Embedding 'tokens': ids must be in \[0, input_dim=5\), got 5 at flat "
                                         r"position 2 \(1 out of range\)"):
        emb(np.array([[0, 4, 5]]))
    with pytest.raises(ValueError, match=r"got -1 at flat position 0"):
        emb(np.array([-1, 2]))


@pytest.mark.parametrize("kwargs, match", [
    ({"input_dim": 0, "output_dim": 2}, r"Embedding '.*': input_dim must be"),
    ({"input_dim": 3, "output_dim": "2"}, r"Embedding '.*': output_dim must be"),
    ({"input_dim": 3, "output_dim": 2, "mask_zero": "yes"}, r"Embedding '.*': mask_zero must be"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        layers.Embedding(**kwargs)


def test_lora_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="lora_rank"):
        layers.Embedding(3, 2, lora_rank=4)


def test_trains_in_a_functional_model_and_saves(tmp_path, rng):
    inp = keras.Input((3,), dtype="int32")
    x = layers.Flatten()(layers.Embedding(10, 4, name="emb")(inp))
    model = keras.Model(inp, layers.Dense(1)(x))
    model.compile(keras.optimizers.Adam(0.05), "mse")
    ids = rng.integers(0, 10, size=(32, 3)).astype(np.int32)
    y = (ids.sum(axis=1, keepdims=True) / 15.0 - 1.0).astype(np.float32)
    h = model.fit(ids, y, epochs=15, batch_size=8, verbose=0)
    assert h.history["loss"][-1] < 0.5 * h.history["loss"][0]
    path = tmp_path / "m.keras"
    model.save(path)
    again = keras.models.load_model(path)
    np.testing.assert_allclose(again.predict(ids, verbose=0), model.predict(ids, verbose=0), rtol=1e-6)


_KERAS_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from keras import layers
work = sys.argv[1]
d = dict(np.load(f"{work}/in.npz"))
inp = keras.Input((2, 3), dtype="int32")
e = layers.Embedding(6, 4, embeddings_regularizer=keras.regularizers.l2(0.01))(inp)
out = layers.Dense(1)(layers.Flatten()(e))
model = keras.Model(inp, out)
model.set_weights([d["w0"], d["w1"], d["w2"]])
first = model.predict(d["x"], verbose=0)
model.compile(keras.optimizers.SGD(0.1), "mse")
losses = [float(model.train_on_batch(d["x"], d["y"])) for _ in range(3)]
np.savez(f"{work}/out.npz", *model.get_weights(), first=first, emb=layers.Embedding(6, 4, weights=d["w0"])(d["x"]))
json.dump(losses, open(f"{work}/losses.json", "w"))
"""


def test_matches_real_keras_values_and_training(rng, tmp_path):
    """Forward values, the loss with the table's L2 penalty and three SGD steps (so the gradients, repeated
    ids included) against Keras 3 on JAX."""
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    inp = keras.Input((2, 3), dtype="int32")
    e = layers.Embedding(6, 4, embeddings_regularizer=keras.regularizers.l2(0.01))(inp)
    model = keras.Model(inp, layers.Dense(1)(layers.Flatten()(e)))
    weights = [rng.normal(size=w.shape).astype(np.float32) * 0.5 for w in model.weights]
    model.set_weights(weights)
    x = rng.integers(0, 6, size=(5, 2, 3)).astype(np.int32)
    x[0, 0] = [2, 2, 2]  # repeated ids: their gradients add
    y = rng.normal(size=(5, 1)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, y=y, **{f"w{i}": w for i, w in enumerate(weights)})
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(model.predict(x, verbose=0), out["first"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layers.Embedding(6, 4, weights=weights[0])(x)), out["emb"],
                               rtol=0, atol=0)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    losses = [float(model.train_on_batch(x, y)) for _ in range(3)]
    np.testing.assert_allclose(losses, json.load(open(tmp_path / "losses.json")), rtol=2e-5)
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_allclose(w, out[f"arr_{i}"], rtol=1e-4, atol=1e-6)
