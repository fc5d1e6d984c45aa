"""``kernels.conv2d_batchnorm_forward_training`` (a convolution then a training batch norm in one call) and
``kernels.batchnorm_relu_conv2d_backward`` (the backward of conv(relu(batchnorm(x))) down to x) on the NumPy
backend, and which layers Sequential runs through them (issue 9)."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, kernels
from dnnbind.models.sequential import conv_bn_candidates
from testutil import TapedStep, numerical_grad, random, rel_error

CASES = [  # (layout, x shape, w shape, conv keywords)
    ("NHWC", (3, 6, 5, 4), (6, 3, 3, 4), dict(padding=1)),
    ("NHWC", (2, 7, 7, 3), (5, 2, 2, 3), dict(padding="same", stride=2)),  # asymmetric padding
    ("NCHW", (2, 4, 6, 6), (5, 4, 3, 3), dict(padding=0, dilation=2)),
]


def _inputs(rng, x_shape, w_shape, layout, dtype=np.float64):
    k = w_shape[0]
    x = random(rng, x_shape, low=-1, high=2).astype(dtype)
    w = random(rng, w_shape, low=-0.5, high=0.5).astype(dtype)
    p = np.float64 if dtype == np.float64 else np.float32
    gamma = random(rng, (k,), low=0.5, high=1.5).astype(p)
    beta = random(rng, (k,), low=-0.3, high=0.3).astype(p)
    rm, rv = random(rng, (k,)).astype(p), random(rng, (k,), low=0.5, high=2).astype(p)
    return x, w, gamma, beta, rm, rv


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("layout, x_shape, w_shape, conv", CASES)
def test_numpy_op_is_the_convolution_then_the_batch_norm(rng, layout, x_shape, w_shape, conv, activation):
    x, w, gamma, beta, rm, rv = _inputs(rng, x_shape, w_shape, layout, np.float32)
    rm_ref, rv_ref = rm.copy(), rv.copy()
    out_buffer = np.full(kernels.conv2d_output_shape(x_shape, w_shape, layout=layout, **conv), np.nan, np.float32)
    y, out, saved = kernels.conv2d_batchnorm_forward_training(x, w, gamma, beta, rm, rv, momentum=0.9,
                                                          activation=activation, layout=layout, out=out_buffer,
                                                          **conv)
    y_ref = kernels.conv2d_forward(x, w, layout=layout, **conv)
    out_ref, saved_ref = kernels.batchnorm_forward_training(y_ref, gamma, beta, rm_ref, rv_ref, momentum=0.9,
                                                        activation=activation, layout=layout)
    assert out is out_buffer
    assert np.array_equal(y, y_ref) and np.array_equal(out, out_ref)
    assert np.array_equal(rm, rm_ref) and np.array_equal(rv, rv_ref) and not np.array_equal(rm, _inputs(
        np.random.default_rng(0), x_shape, w_shape, layout, np.float32)[4])
    assert np.array_equal(saved.mean, saved_ref.mean) and np.array_equal(saved.inv_std, saved_ref.inv_std)
    assert saved.activation == activation and saved.x_shape == y.shape
    if activation == "relu":
        assert np.any(out == 0) and np.any(out > 0)


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("layout, x_shape, w_shape, conv", CASES[:2])
def test_float64_gradients_through_the_op_match_finite_differences(rng, layout, x_shape, w_shape, conv, activation):
    """The op's backward is the batch norm's and the convolution's: dx, dw, dgamma, dbeta of
    sum(out * r) against central differences of the forward (a fresh copy of the running statistics each time)."""
    x, w, gamma, beta, rm, rv = _inputs(rng, x_shape, w_shape, layout)
    out_shape = kernels.conv2d_output_shape(x_shape, w_shape, layout=layout, **conv)
    r = random(rng, out_shape)
    kw = dict(epsilon=1e-3, layout=layout, activation=activation)

    def loss():
        _, out, _ = kernels.conv2d_batchnorm_forward_training(x, w, gamma, beta, rm.copy(), rv.copy(), **kw, **conv)
        return float(np.sum(out * r))

    y, out, saved = kernels.conv2d_batchnorm_forward_training(x, w, gamma, beta, rm.copy(), rv.copy(), **kw, **conv)
    if activation == "relu":
        assert np.min(np.abs(out[out > 0])) > 1e-4 and np.any(out == 0)  # no pre-activation on relu's kink
    dy, dgamma, dbeta = kernels.batchnorm_backward(r, y, gamma, saved, y=out if activation else None, **kw)
    dx = kernels.conv2d_backward_data(dy, w, x_shape, layout=layout, **conv)
    dw = kernels.conv2d_backward_filter(x, dy, w_shape, layout=layout, **conv)
    for name, analytic, arg in (("dx", dx, x), ("dw", dw, w), ("dgamma", dgamma, gamma), ("dbeta", dbeta, beta)):
        assert np.any(analytic != 0), name
        assert rel_error(analytic, numerical_grad(loss, arg)) < 1e-6, name


@pytest.mark.parametrize("change, error, match", [
    (dict(gamma=np.ones(5, np.float32)), ValueError, r"gamma has shape \(5,\), expected \(6,\) for w of shape"),
    (dict(running_var=np.ones(6, np.float16)), TypeError, "running_var must be float32"),
    (dict(momentum=1.5), ValueError, r"momentum must be in \[0, 1\]"),
    (dict(epsilon=0.0), ValueError, "epsilon must be > 0"),
    (dict(activation="gelu"), ValueError, "activation must be None or 'relu'"),
    (dict(out=np.zeros((3, 6, 5, 5), np.float32)), ValueError, "out"),
    (dict(w=np.ones((6, 3, 3, 3), np.float32)), ValueError, "channels"),
    (dict(x=np.ones((3, 6, 5, 4), np.float16)), TypeError, "float16"),
])
def test_bad_input_is_refused_before_the_running_statistics_change(rng, change, error, match):
    x, w, gamma, beta, rm, rv = _inputs(rng, (3, 6, 5, 4), (6, 3, 3, 4), "NHWC", np.float32)
    args = dict(x=x, w=w, gamma=gamma, beta=beta, running_mean=rm, running_var=rv, padding=1, layout="NHWC")
    args.update(change)
    before = rm.copy(), rv.copy()
    with pytest.raises(error, match=match):
        kernels.conv2d_batchnorm_forward_training(**args)
    assert np.array_equal(rm, before[0]) and np.array_equal(rv, before[1])


# ----------------------------------------------------------------------------- Sequential's schedule

def test_which_convolutions_run_with_their_batch_norm():
    bn = layers.BatchNormalization
    conv = lambda **kw: layers.Conv2D(4, 3, padding="same", **{"use_bias": False, **kw})  # noqa: E731
    stack = [conv(), bn(), layers.ReLU(),                                 # 0: fuses, with the relu
             conv(), bn(),                                                # 3: fuses, no relu
             conv(use_bias=True), bn(),                                   # a bias
             conv(activation="relu"), bn(),                               # an activation of its own
             layers.DepthwiseConv2D(3, padding="same", use_bias=False), bn(),  # not Conv2D itself
             conv(), layers.Dropout(0.1), bn(),                           # not adjacent
             conv(), bn(axis=1),                                          # a batch norm over another axis
             conv(), bn()]                                                # the batch norm is the last layer
    model = keras.Sequential([keras.Input((6, 6, 4)), *stack])
    assert conv_bn_candidates(model.layers) == (0, 3)
    relu_pairs, convs, back = model._fused_pairs(True)
    assert relu_pairs == (1,) and convs == (0, 3) and back == (3,)  # conv 3 takes the relu'd output of bn 1
    assert model._fused_pairs(False) == ((), (), ())  # inference never fuses
    with kernels.config.override(fuse_layers=False):
        assert model._fused_pairs(True) == ((), (), ())
    model.layers[4].trainable = False  # a frozen batch norm runs its inference op in training
    assert model._fused_pairs(True)[1] == (0,)


def test_another_compute_dtype_or_channels_first_does_not_fuse():
    model = keras.Sequential([keras.Input((6, 6, 4)), layers.Conv2D(4, 3, use_bias=False),
                              layers.BatchNormalization(dtype="float64"), layers.Flatten(), layers.Dense(2)])
    assert conv_bn_candidates(model.layers) == (0,) and model._fused_pairs(True)[1] == ()
    model = keras.Sequential([keras.Input((4, 6, 6)), layers.Conv2D(4, 3, use_bias=False, data_format="channels_first"),
                              layers.BatchNormalization(axis=1), layers.Flatten(), layers.Dense(2)])
    assert conv_bn_candidates(model.layers) == ()


def test_the_fused_forward_leaves_both_layers_ready_for_their_own_backwards(cpu, rng):
    def build():
        return keras.Sequential([keras.Input((6, 6, 3)), layers.Conv2D(4, 3, padding="same", use_bias=False),
                                 layers.BatchNormalization(), layers.ReLU(), layers.Flatten(), layers.Dense(2)])

    model, plain = build(), build()
    plain.set_weights(model.get_weights())
    x = random(rng, (5, 6, 6, 3)).astype(np.float32)
    step = TapedStep(model, [x], [True])
    out = np.asarray(step.out)
    conv, bn = model.layers[0], model.layers[1]
    assert conv._x is not None and bn._x is not None and bn._activation == "relu" and bn._y is not None
    assert bn._x.shape == (5, 6, 6, 4)  # the convolution's output is what the batch norm normalised
    with kernels.config.override(fuse_layers=False):
        plain_step = TapedStep(plain, [x], [True])
    assert np.array_equal(out, np.asarray(plain_step.out))
    dout = random(rng, out.shape).astype(np.float32)
    got, want = step.backward([dout]), plain_step.backward([dout])
    for a, b in ((model.layers[0], plain.layers[0]), (model.layers[1], plain.layers[1])):
        mine = {k[1]: v for k, v in got.items() if k[0] == a.name}
        theirs = {k[1]: v for k, v in want.items() if k[0] == b.name}
        assert set(mine) == set(theirs) and mine
        for name in mine:
            assert np.array_equal(mine[name], theirs[name]), (a.name, name)
    assert conv._x is None and bn._x is None and bn._saved is None
    biased = layers.Conv2D(4, 3, padding="same", use_bias=True)
    biased.build((None, 6, 6, 3))
    with pytest.raises(RuntimeError, match="no bias and a linear activation"):
        biased._forward_into_batchnorm(x, bn, None)
    with pytest.raises(RuntimeError, match="cannot take a convolution into a forward with training=False"):
        bn._forward_after_conv(x, conv.kernel.value, conv._conv_kwargs(), False, None)


# ------------------------------------------------------------------------------- the backward op

def _backward_inputs(rng, x_shape, w_shape, layout, conv, dtype=np.float64):
    x, w, gamma, beta, rm, rv = _inputs(rng, x_shape, w_shape, layout, dtype)
    c = x_shape[3] if layout == "NHWC" else x_shape[1]
    gamma = random(rng, (c,), low=0.5, high=1.5).astype(gamma.dtype)
    beta = random(rng, (c,), low=-0.3, high=0.3).astype(gamma.dtype)
    rm, rv = np.zeros(c, gamma.dtype), np.ones(c, gamma.dtype)
    y, saved = kernels.batchnorm_forward_training(x, gamma, beta, rm, rv, layout=layout, activation="relu")
    dy = random(rng, kernels.conv2d_output_shape(x_shape, w_shape, layout=layout, **conv)).astype(dtype)
    return dy, w, x, y, gamma, beta, saved


BACKWARD_CASES = [  # (layout, x shape = the batch norm's, w shape, conv keywords)
    ("NHWC", (3, 5, 5, 4), (6, 3, 3, 4), dict(padding=1)),
    ("NHWC", (2, 6, 6, 3), (5, 2, 2, 3), dict(padding="same", stride=2)),
    ("NCHW", (2, 4, 6, 6), (5, 4, 3, 3), dict(padding=0)),
]


@pytest.mark.parametrize("layout, x_shape, w_shape, conv", BACKWARD_CASES)
def test_numpy_backward_op_is_the_data_gradient_then_the_batch_norm_backward(rng, layout, x_shape, w_shape, conv):
    dy, w, x, y, gamma, beta, saved = _backward_inputs(rng, x_shape, w_shape, layout, conv, np.float32)
    got = kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, saved, layout=layout, **conv)
    dconv = kernels.conv2d_backward_data(dy, w, x_shape, layout=layout, **conv)
    ref = kernels.batchnorm_backward(dconv, x, gamma, saved, layout=layout, activation="relu", y=y)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.any(got[0] != 0)


@pytest.mark.parametrize("layout, x_shape, w_shape, conv", BACKWARD_CASES[:2])
def test_float64_backward_op_matches_finite_differences(rng, layout, x_shape, w_shape, conv):
    """dx, dgamma, dbeta of sum(conv(relu(bn(x))) * r) against central differences of the forward."""
    dy, w, x, y, gamma, beta, saved = _backward_inputs(rng, x_shape, w_shape, layout, conv)
    assert np.min(np.abs(y[y > 0])) > 1e-4 and np.any(y == 0)  # no pre-activation on relu's kink

    def loss():
        out, _ = kernels.batchnorm_forward_training(x, gamma, beta, np.zeros_like(gamma), np.ones_like(gamma),
                                                layout=layout, activation="relu")
        return float(np.sum(kernels.conv2d_forward(out, w, layout=layout, **conv) * dy))

    dx, dgamma, dbeta = kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, saved, layout=layout, **conv)
    for name, analytic, arg in (("dx", dx, x), ("dgamma", dgamma, gamma), ("dbeta", dbeta, beta)):
        assert np.any(analytic != 0), name
        assert rel_error(analytic, numerical_grad(loss, arg)) < 1e-6, name


def test_backward_op_refuses_bad_input_with_the_argument_named(rng):
    dy, w, x, y, gamma, beta, saved = _backward_inputs(rng, (3, 5, 5, 4), (6, 3, 3, 4), "NHWC", dict(padding=1),
                                                       np.float32)
    kw = dict(padding=1, layout="NHWC")
    with pytest.raises(ValueError, match=r"dy has shape \(3, 3, 3, 6\), expected the convolution's output shape"):
        kernels.batchnorm_relu_conv2d_backward(dy[:, :3, :3], w, x, y, gamma, beta, saved, **kw)
    with pytest.raises(ValueError, match="y .the relu's output. has shape"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y[:2], gamma, beta, saved, **kw)
    with pytest.raises(TypeError, match="saved must be the BatchNormSaved"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, (saved.mean, saved.inv_std), **kw)
    _, plain = kernels.batchnorm_forward_training(x, gamma, beta, np.zeros(4, np.float32), np.ones(4, np.float32),
                                              layout="NHWC")
    with pytest.raises(ValueError, match="activation=None; this backward needs the record of a forward with"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, plain, **kw)
    with pytest.raises(TypeError, match="float16"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x.astype(np.float16), y, gamma, beta, saved, **kw)
    with pytest.raises(ValueError, match=r"beta has shape \(3,\), expected \(4,\) for x of shape"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta[:3], saved, **kw)
    with pytest.raises(TypeError, match="beta must be float32"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta.astype(np.float64), saved, **kw)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, saved, epsilon=-1.0, **kw)
    other = kernels.batchnorm_forward_training(x[:2], gamma, beta, np.zeros(4, np.float32), np.ones(4, np.float32),
                                           layout="NHWC", activation="relu")[1]
    with pytest.raises(ValueError, match=r"saved was made for x of shape \(2, 5, 5, 4\)"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, other, **kw)
    short = kernels.BatchNormSaved(saved.mean[:3], saved.inv_std)
    with pytest.raises(ValueError, match=r"saved.mean has shape \(3,\)"):
        kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, short, **kw)


def test_sequential_backward_through_conv_relu_and_batch_norm_equals_the_layers_own(cpu, rng):
    def build():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((6, 6, 3)), layers.Conv2D(4, 3, padding="same", use_bias=False),
                                 layers.BatchNormalization(), layers.ReLU(),
                                 layers.Conv2D(5, 3, padding="same", use_bias=False), layers.Flatten(),
                                 layers.Dense(2)])

    model, plain = build(), build()
    assert model._fused_pairs(True) == ((1,), (0,), (3,))
    x = random(rng, (4, 6, 6, 3)).astype(np.float32)
    step = TapedStep(model, [x], [True])
    out = np.asarray(step.out)
    with kernels.config.override(fuse_layers=False):
        plain_step = TapedStep(plain, [x], [True])
    assert np.array_equal(out, np.asarray(plain_step.out))
    calls = []
    conv2 = model.layers[3]
    original = conv2._backward_into_batchnorm
    conv2._backward_into_batchnorm = lambda *a: calls.append(1) or original(*a)
    for i in (1, 2):  # the batch norm's and the relu's own backwards must not run
        setattr(model.layers[i], "backward", lambda *a, **k: pytest.fail("a fused layer's own backward ran"))
    seen = []
    dout = random(rng, out.shape).astype(np.float32)
    got = step.backward([dout], on_leaf=lambda w, g: seen.append(w.layer.name))
    want = plain_step.backward([dout])
    # each weight reported as soon as its layer's backward ran: in reverse layer order
    order = [layer.name for layer in reversed(model.layers) if layer.trainable_weights]
    assert calls == [1] and list(dict.fromkeys(seen)) == order
    assert set(got) == {(m.name, k[1]) for k in want for m, p in zip(model.layers, plain.layers) if p.name == k[0]}
    for a, b in zip(model.layers, plain.layers):
        for w in a.trainable_weights:
            assert np.array_equal(got[(a.name, w.name)], want[(b.name, w.name)]), (a.name, w.name)
    assert model.layers[1]._saved is None


def test_a_channels_first_batch_norm_before_a_convolution_keeps_the_layers_own_backwards(cpu, rng):
    """BatchNormalization(axis=1) normalises over another axis than the convolution's channels: not fused."""
    model = keras.Sequential([keras.Input((6, 6, 6)), layers.BatchNormalization(axis=1), layers.ReLU(),
                              layers.Conv2D(4, 3, padding="same", use_bias=False), layers.Flatten(),
                              layers.Dense(2)])
    assert model.layers[0].layout == "NCHW"
    assert model._fused_pairs(True) == ((0,), (), ())


def test_a_refused_fused_backward_changes_no_state(cpu, rng):
    model = keras.Sequential([keras.Input((6, 6, 3)), layers.BatchNormalization(), layers.ReLU(),
                              layers.Conv2D(4, 3, padding="same", use_bias=False), layers.Flatten(),
                              layers.Dense(2)])
    bn, conv = model.layers[0], model.layers[2]
    x = random(rng, (2, 6, 6, 3)).astype(np.float32)
    y = bn.forward(x, training=True)  # a forward not fused with the relu
    conv.forward(y, training=True)
    dy = random(rng, (2, 6, 6, 4)).astype(np.float32)
    with pytest.raises(RuntimeError, match="needs a training forward fused with its relu"):
        conv._backward_into_batchnorm(dy, bn)
    assert conv.grads == {} and conv._x is not None and bn._x is not None and bn.grads == {}
