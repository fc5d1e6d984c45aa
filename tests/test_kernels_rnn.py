"""``kernels.rnn_forward`` / ``rnn_backward`` (cuDNN's RNN API and its NumPy twin) and the Keras weight packing.

The NumPy twin is checked against the ``keras.ops`` layers (themselves checked against real Keras in
``test_layers_rnn.py``) and its backward against finite differences in float64; on a GPU, cuDNN is checked
against the twin per dtype, into NaN-poisoned outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import kernels as K
from dnnbind import ops

B, T, F, H = 3, 5, 4, 3
LENGTHS = (5, 3, 1)


def _x(dtype=np.float32):
    return np.random.default_rng(3).normal(size=(B, T, F)).astype(dtype)


def _mask(lengths=LENGTHS):
    return np.arange(T)[None, :] < np.array(lengths)[:, None]


LAYERS = [
    ("lstm", lambda **kw: keras.layers.LSTM(H, return_sequences=True, return_state=True, **kw)),
    ("gru", lambda **kw: keras.layers.GRU(H, return_sequences=True, return_state=True, **kw)),
    ("tanh", lambda **kw: keras.layers.SimpleRNN(H, return_sequences=True, return_state=True, **kw)),
    ("relu", lambda **kw: keras.layers.SimpleRNN(H, activation="relu", return_sequences=True, return_state=True,
                                                 **kw)),
]


@pytest.mark.parametrize("cell, make", LAYERS, ids=[c for c, _ in LAYERS])
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "padded"])
def test_numpy_twin_equals_the_keras_layer(cpu, cell, make, lengths):
    x = _x()
    mask = None if lengths is None else _mask(lengths)
    layer = make()
    outs = [ops.convert_to_numpy(o) for o in layer(x, mask=mask)]
    layout = K.rnn_weight_layout(cell, F, H)
    assert layout.backend == "numpy" and layout.size == layout.gates * H * (F + H + 2)
    space = K.pack_keras_weights(layout, [layer.get_weights()])
    y, hy, cy, saved = K.rnn_forward(x, space, layout, seq_lengths=lengths)
    assert saved is None and y.dtype == np.float32
    expected = outs[0] if mask is None else outs[0] * mask[..., None]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hy[0], outs[1], rtol=1e-5, atol=1e-6)
    if cell == "lstm":
        np.testing.assert_allclose(cy[0], outs[2], rtol=1e-5, atol=1e-6)
    else:
        assert cy is None
    for a, b in zip(K.unpack_keras_weights(layout, space)[0], layer.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cell, rnn", [("lstm", "LSTM"), ("gru", "GRU")])
def test_numpy_twin_bidirectional_equals_keras_bidirectional(cpu, cell, rnn):
    x, mask = _x(), _mask()
    layer = keras.layers.Bidirectional(getattr(keras.layers, rnn)(H, return_sequences=True))
    expected = ops.convert_to_numpy(layer(x, mask=mask)) * mask[..., None]
    layout = K.rnn_weight_layout(cell, F, H, bidirectional=True)
    w = layer.get_weights()
    space = K.pack_keras_weights(layout, [w[:3], w[3:]])
    y, hy, _, _ = K.rnn_forward(x, space, layout, seq_lengths=LENGTHS)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert hy.shape == (2, B, H)


def _loss_and_grads(cell, bidirectional, lengths, rng):
    x = rng.normal(size=(B, T, F))
    layout = K.rnn_weight_layout(cell, F, H, bidirectional=bidirectional, dtype="float64")
    dirs = layout.directions
    space = rng.normal(size=layout.size) * 0.5
    h0 = rng.normal(size=(dirs, B, H)) * 0.5
    c0 = rng.normal(size=(dirs, B, H)) * 0.5 if cell == "lstm" else None
    ry = rng.normal(size=(B, T, dirs * H))
    rh = rng.normal(size=(dirs, B, H))
    rc = rng.normal(size=(dirs, B, H))

    def loss(x, space, h0, c0):
        y, hy, cy, _ = K.rnn_forward(x, space, layout, h0=h0, c0=c0, seq_lengths=lengths)
        value = np.sum(y * ry) + np.sum(hy * rh)
        return value + (np.sum(cy * rc) if cy is not None else 0.0)

    y, hy, cy, saved = K.rnn_forward(x, space, layout, h0=h0, c0=c0, seq_lengths=lengths, training=True)
    grads = K.rnn_backward(ry, rh, rc if cell == "lstm" else None, x, space, layout, saved, h0=h0, c0=c0, y=y)
    return loss, (x, space, h0, c0), grads


@pytest.mark.parametrize("cell", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("bidirectional, lengths", [(False, None), (True, (5, 2, 0))], ids=["uni-full", "bi-padded"])
def test_numpy_backward_matches_finite_differences_float64(cell, bidirectional, lengths):
    rng = np.random.default_rng(9)
    loss, args, grads = _loss_and_grads(cell, bidirectional, lengths, rng)
    names = ["x", "weights", "h0", "c0"]
    eps = 1e-6
    for k, (name, value, grad) in enumerate(zip(names, args, grads[:1] + (grads[3], grads[1], grads[2]))):
        if value is None:
            assert grad is None
            continue
        assert grad.shape == value.shape and grad.dtype == np.float64
        flat = value.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, 25), replace=False)
        for i in picks:
            plus, minus = flat.copy(), flat.copy()
            plus[i] += eps
            minus[i] -= eps
            a_plus, a_minus = list(args), list(args)
            a_plus[k], a_minus[k] = plus.reshape(value.shape), minus.reshape(value.shape)
            numeric = (loss(*a_plus) - loss(*a_minus)) / (2 * eps)
            assert abs(numeric - grad.reshape(-1)[i]) < 1e-6 * max(1.0, abs(numeric)), (name, i)
        assert np.abs(grad).max() > 1e-3, name
    if lengths is not None:  # padded steps and the empty sequence take no gradient
        assert np.all(grads[0][~_mask(lengths)] == 0.0)


def test_bad_arguments_are_refused(cpu):
    layout = K.rnn_weight_layout("lstm", F, H)
    space = np.ones(layout.size, np.float32) * 0.1
    x = _x()
    with pytest.raises(ValueError, match=r"rnn_weight_layout: cell must be one of"):
        K.rnn_weight_layout("lstm2", F, H)
    with pytest.raises(ValueError, match=r"rnn_weight_layout: hidden_size must be a positive int"):
        K.rnn_weight_layout("gru", F, 0)
    with pytest.raises(ValueError, match=r"rnn_forward: x must have shape \(batch, time, 4\)"):
        K.rnn_forward(x[:, :, :2], space, layout)
    with pytest.raises(ValueError, match=r"rnn_forward: weights must be the packed weight space"):
        K.rnn_forward(x, space[:-1], layout)
    with pytest.raises(ValueError, match=r"rnn_forward: seq_lengths must hold 3 ints in \[0, 5\]"):
        K.rnn_forward(x, space, layout, seq_lengths=(6, 1, 1))
    with pytest.raises(ValueError, match=r"rnn_forward: h0 must have shape \(1, 3, 3\)"):
        K.rnn_forward(x, space, layout, h0=np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"rnn_forward: x has dtype float64"):
        K.rnn_forward(x.astype(np.float64), space, layout)
    with pytest.raises(ValueError, match=r"pack_keras_weights: direction 0: kernel must have shape \(4, 12\)"):
        K.pack_keras_weights(layout, [(np.zeros((4, 8)), np.zeros((3, 12)), None)])
    gru = K.rnn_weight_layout("gru", F, H)
    with pytest.raises(ValueError, match=r"a GRU bias must have shape \(2, 9\).*reset_after=True"):
        K.pack_keras_weights(gru, [(np.zeros((4, 9)), np.zeros((3, 9)), np.zeros(9))])
    with pytest.raises(ValueError, match=r"c0 is only for the 'lstm' cell"):
        K.rnn_forward(x, K.pack_keras_weights(gru, [(np.ones((4, 9)), np.ones((3, 9)), None)]), gru,
                      c0=np.zeros((1, 3, 3), np.float32))
    with pytest.raises(TypeError, match=r"rnn_backward: saved must be the RNNSaved"):
        K.rnn_backward(np.zeros((B, T, H), np.float32), None, None, x, space, layout, None)


# ----- cuDNN against the twin -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("label, dtype, overrides", [("float32", "float32", {"allow_tf32": False}),
                                                     ("tf32", "float32", {"allow_tf32": True}),
                                                     ("float16", "float16", {}), ("bfloat16", "bfloat16", {})])
def test_gpu_cudnn_rnn_matches_the_numpy_twin(cell, bidirectional, label, dtype, overrides):
    from gpu_errlog import BF16, check, dev, host, poisoned

    from dnnbind import cuda

    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(21)
    batch, time, n_in, hidden = 4, 7, 6, 5
    lengths = (7, 5, 2, 1)  # a zero-length sequence is refused on CUDA (test below)
    dirs = 2 if bidirectional else 1
    gates = {"lstm": 4, "gru": 3}.get(cell, 1)
    weights = [(rng.normal(size=(n_in, gates * hidden)) * 0.4, rng.normal(size=(hidden, gates * hidden)) * 0.4,
                rng.normal(size=(2, gates * hidden) if cell == "gru" else gates * hidden) * 0.2) for _ in range(dirs)]
    x = rng.normal(size=(batch, time, n_in)).astype(dt)
    h0 = (rng.normal(size=(dirs, batch, hidden)) * 0.5).astype(dt)
    c0 = (rng.normal(size=(dirs, batch, hidden)) * 0.5).astype(dt) if cell == "lstm" else None
    dy = rng.normal(size=(batch, time, dirs * hidden)).astype(dt)
    dhy = rng.normal(size=(dirs, batch, hidden)).astype(dt)
    dcy = rng.normal(size=(dirs, batch, hidden)).astype(dt) if cell == "lstm" else None
    # the reference: float64 on the inputs the GPU sees
    ref_layout = K.rnn_weight_layout(cell, n_in, hidden, bidirectional=bidirectional, dtype="float64", device="cpu")
    q = lambda a: None if a is None else np.asarray(a).astype(dt).astype(np.float64)  # noqa: E731
    ref_space = K.pack_keras_weights(ref_layout, [tuple(q(w) for w in ws) for ws in weights])
    ry, rhy, rcy, rsaved = K.rnn_forward(q(x), ref_space, ref_layout, h0=q(h0), c0=q(c0), seq_lengths=lengths,
                                         training=True)
    rdx, rdh0, rdc0, rdw = K.rnn_backward(q(dy), q(dhy), q(dcy), q(x), ref_space, ref_layout, rsaved, h0=q(h0),
                                          c0=q(c0))
    with K.config.override(**overrides):
        layout = K.rnn_weight_layout(cell, n_in, hidden, bidirectional=bidirectional, dtype=dt, device="cuda")
        assert layout.backend == "cudnn"
        space = dev(K.pack_keras_weights(layout, weights))
        xd, h0d = dev(x), dev(h0)
        c0d = None if c0 is None else dev(c0)
        y, hy, cy, saved = K.rnn_forward(xd, space, layout, h0=h0d, c0=c0d, seq_lengths=lengths, training=True,
                                         out=poisoned((batch, time, dirs * hidden), dt))
        dx, dh0, dc0, dw = K.rnn_backward(dev(dy), dev(dhy), None if dcy is None else dev(dcy), xd, space, layout,
                                          saved, h0=h0d, c0=c0d, y=y)
        cuda.current_stream().synchronize()
    case = f"{cell} dirs={dirs}"
    # seven recurrent steps in low precision (states rounded to the dtype between steps) drift past one op's error
    tol = {"float16": 3e-2, "bfloat16": 6e-2}.get(label)
    check("rnn_forward", label, y, ry, case, tol)
    assert np.all(host(y)[~(np.arange(time)[None] < np.array(lengths)[:, None])] == 0.0)  # padding written as 0
    check("rnn_forward_hy", label, hy, rhy, case, tol)
    if cell == "lstm":
        check("rnn_forward_cy", label, cy, rcy, case, tol)
    check("rnn_backward_dx", label, dx, rdx, case, tol)
    check("rnn_backward_dh0", label, dh0, rdh0, case, tol)
    if cell == "lstm":
        check("rnn_backward_dc0", label, dc0, rdc0, case, tol)
    got = K.unpack_keras_weights(layout, host(dw))
    want = K.unpack_keras_weights(ref_layout, rdw)
    for d in range(dirs):
        for a, b in zip(got[d], want[d]):
            check("rnn_backward_weights", label, a, b, case, tol)


@pytest.mark.gpu
def test_gpu_a_zero_length_sequence_is_refused_before_cudnn_runs():
    from gpu_errlog import dev

    layout = K.rnn_weight_layout("gru", 3, 2, dtype="float32", device="cuda")
    rng = np.random.default_rng(3)
    space = dev(K.pack_keras_weights(layout, [(rng.normal(size=(3, 6)), rng.normal(size=(2, 6)),
                                               rng.normal(size=(2, 6)))]))
    x = dev(rng.normal(size=(2, 4, 3)).astype(np.float32))
    with pytest.raises(ValueError, match="at least one step"):
        K.rnn_forward(x, space, layout, seq_lengths=(4, 0))

