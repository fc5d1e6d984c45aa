"""Custom layers, losses, metrics, train_step overrides, GradientTape and nested models (issue 22), on the
NumPy backend: gradients against float64 finite differences and against real Keras 3 (JAX backend, in a
subprocess), and training that learns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, mixed_precision, ops
from dnnbind.autodiff import GradientTape
from testutil import numerical_grad


@pytest.fixture(autouse=True)
def _cpu():
    keras.set_default_device("cpu")
    yield
    keras.set_default_device(None)
    mixed_precision.set_global_policy("float32")


class Linear(layers.Layer):
    """The Keras guide's custom layer: ``inputs @ w + b`` written in ops."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        assert input_shape[0] is None or isinstance(input_shape[0], int)  # Keras shapes: with the batch axis
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="random_normal", name="w")
        self.b = self.add_weight(shape=(self.units,), initializer="random_normal", name="b")

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class Block(layers.Layer):
    """A layer with sublayers, an add_loss and a non-trainable state updated in call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = Linear(3)
        self.dense = layers.Dense(3, activation="tanh")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x, training=None):
        h = self.dense(self.inner(x))
        self.add_loss(0.01 * ops.sum(ops.square(h)))
        if training:
            self.calls.assign_add(1.0)
        return h * ops.sigmoid(h) + x[..., :3] ** 2


def test_a_custom_layer_tracks_weights_and_sublayers():
    block = Block()
    y = block(np.ones((2, 5), np.float32))
    assert y.shape == (2, 3) and isinstance(y, keras.Tensor)
    names = [w.path for w in block.trainable_weights]
    assert names == [f"{block.inner.name}/w", f"{block.inner.name}/b", f"{block.dense.name}/kernel",
                     f"{block.dense.name}/bias"]
    assert [w.name for w in block.non_trainable_weights] == ["calls"]
    assert len(block.losses) == 1 and block.count_params() == 5 * 3 + 3 + 3 * 3 + 3 + 1


def _fd_check(f, arrays, grads, tol=1e-6):
    for a, g in zip(arrays, grads):
        num = numerical_grad(f, a)
        assert np.abs(np.asarray(g) - num).max() <= tol * max(1.0, np.abs(num).max()), (np.asarray(g), num)


def test_a_scalar_weight_stays_0_d_through_get_and_set_weights():
    block = Block()
    block.build((None, 5))
    assert block.calls.shape == () and np.shape(block.calls.numpy()) == ()
    values = block.get_weights()
    assert [np.shape(v) for v in values][0] == ()
    values[0] = np.float32(7.0)
    block.set_weights(values)
    assert float(block.calls.numpy()) == 7.0 and np.shape(block.calls.numpy()) == ()


def test_gradients_of_a_custom_layer_and_its_losses_match_finite_differences(rng):
    mixed_precision.set_global_policy("float64")
    block = Block()
    x = rng.normal(size=(4, 5))
    block(x)  # build
    weights = block.trainable_weights
    r = rng.normal(size=(4, 3))

    def loss_value():
        out = block(x, training=False)
        return ops.sum(out * r) + sum(block.losses)

    with GradientTape() as tape:
        loss = loss_value()
    grads = tape.gradient(loss, weights)
    arrays = [w.value for w in weights]  # NumPy: the weights' own arrays, perturbed in place
    _fd_check(lambda: float(loss_value()), arrays, grads)


def test_gradient_tape_watch_persistent_and_higher_order():
    x = ops.convert_to_tensor(np.array([0.5, -1.2, 2.0]))
    with GradientTape(persistent=True) as outer:
        outer.watch(x)
        with GradientTape() as inner:
            inner.watch(x)
            y = ops.sum(ops.sin(x) * x ** 2)
        dy = inner.gradient(y, x)  # recorded by the outer tape: differentiable again
        z = ops.sum(dy)
    d2 = outer.gradient(z, x)
    xs = np.array([0.5, -1.2, 2.0])
    np.testing.assert_allclose(np.asarray(dy), np.cos(xs) * xs ** 2 + 2 * xs * np.sin(xs), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(d2), -np.sin(xs) * xs ** 2 + 4 * xs * np.cos(xs) + 2 * np.sin(xs),
                               rtol=1e-12)
    again = outer.gradient(z, x)  # persistent: a second call works
    np.testing.assert_allclose(np.asarray(again), np.asarray(d2))
    with GradientTape() as once:
        once.watch(x)
        w = ops.sum(x * x)
    once.gradient(w, x)
    with pytest.raises(RuntimeError, match="non-persistent GradientTape can only be used to compute one set"):
        once.gradient(w, x)


def test_unconnected_sources_and_stop_gradient():
    a = keras.Variable(np.ones(3, np.float32))
    b = keras.Variable(np.ones(3, np.float32) * 2)
    with GradientTape() as tape:
        y = ops.sum(a * ops.stop_gradient(b * 3.0))
    ga, gb = tape.gradient(y, [a, b])
    np.testing.assert_array_equal(np.asarray(ga), np.full(3, 6.0))
    assert gb is None
    with GradientTape() as tape:
        y = ops.sum(a * 2.0)
    assert tape.gradient(y, [a, b], unconnected_gradients="zero")[1].numpy().tolist() == [0.0, 0.0, 0.0]


def test_custom_gradient_and_function():
    @ops.custom_gradient
    def clipped_identity(x):
        def grad(upstream):
            return ops.clip(upstream, -1.0, 1.0)
        return x, grad

    class Cube(keras.autodiff.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3.0 * x ** 2

    x = ops.convert_to_tensor(np.array([0.5, 2.0], np.float32))
    with GradientTape() as tape:
        tape.watch(x)
        y = ops.sum(clipped_identity(x) * 5.0 + Cube.apply(x))
    np.testing.assert_allclose(np.asarray(tape.gradient(y, x)), [1.0 + 0.75, 1.0 + 12.0], rtol=1e-6)


class VAELikeModel(keras.Model):
    """A custom train_step with its own trackers, as keras.io's examples write them."""

    def __init__(self):
        super().__init__()
        self.enc = layers.Dense(8, activation="relu")
        self.dec = layers.Dense(4)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_tracker = keras.metrics.Mean(name="mae")

    def call(self, x):
        return self.dec(self.enc(x))

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_tracker]

    def train_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        with keras.GradientTape() as tape:
            recon = self(x, training=True)
            loss = ops.mean(ops.sum(ops.square(recon - x), axis=-1))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.loss_tracker.update_state(loss)
        self.mae_tracker.update_state(ops.mean(ops.abs(recon - x)))
        return {m.name: m.result() for m in self.metrics}


def test_a_custom_train_step_trains_and_logs_its_metrics(rng):
    x = rng.normal(size=(128, 4)).astype(np.float32)
    model = VAELikeModel()
    model.compile(optimizer=keras.optimizers.Adam(0.02))  # no loss: the step computes its own
    h = model.fit(x, epochs=10, batch_size=32, verbose=0)
    assert set(h.history) == {"loss", "mae"}
    assert h.history["loss"][-1] < 0.4 * h.history["loss"][0]


def test_a_gan_step_with_two_optimizers_and_trainable_toggled(rng):
    gen = keras.Sequential([keras.Input((2,)), layers.Dense(8, activation="relu"), layers.Dense(2)])
    disc = keras.Sequential([keras.Input((2,)), layers.Dense(8, activation="relu"), layers.Dense(1)])

    class GAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.gen, self.disc = gen, disc
            self.g_opt = keras.optimizers.Adam(0.01)
            self.d_opt = keras.optimizers.Adam(0.01)

        def train_step(self, data):
            real = data[0] if isinstance(data, tuple) else data
            noise = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(real.shape[0], 2)).astype("float32"))
            with keras.GradientTape() as tape:
                fake = self.gen(noise)
                d_loss = ops.mean(ops.softplus(self.disc(fake))) + ops.mean(ops.softplus(-self.disc(real)))
            d_grads = tape.gradient(d_loss, self.disc.trainable_weights)
            self.d_opt.apply(d_grads, self.disc.trainable_weights)
            self.disc.trainable = False
            with keras.GradientTape() as tape:
                g_loss = ops.mean(ops.softplus(-self.disc(self.gen(noise))))
            assert not self.disc.trainable_weights
            g_grads = tape.gradient(g_loss, self.gen.trainable_weights)
            self.g_opt.apply(g_grads, self.gen.trainable_weights)
            self.disc.trainable = True
            return {"d_loss": d_loss, "g_loss": g_loss}

    gan = GAN()
    gan.compile()
    before = [w.numpy() for w in gen.weights + disc.weights]
    h = gan.fit(rng.normal(size=(64, 2)).astype(np.float32) + 3, epochs=2, batch_size=32, verbose=0)
    assert set(h.history) == {"d_loss", "g_loss"} and np.isfinite(h.history["g_loss"]).all()
    after = [w.numpy() for w in gen.weights + disc.weights]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))


def test_fit_passes_targets_to_the_step_of_a_model_without_call(rng):
    # regression: keras.io's conditional GAN fits (images, one-hot labels) on a model with only a train_step;
    # fit asked for the output shape of that model (it has none) to check the targets
    class Paired(keras.Model):
        def __init__(self):
            super().__init__()
            self.net = keras.Sequential([keras.Input((3,)), layers.Dense(2)])

        def train_step(self, data):
            x, y = data
            with keras.GradientTape() as tape:
                loss = ops.mean(ops.square(self.net(x) - y))
            self.optimizer.apply(tape.gradient(loss, self.net.trainable_weights), self.net.trainable_weights)
            return {"loss": loss}

    model = Paired()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = (x[:, :2] * 2.0).astype(np.float32)
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_fit_without_targets_trains_on_add_loss_alone(rng):
    # regression: keras.io's LogisticEndpoint model (compile() with no loss, fit(dict of inputs) with no y)
    # failed on the missing targets; the loss comes from add_loss
    class Endpoint(layers.Layer):
        def call(self, targets, logits):
            self.add_loss(ops.mean(ops.square(targets - logits)))
            return logits

    inputs, targets = keras.Input((3,), name="inputs"), keras.Input((2,), name="targets")
    model = keras.Model([inputs, targets], Endpoint()(targets, layers.Dense(2)(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = rng.normal(size=(16, 3)).astype(np.float32)
    data = {"inputs": x, "targets": x[:, :2].copy()}
    history = model.fit(data, epochs=5, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_a_frozen_teacher_inside_a_students_step(rng):
    teacher = keras.Sequential([keras.Input((3,)), layers.Dense(4), layers.Dense(2)])
    teacher.trainable = False
    student = keras.Sequential([keras.Input((3,)), layers.Dense(2)])
    x = rng.normal(size=(6, 3)).astype(np.float32)
    with GradientTape() as tape:
        loss = ops.mean(ops.square(student(x, training=True) - teacher(x, training=False)))
    assert tape.watched_variables() == student.trainable_weights  # the frozen teacher is not watched
    grads = tape.gradient(loss, student.trainable_weights + teacher.weights)
    assert all(g is not None for g in grads[:2]) and all(g is None for g in grads[2:])


def test_a_model_is_a_layer_of_a_functional_model_with_shared_weights(rng):
    encoder = keras.Sequential([keras.Input((4,)), layers.Dense(3, activation="tanh")], name="encoder")
    a, b = keras.Input((4,)), keras.Input((4,))
    ea, eb = encoder(a), encoder(b)  # siamese: one encoder, two applications
    dist = layers.Lambda(lambda t: ops.sum(ops.square(t[0] - t[1]), axis=-1, keepdims=True))([ea, eb])
    model = keras.Model([a, b], dist)
    assert model.count_params() == encoder.count_params() == 15
    assert [w.path for w in model.trainable_weights] == [w.path for w in encoder.trainable_weights]
    xa, xb = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    want = np.sum((np.asarray(encoder(xa)) - np.asarray(encoder(xb))) ** 2, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(model([xa, xb])), want, rtol=1e-6)
    model.compile("adam", "mse")
    model.fit([xa, xb], np.zeros((5, 1), np.float32), epochs=3, verbose=0)
    encoder.trainable = False  # freezing the sub-model freezes it inside the outer one
    assert model.trainable_weights == []


def test_ops_on_symbolic_tensors_become_nodes_and_round_trip(rng, tmp_path):
    inp = keras.Input((6,))
    h = layers.Dense(4)(inp)
    h = ops.relu(h) * 2.0 + ops.reshape(inp[:, :4], (-1, 4))
    out = layers.Dense(2, activation="softmax")(ops.concatenate([h, h], axis=-1))
    model = keras.Model(inp, out)
    x = rng.normal(size=(3, 6)).astype(np.float32)
    y = model.predict(x, verbose=0)
    assert y.shape == (3, 2) and np.allclose(y.sum(-1), 1, atol=1e-6)
    model.save(tmp_path / "m.dnnbind")
    again = keras.load_model(tmp_path / "m.dnnbind")
    np.testing.assert_allclose(again.predict(x, verbose=0), y, rtol=1e-6)


class Dice(keras.losses.Loss):
    def call(self, y_true, y_pred):
        inter = ops.sum(y_true * y_pred, axis=-1)
        return 1.0 - 2.0 * inter / (ops.sum(y_true, axis=-1) + ops.sum(y_pred, axis=-1) + 1e-6)


class SquaredError(keras.metrics.Metric):
    def __init__(self, name="sq_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(ops.sum(ops.square(ops.cast(y_true, "float32") - y_pred)))
        self.count.assign_add(float(np.prod(y_pred.shape)))

    def result(self):
        return self.total / self.count


def test_custom_loss_and_metric_train(rng):
    x = rng.normal(size=(96, 5)).astype(np.float32)
    y = (x[:, :3] > 0).astype(np.float32)
    model = keras.Sequential([keras.Input((5,)), Linear(3), layers.Activation("sigmoid")])
    model.compile(keras.optimizers.Adam(0.05), loss=Dice(), metrics=[SquaredError()])
    h = model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    assert h.history["loss"][-1] < h.history["loss"][0] and h.history["sq_error"][-1] < h.history["sq_error"][0]
    model.compile(keras.optimizers.Adam(0.05), loss=lambda t, p: ops.mean(ops.square(t - p), axis=-1))
    h = model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    assert h.history["loss"][-1] < h.history["loss"][0]


# ----------------------------------------------------------------------------- against real Keras 3
_KERAS_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from keras import layers, ops
work = sys.argv[1]
data = dict(np.load(f"{work}/in.npz"))

class Block(layers.Layer):
    def __init__(self):
        super().__init__()
        self.inner_w = None
        self.dense = layers.Dense(3, activation="tanh")
    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 3), initializer="zeros", name="w")
        self.b = self.add_weight(shape=(3,), initializer="zeros", name="b")
    def call(self, x):
        h = self.dense(ops.matmul(x, self.w) + self.b)
        return h * ops.sigmoid(h) + x[..., :3] ** 2

inp = keras.Input((5,))
out = layers.Dense(2, activation="softmax")(Block()(inp))
model = keras.Model(inp, out)
model.set_weights([data[f"w{i}"] for i in range(6)])
model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
losses = [float(model.train_on_batch(data["x"], data["y"])) for _ in range(3)]
np.savez(f"{work}/out.npz", *model.get_weights(), pred=model.predict(data["x"], verbose=0))
json.dump(losses, open(f"{work}/losses.json", "w"))
"""


class KerasBlock(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(3, activation="tanh")

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 3), initializer="zeros", name="w")
        self.b = self.add_weight(shape=(3,), initializer="zeros", name="b")

    def call(self, x):
        h = self.dense(ops.matmul(x, self.w) + self.b)
        return h * ops.sigmoid(h) + x[..., :3] ** 2


def test_a_custom_layer_trains_as_in_real_keras(rng, tmp_path):
    import importlib.util

    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    inp = keras.Input((5,))
    out = layers.Dense(2, activation="softmax")(KerasBlock()(inp))
    model = keras.Model(inp, out)
    weights = [rng.normal(size=w.shape).astype(np.float32) * 0.5 for w in model.weights]
    # Keras orders a layer's weights as created: the Block's w, b, then its Dense's kernel, bias
    model.set_weights(weights)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.integers(0, 2, 8).astype(np.int32)
    np.savez(tmp_path / "in.npz", x=x, y=y, **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    losses = [float(model.train_on_batch(x, y)) for _ in range(3)]
    theirs = json.load(open(tmp_path / "losses.json"))
    np.testing.assert_allclose(losses, theirs, rtol=2e-5)
    out = np.load(tmp_path / "out.npz")
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_allclose(w, out[f"arr_{i}"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(model.predict(x, verbose=0), out["pred"], rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------- on the GPU
def _gpu_fit_pair(make, x, y, **fit):
    """The same model twice (same weights), one whose steps replay as CUDA graphs, one eager; both fitted."""
    import warnings

    from dnnbind import kernels

    keras.set_default_device("cuda")
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = make(), make()
        for m, jit in ((graphed, "auto"), (eager, False)):
            m.build_from(x)
            m.compile_for(jit)
        eager.set_weights(graphed.get_weights())
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no "could not be captured" fallback
            hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
        he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    return graphed, eager, hg, he


@pytest.mark.gpu
def test_gpu_a_custom_train_step_is_captured_and_matches_eager(rng):
    """keras.io's pattern (own GradientTape, apply_gradients, metric trackers) replays as one CUDA graph."""
    x = rng.normal(size=(64, 4)).astype(np.float32)

    class Model(VAELikeModel):
        def build_from(self, data):
            self(data[:2])

        def compile_for(self, jit):
            self.compile(optimizer=keras.optimizers.Adam(0.02), jit_compile=jit)

    graphed, eager, hg, he = _gpu_fit_pair(Model, x, None)
    stats = graphed._step_graphs.stats
    assert stats["failures"] == 0 and stats["replays"] >= 3 * 4 - 2, stats
    assert eager._step_graphs.stats["replays"] == 0
    for key in ("loss", "mae"):
        np.testing.assert_allclose(hg.history[key], he.history[key], rtol=1e-5, atol=1e-6)
    assert hg.history["loss"][-1] < hg.history["loss"][0]
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_a_layer_written_in_ops_trains_in_graphs_as_eagerly(rng):
    """A user's layer (ops only, no hand-written backward) with add_loss and a state update, inside a
    Sequential, with a custom loss function: the graph step equals the eager step."""
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.integers(0, 3, 64)

    def loss_fn(y_true, y_pred):
        return ops.mean(keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)) \
            + 0.001 * ops.mean(ops.square(y_pred))

    class Model(keras.Sequential):
        def build_from(self, data):
            self.build((None, 5))

        def compile_for(self, jit):
            self.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss_fn, jit_compile=jit)

    def make():
        return Model([keras.Input((5,)), Block(), Linear(3)])

    graphed, eager, hg, he = _gpu_fit_pair(make, x, y)
    stats = graphed._step_graphs.stats
    assert stats["failures"] == 0 and stats["replays"] >= 3 * 4 - 2, stats
    np.testing.assert_allclose(hg.history["loss"], he.history["loss"], rtol=1e-5, atol=1e-6)
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    calls = [w for w in graphed.weights if w.name == "calls"][0]
    assert float(np.asarray(calls)) == 3 * 4  # the state update ran on every replay


class _Penalized(keras.Model):
    """A subclassed model whose call adds a constant loss (it is nested inside a Sequential below)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(3)

    def call(self, x):
        self.add_loss(ops.convert_to_tensor(np.float32(0.75)))
        return self.dense(x)


@pytest.mark.parametrize("where", ["nested_model", "activity_regularizer_in_nested_sequential", "none"])
def test_step_loss_includes_losses_from_nested_models_and_layers(where):
    """The step's loss lookup (made once per structure) still sees add_loss of a nested subclassed model and
    activity regularizers deep inside nested models, and adds nothing when there is nothing."""
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    y = np.zeros((8, 3), np.float32)
    inner = (_Penalized() if where == "nested_model"
             else keras.Sequential([layers.Dense(3, activity_regularizer=keras.regularizers.L2(0.5)
                                                 if where != "none" else None)]))
    model = keras.Sequential([keras.Input((4,)), inner])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    got = float(model.train_on_batch(x, y))
    out = np.asarray(model.predict(x, verbose=0))
    mse = float(np.mean(out ** 2))
    extra = {"nested_model": 0.75, "none": 0.0,
             "activity_regularizer_in_nested_sequential": 0.5 * float(np.sum(out ** 2)) / len(x)}[where]
    np.testing.assert_allclose(got, mse + extra, rtol=1e-4)


# ----- Model.compute_loss overridden (Keras 3 calls it from its built-in train_step / test_step) -----------------
_COMPUTE_LOSS_MODEL = r'''
class Scaled(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        self.seen_training = training
        base = ops.mean(ops.square(y_pred - y))
        return 3.0 * base + 0.1 * ops.mean(x) + (0.0 if training else 1.0)
'''

_COMPUTE_LOSS_SCRIPT = r'''
import json, sys
import numpy as np
import keras
from keras import ops
''' + _COMPUTE_LOSS_MODEL + r'''
d = dict(np.load(sys.argv[1] + "/in.npz"))
m = Scaled()
m(d["x"][:1])
m.set_weights([d["k"], d["b"]])
m.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["mae"])
h = m.fit(d["x"], d["y"], batch_size=4, epochs=1, shuffle=False, verbose=0)
ev = m.evaluate(d["x"], d["y"], batch_size=8, verbose=0, return_dict=True)
json.dump({"w": [w.tolist() for w in m.get_weights()], "loss": h.history["loss"], "eval": ev,
           "keys": sorted(h.history)}, open(sys.argv[1] + "/out.json", "w"))
'''


def _compute_loss_model():
    namespace = {"keras": keras, "ops": ops}
    exec(_COMPUTE_LOSS_MODEL, namespace)
    return namespace["Scaled"]()


def test_an_overridden_compute_loss_is_the_loss_of_fit_and_evaluate_as_in_keras(tmp_path):
    import importlib.util

    rng = np.random.default_rng(4)
    d = {"x": rng.normal(size=(8, 3)).astype(np.float32), "y": rng.normal(size=(8, 2)).astype(np.float32),
         "k": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=(2,)).astype(np.float32)}
    model = _compute_loss_model()
    model(d["x"][:1])
    model.set_weights([d["k"], d["b"]])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["mae"])
    hist = model.fit(d["x"], d["y"], batch_size=4, epochs=1, shuffle=False, verbose=0).history
    assert model.seen_training is True
    ev = model.evaluate(d["x"], d["y"], batch_size=8, verbose=0, return_dict=True)
    assert model.seen_training is False
    # by hand: two SGD steps on 3 * mse (the x term has no gradient), then the evaluation loss with its +1
    k, b = d["k"].astype(np.float64), d["b"].astype(np.float64)
    for i in (0, 4):
        x, y = d["x"][i:i + 4], d["y"][i:i + 4]
        g = 3.0 * 2 * (x @ k + b - y) / y.size
        k, b = k - 0.1 * x.T @ g, b - 0.1 * g.sum(0)
    np.testing.assert_allclose(model.get_weights()[0], k, rtol=1e-5)
    want = 3.0 * np.mean((d["x"] @ k + b - d["y"]) ** 2) + 0.1 * np.mean(d["x"]) + 1.0
    assert ev["loss"] == pytest.approx(want, rel=1e-5)
    assert set(hist) == {"loss", "mae"}
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    np.savez(tmp_path / "in.npz", **d)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _COMPUTE_LOSS_SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.load(open(tmp_path / "out.json"))
    for ours, ref in zip(model.get_weights(), theirs["w"]):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    assert hist["loss"][0] == pytest.approx(theirs["loss"][0], rel=1e-5)
    assert ev["loss"] == pytest.approx(theirs["eval"]["loss"], rel=1e-5)
    assert ev["mae"] == pytest.approx(theirs["eval"]["mae"], rel=1e-5)
    assert sorted(hist) == theirs["keys"]
