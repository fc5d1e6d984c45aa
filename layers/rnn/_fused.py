"""The fused path of the recurrent layers: a whole ``LSTM`` / ``GRU`` / ``SimpleRNN`` (or a ``Bidirectional`` of
two) as one recorded node, :func:`dnnbind.ops._rnn.fused_rnn` (cuDNN's RNN API on a GPU, its NumPy twin on the
CPU backend), instead of the step loop in ``keras.ops``.

A layer routes under Keras's own cuDNN condition (``keras/src/layers/rnn/lstm.py``, ``gru.py`` and the TF
backend's ``cudnn_ok``): ``use_cudnn`` not False, ``recurrent_dropout == 0``, ``unroll=False``,
``use_bias=True``, activation ``tanh`` with recurrent activation ``sigmoid`` (LSTM, GRU), GRU
``reset_after=True``, SimpleRNN ``tanh`` or ``relu``. ``dropout`` is applied to the inputs first with the cell's
one mask, as Keras's cuDNN path does (the same mask the step loop draws). A mask routes when it is right-padded
(Keras's ``is_sequence_right_padded``: the steps become ``seq_lengths``; with ``go_backwards`` each row's real
steps are reversed by a gather, Keras's ``reverse_sequence``); otherwise, and for any other configuration, the
step loop runs. Outputs, final states and gradients are the step loop's
(also at padded steps: the previous output, or 0 with ``zero_output_for_mask``).

Reading a mask's values is one host transfer: a masked call on a GPU synchronises once (cuDNN's sequence
lengths are host values), and while a stream is being captured into a CUDA graph a masked call takes the
step loop instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnbind import activations as _activations
from dnnbind import backend as _backend
from dnnbind import ops as _ops
from dnnbind.ops._core import raw
from dnnbind.ops._rnn import fused_rnn

from .cells import GRUCell, LSTMCell, SimpleRNNCell

__all__ = ["fused_cell", "run_fused", "run_fused_bidirectional", "sequence_lengths"]


def fused_cell(layer: Any) -> "str | None":
    """The kernel cell (``"lstm"``, ``"gru"``, ``"tanh"``, ``"relu"``) when ``layer``'s configuration takes
    the fused path, else None (the step loop)."""
    cell = getattr(layer, "cell", None)
    if not getattr(layer, "_fused_allowed", False) or getattr(layer, "use_cudnn", "auto") is False:
        return None
    if layer.unroll or not cell.use_bias or cell.recurrent_dropout:
        return None
    kind = type(cell)
    if kind in (LSTMCell, GRUCell):
        if cell.activation is not _activations.tanh or cell.recurrent_activation is not _activations.sigmoid:
            return None
        if kind is GRUCell and not cell.reset_after:
            return None
        return "lstm" if kind is LSTMCell else "gru"
    if kind is SimpleRNNCell:
        if cell.activation is _activations.tanh:
            return "tanh"
        if cell.activation is _activations.relu:
            return "relu"
    return None


def sequence_lengths(mask: Any, time: int, on_device: bool) -> "tuple | bool | None":
    """A ``(batch, time)`` mask as ``seq_lengths``: None (no mask, or every step real), a tuple of ints (it is
    right-padded), or False (not right-padded, or not readable now: the step loop runs)."""
    if mask is None:
        return None
    data = raw(mask)
    if _backend.is_device_array(data):
        # deferred: only device masks need the CUDA room; a host read cannot be captured into a graph
        from dnnbind.cuda import current_stream

        if current_stream(_backend.device_of(data)).is_capturing():
            return False
        data = _backend.to_numpy(data)
    m = np.asarray(data).astype(bool)
    lengths = m.sum(axis=1)
    if not (m == (np.arange(time)[None, :] < lengths[:, None])).all():
        return False
    if (lengths == time).all():
        return None
    if on_device and (lengths == 0).any():
        return False  # cuDNN does not carry the initial state of an empty sequence (kernels.rnn_forward refuses)
    return tuple(int(v) for v in lengths)


def _weights(cell: Any) -> list:
    return [_ops.convert_to_tensor(w) for w in (cell.kernel, cell.recurrent_kernel, cell.bias)]


def _dropped(layer: Any, sequences: Any, training: Any) -> Any:
    cell = layer.cell
    if training and 0.0 < cell.dropout < 1.0:
        mask = cell.get_dropout_mask(sequences[:, 0, :])
        return _ops.multiply(sequences, _ops.expand_dims(mask, 1))
    return sequences


def _states(hy: Any, cy: Any, direction: int, dirs: int) -> list:
    def pick(s: Any) -> Any:
        return _ops.squeeze(s, axis=0) if dirs == 1 else _ops.unstack(s, axis=0)[direction]

    return [pick(hy)] if cy is None else [pick(hy), pick(cy)]


def _note(layer: Any, fused: bool) -> None:
    layer._last_call_fused = fused
    if fused:
        layer._fused_calls = getattr(layer, "_fused_calls", 0) + 1


def _padded_outputs(y: Any, h: Any, mask: Any, zero_output: bool) -> Any:
    """The step loop's outputs at padded steps: the last real output (or 0, already there, with
    ``zero_output_for_mask``)."""
    if zero_output:
        return y
    keep = _ops.expand_dims(_ops.cast(mask, "bool"), -1)
    return _ops.where(keep, y, _ops.expand_dims(h, 1))


def run_fused(layer: Any, sequences: Any, initial_state: Any, mask: Any, training: Any) -> "tuple | None":
    """``(last_output, outputs, final_states)`` as :meth:`RNN.inner_loop` gives them, or None when the layer
    takes the step loop."""
    kind = fused_cell(layer)
    if kind is None:
        _note(layer, False)
        return None
    time = int(sequences.shape[1])
    lengths = sequence_lengths(mask, time, sequences.is_cuda)
    if lengths is False:
        _note(layer, False)
        return None
    weights = _weights(layer.cell)
    dtype = weights[0].dtype
    x = sequences if sequences.dtype == dtype else _ops.cast(sequences, dtype)
    x = _dropped(layer, x, training)
    backwards_masked = layer.go_backwards and lengths is not None
    if backwards_masked:
        x = _ops.take_along_axis(x, _reverse_index(lengths, time)[..., None], axis=1)
    elif layer.go_backwards:
        x = _ops.flip(x, axis=1)
    states = list(initial_state)
    h0 = _ops.expand_dims(_ops.cast(states[0], dtype), 0)
    c0 = _ops.expand_dims(_ops.cast(states[1], dtype), 0) if kind == "lstm" else None
    y, hy, cy = fused_rnn(kind, x, [weights], h0, c0, lengths)
    final = _states(hy, cy, 0, 1)
    h = final[0]
    last = h
    if lengths is not None and layer.zero_output_for_mask:
        real = _ops.expand_dims(_ops.cast(mask, "bool")[:, 0 if layer.go_backwards else time - 1], -1)
        last = _ops.where(real, h, _ops.zeros_like(h))
    outputs = None
    if layer.return_sequences:
        if backwards_masked:
            outputs = _backwards_outputs(y, _ops.cast(states[0], dtype), lengths, time, layer.zero_output_for_mask)
        else:
            outputs = y if lengths is None else _padded_outputs(y, h, mask, layer.zero_output_for_mask)
    _note(layer, True)
    return last, outputs, final


def _reverse_index(lengths: tuple, time: int) -> np.ndarray:
    """``reverse_sequence``'s gather: row ``b`` reads its real steps last to first, then its padded ones."""
    steps, n = np.arange(time)[None, :], np.array(lengths)[:, None]
    return np.where(steps < n, n - 1 - steps, steps).astype(np.int32)


def _backwards_outputs(y: Any, h0: Any, lengths: tuple, time: int, zero_output: bool) -> Any:
    """A masked ``go_backwards`` layer's outputs in the order the step loop runs them: the padded steps first
    (the states unchanged: the initial output, or 0), then the real steps last to first (``y``'s first
    ``length`` steps, from the reversed real steps)."""
    n = np.array(lengths)[:, None]
    source = np.arange(time)[None, :] - (time - n)
    taken = _ops.take_along_axis(y, np.maximum(source, 0).astype(np.int32)[..., None], axis=1)
    fill = _ops.zeros_like(taken) if zero_output else _ops.expand_dims(h0, 1)
    return _ops.where((source >= 0)[..., None], taken, fill)


def run_fused_bidirectional(wrapper: Any, sequences: Any, initial_state: Any, mask: Any, training: Any) -> Any:
    """``(forward output, backward output, states, concatenated outputs or None)`` from one bidirectional call
    (the outputs None when the concatenation is given), or None: both layers must route with the
    same cell, units and dropout 0, the forward one running forwards, neither stateful (Keras's
    ``_can_attempt_fused_lstm``; a right-padded mask is taken too, the two layers' own results there)."""
    fwd, bwd = wrapper.forward_layer, wrapper.backward_layer
    kind = fused_cell(fwd)
    if kind is None or fused_cell(bwd) != kind or type(fwd) is not type(bwd):
        return None
    if fwd.go_backwards or not bwd.go_backwards or fwd.stateful or bwd.stateful:
        return None
    if fwd.cell.units != bwd.cell.units or fwd.cell.dropout or bwd.cell.dropout:
        return None
    if not fwd.built or not bwd.built:
        return None
    n_states = 2 if kind == "lstm" else 1
    if initial_state is not None:
        states = list(initial_state) if isinstance(initial_state, (list, tuple)) else [initial_state]
        if len(states) != 2 * n_states:
            return None
    time = int(sequences.shape[1])
    if time == 0 or (mask is not None and tuple(getattr(mask, "shape", ())) != tuple(sequences.shape[:2])):
        return None  # (the two layers' calls report what is wrong)
    lengths = sequence_lengths(mask, time, sequences.is_cuda)
    if lengths is False:
        return None
    wf, wb = _weights(fwd.cell), _weights(bwd.cell)
    dtype = wf[0].dtype
    if any(w.dtype != dtype for w in wb):
        return None
    x = sequences if sequences.dtype == dtype else _ops.cast(sequences, dtype)
    batch, units = int(x.shape[0]), fwd.cell.units
    if initial_state is None:
        h0 = c0 = None
    else:
        cast = [_ops.cast(_ops.convert_to_tensor(s), dtype) for s in states]
        for k, s in enumerate(cast):
            if tuple(s.shape) != (batch, units):
                raise ValueError(f"{wrapper._owner()}: initial_state[{k}] must have shape {(batch, units)}, got "
                                 f"{tuple(s.shape)}")
        h0 = _ops.stack([cast[0], cast[n_states]], axis=0)
        c0 = _ops.stack([cast[1], cast[3]], axis=0) if kind == "lstm" else None
    y, hy, cy = fused_rnn(kind, x, [wf, wb], h0, c0, lengths)
    fstates, bstates = _states(hy, cy, 0, 2), _states(hy, cy, 1, 2)
    joined = None
    if wrapper.return_sequences:
        # (Bidirectional sets zero_output_for_mask = return_sequences: padded steps are 0, as the kernel gives)
        if wrapper.merge_mode == "concat":
            joined, yf, yb = y, None, None  # the kernel's y is the concatenation already
        else:
            yf, yb = _ops.split(y, 2, axis=-1)
    else:
        yf, yb = fstates[0], bstates[0]
    _note(fwd, True)
    _note(bwd, True)
    _note(wrapper, True)
    return yf, yb, fstates + bstates, joined
