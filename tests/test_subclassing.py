"""Subclassed models (``class Net(keras.Model)`` with ``call``) on the NumPy backend: attribute tracking,
build on first call, the op-level tape's gradients against finite differences in float64 (a layer
applied twice, a residual sum through a layer), fit, keras.ops between layers (differentiated) and raw
kernels (refused), and weights saving. GPU part: a subclassed model's graph-replayed steps match eager ones.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision, kernels
from dnnbind.trainers.step_graphs import StepGraphs
from test_functional import check_gradients
from testutil import rel_error


def init(seed):
    return keras.initializers.GlorotUniform(seed)


class ResidualMLP(keras.Model):
    """Dense -> (shared Dense applied twice, tanh) + skip -> Dense(softmax)."""

    def __init__(self, seed=0, classes=3, **kwargs):
        super().__init__(**kwargs)
        self.inp = layers.Dense(5, activation="relu", kernel_initializer=init(seed))
        self.block = layers.Dense(5, activation="tanh", kernel_initializer=init(seed + 1),
                                  bias_initializer=init(seed + 4))
        self.add = layers.Add()
        self.head = layers.Dense(classes, activation="softmax", kernel_initializer=init(seed + 2))

    def call(self, inputs, training=False):
        x = self.inp(inputs)
        h = self.block(self.block(x))  # one layer, two applications
        return self.head(self.add([x, h]))


class TwoTower(keras.Model):
    """Two inputs, a nested Sequential, a list of layers, two outputs; call without a training argument."""

    def __init__(self):
        super().__init__(name="towers")
        self.towers = [layers.Dense(4, activation="relu", kernel_initializer=init(1)),
                       layers.Dense(4, activation="relu", kernel_initializer=init(2))]
        self.trunk = keras.Sequential([layers.Dense(4, activation="tanh", kernel_initializer=init(3))])
        self.add = layers.Add()
        self.out_a = layers.Dense(2, kernel_initializer=init(4))
        self.out_b = layers.Dense(1, kernel_initializer=init(5))

    def call(self, inputs):
        a, b = inputs
        h = self.add([self.towers[0](a), self.towers[1](b)])
        h = self.trunk(h)
        return [self.out_a(h), self.out_b(h)]


def test_layers_are_tracked_and_the_model_builds_on_first_call(cpu, rng):
    model = ResidualMLP()
    assert [layer.name for layer in model.layers] == [model.inp.name, model.block.name, model.add.name,
                                                      model.head.name]
    assert not model.built and model.weights == []
    x = rng.normal(size=(4, 6)).astype(np.float32)
    y = model(x)  # builds, then computes eagerly (inference)
    assert model.built and y.shape == (4, 3) and np.allclose(y.sum(axis=1), 1.0, atol=1e-6)
    assert model.count_params() == 6 * 5 + 5 + 5 * 5 + 5 + 5 * 3 + 3
    assert model.input_shape == (None, 6) and model.output_shape == (None, 3)
    model.summary(print_fn=lambda line: None)
    other = ResidualMLP(seed=1)
    other.build((None, 6))
    other.set_weights(model.get_weights())
    assert np.allclose(other.predict(x, verbose=0), y, atol=1e-6)
    towers = TwoTower()
    assert len(towers._flat_layers()) == 6  # the list's layers and the nested Sequential's are flattened


def test_tape_gradients_match_finite_differences(cpu, rng):
    mixed_precision.set_global_policy("float64")
    model = ResidualMLP(seed=3)
    model.compile("sgd", "sparse_categorical_crossentropy")
    x = rng.normal(size=(5, 6))
    y = rng.integers(0, 3, 5).astype(np.int32)
    model.build((None, 6))
    assert model._fused_outputs() == [False]  # call() is opaque: its softmax runs, and its backward too

    grads = check_gradients(model, [x], [y], rng, per_weight=10)
    assert len(grads) == 6


def test_fit_trains_a_subclassed_model(cpu, rng):
    model = ResidualMLP(seed=5)
    model.compile(keras.optimizers.Adam(0.02), "sparse_categorical_crossentropy", metrics=["accuracy"])
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    h = model.fit(x, y, batch_size=16, epochs=15, verbose=0, seed=0, validation_split=0.25)
    assert h.history["loss"][-1] < 0.6 * h.history["loss"][0]
    assert h.history["accuracy"][-1] > 0.7 and "val_accuracy" in h.history
    assert model.optimizer.iterations == 15 * 5


def test_multi_input_multi_output_subclassed_model_trains(cpu, rng):
    model = TwoTower()
    model.compile(keras.optimizers.Adam(0.03), loss=["mse", "mse"])
    a = rng.normal(size=(64, 3)).astype(np.float32)
    b = rng.normal(size=(64, 2)).astype(np.float32)
    ya = np.stack([a[:, 0] + b[:, 0], a[:, 1]], axis=1).astype(np.float32)
    yb = (a[:, 2] - b[:, 1])[:, None].astype(np.float32)
    h = model.fit([a, b], [ya, yb], batch_size=16, epochs=20, verbose=0, seed=0)
    assert model.output_names == ["output_1", "output_2"]
    assert h.history["loss"][-1] < 0.5 * h.history["loss"][0]
    assert {"output_1_loss", "output_2_loss"} <= set(h.history)
    pa, pb = model.predict([a, b], verbose=0)
    assert pa.shape == (64, 2) and pb.shape == (64, 1)


def test_a_computation_between_layers_in_ops_is_differentiated(cpu, rng):
    class Doubling(keras.Model):
        def __init__(self):
            super().__init__()
            self.d1 = layers.Dense(4, activation="tanh", kernel_initializer=init(0))
            self.d2 = layers.Dense(2, kernel_initializer=init(1))

        def call(self, x, training=False):
            h = self.d1(x)
            return self.d2(h * 2.0 + keras.ops.square(h)) * 3.0  # ops between and after the layers

    mixed_precision.set_global_policy("float64")
    model = Doubling()
    model.compile("sgd", "mse")
    x = rng.normal(size=(5, 3))
    y = rng.normal(size=(5, 2))
    model.build((None, 3))
    grads = check_gradients(model, [x], [y], rng, per_weight=8)
    assert len(grads) == 4
    before = model.get_weights()
    model.train_on_batch(x, y)
    assert not any(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_a_kernel_given_a_tensor_says_to_use_the_ops(cpu, rng):
    class Scaled(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = layers.Dense(2, kernel_initializer=init(0))

        def call(self, x, training=False):
            return kernels.scale(self.d(x), 3.0)  # a raw primitive: not differentiable, so refused

    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 2)).astype(np.float32)
    model = Scaled()
    model.compile("sgd", "mse")
    with pytest.raises(TypeError, match=r"takes raw arrays .* got a dnnbind.Tensor.*dnnbind.ops"):
        model.train_on_batch(x, y)


def test_save_and_load_weights_and_errors(cpu, rng, tmp_path):
    model, other = ResidualMLP(seed=6), ResidualMLP(seed=7)
    x = rng.normal(size=(4, 6)).astype(np.float32)
    model(x)
    other(x)
    model.save_weights(tmp_path / "w.safetensors")
    other.load_weights(tmp_path / "w.safetensors")
    assert np.allclose(other.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-7)
    with pytest.raises(NotImplementedError, match="define call"):
        keras.Model().predict(x, verbose=0)
    with pytest.raises(TypeError, match="unexpected arguments"):
        keras.Model(3)
    out = model(keras.Input((6,)))  # a model called on symbolic tensors is a node of a functional graph
    assert out.shape == (None, 3)


def test_fake_graph_steps_of_a_subclassed_model_match_eager(cpu, rng):
    from test_graph_step import FakeBackend

    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    graphed, eager = ResidualMLP(seed=8), ResidualMLP(seed=9)
    graphed.build((None, 6))
    eager.build((None, 6))
    eager.set_weights(graphed.get_weights())
    for m, jit in ((graphed, "auto"), (eager, False)):
        m.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy", jit_compile=jit)
    graphed._step_graphs = StepGraphs(FakeBackend(graphed))
    hg = graphed.fit(x, y, batch_size=8, epochs=3, verbose=0, seed=1)
    he = eager.fit(x, y, batch_size=8, epochs=3, verbose=0, seed=1)
    assert hg.history == he.history
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        assert np.array_equal(a, b)
    assert graphed._step_graphs.stats["replays"] == 13


@pytest.mark.gpu
def test_gpu_subclassed_model_graphs_match_eager():
    dnnbind.set_default_device("cuda")
    try:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64, 6)).astype(np.float32)
        y = rng.integers(0, 3, 64)
        with kernels.config.override(allow_tf32=False, deterministic=True):
            graphed, eager = ResidualMLP(seed=10), ResidualMLP(seed=11)
            graphed.build((None, 6))
            eager.build((None, 6))
            eager.set_weights(graphed.get_weights())
            graphed.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
            eager.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", jit_compile=False)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no "could not be captured" fallback
                hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=2)
            he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=2)
        stats = graphed._step_graphs.stats
        assert stats["failures"] == 0 and stats["replays"] >= 3 * 4 - 2
        assert np.allclose(hg.history["loss"], he.history["loss"], rtol=1e-5, atol=1e-6)
        for a, b in zip(graphed.get_weights(), eager.get_weights()):
            assert rel_error(a, b) < 1e-5
    finally:
        dnnbind.set_default_device(None)
