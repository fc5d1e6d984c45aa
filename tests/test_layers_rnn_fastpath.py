"""The recurrent layers' fused path (``layers/rnn/_fused.py``, ``dnnbind/ops/_rnn.py``) on the CPU backend: the
whole layer as one node on ``kernels.rnn_forward``/``rnn_backward`` (the NumPy twin here).

Routed against the step loop (the same layer with the fused path switched off): outputs, final states and the
gradients of every weight, the inputs and the initial states, in float64; which configurations route (Keras's
cuDNN condition); finite differences of the node; real Keras (its NumPy backend, one subprocess) on the same
weights; a model that learns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.autodiff.tensor import Tensor
from dnnbind.ops._rnn import fused_rnn

B, T, F, U = 3, 5, 4, 3
LENGTHS = (5, 3, 0)  # right-padded masks; an empty sequence too


def _data(dtype: str = "float64") -> dict:
    rng = np.random.default_rng(3)
    mask = np.arange(T)[None, :] < np.array(LENGTHS)[:, None]
    return {"x": rng.normal(size=(B, T, F)).astype(dtype), "mask": mask,
            "states": [rng.normal(size=(B, U)).astype(dtype) * 0.5 for _ in range(4)],
            "w": rng.normal(size=(B, T, 2 * U)).astype(dtype)}


def _pair(make, shape):
    """Two copies of a layer with the same weights: the first may route, the second runs the step loop."""
    fused, loop = make(), make()
    for layer in (loop,) + ((loop.forward_layer, loop.backward_layer) if hasattr(loop, "forward_layer") else ()):
        layer._fused_allowed = False
    fused.build(shape)
    loop.build(shape)
    loop.set_weights(fused.get_weights())
    return fused, loop


def _run(layer, data, n_states, mask, training=False):
    """``(outputs, gradients)``: the layer's outputs, and the gradients of a weighted sum of them with respect to
    its weights, the inputs and the initial states (when given)."""
    x = Tensor(data["x"])
    states = [Tensor(s) for s in data["states"][:n_states]] if n_states else None
    with GradientTape() as tape:
        tape.watch(x)
        for s in states or []:
            tape.watch(s)
        kwargs = {"mask": data["mask"]} if mask else {}
        if states is not None:
            kwargs["initial_state"] = states
        out = layer(x, training=training, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        loss = 0.0
        for o in outs:
            w = data["w"][..., :o.shape[-1]] if o.ndim == 3 else data["w"][:, 0, :o.shape[-1]]
            loss = ops.add(loss, ops.sum(ops.multiply(o, ops.tanh(Tensor(np.ascontiguousarray(w))))))
    sources = list(layer.trainable_weights) + [x] + list(states or [])
    grads = tape.gradient(loss, sources)
    return [np.asarray(o) for o in outs], [None if g is None else np.asarray(g) for g in grads]


# (id, layer factory, initial states given (count), mask)
CASES = [
    ("lstm", lambda: keras.layers.LSTM(U), 0, False),
    ("lstm-seq-state", lambda: keras.layers.LSTM(U, return_sequences=True, return_state=True), 2, False),
    ("lstm-back", lambda: keras.layers.LSTM(U, go_backwards=True, return_sequences=True, return_state=True), 0,
     False),
    ("lstm-mask", lambda: keras.layers.LSTM(U, return_sequences=True, return_state=True), 2, True),
    ("lstm-mask-zero-out", lambda: keras.layers.LSTM(U, return_sequences=True, zero_output_for_mask=True), 0, True),
    ("lstm-back-mask", lambda: keras.layers.LSTM(U, go_backwards=True, return_sequences=True, return_state=True),
     2, True),
    ("gru-back-mask-zero-out", lambda: keras.layers.GRU(U, go_backwards=True, return_sequences=True,
                                                        zero_output_for_mask=True), 1, True),
    ("simple-back-mask-last", lambda: keras.layers.SimpleRNN(U, go_backwards=True, zero_output_for_mask=True), 0,
     True),
    ("gru-seq-state", lambda: keras.layers.GRU(U, return_sequences=True, return_state=True), 1, False),
    ("gru-back-mask-last", lambda: keras.layers.GRU(U, return_state=True), 1, True),
    ("gru-back", lambda: keras.layers.GRU(U, go_backwards=True), 0, False),
    ("simple-tanh", lambda: keras.layers.SimpleRNN(U, return_sequences=True, return_state=True), 1, False),
    ("simple-relu-mask", lambda: keras.layers.SimpleRNN(U, activation="relu", return_sequences=True), 0, True),
    ("bi-lstm-concat", lambda: keras.layers.Bidirectional(keras.layers.LSTM(U, return_sequences=True)), 0, False),
    ("bi-lstm-state-init", lambda: keras.layers.Bidirectional(keras.layers.LSTM(U, return_state=True),
                                                              merge_mode="sum"), 4, False),
    ("bi-gru-mask-seq", lambda: keras.layers.Bidirectional(keras.layers.GRU(U, return_sequences=True),
                                                           merge_mode="mul"), 0, True),
    ("bi-simple-none-mask", lambda: keras.layers.Bidirectional(keras.layers.SimpleRNN(U, return_state=True),
                                                               merge_mode=None), 2, True),
    ("bi-gru-ave", lambda: keras.layers.Bidirectional(keras.layers.GRU(U), merge_mode="ave"), 0, False),
]


@pytest.mark.parametrize("make, n_states, mask", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_routed_matches_step_loop(cpu, make, n_states, mask):
    with _Floatx("float64"):
        data = _data()
        fused, loop = _pair(make, data["x"].shape)
        out_f, grads_f = _run(fused, data, n_states, mask)
        out_l, grads_l = _run(loop, data, n_states, mask)
    assert fused._last_call_fused and not loop._last_call_fused
    assert len(out_f) == len(out_l)
    for a, b in zip(out_f, out_l):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert len(grads_f) == len(grads_l)
    for a, b in zip(grads_f, grads_l):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    assert any(np.abs(g).max() > 1e-3 for g in grads_f)


class _Floatx:
    """``keras.config.set_dtype_policy`` for a block (the layers made inside compute in ``dtype``)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.old = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.dtype)

    def __exit__(self, *exc) -> None:
        keras.config.set_dtype_policy(self.old)


def test_stateful_and_dropout_match_step_loop(cpu):
    """A stateful layer over two calls, and input dropout in training (the same seed draws the same mask on both
    paths: Keras's cuDNN path applies the cell's one mask to the inputs)."""
    with _Floatx("float64"):
        data = _data()
        for make in (lambda: keras.layers.LSTM(U, stateful=True, return_sequences=True),
                     lambda: keras.layers.GRU(U, dropout=0.4, seed=5, return_sequences=True)):
            fused, loop = _pair(make, data["x"].shape)
            for _ in range(2):
                out_f, grads_f = _run(fused, data, 0, False, training=True)
                out_l, grads_l = _run(loop, data, 0, False, training=True)
                assert fused._last_call_fused
                np.testing.assert_allclose(out_f[0], out_l[0], rtol=1e-10, atol=1e-12)
                for a, b in zip(grads_f, grads_l):
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
        dropped = keras.layers.GRU(U, dropout=0.4, seed=5, return_sequences=True)
        dropped.build(data["x"].shape)
        plain = keras.layers.GRU(U, return_sequences=True)
        plain.build(data["x"].shape)
        plain.set_weights(dropped.get_weights())
        assert not np.allclose(np.asarray(dropped(data["x"], training=True)), np.asarray(plain(data["x"])))


@pytest.mark.parametrize("make, routes", [
    (lambda: keras.layers.LSTM(U), True),
    (lambda: keras.layers.LSTM(U, dropout=0.2), True),
    (lambda: keras.layers.LSTM(U, recurrent_dropout=0.2), False),
    (lambda: keras.layers.LSTM(U, unroll=True), False),
    (lambda: keras.layers.LSTM(U, use_bias=False), False),
    (lambda: keras.layers.LSTM(U, activation="relu"), False),
    (lambda: keras.layers.LSTM(U, recurrent_activation="hard_sigmoid"), False),
    (lambda: keras.layers.LSTM(U, use_cudnn=False), False),
    (lambda: keras.layers.GRU(U), True),
    (lambda: keras.layers.GRU(U, reset_after=False), False),
    (lambda: keras.layers.SimpleRNN(U, activation="relu"), True),
    (lambda: keras.layers.SimpleRNN(U, activation="sigmoid"), False),
    (lambda: keras.layers.RNN(keras.layers.LSTMCell(U)), False),
], ids=["lstm", "dropout", "recurrent_dropout", "unroll", "no-bias", "relu", "hard-sigmoid", "use_cudnn-False",
        "gru", "gru-reset-before", "simple-relu", "simple-sigmoid", "rnn-of-cell"])
def test_routing_condition(cpu, make, routes):
    x = _data("float32")["x"]
    layer = make()
    layer(x, training=True)
    assert bool(getattr(layer, "_last_call_fused", False)) is routes
    assert getattr(layer, "_fused_calls", 0) == (1 if routes else 0)


def test_masks_route_only_right_padded(cpu):
    x = _data("float32")["x"]
    layer = keras.layers.LSTM(U, return_sequences=True)
    right = np.arange(T)[None, :] < np.array(LENGTHS)[:, None]
    layer(x, mask=right)
    assert layer._last_call_fused
    holes = right.copy()
    holes[0, 2] = False
    layer(x, mask=holes)
    assert not layer._last_call_fused
    back = keras.layers.LSTM(U, go_backwards=True)
    back(x, mask=holes)
    assert not back._last_call_fused
    back(x, mask=right)
    assert back._last_call_fused and back._fused_calls == 1
    back(x, mask=np.ones((B, T), bool))
    assert back._fused_calls == 2  # every step real: no mask at all
    # an Embedding's mask reaches the layer in a model, and routes (right-padded ids)
    ids = np.where(right, np.arange(1, T + 1)[None, :], 0).astype("int32")
    model = keras.Sequential([keras.layers.Embedding(9, F, mask_zero=True), keras.layers.LSTM(U)])
    model(ids)
    assert model.layers[1]._last_call_fused


def test_use_cudnn_true_refuses_a_configuration_that_cannot_route(cpu):
    x = _data("float32")["x"]
    keras.layers.LSTM(U, use_cudnn=True)(x)  # routes: fine
    with pytest.raises(ValueError, match=r"LSTM '.*use_cudnn=True.*use_cudnn='auto'"):
        keras.layers.LSTM(U, use_cudnn=True, activation="relu")(x)


def test_bidirectional_routes_as_one_call_only_when_both_sides_match(cpu):
    x = _data("float32")["x"]
    bi = keras.layers.Bidirectional(keras.layers.LSTM(U, return_sequences=True))
    bi(x)
    assert bi._last_call_fused and bi.forward_layer._fused_calls == 1 and bi.backward_layer._fused_calls == 1
    mixed = keras.layers.Bidirectional(keras.layers.LSTM(U), backward_layer=keras.layers.LSTM(
        U + 1, go_backwards=True))
    mixed(x)
    assert not mixed._last_call_fused
    assert mixed.forward_layer._last_call_fused and mixed.backward_layer._last_call_fused  # each on its own
    dropped = keras.layers.Bidirectional(keras.layers.GRU(U, dropout=0.3))
    dropped(x, training=True)
    assert not dropped._last_call_fused and dropped.forward_layer._last_call_fused


@pytest.mark.parametrize("cell, dirs", [("lstm", 2), ("gru", 2), ("relu", 1), ("tanh", 2)])
def test_fused_node_finite_differences(cpu, cell, dirs):
    """The node's VJP (kernels.rnn_backward and the weight unpacking) against central differences in float64,
    with initial states and right-padded lengths."""
    rng = np.random.default_rng(5)
    g = {"lstm": 4, "gru": 3}.get(cell, 1)
    x = rng.normal(size=(B, T, F))
    weights = [[rng.normal(size=(F, g * U)) * 0.5, rng.normal(size=(U, g * U)) * 0.5,
                rng.normal(size=(2, g * U) if cell == "gru" else (g * U,)) * 0.5] for _ in range(dirs)]
    h0 = rng.normal(size=(dirs, B, U)) * 0.5
    c0 = rng.normal(size=(dirs, B, U)) * 0.5 if cell == "lstm" else None
    wy, wh = rng.normal(size=(B, T, dirs * U)), rng.normal(size=(dirs, B, U))
    lengths = (5, 2, 4)

    def loss_of(arrays):
        xs, ws, hs, cs = arrays
        y, hy, cy = fused_rnn(cell, xs, ws, hs, cs, lengths)
        total = ops.add(ops.sum(ops.multiply(y, Tensor(wy))), ops.sum(ops.multiply(hy, Tensor(wh))))
        return total if cy is None else ops.add(total, ops.sum(ops.multiply(cy, Tensor(wh * 0.7))))

    flat = [x] + [a for triple in weights for a in triple] + [h0] + ([c0] if c0 is not None else [])

    def build(values):
        ts = [Tensor(np.array(v)) for v in values]
        ws = [ts[1 + 3 * d:4 + 3 * d] for d in range(dirs)]
        return ts, (ts[0], ws, ts[1 + 3 * dirs], ts[2 + 3 * dirs] if c0 is not None else None)

    ts, args = build(flat)
    with GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        loss = loss_of(args)
    grads = tape.gradient(loss, ts)
    eps = 1e-6
    for k, (value, grad) in enumerate(zip(flat, grads)):
        direction = rng.normal(size=value.shape)
        plus = [v + eps * direction if i == k else v for i, v in enumerate(flat)]
        minus = [v - eps * direction if i == k else v for i, v in enumerate(flat)]
        numeric = (float(loss_of(build(plus)[1])) - float(loss_of(build(minus)[1]))) / (2 * eps)
        analytic = float(np.sum(np.asarray(grad) * direction))
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (k, numeric, analytic)


def test_second_order_gradient_is_refused(cpu):
    layer = keras.layers.GRU(U)
    x = Tensor(_data("float32")["x"])
    with GradientTape() as outer:
        outer.watch(x)
        with GradientTape() as inner:
            inner.watch(x)
            y = ops.sum(layer(x))
        (gx,) = inner.gradient(y, [x])
        z = ops.sum(ops.multiply(gx, gx))
    with pytest.raises(NotImplementedError, match=r"rnn_gru.*differentiable only once"):
        outer.gradient(z, [x])


def test_bad_weights_dtype_is_a_clear_error(cpu):
    x = Tensor(np.ones((B, T, F), np.float32))
    ws = [[Tensor(np.ones((F, 4 * U), np.float64)), Tensor(np.ones((U, 4 * U), np.float32)),
           Tensor(np.ones((4 * U,), np.float32))]]
    with pytest.raises(ValueError, match=r"fused_rnn: direction 0: kernel has dtype float64"):
        fused_rnn("lstm", x, ws)
    ws[0][0] = Tensor(np.ones((F + 1, 4 * U), np.float32))
    with pytest.raises(ValueError, match=r"fused_rnn: direction 0: kernel must have shape \(4, 12\)"):
        fused_rnn("lstm", x, ws)


def test_model_fit_learns(cpu):
    """A sequence task (is the sum of the first half of a sequence above that of the second?) learnt by an
    LSTM that routes in every step of fit."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8, 2)).astype("float32")
    y = (x[:, :4].sum(axis=(1, 2)) > x[:, 4:].sum(axis=(1, 2))).astype("float32")[:, None]
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 2)), keras.layers.LSTM(16), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=12, batch_size=32, verbose=0)
    assert model.layers[0]._fused_calls >= 12 * 8
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert history.history["accuracy"][-1] > 0.9


# ----- real Keras on the same weights -----------------------------------------------------------------------
_KERAS_CASES = [
    ("lstm", "keras.layers.LSTM(3, return_sequences=True, return_state=True)", False),
    ("gru-back", "keras.layers.GRU(3, go_backwards=True, return_sequences=True)", False),
    ("gru-mask", "keras.layers.GRU(3, return_sequences=True, return_state=True)", True),
    ("simple-relu", "keras.layers.SimpleRNN(3, activation='relu', return_sequences=True)", False),
    ("bi-lstm", "keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))", False),
    ("bi-gru-mask", "keras.layers.Bidirectional(keras.layers.GRU(3), merge_mode='sum')", True),
]

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
folder = sys.argv[1]
cases = json.load(open(folder + "/cases.json"))
data = np.load(folder + "/data.npz")
out = {}
for name, expr, masked in cases:
    layer = eval(expr)
    layer.build((3, 5, 4))
    layer.set_weights([data[f"{name}/w{i}"] for i in range(int(data[f"{name}/n"]))])
    kwargs = {"mask": data["mask"]} if masked else {}
    result = layer(data["x"], **kwargs)
    result = result if isinstance(result, (list, tuple)) else [result]
    for i, r in enumerate(result):
        out[f"{name}/{i}"] = np.asarray(r)
np.savez(folder + "/out.npz", **out)
"""


def test_matches_real_keras(cpu, tmp_path):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("real Keras is not installed")
    data = _data("float32")
    arrays = {"x": data["x"], "mask": data["mask"]}
    ours = {}
    for name, expr, masked in _KERAS_CASES:
        layer = eval(expr)
        layer.build(data["x"].shape)
        weights = layer.get_weights()
        rng = np.random.default_rng(len(name))
        weights = [w + rng.normal(size=w.shape).astype(w.dtype) * 0.1 for w in weights]  # (biases not all 0)
        layer.set_weights(weights)
        arrays[f"{name}/n"] = np.array(len(weights))
        arrays.update({f"{name}/w{i}": w for i, w in enumerate(weights)})
        result = layer(data["x"], **({"mask": data["mask"]} if masked else {}))
        assert layer._last_call_fused
        ours[name] = [np.asarray(r) for r in (result if isinstance(result, (list, tuple)) else [result])]
    np.savez(tmp_path / "data.npz", **arrays)
    (tmp_path / "cases.json").write_text(json.dumps(_KERAS_CASES))
    env = {**os.environ, "KERAS_BACKEND": "numpy", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(tmp_path / "out.npz")
    for name, _, _ in _KERAS_CASES:
        for i, value in enumerate(ours[name]):
            np.testing.assert_allclose(value, theirs[f"{name}/{i}"], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("cell, dirs", [("lstm", 2), ("gru", 1), ("relu", 2)])
def test_pack_plan_matches_pack_keras_weights_on_any_layout(cpu, cell, dirs):
    """The gather that packs the Keras weights (and its inverse, the gradient unpacking) on a layout like
    cuDNN's: matrices and biases interleaved in another order, with alignment gaps (which must read 0)."""
    from dnnbind.kernels.rnn import RNNWeightEntry, RNNWeightLayout, pack_keras_weights
    from dnnbind.ops._rnn import rnn_pack_plan

    g = {"lstm": 4, "gru": 3}.get(cell, 1)
    rng = np.random.default_rng(2)
    shapes = [(d, lin, (U, F if lin < g else U)) for d in range(dirs) for lin in range(2 * g)]
    entries, offset = {}, 0
    for d, lin, shape in [shapes[i] for i in rng.permutation(len(shapes))]:
        offset += 3  # a gap
        bias_first = bool(rng.integers(2))
        if bias_first:
            b_off, m_off = offset, offset + U + 1
        else:
            m_off, b_off = offset, offset + shape[0] * shape[1] + 2
        entries[(d, lin)] = RNNWeightEntry(d, lin, m_off, shape, b_off, (U,))
        offset = max(m_off + shape[0] * shape[1], b_off + U)
    layout = RNNWeightLayout(cell, F, U, dirs, np.dtype(np.float64), offset + 5,
                             tuple(entries[(d, lin)] for d in range(dirs) for lin in range(2 * g)), "cudnn")
    weights = [[rng.normal(size=(F, g * U)), rng.normal(size=(U, g * U)),
                rng.normal(size=(2, g * U) if cell == "gru" else (g * U,))] for _ in range(dirs)]
    plan = rnn_pack_plan(layout)
    source = np.concatenate([w.reshape(-1) for triple in weights for w in triple] + [np.zeros(1)])
    space = source[plan.gather]
    np.testing.assert_array_equal(space, pack_keras_weights(layout, weights))
    padded = np.concatenate([space, [0.0]])
    for d in range(dirs):
        for i, w in enumerate(weights[d]):
            np.testing.assert_array_equal(padded[plan.inverse[d][i]].reshape(w.shape), w)
