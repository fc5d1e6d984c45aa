"""Mixed-precision train steps: the weights' compute-dtype copies made by one multi-tensor cast before
the forward (``dnnbind.trainers.precision.precast_weights``), and weight gradients left in the compute dtype for the
fused optimizer update, give bitwise the results of the per-tensor casts they replace.

CPU: NumPy computes in float32 whatever the policy says, so these tests make the layers compute in
float16 on NumPy (``Layer._effective_compute_dtype`` patched): the casts, the precast copies and
the low-precision gradients then take the same paths as on a GPU, with NumPy arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision, kernels
from dnnbind import optimizers as optimizers_module
from dnnbind.layers import base as layers_base
from dnnbind.trainers import precision
from dnnbind.trainers import trainer as trainer_module
from testutil import rel_error

F16 = np.dtype(np.float16)


@pytest.fixture
def f16_on_numpy(monkeypatch):
    """Layers with a float16 policy compute in float16 on NumPy."""
    dnnbind.set_default_device("cpu")
    real = layers_base.Layer._effective_compute_dtype

    def effective(self):
        return F16 if self.dtype_policy.compute_dtype == "float16" else real(self)

    monkeypatch.setattr(layers_base.Layer, "_effective_compute_dtype", effective)
    mixed_precision.set_global_policy("mixed_float16")
    yield
    mixed_precision.set_global_policy("float32")
    dnnbind.set_default_device(None)


def _per_tensor_casts(monkeypatch):
    """The step as it was: no precast copies, gradients cast to float32 layer by layer."""
    monkeypatch.setattr(trainer_module, "precast_weights", lambda model, layers: [])
    monkeypatch.setattr(optimizers_module.Optimizer, "_reads_compute_grads", lambda self: False)


def _sequential(seed=0):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        layers.Conv2D(4, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        layers.Flatten(),
        layers.Dense(8, activation="relu", kernel_initializer=init(seed + 1)),
        layers.Dense(3, activation="softmax", kernel_initializer=init(seed + 2)),
    ])


def _shared_functional(seed=0):
    """A Dense applied twice: the tape sums its gradients over the two applications."""
    init = keras.initializers.GlorotUniform
    inp = keras.Input((5,))
    shared = layers.Dense(5, activation="tanh", kernel_initializer=init(seed))
    h = shared(shared(inp))
    out = layers.Dense(3, activation="softmax", kernel_initializer=init(seed + 1))(h)
    return keras.Model(inp, out)


def _data(shape, n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype(np.float32), rng.integers(0, 3, n)


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(3e-3),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_momentum_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9, clipnorm=0.5),
    "rmsprop_centered_clipvalue": lambda: keras.optimizers.RMSprop(1e-3, centered=True, clipvalue=0.1),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(3e-3, global_clipnorm=0.5),
}


def _train(build, shape, factory, steps=4):
    model = build()
    model.compile(factory(), "sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    x, y = _data(shape)
    losses = [float(model.train_on_batch(x[:12], y[:12])[0]) for _ in range(steps)]
    losses.append(float(model.test_on_batch(x[12:], y[12:])[0]))
    return model, losses, model.predict_on_batch(x[12:])


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("build, shape", [(_sequential, (6, 6, 2)), (_shared_functional, (5,))],
                         ids=["sequential", "shared_functional"])
def test_precast_and_compute_dtype_grads_are_bitwise_the_per_tensor_casts(f16_on_numpy, monkeypatch, opt, build,
                                                                           shape):
    new, new_losses, new_pred = _train(build, shape, OPTIMIZERS[opt])
    with monkeypatch.context() as m:
        _per_tensor_casts(m)
        old, old_losses, old_pred = _train(build, shape, OPTIMIZERS[opt])
    assert new_losses == old_losses and np.isfinite(new_losses).all()
    assert np.array_equal(new_pred.view(np.uint8), old_pred.view(np.uint8))
    for a, b in zip(new.get_weights(), old.get_weights()):
        assert a.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert new.optimizer.iterations == 4
    # the weights moved: a test that compares two idle models would pass too
    assert not np.array_equal(new.get_weights()[0], build().get_weights()[0])


def test_weights_are_cast_once_per_step_and_gradients_stay_float16(f16_on_numpy, monkeypatch):
    model = _sequential()
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", jit_compile=False)
    x, y = _data((6, 6, 2))
    model.train_on_batch(x[:12], y[:12])  # the first step casts layer by layer and learns what
    casts, many, seen_grads = [], [], []
    real_cast, real_many = kernels.cast, kernels.elementwise.CastMany.__call__
    monkeypatch.setattr(kernels, "cast", lambda a, dt, **k: (casts.append((a.shape, np.dtype(dt))), real_cast(a, dt, **k))[1])
    monkeypatch.setattr(kernels.elementwise.CastMany, "__call__",
                        lambda self, **k: (many.append([a.shape for a in self.xs]), real_many(self, **k))[1])
    real_apply = optimizers_module.Optimizer._apply_raw
    monkeypatch.setattr(optimizers_module.Optimizer, "_apply_raw", lambda self, p, g, **k: (
        seen_grads.append([a.dtype for a in g]), real_apply(self, p, g, **k))[1])
    model.train_on_batch(x[:12], y[:12])
    weights = [w.value.shape for layer in model._flat_layers() for w in layer._weights]
    # kernel and bias of Conv2D and both Dense (in the order the layers first cast them): one call
    assert len(many) == 1 and sorted(many[0]) == sorted(weights) and len(weights) == 6
    # no weight and no gradient went through a cast of its own: only the input (to float16)
    # and the logits' gradient (back to the layer's dtype) remain
    assert not any(shape in weights for shape, _ in casts)
    assert seen_grads == [[F16] * 6]
    # outside a step the layers hold no copies and cast their weights as before
    layer = model._flat_layers()[0]
    assert layer._precast is None and not layer._keep_grad_dtype
    assert layer._compute_weight(layer.kernel).dtype == F16


def test_precast_groups_follow_weight_replacement_and_policy(f16_on_numpy):
    model = _sequential()
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", jit_compile=False)
    x, y = _data((6, 6, 2))
    model.train_on_batch(x[:12], y[:12])
    layers_ = model._flat_layers()
    first = precision.precast_groups(model, layers_)
    assert precision.precast_groups(model, layers_) is first  # kept while nothing changed
    dense = layers_[2]
    dense.kernel.value = dense.kernel.value.copy()  # a new array: the group is remade around it
    second = precision.precast_groups(model, layers_)
    assert second is not first and any(a is dense.kernel.value for _, cast in second for a in cast.xs)
    dense.dtype_policy = mixed_precision.Policy("float32")  # computes in float32: no copy for it
    third = precision.precast_groups(model, layers_)
    assert not any(layer is dense for entries, _ in third for layer, _ in entries)


def test_optimizer_without_fused_update_or_with_a_clipping_norm_gets_float32_grads():
    assert keras.optimizers.Adam()._reads_compute_grads()
    assert keras.optimizers.RMSprop(clipvalue=1.0)._reads_compute_grads()  # elementwise: no sum
    assert not keras.optimizers.Adam(global_clipnorm=1.0)._reads_compute_grads()
    assert not keras.optimizers.SGD(clipnorm=1.0)._reads_compute_grads()

    class Custom(keras.optimizers.SGD):
        def _update(self, params, grads, *, grad_scale, skip):
            super()._update(params, grads, grad_scale=grad_scale, skip=skip)

    assert not Custom()._reads_compute_grads()

    class Accumulating(keras.optimizers.Adam):  # its apply may add the gradients into float32 buffers
        def _apply_raw(self, params, grads, *, grad_scale=None, skip=None):
            super()._apply_raw(params, grads, grad_scale=grad_scale, skip=skip)

    assert not Accumulating()._reads_compute_grads()


# ----- GPU ------------------------------------------------------------------------------------
def _gpu_model(seed=0):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        layers.BatchNormalization(),
        layers.MaxPooling2D(),
        layers.Conv2D(8, 3, padding="same", kernel_initializer=init(seed + 1)),
        layers.Flatten(),
        layers.Dense(16, activation="relu", kernel_initializer=init(seed + 2)),
        layers.Dense(5, activation="softmax", kernel_initializer=init(seed + 3)),
    ])


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("opt", ["adam", "sgd_momentum", "rmsprop_centered_clipvalue"])
def test_gpu_eager_mixed_steps_are_bitwise_the_per_tensor_casts(monkeypatch, policy, opt):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, 32)
    results = []
    try:
        dnnbind.set_default_device("cuda")
        mixed_precision.set_global_policy(policy)
        with kernels.config.override(allow_tf32=False, deterministic=True):
            for old in (False, True):
                with monkeypatch.context() as m:
                    if old:
                        _per_tensor_casts(m)
                    model = _gpu_model()
                    model.compile(OPTIMIZERS[opt](), "sparse_categorical_crossentropy", metrics=["accuracy"],
                                  jit_compile=False)
                    losses = [float(model.train_on_batch(x[:16], y[:16])[0]) for _ in range(5)]
                    losses.append(float(model.test_on_batch(x[16:], y[16:])[0]))
                    results.append((losses, model.get_weights(), model.predict_on_batch(x[16:])))
    finally:
        mixed_precision.set_global_policy("float32")
        dnnbind.set_default_device(None)
    (new_losses, new_w, new_p), (old_losses, old_w, old_p) = results
    assert new_losses == old_losses and np.isfinite(new_losses).all()
    assert np.array_equal(new_p, old_p)
    for a, b in zip(new_w, old_w):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert not np.array_equal(new_w[0], _gpu_model().get_weights()[0])


@pytest.mark.gpu
def test_gpu_graph_step_with_precast_matches_eager_and_captures_cleanly():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, 64)
    try:
        dnnbind.set_default_device("cuda")
        mixed_precision.set_global_policy("mixed_bfloat16")
        with kernels.config.override(allow_tf32=False, deterministic=True):
            graphed, eager = _gpu_model(), _gpu_model()
            graphed.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
            eager.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", jit_compile=False)
            hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=1)
            he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=1)
        stats = graphed._step_graphs.stats
        assert stats["replays"] >= 8 and stats["failures"] == 0  # captured, precast included
        # as test_graph_step's mixed-precision check: the same kernels in the same order, the
        # precast one included; a difference can only be 16-bit rounding of non-deterministic sums
        assert np.allclose(hg.history["loss"], he.history["loss"], rtol=1e-3)
        for a, b in zip(graphed.get_weights(), eager.get_weights()):
            assert rel_error(a, b) < 1e-3
        assert not np.array_equal(graphed.get_weights()[0], _gpu_model().get_weights()[0])
    finally:
        mixed_precision.set_global_policy("float32")
        dnnbind.set_default_device(None)
