"""Cross-entropies over outputs with more axes than ``(batch, classes)`` (a sequence of distributions, as a
language model's ``(batch, time, vocab)``), a loss given for only some outputs (``loss=[fn, None]`` with one
target array, Keras 3's "partially defined" losses), and Inputs with a variable-length axis
(``Input(shape=(None,))``) fed arrays of different lengths."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from dnnbind.autodiff import GradientTape
from testutil import rel_error


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_crossentropy_of_a_sequence_is_the_mean_over_positions(rng, from_logits, weighted):
    n, t, c = 3, 5, 7
    z = rng.normal(size=(n, t, c))
    labels = rng.integers(0, c, size=(n, t))
    w = rng.uniform(0.5, 2.0, size=(n,)) if weighted else None
    pred = z if from_logits else np.exp(_log_softmax(z))
    per = -np.take_along_axis(_log_softmax(z), labels[..., None], -1)[..., 0]      # (n, t)
    expected = (per * (1.0 if w is None else w[:, None])).sum() / (n * t)          # sum_over_batch_size
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
    x = ops.convert_to_tensor(pred)
    with GradientTape() as tape:
        tape.watch(x)
        value = loss_fn(labels, x, sample_weight=w)
    assert rel_error(float(ops.convert_to_numpy(value)), expected) < 1e-6  # the fused kernel sums in float32
    g = ops.convert_to_numpy(tape.gradient(value, x))
    if from_logits:  # d/dz of the weighted mean: w (softmax - onehot) / (n t)
        onehot = np.eye(c)[labels]
        want = (np.exp(_log_softmax(z)) - onehot) * (1.0 if w is None else w[:, None, None]) / (n * t)
        assert rel_error(g, want) < 1e-6
    else:
        assert g.shape == (n, t, c) and np.abs(g).max() > 0


def test_categorical_crossentropy_of_a_sequence_with_one_hot_labels(rng):
    n, t, c = 2, 4, 5
    z = rng.normal(size=(n, t, c))
    labels = rng.integers(0, c, size=(n, t))
    onehot = np.eye(c)[labels]
    value = keras.losses.CategoricalCrossentropy(from_logits=True)(onehot, z)
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, z)
    assert rel_error(float(ops.convert_to_numpy(value)), float(ops.convert_to_numpy(sparse))) < 1e-12


def test_sparse_labels_of_a_sequence_output_are_checked(rng):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(ValueError, match=r"labels must be integer class indices of shape \(batch, 4\)"):
        loss_fn.prepare_labels(np.zeros((2, 3), np.int32), (4, 6))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 6\)"):
        loss_fn.prepare_labels(np.full((2, 4), 6), (4, 6))
    assert loss_fn.prepare_labels(np.ones((2, 4, 1)), (4, 6)).shape == (2, 4)


def test_a_language_model_trains_on_a_sequence_of_class_distributions_as_keras(rng):
    """fit of (batch, time, vocab) logits with (batch, time) labels: the loss is the per-position mean, as
    model.evaluate recomputes it by hand from predict."""
    keras.utils.set_random_seed(0)
    vocab, t = 11, 6
    inp = keras.Input((t,), dtype="int32")
    out = layers.Dense(vocab)(layers.Embedding(vocab, 8)(inp))
    model = keras.Model(inp, out)
    model.compile("adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.integers(0, vocab, size=(64, t)).astype(np.int32)
    y = (x + 1) % vocab
    hist = model.fit(x, y, epochs=4, batch_size=16, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    logits = model.predict(x, verbose=0)
    by_hand = -np.take_along_axis(_log_softmax(logits.astype(np.float64)), y[..., None], -1).mean()
    assert abs(model.evaluate(x, y, verbose=0) - by_hand) < 1e-5


@pytest.mark.parametrize("as_list", [False, True])
def test_a_loss_for_some_outputs_takes_targets_for_those_only(rng, as_list):
    """Keras 3: ``loss=[fn, None]`` with a single y (or a list of one) gives y to the first output."""
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,))
    h = layers.Dense(3, name="hidden")(inp)
    out = layers.Dense(1, name="head")(h)
    model = keras.Model(inp, [out, h])
    model.compile("sgd", loss=["mse", None])
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    hist = model.fit(x, [y] if as_list else y, epochs=3, batch_size=8, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    with pytest.raises(ValueError, match="y must be a list of 2 arrays"):
        model.fit(x, [y, y, y], epochs=1, verbose=0)


def test_an_input_with_a_variable_length_axis_takes_any_length(rng):
    inp = keras.Input((None,), dtype="int32")
    out = layers.GlobalAveragePooling1D()(layers.Embedding(20, 4)(inp))
    model = keras.Model(inp, layers.Dense(1)(out))
    model.compile("sgd", loss="mse")
    for length in (7, 12):
        x = rng.integers(0, 20, size=(8, length)).astype(np.int32)
        assert model.predict(x, verbose=0).shape == (8, 1)
        model.fit(x, rng.normal(size=(8, 1)).astype(np.float32), verbose=0)
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, None\)"):
        model.predict(rng.integers(0, 20, size=(8, 3, 2)).astype(np.int32), verbose=0)
