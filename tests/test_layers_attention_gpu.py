"""The attention family, EinsumDense, RMSNormalization and the masked GlobalAveragePooling1D on CUDA: each layer's
output and tape gradients (inputs and weights) vs the float64 NumPy layer per dtype policy, the dropout stream on
the device, and a tiny transformer trained with CUDA-graph replayed steps (no capture fallback) matching the NumPy
backend. MultiHeadAttention's fused branch calls ``ops.dot_product_attention`` (the composed cuBLAS + softmax
path until ``fused_attention`` takes cuDNN's SDPA), the scores branch the einsum-softmax path: both are covered."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
from dnnbind import layers, mixed_precision, ops
from dnnbind.autodiff import GradientTape
from dnnbind.kernels import config
from gpu_errlog import BF16, check, quantize
from testutil import random, rel_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _reset():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


POLICIES = [
    pytest.param("float32", "float32", np.dtype(np.float32), id="fp32"),
    pytest.param("float16", "mixed_float16", np.dtype(np.float16), id="fp16"),
    pytest.param("bfloat16", "mixed_bfloat16", BF16, id="bf16"),
]
# a chain of four products and a softmax: twice the single-op tolerance in half precision
TOL = {"float32": 2e-5, "float16": 2e-2, "bfloat16": 4e-2}

# name, factory(dtype policy), input shapes, call kwargs
CASES = [
    ("mha_fused", lambda dt: layers.MultiHeadAttention(2, 8, dtype=dt), [(2, 6, 16), (2, 7, 16)], {}),
    ("mha_fused_causal", lambda dt: layers.MultiHeadAttention(4, 4, dtype=dt), [(2, 8, 16), (2, 8, 16)],
     {"use_causal_mask": True}),
    ("mha_scores_mask", lambda dt: layers.MultiHeadAttention(2, 8, value_dim=4, output_shape=12, dtype=dt),
     [(2, 6, 16), (2, 7, 16)], {"return_attention_scores": True, "value_mask": "vmask"}),
    ("mha_axes_4d", lambda dt: layers.MultiHeadAttention(2, 4, attention_axes=(2,), dtype=dt),
     [(2, 3, 5, 8), (2, 3, 4, 8)], {}),
    ("gqa_fused", lambda dt: layers.GroupQueryAttention(8, 4, 2, dtype=dt), [(2, 6, 16), (2, 7, 16)], {}),
    ("gqa_scores_causal", lambda dt: layers.GroupQueryAttention(4, 6, 3, dtype=dt), [(2, 7, 12), (2, 7, 12)],
     {"use_causal_mask": True, "return_attention_scores": True}),
    ("einsum_dense", lambda dt: layers.EinsumDense("abc,cde->abde", (None, 4, 8), bias_axes="de", dtype=dt),
     [(3, 5, 16)], {}),
    ("rms_normalization", lambda dt: layers.RMSNormalization(dtype=dt), [(3, 5, 32)], {}),
]


def _as(t):
    return ops.convert_to_numpy(t).astype(np.float64)


def _run(make, policy, device, weights, inputs, call, r):
    """(outputs, input gradients, weight gradients) of sum(outputs[0] * r) on ``device``."""
    dnnbind.set_default_device(device)
    layer = make(policy)
    xs = [ops.convert_to_tensor(x.astype(np.float32)) for x in inputs]
    layer(*xs, **call)
    layer.set_weights(weights)
    with GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        out = layer(*xs, **call)
        outs = list(out) if isinstance(out, tuple) else [out]
        loss = ops.sum(ops.multiply(ops.cast(outs[0], "float32"), r.astype(np.float32)))
    grads = tape.gradient(loss, xs + list(layer.trainable_weights))
    return [_as(o) for o in outs], [_as(g) for g in grads]


@pytest.mark.parametrize("label, policy, cdt", POLICIES)
@pytest.mark.parametrize("name, make, shapes, call", CASES, ids=[c[0] for c in CASES])
def test_layer_on_cuda_matches_float64_numpy(rng, label, policy, cdt, name, make, shapes, call):
    inputs = [quantize(random(rng, s, low=-2, high=2), cdt) for s in shapes]
    call = dict(call)
    if call.get("value_mask") == "vmask":
        vmask = np.ones(shapes[1][:2], bool)
        vmask[0, 5:] = False
        vmask[1, 1] = False
        call["value_mask"] = vmask
    dnnbind.set_default_device("cpu")
    probe = make("float64")
    probe(*inputs, **call)
    weights = [quantize(random(rng, w.shape, low=-0.5, high=0.5), cdt) for w in probe.get_weights()]
    out_shape = probe(*inputs, **call)
    out_shape = (out_shape[0] if isinstance(out_shape, tuple) else out_shape).shape
    r = quantize(random(rng, tuple(out_shape)), cdt)
    want_outs, want_grads = _run(make, "float64", "cpu", weights, inputs, call, r)
    with config.override(allow_tf32=False):
        outs, grads = _run(make, policy, "cuda", weights, inputs, call, r)
    tol = TOL[label]
    for i, (o, w) in enumerate(zip(outs, want_outs)):
        check(f"layer.{name}.out{i}", label, o, w, name, tol=tol)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        if np.abs(w).max() < 1e-9:  # a key bias: the softmax cancels it; what is left is rounding noise
            assert np.abs(g).max() < {"bfloat16": 2e-2, "float16": 1e-2}.get(label, 1e-3), (name, label, np.abs(g).max())
            continue
        check(f"layer.{name}.grad{i}", label, g, w, name, tol=tol)


def test_attention_dropout_stream_on_cuda(rng):
    dnnbind.set_default_device("cuda")
    q = random(rng, (4, 8, 16)).astype(np.float32)
    mha = layers.MultiHeadAttention(2, 8, dropout=0.5, seed=4)
    infer = _as(mha(q, q))
    np.testing.assert_allclose(_as(mha(q, q, training=False)), infer, rtol=0, atol=0)
    a, b = _as(mha(q, q, training=True)), _as(mha(q, q, training=True))
    assert np.all(np.isfinite(a)) and not np.allclose(a, infer) and not np.allclose(a, b)
    att = layers.Attention(dropout=0.5, seed=2)
    assert not np.allclose(_as(att([q, q], training=True)), _as(att([q, q])))


def _transformer(device):
    dnnbind.set_default_device(device)
    init = dnnbind.initializers.GlorotUniform
    inp = dnnbind.Input((8,), dtype="int32")
    h = layers.Embedding(11, 16, mask_zero=True)(inp)
    a = layers.MultiHeadAttention(2, 8, kernel_initializer=init(1))(h, h, use_causal_mask=True)
    h = layers.LayerNormalization()(layers.Add()([h, a]))
    g = layers.GroupQueryAttention(4, 4, 2, kernel_initializer=init(2))(h, h)
    h = layers.RMSNormalization()(layers.Add()([h, g]))
    h = layers.EinsumDense("abc,cd->abd", (None, 16), bias_axes="d", activation="gelu", kernel_initializer=init(3))(h)
    return dnnbind.Model(inp, layers.Dense(5, activation="softmax", kernel_initializer=init(4))(
        layers.GlobalAveragePooling1D()(h)))


def test_graph_replayed_transformer_training_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 11, size=(64, 8)).astype(np.int32)
    x[::3, 6:] = 0  # padding, masked through the Embedding
    y = (x[:, 0] % 5).astype(np.int32)
    cpu = _transformer("cpu")
    gpu = _transformer("cuda")
    gpu.set_weights(cpu.get_weights())
    with config.override(allow_tf32=False):
        for m in (cpu, gpu):
            m.compile(dnnbind.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
        hc = cpu.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hg = gpu.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    fallbacks = [str(w.message) for w in caught if "captur" in str(w.message).lower()]
    assert not fallbacks, fallbacks
    assert np.allclose(hc.history["loss"], hg.history["loss"], rtol=1e-3)
    assert hg.history["loss"][-1] < hg.history["loss"][0]
    for a, b in zip(cpu.get_weights(), gpu.get_weights()):
        # relative to the weight's scale, floored: the key bias gets no gradient (the softmax cancels it), only
        # rounding noise, which Adam normalises into steps of up to ~lr/100 (1e-5 measured on the H200) on both
        # sides, different ones: their relative error means nothing, so the floor is 0.1 * lr
        assert np.max(np.abs(b - a)) <= max(1e-3 * float(np.max(np.abs(a))), 3e-4), (a.shape, rel_error(b, a))
