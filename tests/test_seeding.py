"""``dnnbind.utils.set_random_seed``: Keras 3's reproducibility promise.

After ``set_random_seed(s)`` every unseeded source of randomness draws its seed from dnnbind's
seed generator: initialisers and ``Dropout`` layers when created, ``kernels.DropoutState`` (the
NumPy masks and the cuDNN dropout states) when created, ``kernels.random_crop_flip`` per call and
``fit``'s shuffling per call. Re-seeding and repeating the same work repeats it bit for bit;
without re-seeding, two models differ.

GPU part (``@pytest.mark.gpu``): two whole ``fit`` runs with ``kernels.config.deterministic = True``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import initializers, layers, kernels
from dnnbind.utils import draw_seed, set_random_seed


def _model(dropout_seed=None):
    return keras.Sequential([
        keras.Input((6,)),
        layers.Dense(16, activation="relu"),
        layers.Dropout(0.3, seed=dropout_seed),
        layers.Dense(8, activation="tanh", kernel_initializer="he_normal"),
        layers.Dense(3, activation="softmax", kernel_initializer=initializers.RandomNormal(stddev=0.3)),
    ])


def _data(n=96):
    rng = np.random.default_rng(5)  # fixed data: only dnnbind's own randomness varies below
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n)


def _fit(seed, **fit_kw):
    """Build, compile and fit a model after ``set_random_seed(seed)``; weights and loss history."""
    set_random_seed(seed)
    model = _model()
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = _data()
    history = model.fit(x, y, batch_size=16, epochs=3, validation_split=0.25, shuffle=True, verbose=0, **fit_kw)
    return model.get_weights(), history.history


def test_set_random_seed_seeds_python_numpy_and_dnnbind():
    draws = []
    for _ in range(2):
        set_random_seed(123)
        draws.append((random.random(), np.random.random(), draw_seed(), draw_seed()))
    assert draws[0] == draws[1]
    assert draws[0][2] != draws[0][3]  # a stream, not one value
    set_random_seed(124)
    assert draw_seed() != draws[0][2]


def test_set_random_seed_rejects_what_numpy_cannot_take():
    with pytest.raises(TypeError, match="set_random_seed: seed must be an int, got float"):
        set_random_seed(1.5)
    with pytest.raises(TypeError, match="seed must be an int"):
        set_random_seed(True)
    with pytest.raises(ValueError, match=r"set_random_seed: seed must be in \[0, 2\*\*32\), got -1"):
        set_random_seed(-1)


@pytest.mark.parametrize("name", ["glorot_uniform", "he_normal", "lecun_uniform", "random_normal",
                                  "random_uniform", "truncated_normal"])
def test_unseeded_initialisers_follow_the_global_seed(name):
    shape = (7, 5)
    set_random_seed(9)
    a = initializers.get(name)(shape)
    set_random_seed(9)
    b = initializers.get(name)(shape)
    c = initializers.get(name)(shape)  # no re-seed: a new draw
    assert np.array_equal(a, b) and not np.array_equal(b, c)
    assert np.unique(a).size == a.size  # real random values, not a constant
    assert initializers.get(name).get_config().get("seed") is None  # the config still says "unseeded"


def test_seeded_initialisers_ignore_the_global_seed():
    set_random_seed(1)
    a = initializers.GlorotUniform(seed=42)((4, 4))
    set_random_seed(2)
    b = initializers.GlorotUniform(seed=42)((4, 4))
    assert np.array_equal(a, b)


def test_models_built_after_the_same_seed_have_the_same_weights():
    set_random_seed(1)
    a = _model().get_weights()
    set_random_seed(1)
    b = _model().get_weights()
    c = _model().get_weights()
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    kernels = [i for i, w in enumerate(a) if w.ndim == 2]
    assert len(kernels) == 3 and all(not np.array_equal(b[i], c[i]) for i in kernels)


def test_dropout_states_and_masks_follow_the_global_seed(rng):
    x = rng.normal(size=(64, 32)).astype(np.float32) + 3.0  # nonzero everywhere: zeros are the mask
    masks = []
    for _ in range(2):
        set_random_seed(4)
        state = kernels.DropoutState(0.5)
        masks.append([kernels.dropout_forward(x, state)[0] != 0 for _ in range(2)])
    (a1, a2), (b1, b2) = masks
    assert np.array_equal(a1, b1) and np.array_equal(a2, b2)
    assert not np.array_equal(a1, a2)  # the stream advances between calls
    assert 0.4 < a1.mean() < 0.6
    set_random_seed(4)
    seeds = [kernels.DropoutState(0.5).seed, kernels.DropoutState(0.5).seed]
    set_random_seed(4)
    assert [kernels.DropoutState(0.5).seed, kernels.DropoutState(0.5).seed] == seeds and seeds[0] != seeds[1]
    # the layer draws its seed when created (as Keras), and the state it makes uses it
    set_random_seed(4)
    layer = layers.Dropout(0.5)
    assert layer.seed is None and layer._seed == seeds[0]
    layer.forward(x, training=True)
    assert layer._state.seed == seeds[0]


def test_random_crop_flip_follows_the_global_seed(rng):
    x = rng.normal(size=(6, 3, 8, 8)).astype(np.float32)
    outs = []
    for _ in range(2):
        set_random_seed(11)
        outs.append([kernels.random_crop_flip(x, padding=2) for _ in range(2)])
    (a1, a2), (b1, b2) = outs
    assert np.array_equal(a1, b1) and np.array_equal(a2, b2)
    assert not np.array_equal(a1, a2) and not np.array_equal(a1, x)


def test_fit_shuffling_follows_the_global_seed():
    """No dropout here: only the shuffle order differs between the runs compared."""
    x, y = _data()
    weights = []
    for seed, shuffle in ((3, True), (3, True), (4, True), (3, False)):
        set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        set_random_seed(seed)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=shuffle, verbose=0)
        weights.append(model.get_weights()[0])
    same, other_seed, unshuffled = weights[1], weights[2], weights[3]
    assert np.array_equal(weights[0], same)
    assert not np.array_equal(same, other_seed) and not np.array_equal(same, unshuffled)


def test_two_whole_fits_after_the_same_seed_are_bitwise_equal():
    """Initialisation, dropout masks and shuffling all come from the seed (NumPy backend)."""
    with kernels.config.override(deterministic=True):
        w1, h1 = _fit(21)
        w2, h2 = _fit(21)
        w3, h3 = _fit(22)
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2))
    assert h1 == h2 and set(h1) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert not any(np.array_equal(a, b) for a, b in zip(w1, w3) if a.ndim == 2)


def test_dropout_masks_differ_with_the_seed_only():
    """Same weights and shuffling, different dropout seeds: different training; same seeds: same."""
    x, y = _data()
    set_random_seed(0)
    start = _model().get_weights()
    results = []
    for dropout_seed in (1, 1, 2):
        model = _model(dropout_seed=dropout_seed)
        model.set_weights(start)
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        results.append(model.get_weights()[0])
    assert np.array_equal(results[0], results[1]) and not np.array_equal(results[0], results[2])


# ==================================================================================== GPU
@pytest.fixture
def gpu():
    dnnbind.set_default_device("cuda")
    yield
    dnnbind.set_default_device(None)


def _gpu_fit(seed, jit_compile):
    set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu"),
        layers.BatchNormalization(),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(16, activation="relu"),
        layers.Dropout(0.4),
        layers.Dense(5, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(160, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, len(x))
    history = model.fit(x, y, batch_size=16, epochs=3, validation_split=0.2, shuffle=True, verbose=0)
    dropout = model.layers[-2]
    return model.get_weights(), history.history, dropout._state.seed, model


@pytest.mark.gpu
@pytest.mark.parametrize("jit_compile", [True, False])
def test_gpu_two_whole_fits_after_the_same_seed_are_bitwise_equal(gpu, jit_compile):
    """cuDNN dropout states are seeded (cudnnSetDropoutDescriptor) from the seeded generator."""
    with kernels.config.override(allow_tf32=False, deterministic=True):
        w1, h1, s1, m1 = _gpu_fit(31, jit_compile)
        w2, h2, s2, _ = _gpu_fit(31, jit_compile)
        w3, _, s3, _ = _gpu_fit(32, jit_compile)
    if jit_compile:
        assert m1._step_graphs.stats["replays"] > 0
    assert s1 == s2 != s3
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2)), "two seeded runs differ"
    assert h1 == h2
    assert not any(np.array_equal(a, b) for a, b in zip(w1, w3) if a.ndim > 1)
