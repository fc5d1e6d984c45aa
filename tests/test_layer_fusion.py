"""Layer fusion in Sequential (issue 9): BatchNormalization + a plain relu run as one batch-norm op with
``activation="relu"`` in training forwards; which pairs fuse, and that training gives the same weights
with ``kernels.config.fuse_layers`` on and off (NumPy backend; GPU eager and CUDA-graph steps)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, kernels
from dnnbind.models.sequential import fusion_candidates
from testutil import TapedStep, fit_on_gpu, rel_error


def _conv_model(seed=3, device=None, channels=(8, 6)):
    """[Conv2D(no bias) -> BN -> relu] x 2 -> MaxPool -> Dense, as in benchmarks' vgg_cifar; the first
    relu an Activation layer, the second a ReLU layer."""
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([
        keras.Input((6, 6, 3)),
        layers.Conv2D(channels[0], 3, padding="same", use_bias=False), layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.Conv2D(channels[1], 3, padding="same", use_bias=False), layers.BatchNormalization(momentum=0.9),
        layers.ReLU(),
        layers.MaxPooling2D(), layers.Flatten(), layers.Dense(3, activation="softmax"),
    ])
    if device is not None:
        m.to(device)
    return m


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6, 6, 3)).astype(np.float32)
    y = (x[:, :3, :3, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 3:, 3:, 1].mean(axis=(1, 2)) > 0.2)
    return x, y.astype(np.int64)


@pytest.fixture
def bn_calls(monkeypatch):
    """The ``activation`` of every kernels.batchnorm_forward_training call and of every
    kernels.conv2d_batchnorm_forward_training call (``conv_bn``), and the count of kernels.activation_forward."""
    seen = {"bn": [], "conv_bn": [], "activation_forward": 0}
    bn_forward, act_forward = kernels.batchnorm_forward_training, kernels.activation_forward
    conv_bn_forward = kernels.conv2d_batchnorm_forward_training

    def bn_spy(*args, activation=None, **kwargs):
        seen["bn"].append(activation)
        return bn_forward(*args, activation=activation, **kwargs)

    def conv_bn_spy(*args, activation=None, **kwargs):
        seen["conv_bn"].append(activation)
        return conv_bn_forward(*args, activation=activation, **kwargs)

    def act_spy(*args, **kwargs):
        seen["activation_forward"] += 1
        return act_forward(*args, **kwargs)

    monkeypatch.setattr(kernels, "batchnorm_forward_training", bn_spy)
    monkeypatch.setattr(kernels, "activation_forward", act_spy)
    monkeypatch.setattr(kernels, "conv2d_batchnorm_forward_training", conv_bn_spy)
    return seen


# ------------------------------------------------------------------------------- the schedule

def test_which_pairs_fuse():
    bn = layers.BatchNormalization
    stack = [layers.Dense(4), bn(), layers.Activation("relu"),            # 1: fuses
             layers.Dense(4), bn(), layers.ReLU(),                         # 4: fuses
             layers.Dense(4), bn(), layers.Activation("gelu"),             # not a relu
             layers.Dense(4), bn(), layers.ReLU(max_value=6.0),            # ReLU6
             layers.Dense(4), bn(), layers.ReLU(negative_slope=0.1),       # leaky
             layers.Dense(4), bn(), layers.Dropout(0.5), layers.Activation("relu"),  # not adjacent
             layers.Dense(4), layers.Activation("relu"),                   # no batch norm
             layers.Dense(4), bn(), layers.Activation("relu")]             # the last layer: the model's output
    model = keras.Sequential([keras.Input((5,)), *stack])
    assert fusion_candidates(model.layers) == (1, 4)
    assert model._fused_pairs(True)[0] == (1, 4)
    assert model._fused_pairs(False)[0] == ()  # inference (predict, evaluate) never fuses
    with kernels.config.override(fuse_layers=False):
        assert model._fused_pairs(True)[0] == ()
    assert kernels.config.get("fuse_layers") is True


def test_the_schedule_follows_the_layer_list():
    model = keras.Sequential([keras.Input((5,)), layers.Dense(4), layers.BatchNormalization(),
                              layers.Activation("relu")])
    assert model._fused_pairs(True)[0] == ()  # the relu is the last layer
    model.add(layers.Dense(2))
    assert model._fused_pairs(True)[0] == (1,)
    model.pop()
    assert model._fused_pairs(True)[0] == ()
    model.add(layers.Dense(2))
    model._layers[2] = layers.Activation("tanh")  # replaced in place: the cache compares the layers themselves
    assert model._fused_pairs(True)[0] == ()


def test_a_batch_norm_off_its_plain_training_path_does_not_fuse(monkeypatch):
    model = keras.Sequential([keras.Input((5,)), layers.Dense(4), layers.BatchNormalization(synchronized=True),
                              layers.ReLU(), layers.Dense(2)])
    bn = model.layers[1]
    assert model._fused_pairs(True)[0] == (1,)  # synchronised without a distribution: plain BatchNormalization
    monkeypatch.setattr(bn, "_replica", lambda: object())  # a replica to all-reduce the statistics with
    assert model._fused_pairs(True)[0] == ()
    monkeypatch.undo()
    bn.trainable = False  # a frozen batch norm runs its inference op in training
    assert model._fused_pairs(True)[0] == ()
    bn.trainable = True
    with pytest.raises(RuntimeError, match="cannot fuse activation 'relu' into a forward with training=False"):
        bn._forward_fused(np.ones((2, 4), np.float32), False, "relu")
    # another compute dtype: the relu layer's input cast, which fusion would skip, would change the result
    model = keras.Sequential([keras.Input((5,)), layers.Dense(4), layers.BatchNormalization(),
                              layers.ReLU(dtype="float64"), layers.Dense(2)])
    assert model._fused_pairs(True)[0] == ()


def test_a_batch_norm_subclass_with_its_own_forward_does_not_fuse():
    class Shifted(layers.BatchNormalization):
        def forward(self, x, training=False):
            return super().forward(x, training) + 1

    model = keras.Sequential([keras.Input((5,)), layers.Dense(4), Shifted(), layers.ReLU(), layers.Dense(2)])
    assert model._fused_pairs(True)[0] == ()


def test_a_batch_norm_subclass_with_its_own_backward_does_not_fuse():
    # its backward would get dy w.r.t. the relu's output and lose the relu's mask
    class PassThrough(layers.BatchNormalization):
        def backward(self, dy, need_dx=True):
            return dy

    model = keras.Sequential([keras.Input((5,)), layers.Dense(4), PassThrough(), layers.ReLU(), layers.Dense(2)])
    assert model._fused_pairs(True)[0] == ()


def test_fuse_layers_is_a_checked_setting_in_the_capture_key():
    key = kernels.config.capture_key()
    with kernels.config.override(fuse_layers=False):
        assert kernels.config.capture_key() != key
    with pytest.raises(TypeError, match="fuse_layers must be True or False"):
        with kernels.config.override(fuse_layers=1):
            pass


# ----------------------------------------------------------------------- training (NumPy backend)

def _train(fuse: bool, steps: int = 3, **fit):
    x, y = _data()
    model = _conv_model()
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
    with kernels.config.override(fuse_layers=fuse):
        model.fit(x, y, batch_size=len(x) // steps, epochs=1, shuffle=False, verbose=0, **fit)
    return model


def test_cpu_training_fused_equals_unfused(cpu, bn_calls):
    fused = _train(True)
    # each Conv2D -> BatchNormalization -> relu runs as one conv + batch-norm op with the relu
    assert bn_calls["conv_bn"] == ["relu", "relu"] * 3 and bn_calls["bn"] == []
    assert bn_calls["activation_forward"] == 0
    bn_calls["conv_bn"].clear()
    plain = _train(False)
    assert bn_calls["bn"] == [None, None] * 3 and bn_calls["activation_forward"] == 6
    assert bn_calls["conv_bn"] == []
    start = _conv_model().get_weights()
    for w_fused, w_plain, w0 in zip(fused.get_weights(), plain.get_weights(), start):
        assert not np.array_equal(w_fused, w0)  # every weight (BN moving statistics too) moved
        # the NumPy op applies the relu (and its mask) in the same arithmetic as the separate ops: bitwise
        assert np.array_equal(w_fused, w_plain)
    # inference keeps the unfused path: the relu layers run, no training batch-norm op
    bn_calls["bn"].clear()
    x, _ = _data(8)
    np.testing.assert_array_equal(fused.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert bn_calls["bn"] == [] and bn_calls["activation_forward"] == 6 + 4


def test_cpu_fused_backward_passes_the_relu_layer_through(cpu):
    model = _conv_model()
    x, _ = _data(8)
    step = TapedStep(model, [x], [True])
    out = np.asarray(step.out)
    bn1, relu1 = model.layers[1], model.layers[2]
    assert model._fused_pairs(True)[0] == (1, 4) and bn1._activation == "relu" and bn1._y is not None
    assert np.all(bn1._y >= 0) and np.any(bn1._y == 0)
    def must_not_run(*args, **kwargs):
        raise AssertionError("the fused relu layer's backward ran")

    relu1.backward = must_not_run
    grads = step.backward([np.ones_like(out) / out.size])
    assert bn1._y is None and bn1._saved is None
    assert {k[1] for k in grads if k[0] == bn1.name} == {"gamma", "beta"} and np.any(grads[(bn1.name, "gamma")] != 0)


# --------------------------------------------------------------------------------------- GPU

def _gpu_train(fuse: bool, policy: str, jit_compile, steps: int = 3):
    x, y = _data(16 * steps)
    # channels 8 (a multiple of 4: the fused cuDNN calls) and 6 (the unfused fallback); float32:
    # deterministic convolutions and no TF32, so the runs differ only where fusion does (bfloat16
    # convolutions may lack a deterministic algorithm; its tolerance covers their atomics)
    return fit_on_gpu(lambda device: _conv_model(device=device, channels=(8, 6)), x, y, policy, jit_compile,
                      fuse_layers=fuse, deterministic=policy == "float32", allow_tf32=False)


@pytest.mark.gpu
@pytest.mark.parametrize("jit_compile", [False, "auto"], ids=["eager", "graph"])
@pytest.mark.parametrize("policy, tol", [
    # float32: the fused and unfused cuDNN batch-norm kernels sum in other orders (about 1e-7
    # relative per gradient); three SGD steps keep the updates within 1e-4 of each other.
    ("float32", 1e-4),
    # mixed_bfloat16: the same sums, then dx and the activations rounded to bfloat16 (2**-8
    # relative per rounding) in one kernel or the other; the updates of three steps stay within
    # bfloat16's op tolerance (tests/testutil.py TOLERANCE: 2e-2).
    ("mixed_bfloat16", 2e-2),
])
def test_gpu_training_fused_equals_unfused(bn_calls, policy, tol, jit_compile):
    start, fused = _gpu_train(True, policy, jit_compile)
    assert "relu" in bn_calls["conv_bn"] and None not in bn_calls["conv_bn"] and bn_calls["bn"] == []
    bn_calls["conv_bn"].clear()
    start_plain, plain = _gpu_train(False, policy, jit_compile)
    assert bn_calls["bn"] and set(bn_calls["bn"]) == {None}
    for i, (w0, w0_plain, wf, wp) in enumerate(zip(start, start_plain, fused, plain)):
        assert np.array_equal(w0, w0_plain)  # the same seeded start
        assert not np.array_equal(wf, w0), i
        # compare what training changed (the updates, or the moved BN statistics), not the weights themselves
        assert rel_error(wf.astype(np.float64) - w0, wp.astype(np.float64) - w0) < tol, (policy, i)
