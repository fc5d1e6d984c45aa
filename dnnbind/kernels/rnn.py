"""A whole recurrent layer in one call, cuDNN's RNN API on CUDA (``cudnnRNNForward``, ``cudnnRNNBackwardData_v8``,
``cudnnRNNBackwardWeights_v8``) and a NumPy reference of the same signature: the fast path of
``keras.layers.LSTM``/``GRU``/``SimpleRNN`` (through ``dnnbind.ops._rnn.fused_rnn``, under Keras's cuDNN condition;
other configurations run their step loop in ``keras.ops``).

Weights live in one packed 1-d *weight space* whose layout is the backend's: cuDNN's on CUDA (read through
``cudnnGetRNNWeightParams``), a fixed one here on NumPy (per pseudo-layer, the matrices of every linear layer,
then their biases). :func:`rnn_weight_layout` gives it; :func:`pack_keras_weights` / :func:`unpack_keras_weights`
move Keras's ``kernel``/``recurrent_kernel``/``bias`` in and out of it, whatever the layout.

The cells are cuDNN's: ``"lstm"`` (gates i, f, c, o, Keras's order), ``"gru"`` (cuDNN's gate order is r, z, h;
the packing swaps Keras's z, r; the form is Keras's ``reset_after=True``), ``"tanh"`` and ``"relu"``. Data is
batch-major ``(batch, time, features)``; ``seq_lengths`` (host ints, in [0, time]) mark each sequence's real
steps: padded outputs are 0, the final states are those of each sequence's last real step, and the reverse
direction starts there (what a Keras layer with a padding mask at the end computes). Outputs ``y`` are
``(batch, time, directions * hidden)`` with the reverse direction's aligned to the input steps; states are
``(directions, batch, hidden)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import backend as _backend
from .._validate import normalize_dtype
from ._dispatch import _cuda_module, as_array, check_float, check_out, route

__all__ = ["RNNWeightLayout", "RNNWeightEntry", "rnn_weight_layout", "pack_keras_weights", "unpack_keras_weights",
           "rnn_forward", "rnn_backward", "RNNSaved"]

_GATES = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}
# Keras gate index for each cuDNN linear layer's gate (GRU: cuDNN r, z, h <- Keras z, r, h)
_KERAS_GATE = {"lstm": (0, 1, 2, 3), "gru": (1, 0, 2), "tanh": (0,), "relu": (0,)}


@dataclass(frozen=True)
class RNNWeightEntry:
    """One linear layer of one pseudo-layer (direction): its matrix ``(hidden, rows_in)`` (row-major) and its
    bias ``(hidden,)``, as element offsets in the weight space."""

    pseudo_layer: int
    linear_layer: int
    matrix_offset: int
    matrix_shape: tuple[int, int]
    bias_offset: int
    bias_shape: tuple[int]


@dataclass(frozen=True)
class RNNWeightLayout:
    """Where every matrix and bias of a one-layer RNN lies in its packed weight space (``size`` elements of
    ``dtype``). ``backend``: ``"numpy"`` or ``"cudnn"`` (a weight space is only valid with its own layout)."""

    cell: str
    input_size: int
    hidden_size: int
    directions: int
    dtype: np.dtype
    size: int
    entries: tuple[RNNWeightEntry, ...]
    backend: str

    @property
    def gates(self) -> int:
        return _GATES[self.cell]

    def entry(self, pseudo_layer: int, linear_layer: int) -> RNNWeightEntry:
        return self.entries[pseudo_layer * 2 * self.gates + linear_layer]


def _check_cell(op: str, cell: Any) -> str:
    if cell not in _GATES:
        raise ValueError(f"{op}: cell must be one of {sorted(_GATES)}, got {cell!r}")
    return cell


def _positive(op: str, name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
    return int(value)


def _numpy_layout(cell: str, input_size: int, hidden: int, directions: int, dtype: np.dtype) -> RNNWeightLayout:
    gates = _GATES[cell]
    entries, offset = [], 0
    for pseudo in range(directions):
        shapes = [(hidden, input_size)] * gates + [(hidden, hidden)] * gates
        matrix_offsets = []
        for shape in shapes:
            matrix_offsets.append(offset)
            offset += shape[0] * shape[1]
        for lin, shape in enumerate(shapes):
            entries.append(RNNWeightEntry(pseudo, lin, matrix_offsets[lin], shape, offset, (hidden,)))
            offset += hidden
    return RNNWeightLayout(cell, input_size, hidden, directions, dtype, offset, tuple(entries), "numpy")


def rnn_weight_layout(cell: str, input_size: int, hidden_size: int, *, bidirectional: bool = False,
                      dtype: Any = "float32", device: Any = None) -> RNNWeightLayout:
    """The packed weight space of a one-layer RNN with both biases per gate (cuDNN's ``double`` bias mode) on
    ``device`` (None: the default device): cuDNN's layout on CUDA, NumPy's otherwise."""
    op = "rnn_weight_layout"
    cell = _check_cell(op, cell)
    input_size = _positive(op, "input_size", input_size)
    hidden_size = _positive(op, "hidden_size", hidden_size)
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(f"{op}: bidirectional must be a bool, got {bidirectional!r}")
    dt = normalize_dtype(dtype, op)
    if dt.kind != "f" and dt.name != "bfloat16":
        raise ValueError(f"{op}: dtype must be a float type, got {dt}")
    dev = _backend.resolve_device(device) if device is not None else _backend.default_device()
    directions = 2 if bidirectional else 1
    if dev.is_cuda:  # (the CUDA room is loaded on demand, as route() does: it needs cuda.bindings)
        return _cuda_module("rnn").rnn_weight_layout(cell, input_size, hidden_size, directions, dt, dev)
    return _numpy_layout(cell, input_size, hidden_size, directions, dt)


def pack_keras_weights(layout: RNNWeightLayout, weights: Sequence[Sequence[Any]]) -> np.ndarray:
    """The weight space (a NumPy array of ``layout.size`` elements) holding Keras weights: ``weights`` has one
    ``(kernel, recurrent_kernel, bias)`` per direction in Keras layouts (``kernel`` ``(input, gates * hidden)``,
    ``recurrent_kernel`` ``(hidden, gates * hidden)``, ``bias`` ``(gates * hidden,)``, a GRU's ``(2, 3 *
    hidden)`` (input, recurrent), or None). A Keras single bias goes to the input bias; the recurrent one is 0."""
    op = "pack_keras_weights"
    if not isinstance(layout, RNNWeightLayout):
        raise TypeError(f"{op}: layout must be an RNNWeightLayout (from rnn_weight_layout), got {type(layout).__name__}")
    if len(weights) != layout.directions:
        raise ValueError(f"{op}: expected {layout.directions} (kernel, recurrent_kernel, bias) sets (one per "
                         f"direction), got {len(weights)}")
    g, h, n_in = layout.gates, layout.hidden_size, layout.input_size
    space = np.zeros(layout.size, np.float64)
    for d, triple in enumerate(weights):
        if len(triple) != 3:
            raise ValueError(f"{op}: direction {d}: expected (kernel, recurrent_kernel, bias), got {len(triple)} items")
        kernel, recurrent, bias = (None if a is None else np.asarray(a, np.float64) for a in triple)
        if kernel is None or kernel.shape != (n_in, g * h):
            raise ValueError(f"{op}: direction {d}: kernel must have shape {(n_in, g * h)}, got "
                             f"{None if kernel is None else kernel.shape}")
        if recurrent is None or recurrent.shape != (h, g * h):
            raise ValueError(f"{op}: direction {d}: recurrent_kernel must have shape {(h, g * h)}, got "
                             f"{None if recurrent is None else recurrent.shape}")
        if bias is None:
            biases = np.zeros((2, g * h))
        elif layout.cell == "gru":
            if bias.shape != (2, g * h):
                raise ValueError(f"{op}: direction {d}: a GRU bias must have shape {(2, g * h)} (Keras's reset_after="
                                 f"True, cuDNN's only GRU form), got {bias.shape}")
            biases = bias
        else:
            if bias.shape != (g * h,):
                raise ValueError(f"{op}: direction {d}: bias must have shape {(g * h,)}, got {bias.shape}")
            biases = np.stack([bias, np.zeros_like(bias)])
        for lin in range(2 * g):
            e = layout.entry(d, lin)
            k = _KERAS_GATE[layout.cell][lin % g]
            source = kernel if lin < g else recurrent
            space[e.matrix_offset:e.matrix_offset + h * source.shape[0]] = source[:, k * h:(k + 1) * h].T.reshape(-1)
            space[e.bias_offset:e.bias_offset + h] = biases[lin // g, k * h:(k + 1) * h]
    return space.astype(layout.dtype)


def unpack_keras_weights(layout: RNNWeightLayout, space: Any) -> list:
    """:func:`pack_keras_weights` reversed: one ``(kernel, recurrent_kernel, bias)`` per direction, the bias in
    the cell's Keras shape (a GRU's ``(2, 3 * hidden)``; otherwise the sum of cuDNN's two biases)."""
    space = np.asarray(_backend.to_numpy(space) if _backend.is_device_array(space) else space).reshape(-1)
    if space.size != layout.size:
        raise ValueError(f"unpack_keras_weights: the weight space must hold {layout.size} elements, got {space.size}")
    g, h, n_in = layout.gates, layout.hidden_size, layout.input_size
    out = []
    for d in range(layout.directions):
        kernel, recurrent = np.zeros((n_in, g * h), space.dtype), np.zeros((h, g * h), space.dtype)
        biases = np.zeros((2, g * h), space.dtype)
        for lin in range(2 * g):
            e = layout.entry(d, lin)
            k = _KERAS_GATE[layout.cell][lin % g]
            target = kernel if lin < g else recurrent
            target[:, k * h:(k + 1) * h] = space[e.matrix_offset:e.matrix_offset + h * target.shape[0]].reshape(
                h, target.shape[0]).T
            biases[lin // g, k * h:(k + 1) * h] = space[e.bias_offset:e.bias_offset + h]
        out.append((kernel, recurrent, biases if layout.cell == "gru" else biases[0] + biases[1]))
    return out


# ----- the NumPy reference ---------------------------------------------------------------------------------
@dataclass
class RNNSaved:
    """What :func:`rnn_backward` needs from its forward: NumPy, the per-step values; CUDA, cuDNN's reserve
    space (freed with the record). Opaque: pass it back unchanged."""

    path: str
    steps: Any = None
    reserve: Any = None
    seq_lengths: tuple = ()


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _mats(layout: RNNWeightLayout, space: np.ndarray, d: int) -> tuple[list, list, list, list]:
    g, h = layout.gates, layout.hidden_size
    W, R, bW, bR = [], [], [], []
    for lin in range(2 * g):
        e = layout.entry(d, lin)
        m = space[e.matrix_offset:e.matrix_offset + e.matrix_shape[0] * e.matrix_shape[1]].reshape(e.matrix_shape)
        b = space[e.bias_offset:e.bias_offset + h]
        (W if lin < g else R).append(m)
        (bW if lin < g else bR).append(b)
    return W, R, bW, bR


def _check_inputs(op: str, x: Any, layout: Any, space: Any, h0: Any, c0: Any, seq_lengths: Any) -> tuple:
    if not isinstance(layout, RNNWeightLayout):
        raise TypeError(f"{op}: layout must be an RNNWeightLayout (from rnn_weight_layout), got {type(layout).__name__}")
    check_float(op, "x", x)
    if x.ndim != 3 or x.shape[2] != layout.input_size:
        raise ValueError(f"{op}: x must have shape (batch, time, {layout.input_size}), got {tuple(x.shape)}")
    if x.dtype != layout.dtype:
        raise ValueError(f"{op}: x has dtype {x.dtype}, the weight layout {layout.dtype}")
    if tuple(space.shape) != (layout.size,) or space.dtype != layout.dtype:
        raise ValueError(f"{op}: weights must be the packed weight space, shape ({layout.size},) {layout.dtype}, got "
                         f"{tuple(space.shape)} {space.dtype}")
    batch, time = int(x.shape[0]), int(x.shape[1])
    state_shape = (layout.directions, batch, layout.hidden_size)
    for name, s in (("h0", h0), ("c0", c0)):
        if s is not None and (tuple(s.shape) != state_shape or s.dtype != x.dtype):
            raise ValueError(f"{op}: {name} must have shape {state_shape} and dtype {x.dtype}, got {tuple(s.shape)} "
                             f"{s.dtype}")
    if c0 is not None and layout.cell != "lstm":
        raise ValueError(f"{op}: c0 is only for the 'lstm' cell, got cell {layout.cell!r}")
    if seq_lengths is None:
        lengths = (time,) * batch
    else:
        lengths = tuple(int(v) for v in np.asarray(seq_lengths).reshape(-1))
        if len(lengths) != batch or any(v < 0 or v > time for v in lengths):
            raise ValueError(f"{op}: seq_lengths must hold {batch} ints in [0, {time}], got {seq_lengths!r}")
    return batch, time, state_shape, lengths


def _compute(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def rnn_forward(x: Any, weights: Any, layout: RNNWeightLayout, *, h0: Any = None, c0: Any = None,
                seq_lengths: "Sequence[int] | None" = None, training: bool = False, out: Any = None,
                stream: Any = None) -> tuple:
    """``(y, hy, cy, saved)`` of a one-layer RNN over ``x`` ``(batch, time, input_size)`` (see the module
    docstring): ``cy`` is None but for the LSTM, ``saved`` None unless ``training``. ``h0``/``c0``
    ``(directions, batch, hidden)`` (None: zeros); ``out``: where ``y`` goes. CUDA: ``_cuda.rnn.rnn_forward``
    with the same arguments."""
    op = "rnn_forward"
    x, weights = as_array(x), as_array(weights)
    h0 = None if h0 is None else as_array(h0)
    c0 = None if c0 is None else as_array(c0)
    batch, time, state_shape, lengths = _check_inputs(op, x, layout, weights, h0, c0, seq_lengths)
    check_out(op, out, (batch, time, layout.directions * layout.hidden_size), x.dtype)
    impl = route(op, "rnn", x=x, weights=weights, h0=h0, c0=c0, out=out)
    if impl is not None:
        if 0 in tuple(lengths):
            # cuDNN's final state of a zero-length sequence is not its initial state (Keras's and the twin's):
            # refused rather than answered differently
            raise ValueError(f"{op}: on CUDA every sequence needs at least one step (cuDNN's RNN does not carry "
                             f"the initial state of a zero-length sequence); got seq_lengths {tuple(lengths)}. Drop "
                             "the empty sequences, or run them on the CPU backend")
        return impl.rnn_forward(x, weights, layout, h0=h0, c0=c0, seq_lengths=lengths, training=bool(training),
                                out=out, stream=stream)
    cd = _compute(x.dtype)
    xs, space = x.astype(cd), weights.astype(cd)
    hid = layout.hidden_size
    hs = np.zeros(state_shape, cd) if h0 is None else h0.astype(cd)
    cs = np.zeros(state_shape, cd) if c0 is None else c0.astype(cd)
    y = np.zeros((batch, time, layout.directions * hid), cd)
    hy, cy = np.empty(state_shape, cd), np.empty(state_shape, cd)
    L = np.array(lengths)
    rows = np.arange(batch)
    steps = []
    for d in range(layout.directions):
        W, R, bW, bR = _mats(layout, space, d)
        h, c = hs[d].copy(), cs[d].copy()
        record = []
        for s in range(time):
            active = s < L
            t = np.where(active, L - 1 - s if d else s, 0)
            xt = xs[rows, t]
            h_new, c_new, cache = _cell_step(layout.cell, xt, h, c, W, R, bW, bR)
            record.append((t, active, xt, h, c, cache))
            h = np.where(active[:, None], h_new, h)
            if layout.cell == "lstm":
                c = np.where(active[:, None], c_new, c)
            y[rows[active], t[active], d * hid:(d + 1) * hid] = h[active]
        hy[d], cy[d] = h, c
        steps.append(record)
    saved = RNNSaved("numpy", steps=steps, seq_lengths=lengths) if training else None
    dt = x.dtype
    if out is not None:
        np.copyto(out, y, casting="unsafe")
        y = out
    return y.astype(dt, copy=False), hy.astype(dt), (cy.astype(dt) if layout.cell == "lstm" else None), saved


def _cell_step(cell: str, xt, h, c, W, R, bW, bR) -> tuple:
    pre = [xt @ W[k].T + bW[k] + h @ R[k].T + bR[k] for k in range(len(W))] if cell != "gru" else None
    if cell in ("tanh", "relu"):
        out = np.tanh(pre[0]) if cell == "tanh" else np.maximum(pre[0], 0.0)
        return out, c, (out,)
    if cell == "lstm":
        i, f, g, o = _sigmoid(pre[0]), _sigmoid(pre[1]), np.tanh(pre[2]), _sigmoid(pre[3])
        c_new = f * c + i * g
        tc = np.tanh(c_new)
        return o * tc, c_new, (i, f, g, o, tc)
    r = _sigmoid(xt @ W[0].T + bW[0] + h @ R[0].T + bR[0])
    z = _sigmoid(xt @ W[1].T + bW[1] + h @ R[1].T + bR[1])
    rec_n = h @ R[2].T + bR[2]
    n = np.tanh(xt @ W[2].T + bW[2] + r * rec_n)
    return (1.0 - z) * n + z * h, c, (r, z, n, rec_n)


def rnn_backward(dy: Any, dhy: Any, dcy: Any, x: Any, weights: Any, layout: RNNWeightLayout, saved: RNNSaved, *,
                 h0: Any = None, c0: Any = None, y: Any = None, stream: Any = None) -> tuple:
    """``(dx, dh0, dc0, dweights)`` of :func:`rnn_forward` (``training=True``) for the gradients ``dy`` of its
    ``y`` and ``dhy``/``dcy`` of its final states (None: zeros). ``dweights``: a packed weight space (the same
    layout). ``y``: the forward's output (cuDNN reads it; NumPy ignores it). ``dc0`` is None but for the LSTM."""
    op = "rnn_backward"
    x, weights, dy = as_array(x), as_array(weights), as_array(dy)
    h0 = None if h0 is None else as_array(h0)
    c0 = None if c0 is None else as_array(c0)
    if not isinstance(saved, RNNSaved):
        raise TypeError(f"{op}: saved must be the RNNSaved of rnn_forward(..., training=True), got "
                        f"{type(saved).__name__}")
    batch, time, state_shape, _ = _check_inputs(op, x, layout, weights, h0, c0, saved.seq_lengths)
    if tuple(dy.shape) != (batch, time, layout.directions * layout.hidden_size) or dy.dtype != x.dtype:
        raise ValueError(f"{op}: dy must have shape {(batch, time, layout.directions * layout.hidden_size)} and dtype "
                         f"{x.dtype}, got {tuple(dy.shape)} {dy.dtype}")
    for name, s in (("dhy", dhy), ("dcy", dcy)):
        if s is not None and (tuple(s.shape) != state_shape or s.dtype != x.dtype):
            raise ValueError(f"{op}: {name} must have shape {state_shape} and dtype {x.dtype}, got "
                             f"{tuple(s.shape)} {s.dtype}")
    impl = route(op, "rnn", x=x, weights=weights, dy=dy)
    if impl is not None:
        return impl.rnn_backward(dy, dhy, dcy, x, weights, layout, saved, h0=h0, c0=c0, y=y, stream=stream)
    if saved.path != "numpy":
        raise ValueError(f"{op}: saved comes from the {saved.path} path; pass the record of this backend's forward")
    cd = _compute(x.dtype)
    space, dys = weights.astype(cd), dy.astype(cd)
    hid, gates = layout.hidden_size, layout.gates
    dspace = np.zeros(layout.size, cd)
    dx = np.zeros(x.shape, cd)
    dh0 = np.zeros(state_shape, cd)
    dc0 = np.zeros(state_shape, cd)
    rows = np.arange(batch)
    for d in range(layout.directions):
        W, R, bW, bR = _mats(layout, space, d)
        dW = [np.zeros_like(m) for m in W]
        dR = [np.zeros_like(m) for m in R]
        dbW = [np.zeros(hid, cd) for _ in W]
        dbR = [np.zeros(hid, cd) for _ in R]
        dh = np.zeros((batch, hid), cd) if dhy is None else np.asarray(dhy[d], cd).copy()
        dc = np.zeros((batch, hid), cd) if dcy is None else np.asarray(dcy[d], cd).copy()
        for t, active, xt, h, c, cache in reversed(saved.steps[d]):
            a = active[:, None]
            g_out = np.where(a, dh + np.where(a, dys[rows, t, d * hid:(d + 1) * hid], 0.0), 0.0)
            g_c = np.where(a, dc, 0.0)
            dpre, dh_prev, dc_prev = _cell_backward(layout.cell, g_out, g_c, xt, h, c, R, cache)
            for k in range(gates):
                dW[k] += dpre[k].T @ xt
                dbW[k] += dpre[k].sum(0)
                dx_t = dpre[k] @ W[k]
                dx[rows[active], t[active]] += dx_t[active]
                rec = dpre[k] if layout.cell != "gru" or k < 2 else dpre[3]
                dR[k] += rec.T @ h
                dbR[k] += rec.sum(0)
            dh = np.where(a, dh_prev, dh)
            dc = np.where(a, dc_prev, dc)
        dh0[d], dc0[d] = dh, dc
        for lin in range(2 * gates):
            e = layout.entry(d, lin)
            m, b = (dW[lin], dbW[lin]) if lin < gates else (dR[lin - gates], dbR[lin - gates])
            dspace[e.matrix_offset:e.matrix_offset + m.size] = m.reshape(-1)
            dspace[e.bias_offset:e.bias_offset + hid] = b
    dt = x.dtype
    return (dx.astype(dt), dh0.astype(dt), dc0.astype(dt) if layout.cell == "lstm" else None, dspace.astype(dt))


def _cell_backward(cell: str, g_out, g_c, xt, h, c, R, cache) -> tuple:
    """``(pre-activation gradients per gate [GRU: r, z, n (input part), n (recurrent part)], dh_prev, dc_prev)``."""
    if cell in ("tanh", "relu"):
        (out,) = cache
        dpre = g_out * ((1.0 - out * out) if cell == "tanh" else (out > 0))
        return [dpre], dpre @ R[0], g_c
    if cell == "lstm":
        i, f, g, o, tc = cache
        do = g_out * tc
        dc_new = g_c + g_out * o * (1.0 - tc * tc)
        di, df, dg = dc_new * g, dc_new * c, dc_new * i
        dpre = [di * i * (1 - i), df * f * (1 - f), dg * (1 - g * g), do * o * (1 - o)]
        dh_prev = sum(dpre[k] @ R[k] for k in range(4))
        return dpre, dh_prev, dc_new * f
    r, z, n, rec_n = cache
    dn = g_out * (1.0 - z)
    dz = g_out * (h - n)
    dpre_n = dn * (1.0 - n * n)
    dr = dpre_n * rec_n
    dpre_r, dpre_z = dr * r * (1 - r), dz * z * (1 - z)
    drec_n = dpre_n * r
    dh_prev = g_out * z + dpre_r @ R[0] + dpre_z @ R[1] + drec_n @ R[2]
    return [dpre_r, dpre_z, dpre_n, drec_n], dh_prev, g_c
