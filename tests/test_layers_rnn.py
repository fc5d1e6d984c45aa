"""The recurrent family (``layers/rnn``, ``layers/masking.py``) against real Keras 3.

Every case is one line of layer code evaluated twice: here with ``keras = dnnbind``, and in one subprocess
(real Keras, ``KERAS_BACKEND=jax`` on the CPU) with the weights dnnbind made copied in; the outputs (and, for
the training cases, the weights and loss after one SGD step) must agree. The rest: finite-difference gradients
in float64, a model that learns, configs, Keras weight files both ways, and bad arguments.
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

B, T, F = 3, 5, 4
LENGTHS = (5, 3, 1)  # the mask cases: padded at the end


def _arrays() -> dict:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    mask = np.arange(T)[None, :] < np.array(LENGTHS)[:, None]
    ids = rng.integers(1, 9, size=(B, T))
    ids[~mask] = 0
    return {"x": x, "x2": rng.normal(size=(B, T, F)).astype(np.float32), "mask": mask,
            "h0": rng.normal(size=(B, 3)).astype(np.float32) * 0.5,
            "c0": rng.normal(size=(B, 3)).astype(np.float32) * 0.5,
            "h1": rng.normal(size=(B, 3)).astype(np.float32) * 0.5,
            "ids": ids.astype(np.int32), "xpad": np.where(mask[..., None], x, 0.0).astype(np.float32),
            "y": rng.normal(size=(B, 2)).astype(np.float32)}


# (id, layer expression, call arguments: names of arrays; "stateful": a second call on x2)
LAYER_CASES = [
    ("simple", "keras.layers.SimpleRNN(3)", {}),
    ("simple-seq-relu", "keras.layers.SimpleRNN(3, activation='relu', return_sequences=True)", {}),
    ("simple-state-back", "keras.layers.SimpleRNN(3, return_state=True, go_backwards=True, use_bias=False)", {}),
    ("lstm", "keras.layers.LSTM(3)", {}),
    ("lstm-seq-state", "keras.layers.LSTM(3, return_sequences=True, return_state=True)", {}),
    ("lstm-back", "keras.layers.LSTM(3, go_backwards=True, return_sequences=True)", {}),
    ("lstm-mask", "keras.layers.LSTM(3, return_sequences=True, return_state=True)", {"mask": "mask"}),
    ("lstm-mask-back", "keras.layers.LSTM(3, go_backwards=True)", {"mask": "mask"}),
    ("lstm-init", "keras.layers.LSTM(3, return_state=True)", {"initial_state": ["h0", "c0"]}),
    ("lstm-nobias-hard", "keras.layers.LSTM(3, use_bias=False, recurrent_activation='hard_sigmoid', "
                         "unit_forget_bias=False)", {}),
    ("lstm-stateful", "keras.layers.LSTM(3, stateful=True, return_sequences=True)", {"stateful": True}),
    ("gru", "keras.layers.GRU(3)", {}),
    ("gru-seq-state-back", "keras.layers.GRU(3, return_sequences=True, return_state=True, go_backwards=True)", {}),
    ("gru-before", "keras.layers.GRU(3, reset_after=False, return_sequences=True)", {}),
    ("gru-mask-init", "keras.layers.GRU(3, return_sequences=True)", {"mask": "mask", "initial_state": ["h0"]}),
    ("gru-stateful", "keras.layers.GRU(3, stateful=True)", {"stateful": True}),
    ("rnn-cell", "keras.layers.RNN(keras.layers.LSTMCell(3), return_sequences=True)", {}),
    ("rnn-stacked", "keras.layers.RNN([keras.layers.GRUCell(3), keras.layers.LSTMCell(2)], return_state=True)", {}),
    ("rnn-stacked-mask", "keras.layers.RNN(keras.layers.StackedRNNCells([keras.layers.LSTMCell(3), "
                         "keras.layers.LSTMCell(2)]), return_sequences=True)", {"mask": "mask"}),
    ("rnn-stacked-single-mask", "keras.layers.RNN([keras.layers.GRUCell(3), keras.layers.SimpleRNNCell(2)], "
                                "return_sequences=True, return_state=True)", {"mask": "mask"}),
    ("rnn-zero-mask", "keras.layers.RNN(keras.layers.GRUCell(3), return_sequences=True, zero_output_for_mask=True)",
     {"mask": "mask"}),
    ("bi-concat", "keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))", {}),
    ("bi-sum", "keras.layers.Bidirectional(keras.layers.GRU(3), merge_mode='sum')", {}),
    ("bi-ave-mask", "keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True), merge_mode='ave')",
     {"mask": "mask"}),
    ("bi-mul", "keras.layers.Bidirectional(keras.layers.SimpleRNN(3), merge_mode='mul')", {"mask": "mask"}),
    ("bi-none-state", "keras.layers.Bidirectional(keras.layers.GRU(3, return_sequences=True, return_state=True), "
                      "merge_mode=None)", {"initial_state": ["h0", "h1"]}),
    ("bi-backward-layer", "keras.layers.Bidirectional(keras.layers.LSTM(3), backward_layer=keras.layers.GRU(2, "
                          "go_backwards=True))", {}),
    ("td-dense", "keras.layers.TimeDistributed(keras.layers.Dense(2, activation='tanh'))", {}),
]

# (id, model expression, input array name); the model is Sequential-built from keras.Input
MODEL_CASES = [
    ("emb-bilstm", "keras.Sequential([keras.Input((5,), dtype='int32'), keras.layers.Embedding(9, 4, mask_zero=True), "
                   "keras.layers.Bidirectional(keras.layers.LSTM(3)), keras.layers.Dense(2)])", "ids"),
    ("masking-gru", "keras.Sequential([keras.Input((5, 4)), keras.layers.Masking(0.0), "
                    "keras.layers.GRU(3, return_sequences=True), keras.layers.LSTM(2)])", "xpad"),
    ("emb-stack", "keras.Sequential([keras.Input((5,), dtype='int32'), keras.layers.Embedding(9, 4, mask_zero=True), "
                  "keras.layers.SimpleRNN(3, return_sequences=True), keras.layers.GRU(2)])", "ids"),
    ("td-lstm", "keras.Sequential([keras.Input((5, 4)), keras.layers.TimeDistributed(keras.layers.Dense(3)), "
                "keras.layers.LSTM(2)])", "x"),
]

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
spec = json.load(open(sys.argv[1]))
arrays = dict(np.load(sys.argv[2], allow_pickle=False))
out = {}
def flat(v):
    if isinstance(v, (list, tuple)):
        return [a for x in v for a in flat(x)]
    return [np.asarray(v)]
def call_args(kw):
    args = {}
    if "mask" in kw:
        args["mask"] = arrays[kw["mask"]]
    if "initial_state" in kw:
        args["initial_state"] = [arrays[n] for n in kw["initial_state"]]
    return args
for case in spec["layers"]:
    cid, expr, kw = case
    layer = eval(expr)
    args = call_args(kw)
    layer(arrays["x"], **args)
    layer.set_weights([arrays[f"{cid}/w{i}"] for i in range(spec["counts"][cid])])
    if kw.get("stateful"):
        layer.reset_states()
    outs = flat(layer(arrays["x"], **args))
    if kw.get("stateful"):
        outs += flat(layer(arrays["x2"], **args))
    for i, o in enumerate(outs):
        out[f"{cid}/o{i}"] = o
for cid, expr, name in spec["models"]:
    model = eval(expr)
    model.set_weights([arrays[f"{cid}/w{i}"] for i in range(spec["counts"][cid])])
    out[f"{cid}/pred"] = np.asarray(model(arrays[name]))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    out[f"{cid}/loss0"] = np.asarray(model.train_on_batch(arrays[name], arrays["y"]))
    out[f"{cid}/loss1"] = np.mean((np.asarray(model(arrays[name])) - arrays["y"]) ** 2)
    for i, w in enumerate(model.get_weights()):
        out[f"{cid}/after{i}"] = w
# weight files: dnnbind's into Keras, and one of Keras's for dnnbind to load
def make():
    return eval(spec["files_model"])
theirs = make()
theirs.load_weights(sys.argv[4])
out["files/ours_pred"] = np.asarray(theirs(arrays["x"]))
keras.utils.set_random_seed(5)
other = make()
other.save_weights(sys.argv[5])
out["files/theirs_pred"] = np.asarray(other(arrays["x"]))
# whole .keras files: dnnbind's loaded here, and one Keras writes (new weights) for dnnbind
mine = keras.saving.load_model(sys.argv[6])
out["keras/ours_pred"] = np.asarray(mine(arrays["ids"]))
fresh = keras.models.clone_model(mine)
fresh.save(sys.argv[7])
out["keras/theirs_pred"] = np.asarray(fresh(arrays["ids"]))
np.savez(sys.argv[3], **out)
"""

KERAS_MODEL = ("keras.Sequential([keras.Input((5,), dtype='int32'), keras.layers.Embedding(9, 4, mask_zero=True), "
               "keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True)), "
               "keras.layers.TimeDistributed(keras.layers.Dense(2)), "
               "keras.layers.RNN([keras.layers.GRUCell(2), keras.layers.SimpleRNNCell(2)]), keras.layers.Dense(1)])")
FILES_MODEL = ("keras.Sequential([keras.Input((5, 4)), keras.layers.Bidirectional(keras.layers.LSTM(3, "
               "return_sequences=True)), keras.layers.GRU(2), keras.layers.Dense(1)])")


def _run_keras(script: str, args: list, tmp_path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        pytest.skip("real Keras 3 with JAX is not installed (test extra)")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _flat(v) -> list:
    if isinstance(v, (list, tuple)):
        return [a for x in v for a in _flat(x)]
    return [ops.convert_to_numpy(v)]


def _call_args(kw: dict, arrays: dict) -> dict:
    args = {}
    if "mask" in kw:
        args["mask"] = arrays[kw["mask"]]
    if "initial_state" in kw:
        args["initial_state"] = [arrays[n] for n in kw["initial_state"]]
    return args


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """dnnbind's layers and models of the cases (built, their weights), their outputs, and Keras's."""
    keras.set_default_device("cpu")
    keras.utils.set_random_seed(3)
    tmp = tmp_path_factory.mktemp("rnn")
    arrays = _arrays()
    ours, counts, store = {}, {}, dict(arrays)
    for cid, expr, kw in LAYER_CASES:
        layer = eval(expr)
        args = _call_args(kw, arrays)
        layer(arrays["x"], **args)
        weights = layer.get_weights()
        if kw.get("stateful"):
            layer.reset_states()
        outs = _flat(layer(arrays["x"], **args))
        if kw.get("stateful"):
            outs += _flat(layer(arrays["x2"], **args))
        ours[cid] = outs
        counts[cid] = len(weights)
        store.update({f"{cid}/w{i}": w for i, w in enumerate(weights)})
    models = {}
    for cid, expr, name in MODEL_CASES:
        model = eval(expr)
        weights = model.get_weights()
        counts[cid] = len(weights)
        store.update({f"{cid}/w{i}": w for i, w in enumerate(weights)})
        pred = ops.convert_to_numpy(model(arrays[name]))
        model.compile(keras.optimizers.SGD(0.1), "mse")
        loss0 = model.train_on_batch(arrays[name], arrays["y"])
        loss1 = model.evaluate(arrays[name], arrays["y"], verbose=0)
        models[cid] = {"pred": pred, "loss0": loss0, "loss1": loss1, "after": model.get_weights()}
    files = eval(FILES_MODEL)
    files.save_weights(tmp / "ours.weights.h5")
    models["files"] = {"model": files, "theirs": tmp / "theirs.weights.h5"}
    whole = eval(KERAS_MODEL)
    whole.save(tmp / "ours.keras")
    models["keras"] = {"model": whole, "theirs": tmp / "theirs.keras"}
    spec = {"layers": LAYER_CASES, "models": MODEL_CASES, "counts": counts, "files_model": FILES_MODEL}
    (tmp / "spec.json").write_text(json.dumps(spec))
    np.savez(tmp / "in.npz", **store)
    _run_keras(_SCRIPT, [tmp / "spec.json", tmp / "in.npz", tmp / "out.npz", tmp / "ours.weights.h5",
                         tmp / "theirs.weights.h5", tmp / "ours.keras", tmp / "theirs.keras"], tmp)
    theirs = dict(np.load(tmp / "out.npz", allow_pickle=False))
    return ours, models, theirs


@pytest.mark.parametrize("cid", [c[0] for c in LAYER_CASES])
def test_layer_forward_matches_keras(reference, cid):
    ours, _, theirs = reference
    keys = sorted((k for k in theirs if k.startswith(f"{cid}/o")), key=lambda k: int(k.rsplit("o", 1)[1]))
    assert len(keys) == len(ours[cid])
    for k, mine in zip(keys, ours[cid]):
        assert mine.shape == theirs[k].shape, k
        assert np.abs(theirs[k]).max() > 1e-3, k  # a real signal, not zeros
        np.testing.assert_allclose(mine, theirs[k], rtol=1e-5, atol=2e-6, err_msg=k)


@pytest.mark.parametrize("cid", [c[0] for c in MODEL_CASES])
def test_model_forward_and_one_sgd_step_match_keras(reference, cid):
    _, models, theirs = reference
    mine = models[cid]
    np.testing.assert_allclose(mine["pred"], theirs[f"{cid}/pred"], rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(mine["loss0"], theirs[f"{cid}/loss0"], rtol=1e-5)
    np.testing.assert_allclose(mine["loss1"], theirs[f"{cid}/loss1"], rtol=1e-5)
    assert mine["loss1"] < mine["loss0"]
    for i, w in enumerate(mine["after"]):
        np.testing.assert_allclose(w, theirs[f"{cid}/after{i}"], rtol=1e-5, atol=1e-6, err_msg=f"weight {i}")


def test_masked_steps_keep_the_state_and_repeat_the_output(cpu):
    """At padded steps the states do not move and the output repeats (Keras's JAX backend): the result of a
    padded sequence equals that of the sequence cut to its length."""
    arrays = _arrays()
    layer = keras.layers.GRU(3, return_sequences=True)
    full = ops.convert_to_numpy(layer(arrays["x"], mask=arrays["mask"]))
    for b, n in enumerate(LENGTHS):
        cut = ops.convert_to_numpy(layer(arrays["x"][b:b + 1, :n]))
        np.testing.assert_allclose(full[b, :n], cut[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(full[b, n:], np.repeat(full[b, n - 1:n], T - n, axis=0))


# ----- gradients --------------------------------------------------------------------------------------------
def _fd_check(layer, x, mask=None, eps=1e-6):
    """The tape's gradients of ``sum(out * r)`` w.r.t. every weight and the input, against central
    differences (float64)."""
    rng = np.random.default_rng(5)
    out0 = ops.convert_to_numpy(layer(x, mask=mask))
    r = rng.normal(size=out0.shape)

    def loss_value(xv):
        return float(np.sum(ops.convert_to_numpy(layer(xv, mask=mask)) * r))

    xt = keras.Variable(x, dtype="float64")
    with keras.GradientTape() as tape:
        tape.watch(xt)
        loss = ops.sum(ops.multiply(layer(ops.convert_to_tensor(xt), mask=mask), r))
    grads = tape.gradient(loss, [xt] + layer.trainable_weights)
    checked = 0
    for k, w in enumerate(layer.trainable_weights):
        g = ops.convert_to_numpy(grads[k + 1])
        base = w.numpy()
        flat_idx = rng.choice(base.size, size=min(base.size, 6), replace=False)
        for i in flat_idx:
            idx = np.unravel_index(i, base.shape)
            plus, minus = base.copy(), base.copy()
            plus[idx] += eps
            minus[idx] -= eps
            w.assign(plus)
            lp = loss_value(x)
            w.assign(minus)
            lm = loss_value(x)
            w.assign(base)
            assert abs((lp - lm) / (2 * eps) - g[idx]) < 1e-6 * max(1.0, abs(g[idx])), (w.name, idx)
            checked += 1
    gx = ops.convert_to_numpy(grads[0])
    for idx in [(0, 0, 0), (1, 2, 1), (2, T - 1, F - 1)]:
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        assert abs((loss_value(plus) - loss_value(minus)) / (2 * eps) - gx[idx]) < 1e-6 * max(1.0, abs(gx[idx]))
    assert checked >= 15 and np.abs(gx).max() > 1e-3
    if mask is not None:  # steps after the padding do not reach the loss
        assert np.all(gx[~mask] == 0.0)


@pytest.mark.parametrize("make", [
    lambda: keras.layers.LSTM(3, return_sequences=True, dtype="float64"),
    lambda: keras.layers.GRU(3, dtype="float64", go_backwards=True),
    lambda: keras.layers.GRU(3, reset_after=False, return_sequences=True, dtype="float64"),
    lambda: keras.layers.SimpleRNN(3, dtype="float64"),
], ids=["lstm", "gru-back", "gru-before", "simple"])
def test_finite_difference_gradients_float64(cpu, make):
    x = _arrays()["x"].astype(np.float64)
    _fd_check(make(), x)


def test_finite_difference_gradients_with_mask_float64(cpu):
    arrays = _arrays()
    _fd_check(keras.layers.LSTM(3, dtype="float64"), arrays["x"].astype(np.float64), mask=arrays["mask"])


# ----- training -------------------------------------------------------------------------------------------
def test_embedding_bidirectional_lstm_learns_a_sequence_task(cpu):
    """Is the last real token of a padded sequence above 2? The padding must be masked for it to be seen."""
    keras.utils.set_random_seed(11)
    rng = np.random.default_rng(11)
    n, length = 256, 6
    ids = rng.integers(1, 5, size=(n, length))
    lengths = rng.integers(2, length + 1, size=n)
    for i in range(n):
        ids[i, lengths[i]:] = 0
    y = (ids[np.arange(n), lengths - 1] > 2).astype(np.float32)
    model = keras.Sequential([keras.Input((length,), dtype="int32"), keras.layers.Embedding(5, 8, mask_zero=True),
                              keras.layers.Bidirectional(keras.layers.LSTM(8)),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(0.03), "binary_crossentropy", metrics=["accuracy"])
    hist = model.fit(ids, y, batch_size=64, epochs=8, verbose=0)
    assert hist.history["loss"][-1] < 0.2 * hist.history["loss"][0]
    assert hist.history["accuracy"][-1] > 0.95


def test_dropout_masks_are_fixed_over_time_and_only_in_training(cpu):
    x = np.abs(_arrays()["x"]) + 0.1
    layer = keras.layers.SimpleRNN(4, dropout=0.5, recurrent_dropout=0.5, seed=1, activation="linear",
                                   return_sequences=True)
    inference = ops.convert_to_numpy(layer(x))
    np.testing.assert_array_equal(inference, ops.convert_to_numpy(layer(x, training=False)))
    a = ops.convert_to_numpy(layer(x, training=True))
    b = ops.convert_to_numpy(layer(x, training=True))
    assert not np.allclose(a, inference) and not np.allclose(a, b)  # fresh masks per call
    assert layer.cell._dropout_mask is None and layer.cell._recurrent_dropout_mask is None
    # one input mask for all steps: a feature dropped at step 0 is dropped at every step
    cell = keras.layers.SimpleRNNCell(4, dropout=0.5, seed=2)
    cell.build((None, F))
    m0 = ops.convert_to_numpy(cell.get_dropout_mask(ops.convert_to_tensor(x[:, 0])))
    assert set(np.unique(m0)) <= {0.0, 2.0} and 0.0 in m0 and 2.0 in m0
    assert cell.get_dropout_mask(ops.convert_to_tensor(x[:, 1])) is cell._dropout_mask


def test_stateful_reset_states(cpu):
    x = _arrays()["x"]
    layer = keras.layers.LSTM(3, stateful=True)
    first = ops.convert_to_numpy(layer(x))
    second = ops.convert_to_numpy(layer(x))
    assert not np.allclose(first, second)
    np.testing.assert_allclose(ops.convert_to_numpy(layer.states[0]), second, rtol=1e-6)
    layer.reset_states()
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), first, rtol=1e-6)
    assert len(layer.weights) == 3  # the states are not weights


# ----- a user's cell (keras.io's RNN guide) --------------------------------------------------------------
class MinimalRNNCell(keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="uniform", name="kernel")
        self.recurrent_kernel = self.add_weight(shape=(self.units, self.units), initializer="uniform",
                                                name="recurrent_kernel")

    def call(self, inputs, states):
        prev_output = states[0]
        h = ops.matmul(inputs, self.kernel)
        output = h + ops.matmul(prev_output, self.recurrent_kernel)
        return output, [output]


def test_user_cell_runs_and_trains(cpu):
    x = _arrays()["x"]
    layer = keras.layers.RNN(MinimalRNNCell(3), return_sequences=True)
    out = ops.convert_to_numpy(layer(x))
    k, rk = (w.numpy() for w in layer.weights)
    h = np.zeros((B, 3), np.float32)
    for t in range(T):
        h = x[:, t] @ k + h @ rk
        np.testing.assert_allclose(out[:, t], h, rtol=1e-5, atol=1e-6)
    model = keras.Sequential([keras.Input((T, F)), keras.layers.RNN([MinimalRNNCell(4), MinimalRNNCell(2)])])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    y = _arrays()["y"]
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=B, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before


# ----- configs and files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cid", ["simple-seq-relu", "lstm-nobias-hard", "gru-before", "rnn-stacked", "bi-none-state",
                                 "bi-backward-layer", "td-dense", "lstm-stateful"])
def test_config_round_trip(cpu, cid):
    expr, kw = next((e, k) for c, e, k in LAYER_CASES if c == cid)
    arrays = _arrays()
    layer = eval(expr)
    layer(arrays["x"])
    config = layer.get_config()
    json.dumps(config)
    twin = type(layer).from_config(json.loads(json.dumps(config)))
    assert twin.get_config() == config
    twin(arrays["x"])
    twin.set_weights(layer.get_weights())
    if kw.get("stateful"):
        layer.reset_states()
        twin.reset_states()
    for a, b in zip(_flat(layer(arrays["x"])), _flat(twin(arrays["x"]))):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_lstm_config_keys_are_keras(cpu):
    config = keras.layers.LSTM(3, dropout=0.25, seed=4).get_config()
    for key, value in {"units": 3, "activation": "tanh", "recurrent_activation": "sigmoid", "use_bias": True,
                       "unit_forget_bias": True, "dropout": 0.25, "recurrent_dropout": 0.0, "seed": 4,
                       "return_sequences": False, "go_backwards": False, "stateful": False, "unroll": False,
                       "zero_output_for_mask": False, "kernel_regularizer": None, "activity_regularizer": None,
                       "bias_constraint": None}.items():
        assert config[key] == value, key
    assert "cell" not in config
    assert keras.layers.GRU(2).get_config()["reset_after"] is True


def test_weights_h5_move_both_ways_with_keras(cpu, reference):
    """dnnbind's ``.weights.h5`` loads into the same Keras model (same predictions), and Keras's into dnnbind's
    (Keras's weight paths: ``layers/bidirectional/forward_layer/cell/vars/0``...)."""
    _, models, theirs = reference
    x = _arrays()["x"]
    ours = models["files"]["model"]
    np.testing.assert_allclose(theirs["files/ours_pred"], ours.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    loaded = eval(FILES_MODEL)
    loaded.load_weights(models["files"]["theirs"])
    np.testing.assert_allclose(loaded.predict(x, verbose=0), theirs["files/theirs_pred"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(theirs["files/theirs_pred"], theirs["files/ours_pred"])


def test_keras_files_move_both_ways_with_keras(cpu, reference):
    """A whole ``.keras`` model (config and weights: an Embedding's mask through Bidirectional(LSTM),
    TimeDistributed and a stacked-cell RNN) written by dnnbind loads in Keras and predicts the same; one Keras
    writes (new weights) loads in dnnbind and predicts what Keras did."""
    _, models, theirs = reference
    ids = _arrays()["ids"]
    np.testing.assert_allclose(theirs["keras/ours_pred"], models["keras"]["model"].predict(ids, verbose=0),
                               rtol=1e-5, atol=1e-6)
    loaded = keras.saving.load_model(models["keras"]["theirs"])
    assert isinstance(loaded.layers[1], keras.layers.Bidirectional)
    assert isinstance(loaded.layers[3].cell, keras.layers.StackedRNNCells)
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), theirs["keras/theirs_pred"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(theirs["keras/theirs_pred"], theirs["keras/ours_pred"])


# ----- bad arguments --------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: keras.layers.LSTM(0), r"LSTMCell .*units.*positive integer"),
    (lambda: keras.layers.GRU("3"), r"GRUCell .*units"),
    (lambda: keras.layers.SimpleRNN(3, dropout="x"), r"SimpleRNNCell .*dropout must be a number"),
    (lambda: keras.layers.LSTM(3, activation="nope"), r"LSTMCell .*activation"),
    (lambda: keras.layers.LSTM(3, use_cudnn="yes"), r"LSTM.*use_cudnn"),
    (lambda: keras.layers.LSTM(3, return_sequences="yes"), r"LSTM '.*return_sequences"),
    (lambda: keras.layers.RNN(keras.layers.Dense(2)), r"RNN '.*state_size"),
    (lambda: keras.layers.Bidirectional(keras.layers.Dense(2)), r"Bidirectional '.*recurrent layer"),
    (lambda: keras.layers.Bidirectional(keras.layers.LSTM(2), merge_mode="max"), r"Bidirectional '.*merge mode"),
    (lambda: keras.layers.Bidirectional(keras.layers.LSTM(2), backward_layer=keras.layers.LSTM(2)),
     r"Bidirectional '.*go_backwards"),
    (lambda: keras.layers.Bidirectional(keras.layers.LSTM(2), backward_layer=keras.layers.LSTM(
        2, go_backwards=True, return_sequences=True)), r"Bidirectional '.*return_sequences"),
    (lambda: keras.layers.TimeDistributed("dense"), r"TimeDistributed '.*Layer"),
    (lambda: keras.layers.Masking("a"), r"Masking '.*mask_value"),
    (lambda: keras.layers.StackedRNNCells([]), r"StackedRNNCells '.*non-empty"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_constructor_arguments(cpu, make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_call_arguments_change_nothing(cpu):
    arrays = _arrays()
    layer = keras.layers.LSTM(3, stateful=True, name="lstm_bad")
    with pytest.raises(ValueError, match=r"LSTM 'lstm_bad'.*\(batch, time, features\)"):
        layer(arrays["x"][:, 0])
    layer(arrays["x"])
    before = [w.copy() for w in layer.get_weights()]
    state = ops.convert_to_numpy(layer.states[0]).copy()
    with pytest.raises(ValueError, match=r"LSTM 'lstm_bad'.*mask must have shape \(batch, time\)"):
        layer(arrays["x"], mask=arrays["mask"][:, :2])
    with pytest.raises(ValueError, match=r"LSTM 'lstm_bad'.*initial_state\[1\] must have shape \(3, 3\)"):
        layer(arrays["x"], initial_state=[arrays["h0"], arrays["c0"][:, :2]])
    with pytest.raises(ValueError, match=r"LSTM 'lstm_bad'.*initial_state must hold 2"):
        layer(arrays["x"], initial_state=[arrays["h0"]])
    with pytest.raises(ValueError, match=r"LSTM 'lstm_bad'.*stateful.*Expected batch size: 3"):
        layer(arrays["x"][:2])
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.states[0]), state)
    for a, b in zip(before, layer.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"TimeDistributed '.*mask"):
        keras.layers.TimeDistributed(keras.layers.Dense(2))(arrays["x"], mask=arrays["mask"][:2])
    with pytest.raises(ValueError, match=r"Bidirectional '.*even count"):
        keras.layers.Bidirectional(keras.layers.GRU(3))(arrays["x"], initial_state=[arrays["h0"]])


def test_layers_are_reachable_as_keras_has_them():
    for name in ("SimpleRNN", "LSTM", "GRU", "SimpleRNNCell", "LSTMCell", "GRUCell", "StackedRNNCells", "RNN",
                 "Bidirectional", "TimeDistributed", "Masking"):
        cls = getattr(keras.layers, name)
        assert keras.layers.get_layer_class(name) is cls


@pytest.mark.gpu
@pytest.mark.parametrize("expr", ["keras.layers.LSTM(3, return_sequences=True)", "keras.layers.GRU(3, go_backwards=True)",
                                  "keras.layers.Bidirectional(keras.layers.SimpleRNN(3, return_sequences=True))"])
def test_gpu_layers_match_the_cpu(expr):
    """The keras.ops loop on the device (no cuDNN RNN path yet): the same outputs and input gradients as on
    the CPU, with a padding mask."""
    arrays = _arrays()
    keras.set_default_device("cpu")
    try:
        cpu_layer = eval(expr)
        x = ops.convert_to_tensor(arrays["x"])
        with keras.GradientTape() as tape:
            tape.watch(x)
            y_cpu = cpu_layer(x, mask=arrays["mask"])
            loss = ops.sum(ops.square(y_cpu))
        g_cpu = ops.convert_to_numpy(tape.gradient(loss, x))
        keras.set_default_device("cuda")
        with keras.kernels.config.override(allow_tf32=False):
            gpu_layer = eval(expr)
            xg = ops.convert_to_tensor(arrays["x"])
            gpu_layer(xg)
            gpu_layer.set_weights(cpu_layer.get_weights())
            with keras.GradientTape() as tape:
                tape.watch(xg)
                y_gpu = gpu_layer(xg, mask=ops.convert_to_tensor(arrays["mask"]))
                loss = ops.sum(ops.square(y_gpu))
            g_gpu = ops.convert_to_numpy(tape.gradient(loss, xg))
        np.testing.assert_allclose(ops.convert_to_numpy(y_gpu), ops.convert_to_numpy(y_cpu), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-3, atol=1e-4)
    finally:
        keras.set_default_device(None)
