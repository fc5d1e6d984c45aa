"""``keras.layers.RNN(cell)`` and the three Keras recurrent layers on it (``SimpleRNN``, ``LSTM``, ``GRU``).

The time loop is a Python loop over the steps in ``keras.ops`` (Keras's "non-cuDNN configuration", its
``backend.rnn`` on JAX, step for step): every op records on the tape, so the layers train on both backends with
no backward written by hand. ``SimpleRNN``/``LSTM``/``GRU`` in Keras's cuDNN configuration instead run the whole
layer as one fused node (:mod:`._fused`: cuDNN's RNN on a GPU, its NumPy twin on the CPU), with the step loop's
results. Masks follow Keras's JAX backend: at a masked step the states keep their previous
values and the output is the previous first state (``zero_output_for_mask=False``) or zeros.

``go_backwards`` runs the steps last to first; the sequence output is then in the order the steps ran (Keras's).
``unroll`` changes nothing in the step loop (it is unrolled already); ``unroll=True`` keeps a layer off the fused
path (Keras's cuDNN condition). ``stateful=True`` keeps the last
states in non-trainable variables (``states``) that the next call starts from (``reset_states()`` zeroes
them): their batch size is fixed by the first call.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor
from dnnbind.autodiff.variable import Variable

from ..base import Layer, register
from ._fused import run_fused
from .cells import (GRUCell, LSTMCell, SimpleRNNCell, StackedRNNCells, _call_cell, _cell_output_size, _check_cell,
                    deserialize_layer, flatten_states, is_nested, pack_states, serialize_layer)

__all__ = ["RNN", "SimpleRNN", "LSTM", "GRU"]


@register
class RNN(Layer):
    """``keras.layers.RNN(cell, return_sequences=False, return_state=False, go_backwards=False, stateful=False,
    unroll=False, zero_output_for_mask=False)``: ``cell`` (a layer with ``state_size`` and ``call(inputs,
    states)``, or a list of them: a :class:`StackedRNNCells`) applied over the time axis of ``(batch, time,
    features)`` inputs.

    Call: ``layer(sequences, initial_state=None, mask=None, training=None)``; ``mask`` is ``(batch, time)``
    (True: a real step), taken from the inputs' Keras mask (``Embedding(mask_zero=True)``, ``Masking``) when not
    given. Output: the last output ``(batch, output_size)``, or every output ``(batch, time, output_size)``
    with ``return_sequences``; with ``return_state``, the tuple ``(output, *final_states)``."""

    def __init__(self, cell: Any, return_sequences: bool = False, return_state: bool = False,
                 go_backwards: bool = False, stateful: bool = False, unroll: bool = False,
                 zero_output_for_mask: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if isinstance(cell, dict):
            cell = deserialize_layer(cell, "cell", owner)
        if isinstance(cell, (list, tuple)):
            cell = StackedRNNCells(list(cell))
        _check_cell(cell, "argument `cell`", owner)
        size = cell.state_size
        if not isinstance(size, (int, np.integer, list, tuple)) or isinstance(size, bool):
            raise ValueError(f"{owner}: the cell's state_size must be an integer, or a list/tuple of integers (one "
                             f"per state tensor), got {size!r}")
        self.cell = cell
        self.return_sequences = _validate.boolean(return_sequences, "return_sequences", owner)
        self.return_state = _validate.boolean(return_state, "return_state", owner)
        self.go_backwards = _validate.boolean(go_backwards, "go_backwards", owner)
        self.stateful = _validate.boolean(stateful, "stateful", owner)
        self.unroll = _validate.boolean(unroll, "unroll", owner)
        self.zero_output_for_mask = _validate.boolean(zero_output_for_mask, "zero_output_for_mask", owner)
        self.supports_masking = True
        self._states: "list | None" = None  # the stateful variables (private: not weights, nothing saves them)

    @classmethod
    def _builds_keras_shapes(cls) -> bool:
        return True  # build() takes Keras shapes, with the batch axis (also when a model builds it)

    # ----- shapes and state -----------------------------------------------------------------------------
    @property
    def state_size(self) -> list:
        size = self.cell.state_size
        return list(size) if is_nested(size) else [size]

    @property
    def states(self) -> "list | None":
        """The stateful layer's state variables (None before its first call, or when not stateful)."""
        return self._states

    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def compute_output_shape(self, sequences_shape: Sequence[Any], initial_state_shape: Any = None) -> Any:
        shape = tuple(sequences_shape)
        batch, length = shape[0], shape[1]
        out_size = _cell_output_size(self.cell)
        output = (batch, length, out_size) if self.return_sequences else (batch, out_size)
        if not self.return_state:
            return output
        states = []
        for size in self.state_size:
            states.append([(batch, int(s)) for s in size] if is_nested(size) else (batch, int(size)))
        return (output, *states)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if is_nested(mask):
            mask = mask[0] if mask else None
        output_mask = mask if self.return_sequences else None
        if self.return_state:
            return [output_mask] + [None for _ in self.state_size]
        return output_mask

    def build(self, sequences_shape: Sequence[Any], initial_state_shape: Any = None) -> None:
        shape = tuple(sequences_shape)
        if len(shape) < 3:
            raise ValueError(f"{self._owner()}: expects inputs of shape (batch, time, features), got shape {shape}")
        step_shape = (shape[0], *shape[2:])
        if isinstance(self.cell, Layer) and not self.cell.built:
            self.cell.build(step_shape)
            self.cell.built = True
        self.built = True

    def get_initial_state(self, batch_size: int) -> list:
        fn = getattr(self.cell, "get_initial_state", None)
        if fn is not None:
            states = fn(batch_size=batch_size)
            return list(states) if is_nested(states) else [states]
        dtype = self.cell._effective_compute_dtype_name() if isinstance(self.cell, Layer) else "float32"
        return [_ops.zeros((int(batch_size), int(d)), dtype=dtype) for d in self.state_size]

    def reset_states(self) -> None:
        self.reset_state()

    def reset_state(self) -> None:
        """Zero the stateful layer's states (nothing to do before its first call)."""
        if self._states is not None:
            for v in self._states:
                v.assign(np.zeros(v.shape, np.dtype(str(v.dtype))))

    def _stateful_initial(self, batch: int, dtype: Any) -> list:
        if self._states is None:
            structure = self.get_initial_state(batch)
            flat = [Variable(np.zeros(tuple(t.shape), np.dtype(str(t.dtype))), trainable=False, name="rnn_state",
                             device=self.device) for t in flatten_states(structure)]
            self._states = flat
            self._state_structure = structure
        expected = int(self._states[0].shape[0])
        if batch != expected:
            raise ValueError(f"{self._owner()}: if an RNN is stateful, the batch size of the input sequences must be "
                             f"the same as the batch size of the initial state. Expected batch size: {expected}, "
                             f"received batch size: {batch} (call reset_states() keeps it; make a new layer for "
                             "another batch size)")
        # copies: the call assigns the final states into these variables in place, and the backward (the step
        # loop's VJPs, cuDNN's) reads the initial states after that
        return pack_states(self._state_structure, [_ops.copy(v) for v in self._states])

    # ----- the loop ---------------------------------------------------------------------------------------
    def _check_call(self, sequences: Any, mask: Any) -> None:
        owner = self._owner()
        if not isinstance(sequences, Tensor) or sequences.ndim < 3:
            shape = getattr(sequences, "shape", None)
            raise ValueError(f"{owner}: expects inputs of shape (batch, time, features), got shape {shape}")
        if mask is not None:
            mshape = tuple(getattr(mask, "shape", ()))
            if mshape != tuple(sequences.shape[:2]):
                raise ValueError(f"{owner}: mask must have shape (batch, time) = {tuple(sequences.shape[:2])}, got "
                                 f"{mshape}")

    def _initial_states(self, sequences: Tensor, initial_state: Any) -> Any:
        batch = int(sequences.shape[0])
        if initial_state is None:
            if self.stateful:
                return self._stateful_initial(batch, sequences.dtype)
            zeros = self.get_initial_state(batch)  # on the default device: moved to the sequences' if not there
            flat = flatten_states(zeros)
            if all(getattr(t, "device", None) == sequences.device for t in flat):
                return zeros
            from dnnbind import backend

            dev = sequences.device
            return pack_states(zeros, [t if getattr(t, "device", None) == dev else
                                       Tensor(backend.asarray(np.zeros(tuple(t.shape), t.dtype), device=dev))
                                       for t in flat])
        states = list(initial_state) if is_nested(initial_state) else [initial_state]
        # stacked cells take one structure per cell (the one their zero states have); given flat here
        expected = self.get_initial_state(batch) if isinstance(self.cell, StackedRNNCells) else None
        flat = flatten_states(states)
        sizes = [int(s) for s in flatten_states(self.state_size)]
        if len(flat) != len(sizes):
            raise ValueError(f"{self._owner()}: initial_state must hold {len(sizes)} state tensor(s) of shapes "
                             f"{[(batch, s) for s in sizes]}, got {len(flat)}")
        dtype = sequences.dtype
        out = []
        for k, (t, s) in enumerate(zip(flat, sizes)):
            t = _ops.convert_to_tensor(t)
            if tuple(t.shape) != (batch, s):
                raise ValueError(f"{self._owner()}: initial_state[{k}] must have shape {(batch, s)}, got "
                                 f"{tuple(t.shape)}")
            out.append(t if t.dtype == dtype else _ops.cast(t, dtype))
        return pack_states(expected, out) if expected is not None else pack_states(states, out)

    def _first_state(self, states: Any, like: Any) -> Any:
        """What a masked step outputs (Keras's JAX backend): the first state, or the last cell's first state when
        the first state is itself a structure (stacked cells). Where Keras's choice has another width than the
        output (stacked single-state cells of different units; Keras fails there), the last cell's first state."""
        first = states[0]
        if is_nested(first):
            first = flatten_states(states[-1])[0] if is_nested(states[-1]) else states[-1]
        if tuple(first.shape) != tuple(like.shape):
            last = states[-1]
            first = flatten_states(last)[0] if is_nested(last) else last
        return first

    def inner_loop(self, sequences: Tensor, initial_state: Any, mask: Any, training: Any = False) -> tuple:
        """``(last_output, outputs, final_states)``: ``outputs`` ``(batch, time, output_size)`` in the order the
        steps ran (only the last step's when not ``return_sequences``)."""
        steps = _ops.unstack(sequences, axis=1)
        masks = None
        if mask is not None:
            mask = _ops.cast(mask, "bool")
            masks = [_ops.expand_dims(m, -1) for m in _ops.unstack(mask, axis=1)]
        order = range(len(steps) - 1, -1, -1) if self.go_backwards else range(len(steps))
        states = initial_state
        outputs = []
        for t in order:
            output, new_states = _call_cell(self.cell, steps[t], states, training)
            if not is_nested(new_states):
                new_states = [new_states]
            if masks is not None:
                keep = masks[t]
                if self.zero_output_for_mask:
                    output = _ops.where(keep, output, _ops.zeros_like(output))
                else:
                    output = _ops.where(keep, output, self._first_state(states, output))
                new_flat = [_ops.where(keep, n, o) for n, o in zip(flatten_states(new_states), flatten_states(states))]
                new_states = pack_states(states, new_flat)
            else:
                new_states = pack_states(states, flatten_states(new_states))
            states = new_states
            if self.return_sequences or not outputs:
                outputs.append(output)
            else:
                outputs[0] = output
        return outputs[-1], (_ops.stack(outputs, axis=1) if self.return_sequences else None), states

    def call(self, sequences: Any, initial_state: Any = None, mask: Any = None, training: Any = False) -> Any:
        self._check_call(sequences, mask)
        if int(sequences.shape[1]) == 0:
            raise ValueError(f"{self._owner()}: the input sequences have no time steps (shape {sequences.shape})")
        states = self._initial_states(sequences, initial_state)
        try:
            last, outputs, states = self.inner_loop(sequences, states, mask, training=training)
        finally:
            self._reset_dropout_masks(self.cell)
        if self.stateful:
            for var, value in zip(self._states, flatten_states(states)):
                var.assign(_ops.stop_gradient(value))
        output = outputs if self.return_sequences else last
        if self.return_sequences and mask is not None:
            output._keras_mask = mask  # Keras's compute_mask: the next layer reads it
        if self.return_state:
            return (output, *states)
        return output

    def _reset_dropout_masks(self, cell: Any) -> None:
        if hasattr(cell, "reset_dropout_mask"):
            cell.reset_dropout_mask()
            cell.reset_recurrent_dropout_mask()
        for inner in getattr(cell, "cells", None) or []:
            self._reset_dropout_masks(inner)

    # ----- config -----------------------------------------------------------------------------------------
    def get_config(self) -> dict:
        config = super().get_config()
        config.update(return_sequences=self.return_sequences, return_state=self.return_state,
                      go_backwards=self.go_backwards, stateful=self.stateful, unroll=self.unroll,
                      zero_output_for_mask=self.zero_output_for_mask, cell=serialize_layer(self.cell))
        return config

    @classmethod
    def from_config(cls, config: dict) -> "RNN":
        config = dict(config)
        cell = deserialize_layer(config.pop("cell", None), "cell", f"{cls.__name__} '{config.get('name')}'")
        return cls(cell, **config)


# The arguments of a Keras recurrent layer that belong to its cell, and the cell's config keys it reports
_CELL_KEYS = ("units", "activation", "recurrent_activation", "use_bias", "kernel_initializer",
              "recurrent_initializer", "bias_initializer", "unit_forget_bias", "kernel_regularizer",
              "recurrent_regularizer", "bias_regularizer", "kernel_constraint", "recurrent_constraint",
              "bias_constraint", "dropout", "recurrent_dropout", "seed", "reset_after")


class _CellLayer(RNN):
    """An RNN over one built-in cell made from the layer's own arguments (``SimpleRNN``, ``LSTM``, ``GRU``):
    the cell's arguments read through as attributes, and its config is the layer's.

    Where the configuration is Keras's cuDNN one (see :mod:`._fused`), a call runs the whole layer as one fused
    node (cuDNN's RNN on a GPU, its NumPy twin on the CPU backend); ``use_cudnn=False`` keeps the step loop,
    ``use_cudnn=True`` makes a call that cannot take the fused path an error (Keras's)."""

    _cell_class: type = SimpleRNNCell
    _cell_name = "simple_rnn_cell"

    def __init__(self, units: int, *, return_sequences: bool = False, return_state: bool = False,
                 go_backwards: bool = False, stateful: bool = False, unroll: bool = False,
                 use_cudnn: Any = "auto", cell_arguments: dict, **kwargs: Any) -> None:
        name = kwargs.get("name")
        owner = f"{type(self).__name__}{'' if name is None else f' {name!r}'}"
        if use_cudnn not in ("auto", True, False):
            raise ValueError(f"{owner}: Invalid value received for argument `use_cudnn`. Expected one of "
                             f"{{'auto', True, False}}. Received: use_cudnn={use_cudnn!r}")
        implementation = kwargs.pop("implementation", 2)
        cell = self._cell_class(units, dtype=kwargs.get("dtype"), trainable=kwargs.get("trainable", True),
                                name=self._cell_name, implementation=implementation, **cell_arguments)
        super().__init__(cell, return_sequences=return_sequences, return_state=return_state,
                         go_backwards=go_backwards, stateful=stateful, unroll=unroll, **kwargs)
        self.use_cudnn = use_cudnn

    #: whether the layer may take the fused path at all (a private switch: the tests force the step loop with it)
    _fused_allowed = True
    #: how many calls took the fused path, and whether the last one did (what the tests read)
    _fused_calls = 0
    _last_call_fused = False

    def inner_loop(self, sequences: Tensor, initial_state: Any, mask: Any, training: Any = False) -> tuple:
        """The whole layer as one fused node where its configuration allows (see :mod:`._fused`), else the step
        loop of :meth:`RNN.inner_loop`."""
        if is_nested(mask):
            mask = mask[0] if mask else None
        if isinstance(sequences, Tensor) and sequences.ndim == 3:
            result = run_fused(self, sequences, initial_state, mask, training)
            if result is not None:
                return result
        else:
            self._last_call_fused = False
        if self.use_cudnn is True:
            raise ValueError(f"{self._owner()}: use_cudnn=True was specified, but cuDNN is not supported for this "
                             "layer configuration with this backend. Pass use_cudnn='auto' to fallback to a "
                             "non-cuDNN implementation.")
        return super().inner_loop(sequences, initial_state, mask, training=training)

    def __getattr__(self, name: str) -> Any:
        # (only reached for names the layer lacks) the cell's arguments, as Keras's properties give them
        if name in _CELL_KEYS or name == "implementation":
            cell = self.__dict__.get("cell")
            if cell is not None:
                return getattr(cell, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def get_config(self) -> dict:
        config = super().get_config()
        del config["cell"]
        cell_config = self.cell.get_config()
        for key in _CELL_KEYS:
            if key in cell_config:
                config[key] = cell_config[key]
        config.setdefault("activity_regularizer", None)
        return config

    @classmethod
    def from_config(cls, config: dict) -> "RNN":
        return cls(**config)


def _split_arguments(kwargs: dict, keys: Sequence[str]) -> dict:
    return {k: kwargs.pop(k) for k in keys if k in kwargs}


@register
class SimpleRNN(_CellLayer):
    """``keras.layers.SimpleRNN(units, activation="tanh", use_bias=True, kernel_initializer="glorot_uniform",
    recurrent_initializer="orthogonal", bias_initializer="zeros", kernel_regularizer=None,
    recurrent_regularizer=None, bias_regularizer=None, activity_regularizer=None, kernel_constraint=None,
    recurrent_constraint=None, bias_constraint=None, dropout=0.0, recurrent_dropout=0.0, return_sequences=False,
    return_state=False, go_backwards=False, stateful=False, unroll=False, seed=None)``: an :class:`RNN` over a
    :class:`SimpleRNNCell` (its weights are ``cell.kernel``, ``cell.recurrent_kernel``, ``cell.bias``)."""

    _cell_class = SimpleRNNCell
    _cell_name = "simple_rnn_cell"
    _keys = ("activation", "use_bias", "kernel_initializer", "recurrent_initializer", "bias_initializer",
             "kernel_regularizer", "recurrent_regularizer", "bias_regularizer", "kernel_constraint",
             "recurrent_constraint", "bias_constraint", "dropout", "recurrent_dropout", "seed")

    def __init__(self, units: int, activation: Any = "tanh", use_bias: bool = True, **kwargs: Any) -> None:
        kwargs.update(activation=activation, use_bias=use_bias)
        super().__init__(units, cell_arguments=_split_arguments(kwargs, self._keys), **kwargs)


class _GatedLayer(_CellLayer):
    """LSTM and GRU: the arguments of SimpleRNN and a ``recurrent_activation``."""

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, **kwargs: Any) -> None:
        kwargs.update(activation=activation, recurrent_activation=recurrent_activation, use_bias=use_bias)
        super().__init__(units, cell_arguments=_split_arguments(kwargs, self._keys), **kwargs)


@register
class LSTM(_GatedLayer):
    """``keras.layers.LSTM(units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
    kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
    unit_forget_bias=True, kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None,
    activity_regularizer=None, kernel_constraint=None, recurrent_constraint=None, bias_constraint=None,
    dropout=0.0, recurrent_dropout=0.0, seed=None, return_sequences=False, return_state=False,
    go_backwards=False, stateful=False, unroll=False, use_cudnn="auto")``: an :class:`RNN` over an
    :class:`LSTMCell` (gates i, f, c, o; states ``[h, c]``). ``use_cudnn``: see :class:`_CellLayer`."""

    _cell_class = LSTMCell
    _cell_name = "lstm_cell"
    _keys = SimpleRNN._keys + ("recurrent_activation", "unit_forget_bias")


@register
class GRU(_GatedLayer):
    """``keras.layers.GRU(units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
    kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
    kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None, activity_regularizer=None,
    kernel_constraint=None, recurrent_constraint=None, bias_constraint=None, dropout=0.0, recurrent_dropout=0.0,
    seed=None, return_sequences=False, return_state=False, go_backwards=False, stateful=False, unroll=False,
    reset_after=True, use_cudnn="auto")``: an :class:`RNN` over a :class:`GRUCell` (gates z, r, h; bias
    ``(2, 3 * units)`` with ``reset_after=True``). ``use_cudnn``: see :class:`_CellLayer`."""

    _cell_class = GRUCell
    _cell_name = "gru_cell"
    _keys = SimpleRNN._keys + ("recurrent_activation", "reset_after")

