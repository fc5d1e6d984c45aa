"""The attention family (MultiHeadAttention, GroupedQueryAttention, Attention, AdditiveAttention), EinsumDense and
RMSNormalization on the NumPy backend: forward values against real Keras 3 (JAX backend, one subprocess for
every case, the same weights through set_weights), the loss after one SGD step, .weights.h5 files both ways,
float64 finite-difference gradients, a tiny transformer that learns, configs and the errors for bad arguments."""

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

from testutil import numerical_grad, rel_error


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _np(t):
    return keras.ops.convert_to_numpy(t)


# ----- the cases compared with Keras ----------------------------------------------------------------------
# name: (class, constructor kwargs, input names, call kwargs ("@name": an array), inputs as one list)
B, T, S, D = 2, 5, 6, 8


def _arrays(rng) -> dict:
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)
    amask = rng.random((B, T, S)) > 0.4
    amask[:, :, 0] = True  # every query row keeps a key: both Keras paths agree there
    vmask = np.ones((B, S), bool)
    vmask[0, 4:] = False
    vmask[1, 2] = False
    qmask = np.ones((B, T), bool)
    qmask[1, 3:] = False
    q = f(B, T, D)
    q[~qmask] = 0.0  # what keras.layers.Masking(0.0) masks in the Keras run
    return {"q": q, "v": f(B, S, D), "k": f(B, S, 6), "amask": amask, "vmask": vmask, "qmask": qmask,
            "q4": f(B, 3, 4, D), "v4": f(B, 3, 2, D), "x4": f(B, 3, 4, 5), "sq": f(B, T, D),
            "x5": f(3, 2, 3, 2, 4)}


CASES = {
    "mha_fused": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 4}, ["q", "v"], {}, False),
    "mha_scores_value_mask": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 4}, ["q", "v"],
                              {"value_mask": "@vmask", "return_attention_scores": True}, False),
    "mha_fused_value_mask": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 4}, ["q", "v"],
                             {"value_mask": "@vmask"}, False),
    "mha_causal_fused": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 3}, ["sq", "sq"],
                         {"use_causal_mask": True}, False),
    "mha_causal_scores": ("MultiHeadAttention", {"num_heads": 3, "key_dim": 2}, ["sq", "sq"],
                          {"use_causal_mask": True, "return_attention_scores": True}, False),
    "mha_key_value_dim_output_shape": ("MultiHeadAttention",
                                       {"num_heads": 2, "key_dim": 3, "value_dim": 5, "output_shape": (2, 3)},
                                       ["q", "v", "k"],  # (scores: Keras's JAX fused path needs value_dim == key_dim)
                                       {"attention_mask": "@amask", "return_attention_scores": True}, False),
    "mha_attention_mask_scores_no_bias": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 4, "use_bias": False},
                                          ["q", "v", "k"],
                                          {"attention_mask": "@amask", "return_attention_scores": True}, False),
    "mha_axes_4d": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 3, "attention_axes": (2,)}, ["q4", "v4"],
                    {"return_attention_scores": True}, False),
    "mha_axes_4d_both": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 3, "attention_axes": (1, 2)},
                         ["q4", "v4"], {}, False),
    "mha_query_mask": ("MultiHeadAttention", {"num_heads": 2, "key_dim": 4}, ["q", "v"],
                       {"query_mask": "@qmask"}, False),
    "gqa_fused_mask": ("GroupQueryAttention", {"head_dim": 3, "num_query_heads": 4, "num_key_value_heads": 2},
                       ["q", "v"], {"attention_mask": "@amask"}, False),
    "gqa_causal_scores": ("GroupQueryAttention", {"head_dim": 2, "num_query_heads": 6, "num_key_value_heads": 2},
                          ["sq", "sq"], {"use_causal_mask": True, "return_attention_scores": True}, False),
    "gqa_causal_fused_key": ("GroupQueryAttention", {"head_dim": 4, "num_query_heads": 2, "num_key_value_heads": 1},
                             ["sq", "v", "v"], {"use_causal_mask": True}, False),
    "attention_dot_scale_masks": ("Attention", {"use_scale": True}, ["q", "v"],
                                  {"mask": ["@qmask", "@vmask"], "return_attention_scores": True}, True),
    "attention_causal": ("Attention", {}, ["sq", "sq"], {"use_causal_mask": True}, True),
    "attention_concat_key": ("Attention", {"use_scale": True, "score_mode": "concat"}, ["q", "v", "v"],
                             {"mask": ["@qmask", "@vmask"], "use_causal_mask": True}, True),
    "additive": ("AdditiveAttention", {}, ["q", "v"], {"mask": [None, "@vmask"], "return_attention_scores": True},
                 True),
    "einsum_3d": ("EinsumDense", {"equation": "abc,cde->abde", "output_shape": (None, 2, 4), "bias_axes": "de"},
                  ["q"], {}, False),
    "einsum_ellipsis_relu": ("EinsumDense", {"equation": "...b,bc->...c", "output_shape": 3, "bias_axes": "c",
                                             "activation": "relu"}, ["q4"], {}, False),
    "einsum_right_ellipsis": ("EinsumDense", {"equation": "abc...,cd->abd...", "output_shape": (None, 4),
                                              "bias_axes": "d"}, ["x4"], {}, False),
    "rms_last": ("RMSNormalization", {}, ["q"], {}, False),
    # the sequence odds: normalisation on inputs of other ranks, causal dilated Conv1D, a masked mean
    "layernorm_4d_two_axes": ("LayerNormalization", {"axis": [-2, -1]}, ["x4"], {}, False),
    "layernorm_3d": ("LayerNormalization", {"epsilon": 1e-5}, ["q"], {}, False),
    "batchnorm_3d_inference": ("BatchNormalization", {}, ["q"], {}, False),
    "batchnorm_5d_training": ("BatchNormalization", {"epsilon": 1e-2}, ["x5"], {"training": True}, False),
    "conv1d_causal_dilated": ("Conv1D", {"filters": 3, "kernel_size": 3, "padding": "causal", "dilation_rate": 2},
                              ["q"], {}, False),
    "gap1d_mask": ("GlobalAveragePooling1D", {}, ["q"], {"mask": "@qmask"}, False),
    "gap1d_mask_keepdims": ("GlobalAveragePooling1D", {"keepdims": True}, ["q"], {"mask": "@qmask"}, False),
    "rms_two_axes": ("RMSNormalization", {"axis": [3, 2], "epsilon": 1e-3}, ["x4"], {}, False),
}


def _resolve(value, arrays):
    if isinstance(value, str) and value.startswith("@"):
        return arrays[value[1:]]
    if isinstance(value, list):
        return [_resolve(v, arrays) for v in value]
    return value


def _run_dnnbind(name, arrays, rng):
    cls, kwargs, inputs, call, as_list = CASES[name]
    layer = getattr(layers, cls)(**kwargs)
    args = [arrays[k] for k in inputs]
    call = {k: _resolve(v, arrays) for k, v in call.items()}
    args = [args] if as_list else args
    layer(*args, **call)
    weights = [rng.normal(size=w.shape).astype(np.float32) * 0.5 for w in layer.get_weights()]
    if cls == "BatchNormalization":  # a variance is positive
        weights = [np.abs(w) + 0.5 for w in weights]
    layer.set_weights(weights)
    out = layer(*args, **call)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return weights, [_np(o) for o in outs]


_KERAS_SCRIPT = r"""
import json, sys
import numpy as np
import keras
work = sys.argv[1]
spec = json.load(open(f"{work}/cases.json"))
arr = dict(np.load(f"{work}/in.npz"))
res = {}

def resolve(v):
    if isinstance(v, str) and v.startswith("@"):
        return arr[v[1:]]
    if isinstance(v, list):
        return [resolve(x) for x in v]
    return v

for name, (cls, kwargs, inputs, call, as_list) in spec.items():
    if "output_shape" in kwargs and isinstance(kwargs["output_shape"], list):
        kwargs["output_shape"] = tuple(kwargs["output_shape"])
    if "attention_axes" in kwargs:
        kwargs["attention_axes"] = tuple(kwargs["attention_axes"])
    if cls in ("MultiHeadAttention", "GroupQueryAttention", "EinsumDense"):
        kwargs["kernel_initializer"] = "zeros"  # set_weights follows; a random draw costs seconds of compiling
    layer = getattr(keras.layers, cls)(**kwargs)
    args = [arr[k] for k in inputs]
    call = {k: resolve(v) for k, v in call.items()}
    if "query_mask" in call:  # Keras 3 reads the query's mask from the tensor: a functional model with Masking
        call.pop("query_mask")
        ins = [keras.Input(a.shape[1:]) for a in args]
        q = keras.layers.Masking(0.0)(ins[0])
        model = keras.Model(ins, layer(q, *ins[1:], **call))
        model(args)
        n = len(layer.get_weights())
        layer.set_weights([arr[f"{name}/w{i}"] for i in range(n)])
        outs = [model(args)]
    else:
        args = [args] if as_list else args
        layer(*args, **call)
        n = len(layer.get_weights())
        layer.set_weights([arr[f"{name}/w{i}"] for i in range(n)])
        out = layer(*args, **call)
        outs = out if isinstance(out, (tuple, list)) else (out,)
    for i, o in enumerate(outs):
        res[f"{name}/o{i}"] = np.asarray(o)
    res[f"{name}/n"] = np.array(len(outs))

# one SGD step of a tiny model: the loss after it
def tiny():
    inp = keras.Input((T, D))
    z = dict(kernel_initializer="zeros")
    h = keras.layers.MultiHeadAttention(2, 4, name="mha", **z)(inp, inp, use_causal_mask=True)
    h = keras.layers.LayerNormalization(epsilon=1e-5)(keras.layers.Add()([inp, h]))
    h = keras.layers.GroupQueryAttention(3, 4, 2, name="gqa", **z)(h, h)
    h = keras.layers.RMSNormalization()(h)
    h = keras.layers.EinsumDense("abc,cd->abd", (None, 3), bias_axes="d", **z)(h)
    return keras.Model(inp, keras.layers.Dense(1, **z)(keras.layers.GlobalAveragePooling1D()(h)))

T, D = int(arr["T"]), int(arr["D"])
z0 = dict(kernel_initializer="zeros")
m = tiny()
m.set_weights([arr[f"sgd/w{i}"] for i in range(len(m.weights))])
m.compile(keras.optimizers.SGD(0.1), "mse")
x, y = arr["sgd/x"], arr["sgd/y"]
mse = lambda model: np.mean((np.asarray(model(x)) - y) ** 2)  # (eager: evaluate would compile a step)
res["sgd/before"] = np.array(mse(m))
m.train_on_batch(x, y)
res["sgd/after"] = np.array(mse(m))
for i, w in enumerate(m.get_weights()):
    res[f"sgd/trained{i}"] = w
# .weights.h5 both ways: dnnbind's file into Keras, Keras's own (fresh weights) out
m2 = tiny()
m2.load_weights(f"{work}/dnnbind.weights.h5")
res["h5/from_dnnbind"] = np.asarray(m2(x))
m3 = tiny()
m3.set_weights([w * 0.9 + 0.05 for w in m.get_weights()])  # (the trained weights, moved: not dnnbind's)
m3.save_weights(f"{work}/keras.weights.h5")
res["h5/keras_out"] = np.asarray(m3(x))
# .keras files both ways (config.json with call arguments, GroupQueryAttention's exported name)
res["keras/from_dnnbind"] = np.asarray(keras.models.load_model(f"{work}/dnnbind.keras")(x))
inp = keras.Input((T, D))
h = keras.layers.MultiHeadAttention(2, 4, **z0)(inp, inp, use_causal_mask=True)
h = keras.layers.GroupQueryAttention(4, 2, 2, **z0)(h, h)
h = keras.layers.EinsumDense("abc,cd->abd", (None, 3), bias_axes="d", **z0)(h)
k = keras.Model(inp, keras.layers.AdditiveAttention()([h, h]))
k.set_weights([arr[f"kf/w{i}"] for i in range(len(k.weights))])
k.save(f"{work}/keras.keras")
res["keras/keras_out"] = np.asarray(k(x))
np.savez(f"{work}/out.npz", **res)
"""


def _tiny_model():
    inp = keras.Input((T, D))
    h = layers.MultiHeadAttention(2, 4, name="mha")(inp, inp, use_causal_mask=True)
    h = layers.LayerNormalization(epsilon=1e-5)(layers.Add()([inp, h]))
    h = layers.GroupQueryAttention(3, 4, 2, name="gqa")(h, h)
    h = layers.RMSNormalization()(h)
    h = layers.EinsumDense("abc,cd->abd", (None, 3), bias_axes="d")(h)
    return keras.Model(inp, layers.Dense(1)(layers.GlobalAveragePooling1D()(h)))


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    """Every case through dnnbind here and through Keras 3 (JAX) in one subprocess."""
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    import dnnbind

    dnnbind.set_default_device("cpu")
    work = tmp_path_factory.mktemp("attn_keras")
    rng = np.random.default_rng(7)
    arrays = _arrays(rng)
    ours, feed = {}, dict(arrays)
    for name in CASES:
        weights, outs = _run_dnnbind(name, arrays, rng)
        ours[name] = outs
        feed.update({f"{name}/w{i}": w for i, w in enumerate(weights)})
    model = _tiny_model()
    sgd_w = [rng.normal(size=w.shape).astype(np.float32) * 0.4 for w in model.get_weights()]
    x, y = rng.normal(size=(4, T, D)).astype(np.float32), rng.normal(size=(4, 1)).astype(np.float32)
    feed.update({f"sgd/w{i}": w for i, w in enumerate(sgd_w)}, **{"sgd/x": x, "sgd/y": y, "T": T, "D": D})
    model.set_weights(sgd_w)
    model.save_weights(str(work / "dnnbind.weights.h5"))
    ours["h5/from_dnnbind"] = _np(model(x))
    model.save(str(work / "dnnbind.keras"))
    ours["keras/from_dnnbind"] = ours["h5/from_dnnbind"]
    feed.update({f"kf/w{i}": rng.normal(size=s).astype(np.float32) * 0.4
                 for i, s in enumerate([(D, 2, 4), (2, 4), (D, 2, 4), (2, 4), (D, 2, 4), (2, 4), (2, 4, D), (D,),
                                        (D, 2, 4), (2, 4), (D, 2, 4), (2, 4), (D, 2, 4), (2, 4), (2, 4, D), (D,),
                                        (D, 3), (3,), (3,)])})
    np.savez(work / "in.npz", **feed)
    json.dump({k: [c[0], c[1], c[2], c[3], c[4]] for k, c in CASES.items()}, open(work / "cases.json", "w"))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(work / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, str(work)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ours, dict(np.load(work / "out.npz")), (model, sgd_w, x, y), work


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_keras(keras_run, name):
    ours, theirs, _, _ = keras_run
    assert int(theirs[f"{name}/n"]) == len(ours[name])
    for i, o in enumerate(ours[name]):
        want = theirs[f"{name}/o{i}"]
        assert o.shape == want.shape, (name, i)
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(o, want, rtol=2e-5, atol=2e-6, err_msg=f"{name} output {i}")


def test_one_sgd_step_matches_keras(keras_run):
    _, theirs, (model, sgd_w, x, y), _ = keras_run
    model.set_weights(sgd_w)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    before = float(model.evaluate(x, y, verbose=0))
    model.train_on_batch(x, y)
    after = float(model.evaluate(x, y, verbose=0))
    np.testing.assert_allclose(before, theirs["sgd/before"], rtol=1e-5)
    np.testing.assert_allclose(after, theirs["sgd/after"], rtol=1e-5)
    assert after != before
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_allclose(w, theirs[f"sgd/trained{i}"], rtol=1e-4, atol=1e-6, err_msg=f"weight {i}")


def test_weights_h5_files_load_both_ways(keras_run):
    ours, theirs, (_, _, x, _), work = keras_run
    np.testing.assert_allclose(theirs["h5/from_dnnbind"], ours["h5/from_dnnbind"], rtol=2e-5, atol=1e-6)
    model = _tiny_model()
    model.load_weights(str(work / "keras.weights.h5"))
    np.testing.assert_allclose(_np(model(x)), theirs["h5/keras_out"], rtol=2e-5, atol=1e-6)


# ----- NumPy references and gradients -----------------------------------------------------------------------
def _softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_mha_is_the_textbook_formula(rng):
    """Both paths (fused with no scores, explicit with them) against a NumPy MHA."""
    q, v = rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 3, 6))
    mha = layers.MultiHeadAttention(3, 2, value_dim=4)
    out, scores = mha(q.astype(np.float32), v.astype(np.float32), return_attention_scores=True)
    wq, bq, wk, bk, wv, bv, wo, bo = mha.get_weights()
    Q = np.einsum("btd,dnh->btnh", q, wq) + bq
    K = np.einsum("bsd,dnh->bsnh", v, wk) + bk
    V = np.einsum("bsd,dnh->bsnh", v, wv) + bv
    P = _softmax(np.einsum("btnh,bsnh->bnts", Q, K) / np.sqrt(2.0))
    want = np.einsum("bnts,bsnh->btnh", P, V)
    want = np.einsum("btnh,nhd->btd", want, wo) + bo
    np.testing.assert_allclose(_np(scores), P, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(out), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(mha(q.astype(np.float32), v.astype(np.float32))), want, rtol=1e-5, atol=1e-6)


def _grad_check(layer, inputs, call=None, tol=1e-6):
    """float64: the tape's gradients of sum(out * r) w.r.t. the inputs and every weight vs central differences."""
    call = call or {}
    rng = np.random.default_rng(3)
    out = layer(*inputs, **call)
    r = rng.normal(size=out.shape)
    xs = [ops.convert_to_tensor(x) for x in inputs]
    with GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        loss = ops.sum(layer(*xs, **call) * r)
    grads = tape.gradient(loss, xs + list(layer.trainable_weights))

    def f():
        return float(np.sum(_np(layer(*inputs, **call)) * r))

    for x, g in zip(inputs, grads[:len(inputs)]):
        assert rel_error(_np(g), numerical_grad(f, x)) < tol
    for w, g in zip(layer.trainable_weights, grads[len(inputs):]):
        _check_weight_grad(w, g, f, tol)


def _check_weight_grad(w, g, f, tol):
    if w.path.endswith("key/bias"):  # the softmax over the keys cancels a key bias: its gradient is 0
        assert np.abs(_np(g)).max() < 1e-12
        return
    assert rel_error(_np(g), numerical_grad(f, w.value)) < tol, w.path  # (w.value: the array the layer reads)


@pytest.fixture
def float64():
    keras.mixed_precision.set_global_policy("float64")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("call", [{}, {"use_causal_mask": True, "return_attention_scores": False},
                                  {"attention_mask": "mask"}])
def test_mha_gradients_float64(rng, float64, call):
    q, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 4))
    call = dict(call)
    if call.get("attention_mask") == "mask":
        m = rng.random((2, 3, 4)) > 0.3
        m[..., 0] = True
        call["attention_mask"] = m
    mha = layers.MultiHeadAttention(2, 3, dropout=0.0)
    _grad_check(mha, [q, v], call)


def test_mha_scores_path_gradients_float64(rng, float64):
    q = rng.normal(size=(2, 3, 4))
    mha = layers.MultiHeadAttention(2, 2, attention_axes=(1,))
    layer_call = {"use_causal_mask": True, "return_attention_scores": True}

    class First(layers.Layer):
        def call(self, x):
            return mha(x, x, **layer_call)[0]

    wrapper = First()
    wrapper(q)
    rng2 = np.random.default_rng(5)
    r = rng2.normal(size=(2, 3, 4))
    x = ops.convert_to_tensor(q)
    with GradientTape() as tape:
        tape.watch(x)
        loss = ops.sum(wrapper(x) * r)
    gx, *gw = tape.gradient(loss, [x] + list(mha.trainable_weights))
    f = lambda: float(np.sum(_np(wrapper(q)) * r))
    assert rel_error(_np(gx), numerical_grad(f, q)) < 1e-6
    for w, g in zip(mha.trainable_weights, gw):
        _check_weight_grad(w, g, f, 1e-6)


@pytest.mark.parametrize("equation,shape,bias,x_shape", [("abc,cde->abde", (None, 2, 3), "de", (2, 3, 4)),
                                                         ("...b,bc->...c", 3, "c", (2, 2, 3, 4)),
                                                         ("ab,bc->ac", 5, None, (3, 4))])
def test_einsum_dense_gradients_float64(rng, float64, equation, shape, bias, x_shape):
    layer = layers.EinsumDense(equation, shape, bias_axes=bias, activation="tanh")
    _grad_check(layer, [rng.normal(size=x_shape)])


def test_gqa_and_attention_gradients_float64(rng, float64):
    q, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 4))
    _grad_check(layers.GroupQueryAttention(2, 4, 2), [q, v], {"use_causal_mask": True})

    class Pair(layers.Layer):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def call(self, a, b):
            return self.inner([a, b])

    _grad_check(Pair(layers.Attention(use_scale=True, score_mode="concat")), [q, v])
    _grad_check(Pair(layers.AdditiveAttention()), [q, v])
    _grad_check(layers.RMSNormalization(axis=[1, 2]), [q])


def test_attention_dropout_only_in_training(rng):
    q = rng.normal(size=(2, 4, 6)).astype(np.float32)
    mha = layers.MultiHeadAttention(2, 3, dropout=0.5, seed=3)
    infer = _np(mha(q, q))
    np.testing.assert_allclose(_np(mha(q, q, training=False)), infer, rtol=0, atol=0)
    a, b = _np(mha(q, q, training=True)), _np(mha(q, q, training=True))
    assert not np.allclose(a, infer) and not np.allclose(a, b)
    _, scores = mha(q, q, training=True, return_attention_scores=True)
    np.testing.assert_allclose(_np(scores).sum(-1), 1.0, rtol=1e-5)  # scores are returned before the dropout
    att = layers.Attention(dropout=0.5, seed=1)
    base = _np(att([q, q]))
    assert not np.allclose(_np(att([q, q], training=True)), base)


def test_masks_from_tensors_and_output_mask():
    """An Embedding(mask_zero=True) mask reaches MultiHeadAttention and Attention through the tensors."""
    ids = np.array([[3, 1, 2, 0, 0], [1, 4, 0, 0, 0]])
    emb = layers.Embedding(5, 6, mask_zero=True)
    x = emb(ids)
    mha = layers.MultiHeadAttention(2, 3)
    out = mha(x, x)
    np.testing.assert_array_equal(_np(out._keras_mask), ids != 0)
    xs = _np(x)
    explicit = mha(xs, xs, query_mask=ids != 0, value_mask=ids != 0)
    np.testing.assert_allclose(_np(out), _np(explicit), rtol=0, atol=0)
    unmasked = _np(mha(xs, xs))
    assert not np.allclose(_np(out)[0, :3], unmasked[0, :3])
    att = layers.Attention()
    y = att([x, x])
    np.testing.assert_array_equal(_np(y._keras_mask), ids != 0)
    assert not _np(y)[1, 2:].any() and _np(y)[1, :2].any()


def test_tiny_transformer_learns(rng):
    """Token + position embedding, causal MHA, LayerNorm, FFN, mean over the steps: predicting the first token
    (which the causal mask lets every step see)."""
    vocab, length, dim = 7, 6, 16

    class PositionalEmbedding(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(vocab, dim)
            self.positions = layers.Embedding(length, dim)

        def call(self, ids):
            return self.tokens(ids) + self.positions(ops.arange(length))

    inp = keras.Input((length,), dtype="int32")
    h = PositionalEmbedding()(inp)
    a = layers.MultiHeadAttention(2, 8)(h, h, use_causal_mask=True)
    h = layers.LayerNormalization()(layers.Add()([h, a]))
    f = layers.Dense(dim)(layers.Dense(32, activation="relu")(h))
    h = layers.LayerNormalization()(layers.Add()([h, f]))
    model = keras.Model(inp, layers.Dense(vocab)(layers.GlobalAveragePooling1D()(h)))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.integers(0, vocab, size=(64, length)).astype(np.int32)
    y = x[:, 0].copy()
    hist = model.fit(x, y, epochs=15, batch_size=16, verbose=0).history["loss"]
    assert hist[-1] < 0.5 * hist[0], hist


def test_configs_round_trip():
    for layer in [layers.MultiHeadAttention(2, 4, value_dim=3, dropout=0.1, output_shape=7, attention_axes=1,
                                            use_bias=False, kernel_initializer="he_normal", seed=2),
                  layers.GroupQueryAttention(4, 4, 2, dropout=0.2, kernel_regularizer=keras.regularizers.l2(0.1)),
                  layers.Attention(use_scale=True, score_mode="concat", dropout=0.1, seed=3),
                  layers.AdditiveAttention(use_scale=False),
                  layers.EinsumDense("abc,cd->abd", (None, 3), bias_axes="d", activation="relu"),
                  layers.RMSNormalization(axis=[1, 2], epsilon=1e-4)]:
        config = layer.get_config()
        twin = type(layer).from_config(json.loads(json.dumps(config)))
        assert twin.get_config() == {**config, "name": twin.name} or twin.get_config() == config
    c = layers.MultiHeadAttention(2, 4, output_shape=7, attention_axes=1).get_config()
    assert c["output_shape"] == (7,) and c["attention_axes"] == (1,) and c["value_dim"] == 4
    assert "score_mode" not in layers.AdditiveAttention().get_config()
    assert keras.layers.GroupQueryAttention is keras.layers.GroupedQueryAttention


def test_functional_shapes_and_regularizers():
    q, v = keras.Input((5, 8)), keras.Input((6, 4))
    mha = layers.MultiHeadAttention(2, 3, output_shape=(2, 5), kernel_regularizer=keras.regularizers.l2(0.01))
    out, scores = mha(q, v, return_attention_scores=True)
    assert tuple(out.shape) == (None, 5, 2, 5) and tuple(scores.shape) == (None, 2, 5, 6)
    model = keras.Model([q, v], [out, scores])
    assert [tuple(w.shape) for w in mha.weights] == [(8, 2, 3), (2, 3), (4, 2, 3), (2, 3), (4, 2, 3), (2, 3),
                                                     (2, 3, 2, 5), (2, 5)]
    rng = np.random.default_rng(0)
    model([rng.normal(size=(2, 5, 8)).astype(np.float32), rng.normal(size=(2, 6, 4)).astype(np.float32)])
    assert len(model.losses) == 4  # one per kernel
    att_out = layers.Attention()([q, q], return_attention_scores=True)
    assert [tuple(t.shape) for t in att_out] == [(None, 5, 8), (None, 5, 5)]
    # Keras 3's compute_output_shape leaves an output axis given as None unknown; the symbolic tensor knows it
    dense = layers.EinsumDense("abc,cde->abde", (None, 2, 3))
    assert tuple(dense(q).shape) == (None, 5, 2, 3)
    assert dense.compute_output_shape((None, 5, 8)) == (None, None, 2, 3)


def test_bad_arguments_name_the_layer(rng):
    with pytest.raises(ValueError, match=r"MultiHeadAttention.*num_heads"):
        layers.MultiHeadAttention(0, 4)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.*key_dim"):
        layers.MultiHeadAttention(2, 2.5)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.*Dropout is not supported when flash"):
        layers.MultiHeadAttention(2, 4, dropout=0.1, flash_attention=True)
    with pytest.raises(ValueError, match=r"MultiHeadAttention 'm'.*attention_axes"):
        layers.MultiHeadAttention(2, 4, attention_axes="x", name="m")
    q = rng.normal(size=(2, 5, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"MultiHeadAttention 'm2'.*attention_axes=\(3,\)"):
        layers.MultiHeadAttention(2, 4, attention_axes=3, name="m2")(q, q)
    mha = layers.MultiHeadAttention(2, 4, name="m3")
    with pytest.raises(ValueError, match=r"MultiHeadAttention 'm3': `value` and `key`|MultiHeadAttention 'm3': All"):
        mha(q, q, rng.normal(size=(2, 4, 8)).astype(np.float32))
    assert not mha.built and not mha.weights  # the failed build left nothing
    mha(q, q)
    with pytest.raises(ValueError, match=r"MultiHeadAttention 'm3': value_mask must have shape \(2, 5\)"):
        mha(q, q, value_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"MultiHeadAttention 'm3': the attention mask .* does not broadcast"):
        mha(q, q, attention_mask=np.ones((2, 5, 3), bool), return_attention_scores=True)
    with pytest.raises(ValueError, match=r"GroupedQueryAttention.*num_query_heads.*divisible"):
        layers.GroupQueryAttention(4, 3, 2)
    with pytest.raises(ValueError, match=r"Attention 'a'.*list of inputs"):
        layers.Attention(name="a")(q)
    with pytest.raises(ValueError, match=r"Attention 'a2'.*score_mode"):
        layers.Attention(score_mode="add", name="a2")
    with pytest.raises(ValueError, match=r"Attention 'a3': query and key must have the same last axis"):
        layers.Attention(name="a3")([q, rng.normal(size=(2, 5, 3)).astype(np.float32)])
    with pytest.raises(ValueError, match=r"EinsumDense 'e': Invalid einsum equation"):
        layers.EinsumDense("ab->b", 3, name="e")
    with pytest.raises(ValueError, match=r"EinsumDense 'e2': Weight dimension 'x'"):
        layers.EinsumDense("abc,xd->abd", (None, 3), name="e2")(q)
    with pytest.raises(ValueError, match=r"EinsumDense 'e3': Bias dimension 'z'"):
        layers.EinsumDense("abc,cd->abd", (None, 3), bias_axes="z", name="e3")(q)
    with pytest.raises(ValueError, match=r"RMSNormalization 'r': .*batch axis"):
        layers.RMSNormalization(axis=0, name="r")(q)


def test_einsum_dense_fans_follow_the_kernel_axes():
    """A VarianceScaling kernel initializer counts fan_in over the contracted axes only (Keras 3)."""
    layer = layers.EinsumDense("abc,cde->abde", (None, 64, 32), kernel_initializer="lecun_normal")
    layer.build((None, 5, 256))
    std = float(layer.get_weights()[0].std())
    assert abs(std - 1 / np.sqrt(256)) < 0.1 / np.sqrt(256), std  # lecun: 1/sqrt(fan_in), fan_in=256


def test_global_average_pooling_1d_mask_from_embedding_trains(rng):
    """The Embedding's mask reaches GlobalAveragePooling1D in a functional model: the mean of the kept steps,
    and the gradient reaches only the rows of the ids that were kept."""
    ids = np.array([[3, 1, 2, 0, 0], [1, 4, 0, 0, 0]], np.int32)
    inp = keras.Input((5,), dtype="int32")
    emb = layers.Embedding(6, 4, mask_zero=True)
    pooled = layers.GlobalAveragePooling1D()(emb(inp))
    model = keras.Model(inp, pooled)
    table = emb.get_weights()[0]
    want = np.stack([table[[3, 1, 2]].mean(0), table[[1, 4]].mean(0)])
    np.testing.assert_allclose(_np(model(ids)), want, rtol=1e-6)
    r = rng.normal(size=(2, 4))
    with GradientTape() as tape:
        loss = ops.sum(model(ids) * r)
    (g,) = tape.gradient(loss, emb.trainable_weights)
    g = _np(g)
    np.testing.assert_allclose(g[2], r[0] / 3, rtol=1e-6)
    np.testing.assert_allclose(g[4], r[1] / 2, rtol=1e-6)
    np.testing.assert_allclose(g[1], r[0] / 3 + r[1] / 2, rtol=1e-6)
    assert not g[5].any() and not g[0].any()  # never taken; padding
    gap = layers.GlobalAveragePooling1D(name="g")
    with pytest.raises(ValueError, match=r"GlobalAveragePooling1D 'g': mask must have shape \(batch, steps\)"):
        gap(rng.normal(size=(2, 5, 3)).astype(np.float32), mask=np.ones((2, 4), bool))


def test_keras_files_load_both_ways(keras_run):
    """A .keras file of dnnbind's in Keras, and one of Keras's (MultiHeadAttention called with use_causal_mask,
    GroupQueryAttention, AdditiveAttention) in dnnbind: the same outputs."""
    ours, theirs, (_, _, x, _), work = keras_run
    np.testing.assert_allclose(theirs["keras/from_dnnbind"], ours["keras/from_dnnbind"], rtol=2e-5, atol=1e-6)
    model = keras.models.load_model(str(work / "keras.keras"))
    assert [type(l).__name__ for l in model.layers[1:]] == ["MultiHeadAttention", "GroupedQueryAttention",
                                                           "EinsumDense", "AdditiveAttention"]
    out = model(x)
    out = out[0] if isinstance(out, list) else out  # (a loaded one-output Functional returns a list today)
    np.testing.assert_allclose(_np(out), theirs["keras/keras_out"], rtol=2e-5, atol=1e-6)
    causal = model.get_config()["layers"][1]["inbound_nodes"][0]["kwargs"]
    assert causal.get("use_causal_mask") is True
