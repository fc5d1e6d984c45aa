"""keras.ops.nn beyond the registry's cases (``tests/opcases/nn.py``): second-order gradients through the
kernel-backed ops (a gradient-norm penalty through ``conv`` and a dense layer, pooling, normalisation,
softmax, activations), the fused cross-entropy's VJP reusing its saved gradient, the attention seam and
masks, dtypes, and the errors bad arguments get."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import kernels, ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import numeric as N
from dnnbind.ops import _attention
from dnnbind.ops._core import np_dtype
from testutil import numerical_grad, random, rel_error


@pytest.fixture(autouse=True)
def _cpu():
    dnnbind.set_default_device("cpu")
    yield
    dnnbind.set_default_device(None)


def _t(a):
    return ops.convert_to_tensor(a)


def _penalty_and_grads(fn, x, params):
    """``p = sum(d fn(x, *params) / dx ** 2)`` and its gradients w.r.t. ``params`` (a gradient of a gradient)."""
    xt, pts = _t(x), [_t(p) for p in params]
    with GradientTape() as outer:
        for p in pts:
            outer.watch(p)
        with GradientTape() as inner:
            inner.watch(xt)
            y = fn(xt, *pts)
        (gx,) = inner.gradient(y, [xt])
        penalty = ops.sum(ops.square(gx))
    return float(penalty), outer.gradient(penalty, pts)


def _penalty(fn, x, params):
    xt = _t(x)
    with GradientTape() as tape:
        tape.watch(xt)
        y = fn(xt, *[_t(p) for p in params])
    return float(ops.sum(ops.square(tape.gradient(y, xt))))


def _check_second_order(fn, x, params, tol=1e-6):
    _, grads = _penalty_and_grads(fn, x, params)
    for p, g in zip(params, grads):
        num = numerical_grad(lambda: _penalty(fn, x, params), p)
        assert g is not None
        assert rel_error(np.asarray(g), num) < tol, rel_error(np.asarray(g), num)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_second_order_through_conv_and_a_dense_layer(rng, fmt):
    """A gradient penalty (WGAN-GP's ``|d D(x) / dx|^2``) through a conv layer and a dense layer in ops:
    the conv's VJP is a transposed convolution and a filter gradient, each differentiable again."""
    shape = (2, 5, 5, 2) if fmt == "channels_last" else (2, 2, 5, 5)
    x = random(rng, shape)
    w = random(rng, (3, 3, 2, 3))
    dense_w = random(rng, (27, 2))
    dense_b = random(rng, (2,))

    def critic(xt, wt, dwt, dbt):
        h = ops.tanh(ops.conv(xt, wt, strides=2, padding="same", data_format=fmt))
        h = ops.reshape(h, (h.shape[0], -1))
        return ops.sum(ops.softplus(ops.matmul(h, dwt) + dbt))

    _check_second_order(critic, x, [w, dense_w, dense_b])


def test_second_order_through_grouped_dilated_conv_and_conv_transpose(rng):
    x = random(rng, (1, 6, 6, 4))
    w = random(rng, (2, 2, 2, 4))  # groups = 2
    k = random(rng, (3, 3, 2, 4))  # conv_transpose kernel (h, w, out, in)

    def fn(xt, wt, kt):
        h = ops.gelu(ops.conv(xt, wt, padding="same", dilation_rate=2))
        return ops.sum(ops.sin(ops.conv_transpose(h, kt, strides=2, padding="same")))

    _check_second_order(fn, x, [w, k])


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_second_order_through_the_filter_gradient(rng, fmt):
    """A penalty on the kernel's gradient (MAML's inner step): the filter-gradient convolution's VJP, w.r.t.
    the data and the output gradient, is needed."""
    shape = (2, 5, 4, 2) if fmt == "channels_last" else (2, 2, 5, 4)
    x, w = random(rng, shape), random(rng, (2, 3, 2, 3))

    def weight_penalty(xt, wt):
        with GradientTape() as tape:
            tape.watch(wt)
            y = ops.sum(ops.sin(ops.conv(xt, wt, strides=(2, 1), padding="same", data_format=fmt)))
        return ops.sum(ops.square(tape.gradient(y, wt)))

    xt, wt = _t(x), _t(w)
    with GradientTape() as outer:
        outer.watch(xt)
        outer.watch(wt)
        p = weight_penalty(xt, wt)
    gx, gw = outer.gradient(p, [xt, wt])
    for arr, g in ((x, gx), (w, gw)):
        num = numerical_grad(lambda: float(weight_penalty(_t(x), _t(w))), arr)
        assert rel_error(g, num) < 1e-6


@pytest.mark.parametrize("pool", ["max_pool", "average_pool"])
def test_second_order_through_pooling(rng, pool):
    x = random(rng, (1, 5, 5, 2))
    w = random(rng, (2, 2, 2, 2))

    def fn(xt, wt):
        h = ops.conv(xt, wt, padding="same")
        h = getattr(ops, pool)(ops.multiply(h, h), 3, strides=2, padding="same")
        return ops.sum(ops.tanh(h))

    _check_second_order(fn, x, [w])


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_normalization", "gelu", "elu", "selu",
                                  "leaky_relu", "relu6", "celu"])
def test_second_order_through_kernel_backed_ops(rng, name):
    x = random(rng, (3, 4), low=-3, high=3) if name != "relu6" else random(rng, (3, 4), low=-2, high=8)
    w = random(rng, (4, 4))

    def fn(xt, wt):
        return ops.sum(ops.sin(getattr(ops, name)(ops.matmul(xt, wt))))

    _check_second_order(fn, x, [w])


def test_second_order_through_the_layer_norm_kernel_with_parameters(rng):
    x = random(rng, (3, 2, 4))
    gamma, beta = random(rng, (2, 4)), random(rng, (2, 4))

    def fn(xt, g, b):
        return ops.sum(ops.sin(ops.layer_normalization(ops.multiply(xt, xt), g, b, axis=(1, 2))))

    _check_second_order(fn, x, [gamma, beta])


def test_second_order_through_batch_norm_kernel_and_fused_crossentropy(rng):
    x = random(rng, (4, 3))
    mean, var = random(rng, (3,)), random(rng, (3,), low=0.5, high=1.5)
    gamma, beta = random(rng, (3,)), random(rng, (3,))
    labels = np.array([0, 2, 1, 2], np.int32)

    def fn(xt, g, b):
        h = ops.batch_normalization(xt, _t(mean), _t(var), axis=-1, offset=b, scale=g)
        return ops.mean(ops.sparse_categorical_crossentropy(labels, h, from_logits=True))

    _check_second_order(fn, x, [gamma, beta])


def test_second_order_through_probability_crossentropy(rng):
    x = random(rng, (3, 4))
    t = random(rng, (3, 4), low=0.0, high=1.0)

    def fn(xt, tt):
        return ops.sum(ops.categorical_crossentropy(tt, ops.softmax(xt)))

    _check_second_order(fn, x, [t])


# ------------------------------------------------------------------------ the fused cross-entropy's VJP
def _count_numeric_calls(monkeypatch):
    calls = []
    for name in ("unary", "binary", "where", "reduce", "strided_copy", "full", "matmul"):
        original = getattr(N, name)

        def counting(*args, __original=original, __name=name, **kwargs):
            calls.append(__name)
            return __original(*args, **kwargs)

        monkeypatch.setattr(N, name, counting)
    return calls


@pytest.mark.parametrize("sparse", [True, False])
def test_crossentropy_vjp_returns_the_saved_gradient_without_a_kernel(rng, monkeypatch, sparse):
    logits = _t(random(rng, (5, 4)))
    labels = np.array([0, 3, 1, 1, 2], np.int32)
    target = np.eye(4)[labels]
    with GradientTape() as tape:
        tape.watch(logits)
        loss = ops.sum(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True) if sparse
                       else ops.categorical_crossentropy(target, logits, from_logits=True))
    calls = _count_numeric_calls(monkeypatch)
    grad = tape.gradient(loss, logits)
    assert calls == []  # the seed is a FilledTensor of ones: the saved dlogits are the answer
    x = logits.numpy()
    softmax = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    assert rel_error(grad, softmax - target) < 1e-12


def test_crossentropy_vjp_scales_the_saved_gradient_once_for_a_mean(rng, monkeypatch):
    logits = _t(random(rng, (5, 4)))
    labels = np.array([0, 3, 1, 1, 2], np.int32)
    with GradientTape() as tape:
        tape.watch(logits)
        loss = ops.mean(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    calls = _count_numeric_calls(monkeypatch)
    grad = tape.gradient(loss, logits)
    assert calls == ["unary"]  # one scale_shift by 1/N
    x = logits.numpy()
    softmax = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    assert rel_error(grad, (softmax - np.eye(4)[labels]) / 5) < 1e-12


def test_crossentropy_vjp_with_per_sample_gradients(rng):
    logits = _t(random(rng, (3, 4)))
    labels = np.array([1, 0, 3], np.int32)
    weights = np.array([0.5, -2.0, 3.0])
    with GradientTape() as tape:
        tape.watch(logits)
        loss = ops.sum(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True) * weights)
    grad = tape.gradient(loss, logits)
    x = logits.numpy()
    softmax = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    assert rel_error(grad, (softmax - np.eye(4)[labels]) * weights[:, None]) < 1e-12


# ------------------------------------------------------------------------------------- attention
def test_attention_fully_masked_rows_attend_uniformly(rng):
    q, k, v = (random(rng, (1, 2, 1, 3)), random(rng, (1, 3, 1, 3)), random(rng, (1, 3, 1, 3)))
    mask = np.zeros((1, 1, 2, 3), bool)
    out = ops.dot_product_attention(q, k, v, mask=mask)
    assert rel_error(out, np.broadcast_to(v.mean(1, keepdims=True), (1, 2, 1, 3))) < 1e-12


def test_attention_seam_takes_the_fused_result_when_it_has_one(rng, monkeypatch):
    q, k, v = (random(rng, (1, 2, 2, 4)) for _ in range(3))
    seen = []

    def fused(query, key, value, bias, mask, scale, is_causal):
        seen.append((tuple(query.shape), scale, is_causal))
        return ops.zeros_like(query)

    monkeypatch.setattr(_attention, "fused_attention", fused)
    out = ops.dot_product_attention(q, k, v, is_causal=True)
    assert seen == [((1, 2, 2, 4), 0.5, True)] and not np.any(out.numpy())
    ops.dot_product_attention(q, k, v, flash_attention=False)
    assert len(seen) == 1  # flash_attention=False never asks


def test_attention_refusals(rng):
    q = random(rng, (1, 2, 2, 4))
    with pytest.raises(ValueError, match="flash_attention=True needs cuDNN"):
        ops.dot_product_attention(q, q, q, flash_attention=True)
    with pytest.raises(ValueError, match="attn_logits_soft_cap"):
        ops.dot_product_attention(q, q, q, attn_logits_soft_cap=20.0)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ops.dot_product_attention(random(rng, (1, 2, 3, 4)), q, q)
    with pytest.raises(ValueError, match="only supports 4D"):
        ops.dot_product_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match=r"Expected `mask` to have shape \(B, 1, T, S\)"):
        ops.dot_product_attention(q, q, q, mask=np.ones((1, 3, 2, 2), bool))


def test_attention_half_precision_keeps_the_dtype_and_computes_logits_in_float32(rng):
    q, k, v = (random(rng, (1, 3, 2, 4), dtype=np.float16) for _ in range(3))
    out = ops.dot_product_attention(q, k, v)
    assert out.dtype == np.float16
    ref = ops.dot_product_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert rel_error(out.numpy().astype(np.float64), ref.numpy()) < 2e-3


# ------------------------------------------------------------------------------------------ dtypes
def test_normalisations_compute_half_precision_in_float32_and_return_it(rng):
    x = random(rng, (4, 6), dtype=np.float16)
    assert ops.layer_normalization(x).dtype == np.float16
    assert ops.layer_normalization(x, axis=0).dtype == np.float16  # the composed path
    assert ops.rms_normalization(x).dtype == np.float16
    m, v = ops.moments(x, axes=[0])
    assert m.dtype == np.float16 and v.dtype == np.float16
    ref = ops.layer_normalization(x.astype(np.float64))
    assert rel_error(ops.layer_normalization(x).numpy().astype(np.float64), ref.numpy()) < 2e-3


def test_conv_converts_the_inputs_to_the_kernels_dtype(rng):
    y = ops.conv(random(rng, (1, 4, 4, 2)), random(rng, (2, 2, 2, 3), dtype=np.float32))
    assert y.dtype == np.float32
    assert ops.softmax(np.arange(6).reshape(2, 3)).dtype == np.float32  # ints compute in floatx


def test_layer_and_batch_norm_kernel_paths_match_their_compositions(rng):
    x = random(rng, (2, 3, 4, 5))
    gamma, beta = random(rng, (4, 5)), random(rng, (4, 5))
    fast = ops.layer_normalization(x, gamma, beta, axis=(2, 3))  # trailing axes: the kernel
    moved = ops.layer_normalization(np.moveaxis(x, 0, -1), np.moveaxis(gamma[..., None], 2, 2), None,
                                    axis=(1, 2))  # the composed path
    ref = (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-7) * gamma + beta
    assert rel_error(fast, ref) < 1e-12
    assert rel_error(np.moveaxis(moved.numpy(), -1, 0), ref - beta) < 1e-12
    xb = random(rng, (2, 3, 2, 2))
    mean, var = random(rng, (3,)), random(rng, (3,), low=0.5, high=1.5)
    kernel = ops.batch_normalization(xb, mean, var, axis=1, epsilon=1e-3)
    composed = ops.batch_normalization(xb, mean, var, axis=1, epsilon=1e-6)  # below cuDNN's minimum: ops
    for y, eps in ((kernel, 1e-3), (composed, 1e-6)):
        want = (xb - mean[:, None, None]) / np.sqrt(var[:, None, None] + eps)
        assert rel_error(y, want) < 1e-12


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("call, error, message", [
    (lambda r: ops.conv(random(r, (1, 5, 5, 3)), random(r, (3, 3, 2, 4))), ValueError, "evenly divisible"),
    (lambda r: ops.conv(random(r, (1, 5, 5, 4)), random(r, (3, 3, 2, 3))), ValueError, "divisible by the 2 groups"),
    (lambda r: ops.conv(random(r, (1, 2, 2, 1)), random(r, (3, 3, 1, 1))), ValueError, "empty output"),
    (lambda r: ops.conv(random(r, (1, 5, 5, 1)), random(r, (3, 1, 1))), ValueError, "must have rank 4"),
    (lambda r: ops.conv(random(r, (1, 5, 5, 1)), random(r, (3, 3, 1, 1)), padding="full"), ValueError,
     "padding must be 'valid' or 'same'"),
    (lambda r: ops.conv(random(r, (1, 5, 5, 1)), random(r, (3, 3, 1, 1)), data_format="NHWC"), ValueError,
     "data_format"),
    (lambda r: ops.conv(random(r, (1, 5, 5, 1)), random(r, (3, 3, 1, 1)), strides=(1, 2, 1)), ValueError,
     "strides must have 2 values"),
    (lambda r: ops.conv_transpose(random(r, (1, 3, 3, 2)), random(r, (3, 3, 2, 3))), ValueError,
     "kernel input channels=3"),
    (lambda r: ops.depthwise_conv(random(r, (1, 5, 5, 2)), random(r, (3, 3, 3, 1))), ValueError,
     "must match the kernel's input channels"),
    (lambda r: ops.max_pool(random(r, (1, 2, 2, 1)), 3, 1), ValueError, "does not fit"),
    (lambda r: ops.max_pool(random(r, (2, 3)), 2), ValueError, "3-d, 4-d or 5-d"),
    (lambda r: ops.glu(random(r, (2, 3))), ValueError, "divisible by 2"),
    (lambda r: ops.softmax(random(r, (2, 3)), axis=2), ValueError, "out of bounds"),
    (lambda r: ops.categorical_crossentropy(random(r, (2, 3)), random(r, (2, 4))), ValueError, "same shape"),
    (lambda r: ops.sparse_categorical_crossentropy(np.zeros((3,), np.int32), random(r, (2, 4))), ValueError,
     "up until the last dimension"),
    (lambda r: ops.binary_crossentropy(random(r, (2, 3)), random(r, (3, 2))), ValueError, "same shape"),
    (lambda r: ops.batch_normalization(random(r, (2, 3)), random(r, (2,)), random(r, (3,)), axis=-1), ValueError,
     "must be a vector of length"),
    (lambda r: ops.layer_normalization(random(r, (2, 3)), rms_scale=True), TypeError, "unexpected keyword"),
    (lambda r: ops.moments(random(r, (2, 3)), [0], synchronized=True), NotImplementedError, "synchronized"),
    (lambda r: ops.normalize(random(r, (2, 3)), order=0), ValueError, "order"),
    (lambda r: ops.depth_to_space(random(r, (1, 2, 2, 3)), 2), ValueError, "divisible by block_size"),
    (lambda r: ops.space_to_depth(random(r, (1, 3, 2, 3)), 2), ValueError, r"Height \(3\)"),
    (lambda r: ops.depth_to_space(random(r, (1, 2, 2, 4)), 1), ValueError, "at least 2"),
    (lambda r: ops.unfold(random(r, (2, 3, 4)), 2), ValueError, "4D"),
    (lambda r: ops.fold(random(r, (1, 8, 5)), 3, 2), ValueError, "blocks"),
    (lambda r: ops.multi_hot(np.array([1, 2])), ValueError, "num_classes"),
    (lambda r: ops.psnr(random(r, (2, 3)), random(r, (3, 2)), 1.0), ValueError, "must match"),
    (lambda r: ops.ctc_decode(random(r, (1, 3, 4)), np.array([3]), strategy="best"), ValueError,
     "Invalid strategy"),
    (lambda r: ops.ctc_loss(np.zeros((2, 2), np.int32), random(r, (1, 3, 4)), np.array([2]), np.array([3])),
     ValueError, "same first dimension"),
])
def test_bad_arguments_are_named(rng, call, error, message):
    with pytest.raises(error, match=message):
        call(rng)


def test_conv3d_and_pool3d_compose_the_2d_primitives(rng, monkeypatch):
    """3-d convolutions and poolings run on the 2-d kernels (cuDNN's on the device): no other kernel."""
    used = []
    for name in ("conv2d_forward", "pool2d_forward"):
        original = getattr(kernels, name)

        def spy(*args, __original=original, __name=name, **kwargs):
            used.append((__name, args[0].ndim))
            return __original(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
    ops.conv(random(rng, (1, 4, 4, 4, 2)), random(rng, (2, 2, 2, 2, 3)))
    ops.max_pool(random(rng, (1, 4, 4, 4, 2)), 2, 2)
    assert used == [("conv2d_forward", 4)] * 2 + [("pool2d_forward", 4)] * 2


_HALF_CASES = {
    "relu6": lambda x: ops.relu6(x * 4),
    "elu": ops.elu,
    "gelu": ops.gelu,
    "softmax": ops.softmax,
    "log_softmax": ops.log_softmax,
    "max_pool": lambda x: ops.max_pool(x, 2, 1, "same"),
    "average_pool": lambda x: ops.average_pool(x, 2, 1, "same"),
    "adaptive_average_pool": lambda x: ops.adaptive_average_pool(x, (2, 3)),
    "conv": lambda x: ops.conv(x, np.full((2, 2, 4, 3), 0.25, x.dtype), padding="same"),
    "conv_transpose": lambda x: ops.conv_transpose(x, np.full((2, 2, 3, 4), 0.25, x.dtype), strides=2),
    "layer_normalization": ops.layer_normalization,
    "batch_normalization": lambda x: ops.batch_normalization(x, np.zeros(4, x.dtype), np.ones(4, x.dtype), -1),
    "categorical_crossentropy": lambda x: ops.categorical_crossentropy(ops.softmax(x), x, from_logits=True),
    "sparse_categorical_crossentropy": lambda x: ops.sparse_categorical_crossentropy(
        np.zeros(x.shape[:-1], np.int32), x, from_logits=True),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_HALF_CASES))
def test_half_precision_inputs_keep_their_dtype(rng, name, dtype):
    dt = np_dtype(dtype)
    x64 = random(rng, (2, 3, 4, 4))
    got = _HALF_CASES[name](x64.astype(dt))
    want = _HALF_CASES[name](x64.astype(dt).astype(np.float64))
    assert got.dtype == dt, (name, got.dtype)
    assert rel_error(got.numpy().astype(np.float64), want.numpy()) < (2e-2 if dtype == "bfloat16" else 3e-3)


def test_integer_inputs_compute_in_floatx():
    for fn in (ops.elu, ops.gelu, ops.hard_sigmoid, ops.softsign, ops.log_softmax, ops.relu6):
        assert fn(np.array([[1, -2, 3]], np.int32)).dtype == np.float32
